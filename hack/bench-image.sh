#!/usr/bin/env bash
# Image streaming benchmark: the KVM driver downloads a generated image of
# SIZE_MIB MiB from an HTTP server on loopback into a storage pool of the
# real libvirt host (hack/libvirt-up.sh: libvirtd behind sshd on
# loopback) and this prints its process's RSS growth and the throughput.
# Not a test: it prints figures (see hack/benchimage/main.go). Needs root.
#
#   hack/bench-image.sh [SIZE_MIB] [-- extra benchimage flags]
#
#   hack/bench-image.sh          1 GiB
#   hack/bench-image.sh 256
# shellcheck source=hack/bench-env.sh
source "$(dirname "$0")/bench-env.sh"

bench_args 1024 "$@"

bench_build benchimage
exec bin/benchimage -size-mib "$COUNT" "${ARGS[@]}"
