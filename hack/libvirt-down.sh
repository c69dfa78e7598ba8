#!/usr/bin/env bash
# Undoes hack/libvirt-up.sh for one caller: unregisters CALLER_PID, and
# once no registered caller is alive, destroys and undefines the domains
# left whose disks are under $DATA (and removes their QEMU logs), the
# tests' pools under $DATA/pools (and unmounts and removes what is mounted
# there), stops the transient test network and pool libvirt-up.sh
# created, stops sshd, libvirtd and virtlogd by their PID files (only
# those it started), restores /dev/kvm's mode and net.ipv4.ip_forward and
# removes the test user it created. The storage pool's directory (the
# cached base images) stays. Nothing that does not carry the project's
# names or paths is touched: no other domain, network, pool or mount.
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
        "$ipt" -w -t "$t" -D "$chain" $rest 2>/dev/null || true
      done < <("$ipt-save" -t "$t" 2>/dev/null | grep -E '^-A [A-Z]+ .*-j LIBVIRT_[A-Z]+$' | grep -v '^-A LIBVIRT_')
      for c in $("$ipt-save" -t "$t" 2>/dev/null | sed -n 's/^:\(LIBVIRT_[A-Z]*\) .*/\1/p'); do
        "$ipt" -w -t "$t" -F "$c" 2>/dev/null || true
      done
      for c in $("$ipt-save" -t "$t" 2>/dev/null | sed -n 's/^:\(LIBVIRT_[A-Z]*\) .*/\1/p'); do
        "$ipt" -w -t "$t" -X "$c" 2>/dev/null || true
      done
    done
  done
  log "removed libvirtd's LIBVIRT_* chains"
}

stop "$STATE/sshd.pid" sshd

# under PATH: PATH is below $DATA/ (the project's folder).
under() { case "$1" in "$DATA"/?*) return 0 ;; esac; return 1; }

# disks_under_data DOMAIN: a disk of DOMAIN is a file below $DATA/.
disks_under_data() {
  local src
  while read -r _ src; do
    under "$src" && return 0
  done < <(virsh -c "$URI" domblklist "$1" 2>/dev/null | tail -n +3)
  return 1
}

# pool_target POOL: the target path of POOL.
pool_target() {
  virsh -c "$URI" pool-dumpxml "$1" 2>/dev/null |
    awk '/<target>/ { t = 1 } t && /<path>/ { sub(/.*<path>/, ""); sub(/<\/path>.*/, ""); print; exit }'
}

# forwarding_held: whether a running process holds net.ipv4.ip_forward
# in the project's record (internal/devenv/forwarding): a file per hold,
# "pid start-time", the start time field 22 of /proc/PID/stat.
FORWARDING_DIR=/run/egressproxy-forwarding
forwarding_held() {
  local f pid start now
  for f in "$FORWARDING_DIR"/holders/*; do
    [ -f "$f" ] || continue
    read -r pid start <"$f" 2>/dev/null || continue
    [ -r "/proc/$pid/stat" ] || continue
    now=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f20)
    [ -n "$now" ] && [ "$now" = "$start" ] && return 0
  done
  return 1
}

# forwarding_networks: the active networks that forward (nat, route,
# open: those libvirt turns net.ipv4.ip_forward on for).
forwarding_networks() {
  local n
  for n in $(virsh -c "$URI" net-list --name 2>/dev/null); do
    if grep -q '<forward' <<<"$(virsh -c "$URI" net-dumpxml "$n" 2>/dev/null)"; then echo "$n"; fi
  done
}

# Whether a libvirt daemon runs is told by its process, never by
# connecting: on a host with systemd a connection would start the
# machine's daemon through its socket unit.
forwarding=
if { alive "$STATE/libvirtd.pid" || pgrep -x libvirtd >/dev/null || pgrep -x virtqemud >/dev/null; } &&
  virsh -c "$URI" version >/dev/null 2>&1; then
  # Guests outlive libvirtd, and their definitions outlive a run killed
  # before its Delete: the tests' domains, those with a disk below $DATA
  # (the test pool's folder, the tests' own pools in $DATA/pools: the
  # project's), are destroyed and undefined, and the QEMU log libvirt
  # keeps after an undefine goes with them; another domain is not ours
  # and stays as it is.
  for d in $(virsh -c "$URI" list --all --name 2>/dev/null); do
    if disks_under_data "$d"; then
      virsh -c "$URI" destroy "$d" >/dev/null 2>&1 && log "destroyed domain $d"
      virsh -c "$URI" undefine --nvram "$d" >/dev/null 2>&1 && log "undefined domain $d"
      # Gone (a transient one goes with its destroy): its log goes too.
      if ! virsh -c "$URI" domuuid "$d" >/dev/null 2>&1; then
        case "$d" in
          */* | .*) ;;
          *) rm -f "/var/log/libvirt/qemu/$d.log" "/var/log/libvirt/qemu/$d.log".[0-9]* ;;
        esac
      fi
    fi
  done
  # The tests' own pools (egp-hf-small, egp-tidy-pool, ...) are on
  # mounts in $DATA/pools: a run killed before its clean-up leaves them.
  for p in $(virsh -c "$URI" pool-list --all --name 2>/dev/null); do
    target=$(pool_target "$p")
    case "$target" in
      "$DATA"/pools/?*)
        virsh -c "$URI" pool-destroy "$p" >/dev/null 2>&1 && log "destroyed pool $p ($target)"
        virsh -c "$URI" pool-undefine "$p" >/dev/null 2>&1 || true
        ;;
    esac
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
  forwarding=$(forwarding_networks | tr '\n' ' ')
