#!/usr/bin/env bash
# Brings up a real libvirt host on this machine for the kvm backend's
# integration and end-to-end tests: Debian's libvirtd (qemu:///system, TCG
# guests), an isolated network with DHCP and no forward (guests reach the
# host and nothing else), a directory storage pool, and a private sshd on
# 127.0.0.1 through which the provider reaches libvirtd's socket, as it
# does a real host.
#
#   hack/libvirt-up.sh [CALLER_PID]
#
# Idempotent and shared: every caller registers its PID; hack/libvirt-down.sh
# unregisters it and stops what this script started (by PID files) once no
# registered caller is alive. Host settings it changes (the /dev/kvm mode,
# the test user) are restored by libvirt-down.sh.
#
# Prints KEY=VALUE lines on stdout for the tests; logs go to stderr.
set -euo pipefail

CALLER=${1:-$PPID}
STATE=${EGRESSPROXY_LIBVIRT_STATE:-/run/egressproxy-libvirt}
DATA=${EGRESSPROXY_LIBVIRT_DATA:-/var/lib/egressproxy-libvirt}
SSH_PORT=${EGRESSPROXY_LIBVIRT_SSH_PORT:-22022}
SSH_USER=egressproxy
NET=egressproxy-test
BRIDGE=virbr-egp
NET_PREFIX=192.168.213
POOL=egressproxy
SOCK=/var/run/libvirt/libvirt-sock
URI=qemu:///system

log() { echo "libvirt-up: $*" >&2; }
die() { log "$*"; exit 1; }
[ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages and starts libvirtd)"

mkdir -p "$STATE" "$DATA"
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

# --- packages ----------------------------------------------------------------
PKGS="libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients libvirt-daemon-system libvirt-daemon-system-sysv qemu-system-x86 qemu-utils ovmf dnsmasq-base iptables openssh-server"
need=
for b in /usr/sbin/libvirtd /usr/sbin/virtlogd /usr/bin/virsh /usr/bin/qemu-system-x86_64 /usr/bin/qemu-img /usr/sbin/dnsmasq /usr/sbin/sshd /usr/sbin/iptables; do
  [ -x "$b" ] || need=1
done
if [ -n "$need" ]; then
  log "installing $PKGS"
  export DEBIAN_FRONTEND=noninteractive
  # Keep package scripts from starting daemons: this script starts its own.
  # Only a policy-rc.d this script added goes, on any exit (a failure,
  # Ctrl-C): left behind, it would keep dpkg from starting any service.
  POLICY=/usr/sbin/policy-rc.d
  ADDED_POLICY=
  cleanup_policy() { if [ -n "$ADDED_POLICY" ]; then rm -f "$POLICY"; ADDED_POLICY=; fi; }
  trap cleanup_policy EXIT
  if [ ! -e "$POLICY" ]; then
    ADDED_POLICY=1
    printf '#!/bin/sh\nexit 101\n' >"$POLICY"
    chmod 0755 "$POLICY"
  fi
  t0=$SECONDS
  apt-get update -qq >&2
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $PKGS >&2 || die "apt-get install failed"
  cleanup_policy
  log "packages installed in $((SECONDS - t0)) s"
fi

# --- /dev/kvm ------------------------------------------------------------------
# Without udev /dev/kvm is root:root 0600 and libvirt re-probes QEMU on many
# calls (seconds each). Guests still run as TCG (type='qemu'): this machine
# has no usable hardware virtualisation.
if [ -e /dev/kvm ] && [ ! -e "$STATE/devkvm.orig" ]; then
  stat -c '%u:%g %a' /dev/kvm >"$STATE/devkvm.orig"
  chown root:kvm /dev/kvm
  chmod 0660 /dev/kvm
fi

# --- daemons -------------------------------------------------------------------
cat >"$STATE/libvirtd.conf" <<CONF
unix_sock_group = "libvirt"
unix_sock_ro_perms = "0777"
unix_sock_rw_perms = "0770"
auth_unix_ro = "none"
auth_unix_rw = "none"
CONF
mkdir -p /var/run/libvirt
if ! alive "$STATE/virtlogd.pid"; then
  if pgrep -x virtlogd >/dev/null; then
    log "a virtlogd not started by this script is running; using it"
  else
    virtlogd -d -p "$STATE/virtlogd.pid" 9>&-
    echo 1 >"$STATE/owns-virtlogd"
  fi
fi
if ! alive "$STATE/libvirtd.pid"; then
  if [ -S "$SOCK" ] && virsh -c "$URI" version >/dev/null 2>&1; then
    log "a libvirtd not started by this script answers on $SOCK; using it"
  else
    t0=$SECONDS
    # libvirtd adds its LIBVIRT_* chains and the jumps to them from the
    # built-in chains; when none were there, libvirt-down.sh removes them.
    if ! { iptables-save; ip6tables-save; } 2>/dev/null | grep -q '^:LIBVIRT_'; then
      echo 1 >"$STATE/owns-libvirt-chains"
    fi
    libvirtd -d -f "$STATE/libvirtd.conf" -p "$STATE/libvirtd.pid" 9>&-
    echo 1 >"$STATE/owns-libvirtd"
    for _ in $(seq 1 120); do
      virsh -c "$URI" version >/dev/null 2>&1 && break
      sleep 0.5
    done
    virsh -c "$URI" version >/dev/null 2>&1 || die "libvirtd did not answer on $SOCK"
    log "libvirtd up in $((SECONDS - t0)) s"
  fi
