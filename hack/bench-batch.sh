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
# shellcheck source=hack/bench-env.sh
source "$(dirname "$0")/bench-env.sh"

bench_args 100 "$@"

bench_build benchbatch
exec bin/benchbatch -n "$COUNT" "${ARGS[@]}"
