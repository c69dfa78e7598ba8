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
# the test user, net.ipv4.ip_forward, which libvirt turns on for a NAT
# network: its value before is kept in $STATE/ip_forward.orig) are
# restored by libvirt-down.sh.
#
# The network and the pool are transient (virsh net-create, pool-create-as):
# nothing is written into /etc/libvirt, and they go with the libvirtd they
# run on. A libvirtd (or virtqemud) already running is used as it is;
# whether one runs is told by its process (pgrep), never by connecting,
# which on a host with systemd would start the machine's daemon through
# its socket unit. The script refuses to start libvirtd itself while
# /etc/libvirt holds autostart entries (domains, networks, pools): they are
# not the project's, and starting the daemon would start them too; and
# while systemd listens on libvirt's sockets for a daemon that does not
# run: the script's daemon would take the sockets over.
#
# Packages it installs are recorded in $DATA/installed-packages; the boot
# start their maintainer scripts enable (sysvinit links, systemd units) is
# disabled again on every run, for those packages only.
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
# shellcheck source=hack/lib-apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib-apt.sh"
exec 9>"$STATE/script.lock"
# Daemons started below must not inherit fd 9, or they would hold the lock.
flock -w 300 9 || die "$STATE/script.lock held for 5 minutes by another libvirt-up.sh or libvirt-down.sh"

# alive PIDFILE: the process the file names runs, and is the daemon the
# file is named for (a PID left by a crash may since be another's).
alive() {
  [ -s "$1" ] || return 1
  local pid; pid=$(cat "$1" 2>/dev/null) || return 1
  kill -0 "$pid" 2>/dev/null && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$(basename "$1" .pid)" ]
}

# --- packages ----------------------------------------------------------------
PKGS="libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients libvirt-daemon-system libvirt-daemon-system-sysv qemu-system-x86 qemu-utils ovmf dnsmasq-base iptables openssh-server"
# The packages this script newly installed (not those the machine had):
# kept in $DATA, which outlives a reboot, unlike $STATE.
INSTALLED=$DATA/installed-packages

installed_pkgs() {
  dpkg-query -W -f '${db:Status-Status} ${Package}\n' 2>/dev/null | awk '$1 == "installed" { print $2 }' | sort -u
}

# An install by an earlier version of this script, made before it kept
# $INSTALLED, is known by apt's own history: the entries whose command
# line is this script's, and the packages their Install line names (apt
# lists only the packages it newly installed there, not upgrades).
if [ ! -e "$INSTALLED" ]; then
  for f in /var/log/apt/history.log /var/log/apt/history.log.*.gz; do
    [ -e "$f" ] && zcat -f "$f"
  done 2>/dev/null | awk -v cmd="Commandline: apt-get install -y -qq --no-install-recommends $PKGS" '
    /^Start-Date:/ { ours = 0 }
    $0 == cmd { ours = 1 }
    ours && /^Install: / {
      sub(/^Install: /, "")
      n = split($0, entries, /\), /)
      for (i = 1; i <= n; i++) { split(entries[i], name, ":"); print name[1] }
    }' | sort -u >"$INSTALLED.new" || true
  mv "$INSTALLED.new" "$INSTALLED"
  if [ -s "$INSTALLED" ]; then
    log "recorded $(wc -l <"$INSTALLED") packages an earlier run of this script installed (apt's history)"
  fi
fi

need=
for b in /usr/sbin/libvirtd /usr/sbin/virtlogd /usr/bin/virsh /usr/bin/qemu-system-x86_64 /usr/bin/qemu-img /usr/sbin/dnsmasq /usr/sbin/sshd /usr/sbin/iptables; do
  [ -x "$b" ] || need=1
