#!/usr/bin/env bash
# Builds the control-plane binaries the tests and `make run` need
# (kube-apiserver, kube-controller-manager, etcd) and the kubectl `make run`
# prints commands for, from the Go module proxy, since none can be
# downloaded here. Binaries are cached outside the repo
# and rebuilt only when missing. Prints the folder holding them.
set -euo pipefail

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
  (cd "$d" && go mod tidy >/dev/null && go build -trimpath -ldflags="-s -w" -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3)
  mv "$BIN/etcd.tmp" "$BIN/etcd"
}

# kubernetes' go.mod maps its staging modules to ./staging; the wrapper maps
# each to the published v0.x module of the same release instead.
CMDS=(kube-apiserver kube-controller-manager kubectl)
k8s_wrapper() {
  local d="$WORK/k8s"
  [ -f "$d/.ready" ] && [ "$(cat "$d/.ready")" = "${CMDS[*]}" ] && return
  rm -rf "$d"; mkdir -p "$d"
  local minor="v0.${K8S_VERSION#v1.}"
  cat >"$d/go.mod" <<MOD
module k8swrapper
go 1.25
require k8s.io/kubernetes $K8S_VERSION
MOD
  (cd "$d" && go mod download -json k8s.io/kubernetes@"$K8S_VERSION" >/dev/null)
  local kmod; kmod=$(cd "$d" && go mod download -json k8s.io/kubernetes@"$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  grep -E '^\s*k8s.io/[a-z0-9-]+ => \./staging' "$kmod" | awk '{print $1}' | sort -u | while read -r m; do
    echo "replace $m => $m $minor" >>"$d/go.mod"
  done
  { printf '//go:build tools\npackage tools\nimport (\n'; printf '_ "k8s.io/kubernetes/cmd/%s"\n' "${CMDS[@]}"; printf ')\n'; } >"$d/tools.go"
  (cd "$d" && go mod tidy >/dev/null)
  echo "${CMDS[*]}" >"$d/.ready"
}

build_k8s() {
  local name=$1
  [ -x "$BIN/$name" ] && return
  k8s_wrapper
  log "building $name $K8S_VERSION (about 6 min cold, seconds warm)"
  local ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
  ld="$ld -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  (cd "$WORK/k8s" && go build -trimpath -ldflags="$ld" -o "$BIN/$name.tmp" "k8s.io/kubernetes/cmd/$name")
  mv "$BIN/$name.tmp" "$BIN/$name"
}

build_etcd
build_k8s kube-apiserver
build_k8s kube-controller-manager
build_k8s kubectl
echo "$BIN"
