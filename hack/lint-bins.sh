#!/usr/bin/env bash
# Builds golangci-lint, at the version pinned below, from the Go module
# proxy into the tool cache outside the repo, only when missing (a couple of
# minutes cold). `go install pkg@version` builds it from its own module, so
# its dependency tree stays out of the provider's go.mod. Prints the path of
# the binary on stdout; logs go to stderr.
# shellcheck source=hack/bins-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/bins-env.sh"
bins_init lint-bins lint

GOLANGCI_LINT_VERSION=${GOLANGCI_LINT_VERSION:-v2.15.0}
BIN="$CACHE/lint/golangci-lint-$GOLANGCI_LINT_VERSION"
mkdir -p "$BIN"

if [ ! -x "$BIN/golangci-lint" ]; then
  log "building golangci-lint $GOLANGCI_LINT_VERSION (a couple of minutes cold)"
  t0=$SECONDS
  GOBIN="$BIN" go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$GOLANGCI_LINT_VERSION" >&2
  log "built in $((SECONDS - t0)) s"
fi
echo "$BIN/golangci-lint"
