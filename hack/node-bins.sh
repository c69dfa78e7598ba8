#!/usr/bin/env bash
# Builds the node binaries internal/controlplane's optional node needs
# (kubelet, kube-proxy, kube-scheduler) from the Go module proxy, the same
# way hack/controlplane-bins.sh builds kube-apiserver, plus the pod
# sandboxes' pause process (hack/pause) and crictl, and installs the node's runtime
# from Debian (containerd, runc, the CNI plugins, iptables, conntrack) when
# missing. Binaries are cached outside the repo and rebuilt only when
# missing. Prints the folder holding them.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.35.4}
CACHE=${EGRESSPROXY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/provider-egressproxy}
BIN="$CACHE/node/k8s-$K8S_VERSION"
WORK="$CACHE/node/build"
mkdir -p "$BIN" "$WORK"

export GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0
log() { echo "node-bins: $*" >&2; }

# One build at a time: test packages run in parallel may all call this.
# (Its own lock: the control-plane build may run at the same time.)
if command -v flock >/dev/null; then
  exec 9>"$CACHE/node/.lock"
  flock -n 9 || { log "another build is running; waiting for it"; flock 9; }
fi

# containerd, runc and the CNI plugins come from Debian; apt only when one
# is missing, so a warm machine never touches the package lists.
install_runtime() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  [ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/loopback ] || missing+=(containernetworking-plugins)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v conntrack >/dev/null || missing+=(conntrack)
  [ ${#missing[@]} -eq 0 ] && return
  [ "$(id -u)" -eq 0 ] || { log "need root to install ${missing[*]}"; exit 1; }
  log "installing ${missing[*]} from apt"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >&2
  # Debian starts a system containerd; the node runs its own, on its own
  # socket and folders, and needs nothing from this one.
  if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    systemctl disable --now containerd >/dev/null 2>&1 || true
  fi
}

# The same wrapper module as hack/controlplane-bins.sh (kubernetes' staging
# modules mapped to the published v0.x ones), importing the node commands.
CMDS=(kubelet kube-proxy kube-scheduler)
k8s_wrapper() {
  local d="$WORK/k8s"
  [ -f "$d/.ready" ] && [ "$(cat "$d/.ready")" = "${CMDS[*]}" ] && return
  rm -rf "$d"; mkdir -p "$d"
  local minor="v0.${K8S_VERSION#v1.}"
  cat >"$d/go.mod" <<MOD
module k8snodewrapper
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
  log "building $name $K8S_VERSION (about 5 min cold, seconds warm)"
  local ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
  ld="$ld -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  (cd "$WORK/k8s" && go build -trimpath -ldflags="$ld" -o "$BIN/$name.tmp" "k8s.io/kubernetes/cmd/$name")
  mv "$BIN/$name.tmp" "$BIN/$name"
}

# pause holds a pod's namespaces (containerd's sandbox image, which cannot
# be pulled here, is made from it); static, from this repository.
build_pause() {
  [ -x "$BIN/pause" ] && return
  local root; root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  (cd "$root" && go build -trimpath -ldflags="-s -w" -o "$BIN/pause.tmp" ./hack/pause)
  mv "$BIN/pause.tmp" "$BIN/pause"
}

# crictl, to debug the node's pods (and to remove them on stop through
# the CRI); cri-tools has no 1.35 release.
CRICTL_VERSION=${CRICTL_VERSION:-v1.34.0}
build_crictl() {
  [ -x "$BIN/crictl" ] && return
  log "building crictl $CRICTL_VERSION (about a minute cold)"
  GOBIN="$WORK/crictl-bin" go install -trimpath -ldflags="-s -w" "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
  mv "$WORK/crictl-bin/crictl" "$BIN/crictl"
}

install_runtime
for c in "${CMDS[@]}"; do build_k8s "$c"; done
build_pause
build_crictl
echo "$BIN"