done
if [ -n "$need" ]; then
  log "installing $PKGS"
  # Package scripts start no daemon (this script starts its own): a
  # policy-rc.d (exit 101) is in place meanwhile (hack/lib-apt.sh: under a
  # machine-wide lock, marked as the project's, removed after or by the
  # next run if this one is killed; the machine's own is kept as it is).
  # The lock also keeps another of the project's installs out of the
  # before/after snapshots: what they differ by is this script's.
  t0=$SECONDS
  # The script runs as root (checked above), so no sudo: the environment
  # reaches apt and dpkg as it is.
  # shellcheck disable=SC2086 # $PKGS: words
  apt_libvirt() {
    installed_pkgs >"$STATE/packages.before" &&
      DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq >&2 &&
      DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends $PKGS >&2 &&
      installed_pkgs | comm -13 "$STATE/packages.before" - | cat - "$INSTALLED" | sort -u >"$INSTALLED.new"
  }
  apt_no_start apt_libvirt || die "apt-get install failed"
  # What was not installed before is this script's.
  mv "$INSTALLED.new" "$INSTALLED"
  rm -f "$STATE/packages.before"
  log "packages installed in $((SECONDS - t0)) s"
fi

# The maintainer scripts of the packages this script installed enabled
# their services for boot (policy-rc.d only keeps them from starting
# during the install): sshd on :22, libvirtd, virtlogd, libvirt-guests
# would run after a reboot. Their boot start is disabled, for those
# packages only; a service of a package the machine had is left alone.
disable_boot_start() {
  local pkg f name unit
  [ -s "$INSTALLED" ] || return 0
  while read -r pkg; do
    [ -n "$pkg" ] || continue
    grep -qx installed <<<"$(dpkg-query -W -f '${db:Status-Status}\n' "$pkg" 2>/dev/null)" || continue
    while read -r f; do
      case "$f" in
        /etc/init.d/*)
          name=${f#/etc/init.d/}
          if ls /etc/rc[2345].d/S[0-9][0-9]"$name" >/dev/null 2>&1; then
            update-rc.d "$name" disable >/dev/null 2>&1 && log "disabled the boot start of $name (sysvinit; package $pkg, installed by this script)"
          fi
          ;;
        /lib/systemd/system/*.service | /lib/systemd/system/*.socket | /usr/lib/systemd/system/*.service | /usr/lib/systemd/system/*.socket)
          unit=${f##*/}
          case "$unit" in *@*) continue ;; esac
          command -v systemctl >/dev/null || continue
          # is-enabled and disable work on the unit files without a
          # running systemd as well.
          if [ "$(systemctl is-enabled "$unit" 2>/dev/null)" = enabled ]; then
            systemctl disable --quiet --no-reload "$unit" >/dev/null 2>&1 && log "disabled the boot start of $unit (systemd; package $pkg, installed by this script)"
          fi
          ;;
      esac
    done < <(dpkg -L "$pkg" 2>/dev/null)
    # (No /etc/ssh/sshd_not_to_be_run: the boot start of ssh is disabled
    # above, and that file would outlive the project; libvirt-down.sh
    # removes one an earlier version of this script wrote.)
  done <"$INSTALLED"
  return 0
}
disable_boot_start

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
# A marker whose daemon is gone (killed, crashed, a reboot) is stale: the
# daemon that may answer now is someone else's, and libvirt-down.sh must
# not treat it as this script's.
if [ -f "$STATE/owns-virtlogd" ] && ! alive "$STATE/virtlogd.pid"; then
  rm -f "$STATE/owns-virtlogd"
fi
if [ -f "$STATE/owns-libvirtd" ] && ! alive "$STATE/libvirtd.pid"; then
  log "the libvirtd this script started earlier is gone; forgetting it"
  rm -f "$STATE/owns-libvirtd"
fi

