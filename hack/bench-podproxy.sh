#!/usr/bin/env bash
# Benchmark of the PodProxy controller on a local control plane, with the
# kubelet stand-in (internal/backend/kubernetes/kubelettest) playing the
# nodes: a thousand real pods do not fit 2 cores, so this benchmark keeps
# the stand-in where everything else runs on the local node
# (hack/bench-node.sh measures real pods). Not a test: it prints figures
# (see hack/benchpodproxy/main.go). It measures the floor (the same
# Deployments and Secrets through the kubernetes driver, no provider), then
# the provider, each on a fresh control plane, and ends with a summary of
# both beside the targets.
#
#   hack/bench-podproxy.sh N [KUBELET_DELAY] [-- extra benchpodproxy flags]
#
#   hack/bench-podproxy.sh 200 3s     200 PodProxies, 3 s from pod to Ready
#   hack/bench-podproxy.sh 1000       1000, an instant kubelet
#   hack/bench-podproxy.sh 200 3s -- -only provider    the provider only
#   hack/bench-podproxy.sh 200 3s -- -floor            the floor only
#   hack/bench-podproxy.sh 1000 -- -network-policy=false   without the proxies' NetworkPolicies (what they cost)
#
# KUBELET_DELAY is a Go duration (3s, 500ms) or a number of seconds.
# Each run appends its figures to BENCH_DATA/podproxy.jsonl (default
# .cache/bench), keeps the provider's CPU and heap profiles in a folder
# there, and redraws the charts (hack/benchchart).
# Needs the control-plane binaries (hack/controlplane-bins.sh builds them
# when missing); builds bin/benchprovider.
# shellcheck source=hack/bench-env.sh
source "$(dirname "$0")/bench-env.sh"

N="${1:-200}"
DELAY="${2:-0s}"
shift $(( $# > 2 ? 2 : $# ))
[ "${1:-}" = "--" ] && shift
case "$DELAY" in
  *[a-z]*) ;;
  *) DELAY="${DELAY}s" ;;
esac

# The provider with its requests counted by verb and resource
# (hack/benchprovider; its in-memory KVMProxy backend is not used here).
bench_provider
bench_build benchpodproxy
bin/benchpodproxy -n "$N" -kubelet-delay "$DELAY" -provider bin/benchprovider "$@"
bench_charts
