#!/usr/bin/env bash
# Builds the node binaries internal/devenv/controlplane's optional node needs
# (kubelet, kube-proxy, kube-scheduler) from the Go module proxy, the same
# way hack/controlplane-bins.sh builds kube-apiserver, plus the pod
# sandboxes' pause process (hack/pause) and crictl, and installs the node's runtime
# from Debian (containerd, runc, the CNI plugins, iptables, conntrack) when
# missing. Binaries are cached outside the repo and rebuilt only when
# missing. Prints the folder holding them.
# shellcheck source=hack/bins-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/bins-env.sh"
# Its own lock: the control-plane build may run at the same time.
bins_init node-bins node

K8S_VERSION=${K8S_VERSION:-v1.35.4}
BIN="$CACHE/node/k8s-$K8S_VERSION"
mkdir -p "$BIN"

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
  # The node runs its own containerd, on its own socket and folders: the
  # package's service is not started (policy-rc.d exit 101 tells
  # invoke-rc.d and deb-systemd-invoke so; hack/lib-apt.sh adds it under a
  # machine-wide lock, marked as the project's, and removes it after, or
  # at the next run if this one is killed). A policy-rc.d already there is
  # the machine's own and stays as it is; nothing running is stopped.
  local rc=0
  apt_no_start apt_runtime "${missing[@]}" || rc=$?
  [ "$rc" -eq 0 ] || { log "apt-get install ${missing[*]} failed"; exit "$rc"; }
  # Nor started at boot: the package's postinst enables its service
  # (policy-rc.d only keeps it from starting now). Only for a containerd
  # this script installed.
  if [[ " ${missing[*]} " == *" containerd "* ]]; then
    [ -e /etc/init.d/containerd ] && { update-rc.d containerd disable >/dev/null 2>&1 || true; }
    command -v deb-systemd-helper >/dev/null && { DPKG_MAINTSCRIPT_PACKAGE=containerd deb-systemd-helper disable containerd.service >/dev/null 2>&1 || true; }
  fi
}
apt_runtime() {
  apt-get -o DPkg::Lock::Timeout=600 update -qq >&2 &&
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "$@" >&2
}
# shellcheck source=hack/lib-apt.sh
source "$HACK/lib-apt.sh"

# The Kubernetes commands this script builds (hack/k8s-build.sh).
CMDS=(kubelet kube-proxy kube-scheduler)
# shellcheck source=hack/k8s-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/k8s-build.sh"

# pause holds a pod's namespaces (containerd's sandbox image, which cannot
# be pulled here, is made from it); static, from this repository.
build_pause() {
  [ -x "$BIN/pause" ] && return
  (cd "$HACK/.." && bash hack/go-build.sh "node-bins: pause" -trimpath -ldflags="-s -w" -o "$BIN/pause.tmp" ./hack/pause)
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
for c in "${CMDS[@]}"; do build_k8s k8snodewrapper "$c"; done
build_pause
build_crictl
echo "$BIN"
