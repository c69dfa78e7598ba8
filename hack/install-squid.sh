#!/usr/bin/env bash
# Installs Debian's squid package, which the real-Squid tests of
# internal/squid run (go test ./internal/squid/...), and curl, the client
# the connection-Secret tests run with the Secret as its environment
# (testenv.FetchWithEnv), and iproute2, whose ip the tests use for test
# hosts in network namespaces of their own (testenv.NewTestHost).
# Idempotent: it does nothing when /usr/sbin/squid, curl and ip exist.
#
# The tests start their own squids in the foreground with generated
# configs, ports and PID files, and need nothing from a system squid:
# while installing, a policy-rc.d (exit 101) keeps the package's postinst
# from starting one (hack/lib-apt.sh: added under a machine-wide lock,
# marked as the project's, removed after; one the machine had is used as
# it is and never removed). A squid the machine already had, running or
# not, is left as it is.
set -euo pipefail

log() { echo "install-squid: $*" >&2; }

if [ -x /usr/sbin/squid ] && command -v curl >/dev/null && command -v ip >/dev/null; then
  log "/usr/sbin/squid present: $(/usr/sbin/squid -v | head -n1)"
  exit 0
fi

# apt, the policy-rc.d and its lock need root: the rest runs through sudo.
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { log "need root or sudo to run apt-get"; exit 1; }
  exec sudo bash "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")" "$@"
fi

# shellcheck source=hack/lib-apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib-apt.sh"

# A squid this script installs is not started at boot either: the
# package's postinst enables it (policy-rc.d only keeps it from starting
# now), and a reboot would then run a system squid on :3128 on every
# address. One the machine had before is left as it was.
HAD_SQUID=
[ -x /usr/sbin/squid ] && HAD_SQUID=1

log "installing Debian's squid package"
apt_install_squid() {
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends squid curl iproute2 >/dev/null
}
apt_no_start apt_install_squid || { log "apt-get failed"; exit 1; }

if [ -z "$HAD_SQUID" ]; then
  [ -e /etc/init.d/squid ] && { update-rc.d squid disable >/dev/null 2>&1 || true; }
  command -v deb-systemd-helper >/dev/null && { DPKG_MAINTSCRIPT_PACKAGE=squid deb-systemd-helper disable squid.service >/dev/null 2>&1 || true; }
  log "squid's boot start disabled (the tests run their own)"
fi

log "installed: $(/usr/sbin/squid -v | head -n1)"