# listening SOCKET: a process listens on the Unix socket SOCKET. Read from
# /proc/net/unix: no connection is made, which would start a daemon
# through a systemd socket unit.
listening() {
  awk -v p="$1" '
    function norm(x) { sub(/^\/var\/run\//, "/run/", x); return x }
    $4 == "00010000" && norm($NF) == norm(p) { found = 1 }
    END { exit !found }' /proc/net/unix 2>/dev/null
}
# activatable SOCKET DAEMON: someone (systemd's socket unit) listens on
# SOCKET while no DAEMON runs: a connection would start the machine's
# DAEMON, and a DAEMON of this script's would take the socket over.
activatable() { listening "$1" && ! pgrep -x "$2" >/dev/null; }

# Who serves qemu:///system, told by processes alone: this script's
# libvirtd, the machine's (libvirtd or the modular virtqemud), or none,
# and then this script starts its own. No virsh call before this.
if alive "$STATE/libvirtd.pid"; then
  libvirt=ours
elif pgrep -x libvirtd >/dev/null || pgrep -x virtqemud >/dev/null; then
  libvirt=machine
else
  libvirt=start
  # The system libvirtd reads this machine's /etc/libvirt and starts
  # every domain, network and pool marked autostart there: none of them
  # is the project's (its own are transient), so it is not started.
  autostart=$(find /etc/libvirt/qemu/autostart /etc/libvirt/qemu/networks/autostart /etc/libvirt/storage/autostart \
    -maxdepth 1 -name '*.xml' 2>/dev/null | sort | tr '\n' ' ' || true)
  if [ -n "$autostart" ]; then
    die "refusing to start the system libvirtd: it would also start what this machine's /etc/libvirt marks autostart ($autostart), which is not this project's. Start libvirtd yourself (the tests then use it) or remove those autostart entries."
  fi
  for sd in libvirt-sock:libvirtd virtqemud-sock:virtqemud virtlogd-sock:virtlogd; do
    if activatable "/run/libvirt/${sd%%:*}" "${sd#*:}"; then
      die "refusing to start libvirtd: /run/libvirt/${sd%%:*} is listened on (a systemd socket unit of this machine's ${sd#*:}) and no ${sd#*:} runs; connecting would start the machine's daemon, and one of this script's would take its socket. Start it yourself (systemctl start ${sd#*:}; the tests then use it) or stop that socket unit."
    fi
  done
fi

# net.ipv4.ip_forward before anything of this project's can change it,
# once nothing above refused to go on: libvirt turns it on when it starts
# a NAT network (the tests' egressproxy-nat-*, libvirt's first-start
# "default"), and never off.
# Kept once (a value kept by a killed run is the machine's, the one now
# may be libvirt's); libvirt-down.sh puts it back and removes the file.
if [ ! -e "$STATE/ip_forward.orig" ] && [ -r /proc/sys/net/ipv4/ip_forward ]; then
  cat /proc/sys/net/ipv4/ip_forward >"$STATE/ip_forward.orig.new"
  mv "$STATE/ip_forward.orig.new" "$STATE/ip_forward.orig"
fi

if ! alive "$STATE/virtlogd.pid"; then
  if pgrep -x virtlogd >/dev/null; then
    log "a virtlogd not started by this script is running; using it"
  elif activatable /run/libvirt/virtlogd-sock virtlogd; then
    # Only with the machine's libvirtd (refused above otherwise): its
    # virtlogd is its own business.
    log "virtlogd is socket-activated on this machine; not starting one"
  else
    virtlogd -d -p "$STATE/virtlogd.pid" 9>&-
    echo 1 >"$STATE/owns-virtlogd"
  fi
fi
case $libvirt in
  machine)
    virsh -c "$URI" version >/dev/null 2>&1 || die "a libvirtd or virtqemud not started by this script runs but does not answer on $URI"
    [ -S "$SOCK" ] || die "the libvirt daemon of this machine's that runs serves no $SOCK, which the provider reaches through sshd"
    log "a libvirtd not started by this script runs; using it"
    # Its LIBVIRT_* chains are its own, whoever added them first.
    rm -f "$STATE/owns-libvirt-chains"
    ;;
  start)
    t0=$SECONDS
    # libvirtd adds its LIBVIRT_* chains and the jumps to them from the
    # built-in chains; when none were there, libvirt-down.sh removes them.
    # (A marker kept from an earlier libvirtd of this script's, which died,
    # stays: the chains it finds are that one's.)
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
    ;;
esac

