#!/usr/bin/env bash
# Batched observation (internal/backend/batch): backend calls per proxy per
# poll for N steady proxies of one config, counted at the Proxmox and
# Compute Engine fakes through the real drivers. Not a test: it prints
# figures (see hack/benchbatch/main.go).
#
#   hack/bench-batch.sh N [-- extra benchbatch flags]
#
#   hack/bench-batch.sh 100
#   hack/bench-batch.sh 500 -- -poll 16s -backend gcp
set -euo pipefail
cd "$(dirname "$0")/.."

N="${1:-100}"
shift $(( $# > 1 ? 1 : $# ))
[ "${1:-}" = "--" ] && shift

export GOFLAGS="${GOFLAGS:--buildvcs=false}"
mkdir -p bin
go build -o bin/benchbatch ./hack/benchbatch
exec bin/benchbatch -n "$N" "$@"
