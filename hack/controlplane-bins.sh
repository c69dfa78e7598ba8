#!/usr/bin/env bash
# Builds the control-plane binaries the tests and `make run` need
# (kube-apiserver, kube-controller-manager, etcd) and the kubectl `make run`
# prints commands for, from the Go module proxy, since none can be
# downloaded here. Binaries are cached outside the repo
# and rebuilt only when missing. Prints the folder holding them.
set -euo pipefail
HACK=$(cd "$(dirname "$0")" && pwd)

K8S_VERSION=${K8S_VERSION:-v1.35.4}
ETCD_VERSION=${ETCD_VERSION:-v3.6.5}
CACHE=${EGRESSPROXY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/provider-egressproxy}
BIN="$CACHE/controlplane/k8s-$K8S_VERSION-etcd-$ETCD_VERSION"
WORK="$CACHE/controlplane/build"
mkdir -p "$BIN" "$WORK"

export GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0
log() { echo "controlplane-bins: $*" >&2; }

# One build at a time: test packages run in parallel may all call this.
if command -v flock >/dev/null; then
  exec 9>"$CACHE/controlplane/.lock"
  flock -n 9 || { log "another build is running; waiting for it"; flock 9; }
fi

build_etcd() {
  [ -x "$BIN/etcd" ] && return
  log "building etcd $ETCD_VERSION (about 90 s cold)"
  local d="$WORK/etcd"; rm -rf "$d"; mkdir -p "$d"
  cat >"$d/go.mod" <<MOD
module etcdwrapper
go 1.24
require (
	go.etcd.io/etcd/server/v3 $ETCD_VERSION
	go.etcd.io/etcd/api/v3 $ETCD_VERSION
	go.etcd.io/etcd/client/pkg/v3 $ETCD_VERSION
	go.etcd.io/etcd/client/v3 $ETCD_VERSION
	go.etcd.io/etcd/pkg/v3 $ETCD_VERSION
)
MOD
  printf '//go:build tools\npackage tools\nimport _ "go.etcd.io/etcd/server/v3"\n' >"$d/tools.go"
  (cd "$d" && go mod tidy >/dev/null && bash "$HACK/go-build.sh" "controlplane-bins: etcd" -trimpath -ldflags="-s -w" -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3)
  mv "$BIN/etcd.tmp" "$BIN/etcd"
}

# The Kubernetes commands this script builds (hack/k8s-build.sh).
CMDS=(kube-apiserver kube-controller-manager kubectl)
# shellcheck source=hack/k8s-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/k8s-build.sh"

build_etcd
build_k8s k8swrapper kube-apiserver
build_k8s k8swrapper kube-controller-manager
build_k8s k8swrapper kubectl
echo "$BIN"
