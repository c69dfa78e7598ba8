#!/usr/bin/env bash
# Builds crossplane-tools' angryjet, the generator of the getters and
# setters crossplane-runtime's interfaces need (`make generate`, through
# apis/generate.go), at the version pinned below, from the Go module proxy
# into the tool cache outside the repo, only when missing (under a minute
# cold). crossplane-tools has no releases, only commits: the pin is the
# newest pseudo-version a provider on crossplane/apis/v2 v2.4 uses, the
# first that matches the core API types (crossplane/apis/v2/core/v2) this
# repository embeds; older ones match only crossplane-runtime's
# apis/common types and generate nothing here. It builds in a throwaway
# wrapper module (`go install pkg@version` asks the proxy for the module's
# version list, which the proxy here refuses), so its dependency tree stays
# out of the provider's go.mod. Prints the path of the binary on stdout;
# logs go to stderr. With arguments, runs angryjet with them instead
# (apis/generate.go: go:generate runs no shell).
# shellcheck source=hack/bins-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/bins-env.sh"
bins_init angryjet-bins angryjet

ANGRYJET_VERSION=${ANGRYJET_VERSION:-v0.0.0-20260719180100-659f1dc036c5}
BIN="$CACHE/angryjet/angryjet-$ANGRYJET_VERSION"
mkdir -p "$BIN"

if [ ! -x "$BIN/angryjet" ]; then
  log "building angryjet $ANGRYJET_VERSION (under a minute cold)"
  d="$WORK/angryjet"
  wrapper_module "$d" angryjetwrapper github.com/crossplane/crossplane-tools/cmd/angryjet \
    "github.com/crossplane/crossplane-tools $ANGRYJET_VERSION"
  (cd "$d" && bash "$HACK/go-build.sh" "angryjet-bins: angryjet" -trimpath -ldflags="-s -w" \
    -o "$BIN/angryjet.tmp" github.com/crossplane/crossplane-tools/cmd/angryjet)
  mv "$BIN/angryjet.tmp" "$BIN/angryjet"
fi
[ $# -eq 0 ] || exec "$BIN/angryjet" "$@"
echo "$BIN/angryjet"
