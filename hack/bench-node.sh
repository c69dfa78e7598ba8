#!/usr/bin/env bash
# Benchmark of the local node (internal/controlplane's Options.Node): warm
# start and stop of a control plane with its node, and PodProxy
# create-to-Ready on real pods. Not a test: it prints figures (see
# hack/benchnode/main.go). Needs root; builds what is missing first
# (hack/controlplane-bins.sh, hack/node-bins.sh, hack/squid-image.sh).
#
#   hack/bench-node.sh [ROUNDS] [PROXIES]
set -euo pipefail
cd "$(dirname "$0")/.."
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
bash hack/controlplane-bins.sh >/dev/null
bash hack/node-bins.sh >/dev/null
bash hack/squid-image.sh >/dev/null
mkdir -p bin
go build -trimpath -o bin/provider ./cmd/provider
go build -o bin/benchnode ./hack/benchnode
exec bin/benchnode -rounds "${1:-3}" -proxies "${2:-3}" -provider bin/provider
