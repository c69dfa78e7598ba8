#!/usr/bin/env bash
# `go build` that says how far it is: what make run, make build and the
# hack/ scripts build with. Cold (an empty Go build cache) a build takes
# minutes; this prints how many of the packages it needs it has compiled
# after 10 s and every 20 s after that (also while it links), then how
# long it took. Warm (a few seconds) it prints nothing. Compiler errors are printed as
# go build prints them, and its exit code is this script's.
#
#   hack/go-build.sh LABEL [GO BUILD FLAGS] PACKAGE
#
# In the current folder, with the environment given (GOOS, GOARCH,
# CGO_ENABLED, ...): the package is the last argument.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 LABEL [GO BUILD FLAGS] PACKAGE" >&2; exit 2; }
label=$1
shift
pkg=${!#}
out=$(mktemp)
trap 'rm -f "$out"' EXIT

"${GO:-go}" build -v "$@" 2>"$out" &
pid=$!
# -v names each package as it is compiled: a line without spaces or a
# colon. Anything else is go build's own output (errors).
compiled() { grep -cv '[[:space:]:]' "$out" || true; }
total=
t0=$SECONDS
next=10
while kill -0 "$pid" 2>/dev/null; do
  if ((SECONDS - t0 >= next)); then
    # What the package needs in all, the standard library included (an
    # empty build cache compiles it too): only worth asking when slow.
    [ -n "$total" ] || total=$("${GO:-go}" list -deps "$pkg" 2>/dev/null | wc -l) || total="?"
    echo "$label: $((SECONDS - t0)) s so far; compiled $(compiled) of the $total packages it needs (the others are in Go's build cache or still to come), then it links" >&2
    next=$((next + 20))
  fi
  sleep 0.2
done
rc=0
wait "$pid" || rc=$?
grep '[[:space:]:]' "$out" >&2 || true
if ((rc == 0 && next > 10)); then
  echo "$label: built in $((SECONDS - t0)) s" >&2
fi
exit "$rc"
