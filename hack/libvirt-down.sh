#!/usr/bin/env bash
# Undoes hack/libvirt-up.sh for one caller: unregisters CALLER_PID, and
# once no registered caller is alive, destroys the domains left on the
# libvirtd it started, stops sshd, libvirtd and virtlogd by their PID
# files (only those it started), removes the test network's bridge,
# restores /dev/kvm's mode and removes the test user it created. The
# storage pool's directory (the cached base images) stays.
#
#   hack/libvirt-down.sh [CALLER_PID]
set -euo pipefail

CALLER=${1:-$PPID}
STATE=${EGRESSPROXY_LIBVIRT_STATE:-/run/egressproxy-libvirt}
DATA=${EGRESSPROXY_LIBVIRT_DATA:-/var/lib/egressproxy-libvirt}
NET=egressproxy-test
POOL=egressproxy
URI=qemu:///system

log() { echo "libvirt-down: $*" >&2; }
[ -d "$STATE" ] || exit 0
exec 9>"$STATE/script.lock"
# Daemons started below must not inherit fd 9, or they would hold the lock.
flock -w 300 9 || { echo "libvirt: $STATE/lock held for 5 minutes" >&2; exit 1; }

# alive PIDFILE: the process the file names runs, and is the daemon the
# file is named for (a PID left by a crash may since be another's).
alive() {
  [ -s "$1" ] || return 1
  local pid; pid=$(cat "$1" 2>/dev/null) || return 1
  kill -0 "$pid" 2>/dev/null && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$(basename "$1" .pid)" ]
}

if [ -f "$STATE/users" ]; then
  grep -vx "$CALLER" "$STATE/users" >"$STATE/users.new" || true
  mv "$STATE/users.new" "$STATE/users"
  while read -r pid; do
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      log "still in use by PID $pid; leaving everything up"
      exit 0
    fi
  done <"$STATE/users"
  : >"$STATE/users"
fi

stop() { # pidfile name
  if alive "$1"; then
    local pid; pid=$(cat "$1" 2>/dev/null)
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do alive "$1" || break; sleep 0.1; done
    if alive "$1"; then kill -9 "$pid" 2>/dev/null || true; fi
    log "stopped $2 (PID $pid)"
  fi
  rm -f "$1"
}

# remove_libvirt_chains removes the LIBVIRT_* chains a libvirtd this
# script started added, and the jumps to them from the built-in chains.
remove_libvirt_chains() {
  local ipt t chain rest c
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    for t in filter nat mangle; do
      while read -r _ chain rest; do
        # shellcheck disable=SC2086 # a jump rule is plain words
        "$ipt" -t "$t" -D "$chain" $rest 2>/dev/null || true
      done < <("$ipt-save" -t "$t" 2>/dev/null | grep -E '^-A [A-Z]+ .*-j LIBVIRT_[A-Z]+$' | grep -v '^-A LIBVIRT_')
      for c in $("$ipt-save" -t "$t" 2>/dev/null | sed -n 's/^:\(LIBVIRT_[A-Z]*\) .*/\1/p'); do
        "$ipt" -t "$t" -F "$c" 2>/dev/null || true
      done
      for c in $("$ipt-save" -t "$t" 2>/dev/null | sed -n 's/^:\(LIBVIRT_[A-Z]*\) .*/\1/p'); do
        "$ipt" -t "$t" -X "$c" 2>/dev/null || true
      done
    done
  done
  log "removed libvirtd's LIBVIRT_* chains"
}

stop "$STATE/sshd.pid" sshd
if [ -f "$STATE/owns-libvirtd" ] && alive "$STATE/libvirtd.pid"; then
  # Guests outlive libvirtd: destroy the tests' that run on the daemon we
  # started, those whose disks are in the test pool (another guest of this
  # machine's libvirt configuration is not ours).
  for d in $(virsh -c "$URI" list --name 2>/dev/null); do
    if grep -qF "$DATA/pool/" <<<"$(virsh -c "$URI" domblklist "$d" 2>/dev/null)"; then
      virsh -c "$URI" destroy "$d" >/dev/null 2>&1 && log "destroyed domain $d"
    fi
  done
  # The network and pool were defined by libvirt-up.sh into this
  # machine's libvirt configuration: undefined again (the pool's folder,
  # the cached base images, stays).
  virsh -c "$URI" net-destroy "$NET" >/dev/null 2>&1 || true
  virsh -c "$URI" net-undefine "$NET" >/dev/null 2>&1 || true
  virsh -c "$URI" pool-destroy "$POOL" >/dev/null 2>&1 || true
  virsh -c "$URI" pool-undefine "$POOL" >/dev/null 2>&1 || true
  stop "$STATE/libvirtd.pid" libvirtd
  rm -f "$STATE/owns-libvirtd"
  if [ -f "$STATE/owns-libvirt-chains" ]; then
    remove_libvirt_chains
    rm -f "$STATE/owns-libvirt-chains"
  fi
fi
if [ -f "$STATE/owns-virtlogd" ]; then
  stop "$STATE/virtlogd.pid" virtlogd
  rm -f "$STATE/owns-virtlogd"
fi
if [ -f "$STATE/devkvm.orig" ] && [ -e /dev/kvm ]; then
  read -r owner mode <"$STATE/devkvm.orig"
  chown "$owner" /dev/kvm && chmod "$mode" /dev/kvm
  rm -f "$STATE/devkvm.orig"
  log "restored /dev/kvm to $owner $mode"
fi
if [ -f "$STATE/owns-user" ]; then
  userdel egressproxy 2>/dev/null || true
  rm -f "$STATE/owns-user"
fi
