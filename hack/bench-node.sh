#!/usr/bin/env bash
# Benchmark of the local node (internal/devenv/controlplane's Options.Node): warm
# start and stop of a control plane with its node, and PodProxy
# create-to-Ready on real pods. Not a test: it prints figures (see
# hack/benchnode/main.go). Needs root; builds what is missing first
# (hack/controlplane-bins.sh, hack/node-bins.sh, hack/squid-image.sh).
#
#   hack/bench-node.sh [ROUNDS] [PROXIES]
# shellcheck source=hack/bench-env.sh
source "$(dirname "$0")/bench-env.sh"
bash hack/controlplane-bins.sh >/dev/null
bash hack/node-bins.sh >/dev/null
bash hack/squid-image.sh >/dev/null
go build -trimpath -o bin/provider ./cmd/provider
bench_build benchnode
exec bin/benchnode -rounds "${1:-3}" -proxies "${2:-3}" -provider bin/provider
