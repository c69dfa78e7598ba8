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
URI=qemu:///system

log() { echo "libvirt-down: $*" >&2; }
[ -d "$STATE" ] || exit 0
exec 9>"$STATE/script.lock"
# Daemons started below must not inherit fd 9, or they would hold the lock.
flock -w 300 9 || { echo "libvirt: $STATE/lock held for 5 minutes" >&2; exit 1; }

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

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
    local pid; pid=$(cat "$1")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    log "stopped $2 (PID $pid)"
  fi
  rm -f "$1"
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
  virsh -c "$URI" net-destroy "$NET" >/dev/null 2>&1 || true
  stop "$STATE/libvirtd.pid" libvirtd
  rm -f "$STATE/owns-libvirtd"
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
