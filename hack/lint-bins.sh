#!/usr/bin/env bash
# Builds golangci-lint, at the version pinned below, from the Go module
# proxy into the tool cache outside the repo, only when missing (a couple of
# minutes cold). `go install pkg@version` builds it from its own module, so
# its dependency tree stays out of the provider's go.mod. Prints the path of
# the binary on stdout; logs go to stderr.
set -euo pipefail

GOLANGCI_LINT_VERSION=${GOLANGCI_LINT_VERSION:-v2.15.0}
CACHE=${EGRESSPROXY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/provider-egressproxy}
BIN="$CACHE/lint/golangci-lint-$GOLANGCI_LINT_VERSION"
mkdir -p "$BIN"

export GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0
log() { echo "lint-bins: $*" >&2; }

if command -v flock >/dev/null; then
  exec 9>"$CACHE/lint/.lock"
  flock -n 9 || { log "another build is running; waiting for it"; flock 9; }
fi

if [ ! -x "$BIN/golangci-lint" ]; then
  log "building golangci-lint $GOLANGCI_LINT_VERSION (a couple of minutes cold)"
  t0=$SECONDS
  GOBIN="$BIN" go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$GOLANGCI_LINT_VERSION" >&2
  log "built in $((SECONDS - t0)) s"
fi
echo "$BIN/golangci-lint"
