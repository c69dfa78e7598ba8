#!/usr/bin/env bash
# KVMProxy create-to-Ready by phase on the real libvirt host of
# hack/libvirt-up.sh (TCG guests), with the guest image of
# hack/guest-image.sh (Squid preinstalled) already in the storage pool: a
# first round brings it there and is reported apart. Each round times the
# domain defined, started, its first DHCP address, Squid answering,
# cloud-init done and the provider's Ready, from the create; the medians
# follow (internal/controller/kvm, BenchmarkKVMProxyCreateToReady). Not a
# test: it prints figures. As root (libvirtd, the image build).
#
#   hack/bench-kvm.sh ROUNDS
#
# Appends each round to BENCH_DATA/kvm.jsonl (default .cache/bench) and
# draws the phases (hack/benchchart).
# shellcheck source=hack/bench-env.sh
source "$(dirname "$0")/bench-env.sh"

ROUNDS="${1:-3}"
BENCH_DATA=$(realpath -m "${BENCH_DATA:-.cache/bench}")
export BENCH_DATA EGRESSPROXY_REQUIRE_SQUID=1
go test ./internal/controller/kvm/ -run '^$' -bench '^BenchmarkKVMProxyCreateToReady$' -benchtime 1x -timeout 2h -v -args -kvm-rounds "$ROUNDS" |
  grep -v '^goos\|^goarch\|^pkg\|^cpu'
bench_charts
