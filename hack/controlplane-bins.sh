#!/usr/bin/env bash
# Builds the control-plane binaries the tests and `make run` need
# (kube-apiserver, kube-controller-manager, etcd) and the kubectl `make run`
# prints commands for, from the Go module proxy, since none can be
# downloaded here. Binaries are cached outside the repo
# and rebuilt only when missing. Prints the folder holding them.
# shellcheck source=hack/bins-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/bins-env.sh"
bins_init controlplane-bins controlplane

K8S_VERSION=${K8S_VERSION:-v1.35.4}
ETCD_VERSION=${ETCD_VERSION:-v3.6.5}
BIN="$CACHE/controlplane/k8s-$K8S_VERSION-etcd-$ETCD_VERSION"
mkdir -p "$BIN"

build_etcd() {
  [ -x "$BIN/etcd" ] && return
  log "building etcd $ETCD_VERSION (about 90 s cold)"
  local d="$WORK/etcd" m
  local mods=()
  for m in server/v3 api/v3 client/pkg/v3 client/v3 pkg/v3; do mods+=("go.etcd.io/etcd/$m $ETCD_VERSION"); done
  wrapper_module "$d" etcdwrapper go.etcd.io/etcd/server/v3 "${mods[@]}"
  (cd "$d" && bash "$HACK/go-build.sh" "controlplane-bins: etcd" -trimpath -ldflags="-s -w" -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3)
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
