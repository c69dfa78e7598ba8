#!/usr/bin/env bash
# Undoes hack/libvirt-up.sh for one caller: unregisters CALLER_PID, and
# once no registered caller is alive, destroys and undefines the domains
# left whose disks are in the test pool, stops the transient test network
# and pool libvirt-up.sh created, stops sshd, libvirtd and virtlogd by
# their PID files (only those it started), restores /dev/kvm's mode and
# removes the test user it created. The storage pool's directory (the
# cached base images) stays. Nothing that does not carry the project's
# names is touched: no other domain, network or pool.
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
flock -w 300 9 || { log "$STATE/script.lock held for 5 minutes by another libvirt-up.sh or libvirt-down.sh"; exit 1; }

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

# A libvirtd answers: this script's or one that was running already.
if virsh -c "$URI" version >/dev/null 2>&1; then
  # Guests outlive libvirtd, and their definitions outlive a run killed
  # before its Delete: the tests' domains, those whose disks are in the
  # test pool's folder (the project's), are destroyed and undefined;
  # another domain is not ours and stays as it is.
  for d in $(virsh -c "$URI" list --all --name 2>/dev/null); do
    if grep -qF "$DATA/pool/" <<<"$(virsh -c "$URI" domblklist "$d" 2>/dev/null)"; then
      virsh -c "$URI" destroy "$d" >/dev/null 2>&1 && log "destroyed domain $d"
      virsh -c "$URI" undefine --nvram "$d" >/dev/null 2>&1 && log "undefined domain $d"
    fi
  done
  # The tests' own transient NAT networks (egressproxy-nat-PID), left by a
  # run killed before its clean-up: no test runs now. (An earlier version
  # of the test defined them persistently: undefined.)
  for n in $(virsh -c "$URI" net-list --all --name 2>/dev/null); do
    case "$n" in
      egressproxy-nat-*)
        virsh -c "$URI" net-destroy "$n" >/dev/null 2>&1 && log "destroyed network $n"
        virsh -c "$URI" net-undefine "$n" >/dev/null 2>&1 || true
        ;;
    esac
  done
  # The transient network and pool libvirt-up.sh created go with a
  # destroy (the pool's folder, the cached base images, stays). The
  # undefines are for the persistent definitions of an earlier version of
  # libvirt-up.sh; both names are the project's.
  if [ -f "$STATE/owns-net" ] || [ -f "$STATE/owns-libvirtd" ]; then
    virsh -c "$URI" net-destroy "$NET" >/dev/null 2>&1 || true
    virsh -c "$URI" net-undefine "$NET" >/dev/null 2>&1 || true
  fi
  if [ -f "$STATE/owns-pool" ] || [ -f "$STATE/owns-libvirtd" ]; then
    virsh -c "$URI" pool-destroy "$POOL" >/dev/null 2>&1 || true
    virsh -c "$URI" pool-undefine "$POOL" >/dev/null 2>&1 || true
  fi
fi
rm -f "$STATE/owns-net" "$STATE/owns-pool"

if [ -f "$STATE/owns-libvirtd" ]; then
  if alive "$STATE/libvirtd.pid"; then
    stop "$STATE/libvirtd.pid" libvirtd
    if [ -f "$STATE/owns-libvirt-chains" ]; then
      remove_libvirt_chains
    fi
  else
    # The libvirtd this script started is gone (killed, crashed): the
    # marker is stale, and whatever libvirtd answers now is not ours. Its
    # chains are this script's to remove only when no libvirtd runs.
    log "the libvirtd this script started is gone; forgetting it"
    if [ -f "$STATE/owns-libvirt-chains" ] && ! pgrep -x libvirtd >/dev/null; then
      remove_libvirt_chains
    fi
  fi
  rm -f "$STATE/owns-libvirtd" "$STATE/libvirtd.pid"
fi
rm -f "$STATE/owns-libvirt-chains"
if [ -f "$STATE/owns-virtlogd" ]; then
  stop "$STATE/virtlogd.pid" virtlogd # stop removes a stale PID file too
  rm -f "$STATE/owns-virtlogd"
fi
if [ -f "$STATE/devkvm.orig" ] && [ -e /dev/kvm ]; then
  read -r owner mode <"$STATE/devkvm.orig"
  chown "$owner" /dev/kvm && chmod "$mode" /dev/kvm
  rm -f "$STATE/devkvm.orig"
  log "restored /dev/kvm to $owner $mode"
fi
# The user libvirt-up.sh created ($STATE/owns-user: an earlier version's
# record); a user of that name it did not create stays.
if [ -f "$DATA/owns-user" ] || [ -f "$STATE/owns-user" ]; then
  userdel egressproxy 2>/dev/null || true
  rm -f "$DATA/owns-user" "$STATE/owns-user"
fi