fi

# --- network: isolated, DHCP, no forward ------------------------------------------
# A libvirtd this script started (none was running) brings up the NAT
# network "default" it defines on a first start: traffic must stay on this
# machine, so that instance of it is stopped. Its definition and autostart
# setting are the machine's and stay as they are, and a libvirtd that was
# running already is not reconfigured at all.
if [ -f "$STATE/owns-libvirtd" ] && grep -q '^Active:.*yes' <<<"$(virsh -c "$URI" net-info default 2>/dev/null)"; then
  virsh -c "$URI" net-destroy default >/dev/null 2>&1 || true
fi
if ! virsh -c "$URI" net-info "$NET" >/dev/null 2>&1; then
  cat >"$STATE/net.xml" <<XML
<network>
  <name>$NET</name>
  <bridge name='$BRIDGE' stp='on' delay='0'/>
  <ip address='$NET_PREFIX.1' netmask='255.255.255.0'>
    <dhcp><range start='$NET_PREFIX.10' end='$NET_PREFIX.250'/></dhcp>
  </ip>
</network>
XML
  virsh -c "$URI" net-define "$STATE/net.xml" >/dev/null
fi
# (grep -q on a pipe would SIGPIPE virsh and, with pipefail, lie.)
if ! grep -q '^Active:.*yes' <<<"$(virsh -c "$URI" net-info "$NET")"; then
  virsh -c "$URI" net-start "$NET" >/dev/null 9>&-
fi

# --- storage pool ------------------------------------------------------------------
mkdir -p "$DATA/pool"
if ! virsh -c "$URI" pool-info "$POOL" >/dev/null 2>&1; then
  virsh -c "$URI" pool-define-as "$POOL" dir --target "$DATA/pool" >/dev/null
fi
if ! grep -q '^State:.*running' <<<"$(virsh -c "$URI" pool-info "$POOL")"; then
  virsh -c "$URI" pool-start "$POOL" >/dev/null
fi

# --- ssh: a user in the libvirt group, a private sshd on loopback ---------------------
if ! id "$SSH_USER" >/dev/null 2>&1; then
  useradd --system --create-home --home-dir "$DATA/home" --shell /bin/sh --groups libvirt "$SSH_USER"
  echo 1 >"$STATE/owns-user"
fi
# '*', not '!': with UsePAM no, sshd refuses a locked account.
usermod -p '*' "$SSH_USER"
[ -s "$STATE/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$STATE/ssh_host_ed25519_key"
[ -s "$STATE/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C egressproxy-test -f "$STATE/id_ed25519"
cp "$STATE/id_ed25519.pub" "$STATE/authorized_keys"
chmod 0644 "$STATE/authorized_keys"
echo "[127.0.0.1]:$SSH_PORT $(cut -d' ' -f1-2 "$STATE/ssh_host_ed25519_key.pub")" >"$STATE/known_hosts"
cat >"$STATE/sshd_config" <<CONF
Port $SSH_PORT
ListenAddress 127.0.0.1
HostKey $STATE/ssh_host_ed25519_key
PidFile $STATE/sshd.pid
AuthorizedKeysFile $STATE/authorized_keys
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin no
AllowUsers $SSH_USER
# The provider needs direct-streamlocal to libvirtd's socket; sshd grants
# it only with local forwarding on (PermitOpen would deny socket paths
# too). sshd listens on loopback only and the key is this script's.
AllowTcpForwarding local
AllowStreamLocalForwarding local
X11Forwarding no
CONF
mkdir -p /run/sshd
if alive "$STATE/sshd.pid" && ! cmp -s "$STATE/sshd_config" "$STATE/sshd_config.running"; then
  kill "$(cat "$STATE/sshd.pid")"; sleep 0.5
fi
cp "$STATE/sshd_config" "$STATE/sshd_config.running"
if ! alive "$STATE/sshd.pid"; then
  /usr/sbin/sshd -f "$STATE/sshd_config" -E "$STATE/sshd.log" 9>&-
  for _ in $(seq 1 50); do alive "$STATE/sshd.pid" && break; sleep 0.1; done
  alive "$STATE/sshd.pid" || die "sshd did not start: $(tail -5 "$STATE/sshd.log" 2>/dev/null)"
fi

# --- register the caller --------------------------------------------------------------
echo "$CALLER" >>"$STATE/users"

cat <<OUT
SSH_ADDRESS=127.0.0.1:$SSH_PORT
SSH_USER=$SSH_USER
SSH_KEY=$STATE/id_ed25519
SSH_KNOWN_HOSTS=$STATE/known_hosts
SOCKET=$SOCK
POOL=$POOL
POOL_DIR=$DATA/pool
NETWORK=$NET
BRIDGE=$BRIDGE
HOST_IP=$NET_PREFIX.1
OUT
