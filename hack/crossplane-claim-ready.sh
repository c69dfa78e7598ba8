#!/usr/bin/env bash
# Time from an EgressProxyClaim's creation to Ready=True, on real Crossplane
# core v2.4.0 (out of cluster on the local control plane), the composition
# function over mTLS, the provider's controllers and the kubelet stand-in
# running a real Squid per proxy pod: the median (and min, max) over N
# claims created one after another. Not a test: it prints figures
# (test/compositions BenchmarkClaimToReady).
#
#   hack/crossplane-claim-ready.sh [N]      default N=10
#
# Needs squid (hack/install-squid.sh); builds Crossplane core and the
# control plane when missing (hack/crossplane-bins.sh,
# hack/controlplane-bins.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-10}"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
out=$(go test -count=1 -run '^$' -bench '^BenchmarkClaimToReady$' -benchtime "${N}x" -timeout 20m ./test/compositions/ 2>&1) || { echo "$out" | grep -v '^\s*\[' >&2; exit 1; }
echo "$out" | grep -E 'claim to Ready over|BenchmarkClaimToReady' | sed 's/^ *//'
median=$(echo "$out" | grep -oE '[0-9.]+ s-median-claim-to-ready' | awk '{print $1}')
echo "claim to Ready, median over $N claims: ${median} s"
