#!/usr/bin/env bash
# Builds Crossplane core v2.4.0 (`crossplane core init|start`, the
# composition engine the compositions' end-to-end test runs, and the hidden
# `crossplane internal render`) from the Go module proxy, since it cannot be
# downloaded here. It is built in a throwaway wrapper module, so its
# dependency tree stays out of the provider's go.mod. The binary and
# Crossplane's CRDs are cached outside the repo and rebuilt only when
# missing (a few minutes cold). Prints the folder holding:
#
#   crossplane      core v2.4.0
#   crds/           Crossplane's own CRDs (core's cluster/crds)
#
# Packages (.xpkg) are built by hack/xpkg.sh with hack/xpkg, not by the v1
# CLI (v1.20.1's crank): it re-encodes packages with v1 types, refusing
# apiextensions v2 XRDs and dropping a Provider's capabilities.
set -euo pipefail

XP_VERSION=${XP_VERSION:-v2.4.0}
CACHE=${EGRESSPROXY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/provider-egressproxy}
BIN="$CACHE/crossplane/core-$XP_VERSION"
WORK="$CACHE/crossplane/build"
mkdir -p "$BIN" "$WORK"

export GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0
log() { echo "crossplane-bins: $*" >&2; }

# One build at a time: test packages run in parallel may all call this.
if command -v flock >/dev/null; then
  exec 9>"$CACHE/crossplane/.lock"
  flock -n 9 || { log "another build is running; waiting for it"; flock 9; }
fi

build_core() {
  [ -x "$BIN/crossplane" ] && [ -d "$BIN/crds" ] && return
  log "building Crossplane core $XP_VERSION (a few minutes cold)"
  local d="$WORK/core"; rm -rf "$d"; mkdir -p "$d"
  cat >"$d/go.mod" <<MOD
module crossplanewrapper
go 1.25
require (
	github.com/crossplane/crossplane/v2 $XP_VERSION
	github.com/crossplane/crossplane/apis/v2 $XP_VERSION
)
MOD
  printf '//go:build tools\npackage tools\nimport _ "github.com/crossplane/crossplane/v2/cmd/crossplane"\n' >"$d/tools.go"
  (cd "$d" && go mod tidy >/dev/null)
  (cd "$d" && go build -trimpath -ldflags="-s -w -X github.com/crossplane/crossplane-runtime/v2/pkg/version.version=$XP_VERSION" \
    -o "$BIN/crossplane.tmp" github.com/crossplane/crossplane/v2/cmd/crossplane)
  # Crossplane's CRDs ship in the module, read by `crossplane core init`.
  local src; src=$(cd "$d" && go list -m -f '{{.Dir}}' github.com/crossplane/crossplane/v2)
  rm -rf "$BIN/crds.tmp"; cp -r "$src/cluster/crds" "$BIN/crds.tmp"; chmod -R u+w "$BIN/crds.tmp"
  rm -rf "$BIN/crds"; mv "$BIN/crds.tmp" "$BIN/crds"
  mv "$BIN/crossplane.tmp" "$BIN/crossplane"
}

build_core
echo "$BIN"
