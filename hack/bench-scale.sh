#!/usr/bin/env bash
# Scale benchmark: one provider process holding N managed resources, on
# the in-memory reference driver so the backend costs nothing (the
# provider is hack/benchprovider, which also counts its requests by
# resource and verb, so writes are told apart).
# Not a test: it prints figures (see hack/benchscale/main.go).
#
#   hack/bench-scale.sh N [-- extra benchscale flags]
#
#   hack/bench-scale.sh 10000         stages at 1000, 5000 and 10000
#   hack/bench-scale.sh 1000 -- -poll 30s -restart=false
#
# Each stage appends its figures to BENCH_DATA/scale.jsonl (default
# .cache/bench) and the charts are drawn again (hack/benchchart).
# Needs the control-plane binaries (hack/controlplane-bins.sh builds them
# when missing).
# shellcheck source=hack/bench-env.sh
source "$(dirname "$0")/bench-env.sh"

bench_args 10000 "$@"

bench_provider
bench_build benchscale
bin/benchscale -n "$COUNT" -provider bin/benchprovider "${ARGS[@]}"
bench_charts