fi
rm -f "$STATE/owns-net" "$STATE/owns-pool"

# The tests' mounts in $DATA/pools (tmpfs of their small pools), deepest
# first, and the folders they were on; nothing outside $DATA/pools.
if [ -d "$DATA/pools" ]; then
  while read -r mp; do
    if umount "$mp" 2>/dev/null; then
      log "unmounted $mp"
    else
      log "could not unmount $mp (busy?); left"
    fi
  done < <(awk '{ print $5 }' /proc/self/mountinfo | while read -r m; do printf '%b\n' "$m"; done |
    while read -r m; do case "$m" in "$DATA"/pools/?*) echo "$m" ;; esac; done | sort -ru)
  find "$DATA/pools" -xdev -mindepth 1 -depth -type d -empty -delete 2>/dev/null || true
fi

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

# net.ipv4.ip_forward, which libvirt turned on for a NAT network, goes
# back to the 0 libvirt-up.sh found, unless something still needs it: a
# forwarding network of the machine's libvirtd (forwarding is theirs then:
# the record goes), one of the project's that could not be stopped (the
# record stays for the next run), or a running part of the project that
# holds it (a controlplane node's pods, a test's NAT network: package
# forwarding, whose last hold puts back the value handed to it here).
if [ -f "$STATE/ip_forward.orig" ]; then
  # Under the holds' lock: no part of the project takes forwarding
  # between the look at the holds and the write.
  mkdir -p -m 700 "$FORWARDING_DIR" && exec 8>>"$FORWARDING_DIR/lock" && flock 8
  orig=$(cat "$STATE/ip_forward.orig" 2>/dev/null || true)
  now=$(cat /proc/sys/net/ipv4/ip_forward 2>/dev/null || true)
  ours=$(tr ' ' '\n' <<<"$forwarding" | grep -E '^(egressproxy-nat-.*|egressproxy-test)$' || true)
  if [ "$orig" != 0 ] || [ "$now" != 1 ]; then
    rm -f "$STATE/ip_forward.orig"
  elif [ -n "$ours" ]; then
    log "net.ipv4.ip_forward left on: the project's network(s) $(echo "$ours" | tr '\n' ' ')still run"
  elif forwarding_held; then
    # The holds' record of the machine's value may be the 1 libvirt had
    # set by the time the first hold was taken: the value found here
    # before goes there (on, while a network of the machine's forwards),
    # for the last hold to put back.
    was=$orig
    [ -z "${forwarding// /}" ] || was=1
    printf '%s\n' "$was" >"$FORWARDING_DIR/before.tmp" && mv "$FORWARDING_DIR/before.tmp" "$FORWARDING_DIR/before"
    rm -f "$STATE/ip_forward.orig"
    log "net.ipv4.ip_forward left on: a running part of the project holds it ($FORWARDING_DIR); the last to let go puts back $was"
  elif grep -q '^net/ipv4/ip_forward ' /run/egressproxy-node.sysctls 2>/dev/null; then
    log "net.ipv4.ip_forward left on: the controlplane node needs it and puts it back itself"
  elif [ -n "${forwarding// /}" ]; then
    log "net.ipv4.ip_forward left on: this machine's libvirt network(s) ${forwarding% } need it"
    rm -f "$STATE/ip_forward.orig"
  else
    echo 0 >/proc/sys/net/ipv4/ip_forward && log "net.ipv4.ip_forward put back to 0"
    rm -f "$STATE/ip_forward.orig"
  fi
  exec 8>&-
fi
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
# /etc/ssh/sshd_not_to_be_run as an earlier version of libvirt-up.sh wrote
# it (its one line); one with anything else in it is the machine's.
if [ -f /etc/ssh/sshd_not_to_be_run ] &&
  [ "$(cat /etc/ssh/sshd_not_to_be_run 2>/dev/null)" = "created by provider-egressproxy's hack/libvirt-up.sh, which installed openssh-server" ]; then
  rm -f /etc/ssh/sshd_not_to_be_run
  log "removed /etc/ssh/sshd_not_to_be_run, which an earlier libvirt-up.sh wrote"
fi