# --- network: isolated, DHCP, no forward, no DNS -------------------------------
# Transient (net-create): nothing goes into /etc/libvirt, and it is gone
# with the libvirtd it runs on. No other network is touched: a libvirtd
# this script starts has no autostart entries to start (checked above)
# but for libvirt's own first-start network, below.
# DNS is off: the guests need none (the image carries Squid and the guest
# agent, the seed is a NoCloud ISO, and every address they are asked to
# reach is an IP), and libvirt's dnsmasq would forward their lookups to
# this machine's resolvers.
# (grep -q on a pipe would SIGPIPE virsh and, with pipefail, lie.)
# A libvirtd this script started may still bring up the NAT network
# "default" on its first start (libvirt's own first-start setup, not an
# autostart entry): that instance, of a daemon of this script's, is
# stopped, and traffic stays on this machine. Its definition stays, and
# a libvirtd that was running already is not reconfigured at all.
if [ -f "$STATE/owns-libvirtd" ] && grep -q '^Active:.*yes' <<<"$(virsh -c "$URI" net-info default 2>/dev/null)"; then
  virsh -c "$URI" net-destroy default >/dev/null 2>&1 || true
  log "stopped network default, which the libvirtd this script started brought up"
fi
if grep -q '^Persistent:.*yes' <<<"$(virsh -c "$URI" net-info "$NET" 2>/dev/null)"; then
  # Defined into /etc/libvirt by an earlier version of this script: the
  # definition goes (a running network stays, transient).
  virsh -c "$URI" net-undefine "$NET" >/dev/null
  log "removed the persistent definition of network $NET (an earlier version of this script's)"
fi
if ! grep -q '^Active:.*yes' <<<"$(virsh -c "$URI" net-info "$NET" 2>/dev/null)"; then
  cat >"$STATE/net.xml" <<XML
<network>
  <name>$NET</name>
  <bridge name='$BRIDGE' stp='on' delay='0'/>
  <dns enable='no'/>
  <ip address='$NET_PREFIX.1' netmask='255.255.255.0'>
    <dhcp><range start='$NET_PREFIX.10' end='$NET_PREFIX.250'/></dhcp>
  </ip>
</network>
XML
  virsh -c "$URI" net-create "$STATE/net.xml" >/dev/null 9>&-
  echo 1 >"$STATE/owns-net"
fi

# --- storage pool ------------------------------------------------------------------
# Transient too (pool-create-as): the provider creates, uploads and
# deletes volumes in it, which a transient pool serves as well.
mkdir -p "$DATA/pool"
# The tests' own pools (on mounts of their own) go in $DATA/pools/NAME
# (POOLS_DIR below): libvirt-down.sh removes what a killed run left there.
mkdir -p "$DATA/pools"
if grep -q '^Persistent:.*yes' <<<"$(virsh -c "$URI" pool-info "$POOL" 2>/dev/null)"; then
  virsh -c "$URI" pool-undefine "$POOL" >/dev/null
  log "removed the persistent definition of pool $POOL (an earlier version of this script's)"
fi
if ! grep -q '^State:.*running' <<<"$(virsh -c "$URI" pool-info "$POOL" 2>/dev/null)"; then
  virsh -c "$URI" pool-create-as "$POOL" dir --target "$DATA/pool" >/dev/null
  echo 1 >"$STATE/owns-pool"
fi

# --- ssh: a user in the libvirt group, a private sshd on loopback ---------------------
# The user this script created is recorded in $DATA (it outlives a
# reboot, as the user does); $STATE/owns-user is an earlier version's.
if ! id "$SSH_USER" >/dev/null 2>&1; then
  rm -f "$DATA/owns-user" "$STATE/owns-user"
  useradd --system --create-home --home-dir "$DATA/home" --shell /bin/sh --groups libvirt "$SSH_USER"
  echo 1 >"$DATA/owns-user"
fi
if [ -f "$DATA/owns-user" ] || [ -f "$STATE/owns-user" ]; then
  # '*', not '!': with UsePAM no, sshd refuses a locked account.
  usermod -p '*' "$SSH_USER"
else
  # Someone else's user of that name is used as it is, never changed.
  id -nG "$SSH_USER" | tr ' ' '\n' | grep -qx libvirt ||
    die "user $SSH_USER exists, was not created by this script and is not in group libvirt; not changing it"
  case "$(getent shadow "$SSH_USER" | cut -d: -f2)" in
    '!'*) die "user $SSH_USER exists, was not created by this script and is locked (sshd refuses it); not changing it" ;;
  esac
fi
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
POOLS_DIR=$DATA/pools
NETWORK=$NET
BRIDGE=$BRIDGE
HOST_IP=$NET_PREFIX.1
OUT
