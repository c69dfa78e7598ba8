# Sourced by hack/*-bins.sh, which build tools from the Go module proxy
# into the cache outside the repo: strict mode, HACK (this folder), CACHE,
# static builds that ignore any go.work, and
#
#   bins_init NAME DIR   log lines say NAME ("node-bins: ..."); WORK is
#                        $CACHE/DIR/build; waits for DIR's lock, so that
#                        one build of DIR runs at a time (test packages run
#                        in parallel may all call the script).
set -euo pipefail
HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${EGRESSPROXY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/provider-egressproxy}
export GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0

log() { echo "$BINS_NAME: $*" >&2; }

bins_init() {
  BINS_NAME=$1
  WORK="$CACHE/$2/build"
  mkdir -p "$WORK"
  if command -v flock >/dev/null; then
    exec 9>"$CACHE/$2/.lock"
    flock -n 9 || { log "another build is running; waiting for it"; flock 9; }
  fi
}

# wrapper_module DIR MODULE PKG REQUIRE...: a throwaway module in DIR
# (made anew) named MODULE that requires each REQUIRE ("path version") and
# imports PKG, tidied: the command PKG then builds from the module proxy
# with its own dependency tree, which stays out of the provider's go.mod.
wrapper_module() {
  local d=$1 mod=$2 pkg=$3; shift 3
  rm -rf "$d"; mkdir -p "$d"
  { printf 'module %s\ngo 1.25\nrequire (\n' "$mod"; printf '\t%s\n' "$@"; printf ')\n'; } >"$d/go.mod"
  printf '//go:build tools\npackage tools\nimport _ "%s"\n' "$pkg" >"$d/tools.go"
  (cd "$d" && go mod tidy >/dev/null)
}
