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
# and, beside it, the Crossplane CLI (github.com/crossplane/cli/v2 v2.5.0,
# `crossplane xpkg build|push|install`), which packages and installs this
# project: hack/crossplane-bins.sh cli prints the CLI binary's path instead.
# shellcheck source=hack/bins-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/bins-env.sh"
bins_init crossplane-bins crossplane

XP_VERSION=${XP_VERSION:-v2.4.0}
CLI_VERSION=${CLI_VERSION:-v2.5.0}
BIN="$CACHE/crossplane/core-$XP_VERSION"
mkdir -p "$BIN"

build_core() {
  [ -x "$BIN/crossplane" ] && [ -d "$BIN/crds" ] && return
  log "building Crossplane core $XP_VERSION (a few minutes cold)"
  local d="$WORK/core"
  wrapper_module "$d" crossplanewrapper github.com/crossplane/crossplane/v2/cmd/crossplane \
    "github.com/crossplane/crossplane/v2 $XP_VERSION" "github.com/crossplane/crossplane/apis/v2 $XP_VERSION"
  (cd "$d" && bash "$HACK/go-build.sh" "crossplane-bins: core" -trimpath -ldflags="-s -w -X github.com/crossplane/crossplane-runtime/v2/pkg/version.version=$XP_VERSION" \
    -o "$BIN/crossplane.tmp" github.com/crossplane/crossplane/v2/cmd/crossplane)
  # Crossplane's CRDs ship in the module, read by `crossplane core init`.
  local src; src=$(cd "$d" && go list -m -f '{{.Dir}}' github.com/crossplane/crossplane/v2)
  rm -rf "$BIN/crds.tmp"; cp -r "$src/cluster/crds" "$BIN/crds.tmp"; chmod -R u+w "$BIN/crds.tmp"
  rm -rf "$BIN/crds"; mv "$BIN/crds.tmp" "$BIN/crds"
  mv "$BIN/crossplane.tmp" "$BIN/crossplane"
}

# The CLI is a module of its own (github.com/crossplane/cli/v2), built
# from its own go.mod and go.sum exactly as released.
CLI="$CACHE/crossplane/cli-$CLI_VERSION/crossplane"
build_cli() {
  [ -x "$CLI" ] && return
  log "building the Crossplane CLI $CLI_VERSION (a few minutes cold)"
  local src d="$WORK/cli"
  # Its own go.mod and go.sum, as released (the module proxy here serves
  # the version but not the version list `go install pkg@version` reads).
  src=$(cd "$WORK" && go mod download -json "github.com/crossplane/cli/v2@$CLI_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -d "$src" ] || { log "cannot download github.com/crossplane/cli/v2@$CLI_VERSION"; exit 1; }
  rm -rf "$d"; cp -r "$src" "$d"; chmod -R u+w "$d"
  mkdir -p "$(dirname "$CLI")"
  (cd "$d" && bash "$HACK/go-build.sh" "crossplane-bins: CLI" -trimpath \
    -ldflags="-s -w -X github.com/crossplane/crossplane-runtime/v2/pkg/version.version=$CLI_VERSION" \
    -o "$CLI.tmp" ./cmd/crossplane)
  mv "$CLI.tmp" "$CLI"
  rm -rf "$d"
}

case "${1:-core}" in
  core) build_core; echo "$BIN" ;;
  cli) build_cli; echo "$CLI" ;;
  all) build_core; build_cli; echo "$BIN" ;;
  *) echo "usage: $0 [core|cli|all]" >&2; exit 2 ;;
esac
