#!/usr/bin/env bash
# Start benchmark: from exec of the provider until its /readyz answers and
# until it has reconciled a managed resource that exists already, on a
# local control plane, ROUNDS times (hack/benchprovider: the KVMProxy kind
# on the in-memory reference driver, so no backend is in the way). Not a test: it prints figures and the median
# round's log (see hack/benchstart/main.go).
#
#   hack/bench-start.sh [ROUNDS] [-- extra benchstart flags]
#
#   hack/bench-start.sh 5
#   hack/bench-start.sh 3 -- -provider-args --leader-election
#
# Needs the control-plane binaries (hack/controlplane-bins.sh builds them
# when missing).
# shellcheck source=hack/bench-env.sh
source "$(dirname "$0")/bench-env.sh"

bench_args 5 "$@"

bench_provider
bench_build benchstart
exec bin/benchstart -rounds "$COUNT" -provider bin/benchprovider "${ARGS[@]}"
