#!/usr/bin/env bash
# `go build` that says how far it is: what make run, make build and the
# hack/ scripts build with. Cold (an empty Go build cache) a build takes
# minutes; this prints how many of the packages it needs it has compiled
# after 10 s and every 20 s after that (also while it links), then how
# long it took. Warm (a few seconds) it prints nothing. Ctrl-C stops it.
# Compiler errors are printed as go build prints them, and its exit code
# is this script's.
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
t0=$SECONDS

# The progress lines come from a loop in the background; go build runs in
# the foreground, so that Ctrl-C (SIGINT, which a non-interactive shell's
# background jobs ignore) stops it.
report() {
  local next=10 total=
  while sleep 1; do
    kill -0 "$$" 2>/dev/null || exit 0
    ((SECONDS - t0 >= next)) || continue
    # What the package needs in all, the standard library included (an
    # empty build cache compiles it too): only worth asking when slow.
    [ -n "$total" ] || total=$("${GO:-go}" list -deps "$pkg" 2>/dev/null | wc -l) || total="?"
    # -v names each package as it is compiled: a line without spaces or
    # a colon. Anything else is go build's own output (errors).
    echo "$label: $((SECONDS - t0)) s so far; compiled $(grep -cv '[[:space:]:]' "$out" || true) of the $total packages it needs (the others are in Go's build cache or still to come), then it links" >&2
    next=$((next + 20))
  done
}
report &
reporter=$!
trap 'kill "$reporter" 2>/dev/null || true; rm -f "$out"' EXIT

rc=0
"${GO:-go}" build -v "$@" 2>"$out" || rc=$?
kill "$reporter" 2>/dev/null || true
wait "$reporter" 2>/dev/null || true
grep '[[:space:]:]' "$out" >&2 || true
if ((rc == 0 && SECONDS - t0 >= 10)); then
  echo "$label: built in $((SECONDS - t0)) s" >&2
fi
exit "$rc"
