# shellcheck shell=bash
# Sourced by hack/libvirt-up.sh, hack/node-bins.sh, hack/install-squid.sh,
# hack/guest-image.sh, hack/squid-image.sh and hack/xpkg.sh
# (as root, strict mode on):
#
#   apt_no_start CMD [ARG...]
#
# runs CMD (a command or a function: apt-get update, apt-get install ...)
# with a policy-rc.d (exit 101) in place, so that the packages' maintainer
# scripts start no service, and returns CMD's status. CMD runs as the
# condition of an ||, so set -e is off inside it: chain its steps with &&.
#
# The policy-rc.d is the machine's, not the project's, unless it carries
# the marker line below:
#
# - One runs at a time, under a lock on $APT_LOCK (flock, machine-wide):
#   those scripts run at the same time (test packages run in parallel) and
#   never remove each other's policy-rc.d mid-install, nor snapshot each
#   other's packages as their own. A process killed with SIGKILL holds
#   the lock no longer.
# - The file it adds carries "# egressproxy policy-rc.d pid=PID start=T",
#   PID and start time (/proc/PID/stat) of the shell that added it. It is
#   removed after CMD and on any exit (a failure, Ctrl-C); one a killed
#   run left (its process is gone) is removed by the next call, under the
#   lock, before anything else.
# - A policy-rc.d without the marker is the machine's own: it stays as it
#   is, never written, never removed (it is used as it is).
#
# The paths can be moved, for a test of this file only.
APT_POLICY=${EGRESSPROXY_APT_POLICY:-/usr/sbin/policy-rc.d}
APT_LOCK=${EGRESSPROXY_APT_LOCK:-/run/egressproxy-apt.lock}
APT_POLICY_MARK='# egressproxy policy-rc.d'

_apt_log() {
  if declare -F log >/dev/null; then log "$*"; else echo "$*" >&2; fi
}

# _apt_proc_start PID: the start time of process PID (field 22 of
# /proc/PID/stat, after the parenthesised name, which may hold spaces).
_apt_proc_start() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  awk '{ print $20 }' <<<"$stat"
}

# _apt_policy_owner: the "pid=P start=T" of the marker of $APT_POLICY;
# fails when the file is missing or carries no marker (the machine's own).
_apt_policy_owner() {
  [ -f "$APT_POLICY" ] || return 1
  sed -n "s/^$APT_POLICY_MARK \\(pid=[0-9]* start=[0-9]*\\)\$/\\1/p" "$APT_POLICY" 2>/dev/null | grep -m1 .
}

# _apt_policy_stale removes a marked policy-rc.d whose process is gone (a
# run killed before its clean-up). Called under the lock.
_apt_policy_stale() {
  local owner pid start
  owner=$(_apt_policy_owner) || return 0
  pid=${owner#pid=}; pid=${pid%% *}
  start=${owner##*start=}
  if [ "$(_apt_proc_start "$pid")" = "$start" ]; then
    # Under the lock no live holder of ours can have a file there; a
    # live process of that PID and start time is one anyway: left alone.
    _apt_log "$APT_POLICY of running PID $pid (the project's marker) left as it is"
    return 0
  fi
  rm -f "$APT_POLICY"
  _apt_log "removed $APT_POLICY that a killed run (PID $pid) left"
}

APT_POLICY_ADDED=
# _apt_policy_remove removes the policy-rc.d this shell added, and only
# while it still carries this shell's own marker.
_apt_policy_remove() {
  [ -n "$APT_POLICY_ADDED" ] || return 0
  if [ "$(_apt_policy_owner)" = "$APT_POLICY_ADDED" ]; then
    rm -f "$APT_POLICY"
  fi
  APT_POLICY_ADDED=
}

# _apt_set_prev -- CMD EXIT: the arguments of trap -p's output.
_apt_set_prev() { _APT_PREV_EXIT=$2; }

apt_no_start() {
  local rc=0 prev_trap me tmp
  mkdir -p "$(dirname "$APT_LOCK")"
  # The lock is on fd 8 (the scripts keep 9 for locks of their own); CMD
  # runs without it, so that nothing CMD leaves running holds the lock.
  exec 8>>"$APT_LOCK"
  if ! flock -n 8; then
    _apt_log "waiting for another install of the project's scripts ($APT_LOCK)"
    flock -w 1800 8 || { _apt_log "$APT_LOCK held for 30 minutes"; exec 8>&-; return 1; }
  fi
  _apt_policy_stale
  # The caller's EXIT trap, if any, still runs on an exit inside CMD.
  prev_trap=$(trap -p EXIT)
  _APT_PREV_EXIT=
  if [ -n "$prev_trap" ]; then eval "_apt_set_prev ${prev_trap#trap }"; fi
  trap '_apt_policy_remove; eval "$_APT_PREV_EXIT"' EXIT
  if [ ! -e "$APT_POLICY" ]; then
    me="pid=$$ start=$(_apt_proc_start $$)"
    tmp="$APT_POLICY.egressproxy.$$"
    printf '#!/bin/sh\n%s %s\n# Added by provider-egressproxy'"'"'s hack/ scripts while they install packages;\n# removed after, or by their next run if that one was killed.\nexit 101\n' "$APT_POLICY_MARK" "$me" >"$tmp"
    chmod 0755 "$tmp"
    # ln fails if a policy-rc.d appeared meanwhile: that one is kept.
    if ln "$tmp" "$APT_POLICY" 2>/dev/null; then
      APT_POLICY_ADDED=$me
    fi
    rm -f "$tmp"
  fi
  "$@" 8>&- || rc=$?
  _apt_policy_remove
  if [ -n "$prev_trap" ]; then eval "$prev_trap"; else trap - EXIT; fi
  exec 8>&-
  return "$rc"
}
