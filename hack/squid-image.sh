#!/usr/bin/env bash
# Builds the Squid image PodProxy runs by default, with no registry and no
# docker: a minimal Debian bookworm root filesystem with squid (mmdebstrap,
# as hack/guest-image.sh), made into an image by hack/squidimage
# (go-containerregistry), for linux/amd64. Written three ways, cached
# outside the repo, keyed by this script, hack/squidimage (its code and
# packages.lock) and internal/devenv/ociimage, so it is built once:
#
#   - a `docker save` tarball, which the real node's containerd imports
#     (ctr -n k8s.io images import), named localhost/egressproxy/squid:KEY;
#     next to it, the same image with a squid that prints a message and
#     exits 1, for the crash-loop test;
#   - an OCI image layout holding the image as a one-platform index, which
#     make xpkg-push and make release push next to the packages
#     (hack/squidimage -push), and whose digest the provider's build
#     makes its default image (hack/xpkg.sh).
#
#   hack/squid-image.sh          prints four lines: the tarball and its
#                                name, the crashing one's tarball and name
#   hack/squid-image.sh oci      prints two lines: the OCI layout folder and
#                                the index digest (sha256:...)
#   hack/squid-image.sh lock     builds anew and writes what it installed
#                                into hack/squidimage/packages.lock
#   hack/squid-image.sh twice    builds twice, anew, and prints both
#                                digests: the same when reproducible
#
# Reproducible: SOURCE_DATE_EPOCH (from packages.lock) makes mmdebstrap's
# output the same for the same package versions, and the layer has its
# entries sorted and timestamped at the epoch (internal/devenv/ociimage).
# Debian's mirror serves only the current versions of bookworm's packages,
# so a build gives packages.lock's digest only while the mirror still
# serves the versions it records: the build compares what it installed with
# the lock and warns when they differ, and fails instead when
# SQUID_IMAGE_STRICT=1 (make release), so that a released image's content
# is in the repository. `hack/squid-image.sh lock` takes the mirror's
# current versions.
#
# Needs root (mmdebstrap in root mode) and Debian's apt mirror; installs
# mmdebstrap when missing. arm64 is not built: mmdebstrap runs the
# packages' maintainer scripts, which for another architecture needs
# qemu-user through binfmt_misc.
set -euo pipefail

log() { echo "squid-image: $*" >&2; }
die() { log "$*"; exit 1; }
[ "$(id -u)" -eq 0 ] || die "must run as root"

MODE=${1:-}
case $MODE in ''|oci|lock|twice) ;; *) die "usage: $0 [oci|lock|twice]" ;; esac
SELF=$(readlink -f "${BASH_SOURCE[0]}")
ROOT=$(cd "$(dirname "$SELF")/.." && pwd)
LOCK="$ROOT/hack/squidimage/packages.lock"
SOURCE_DATE_EPOCH=$(sed -n 's/^# source-date-epoch: *//p' "$LOCK")
[[ $SOURCE_DATE_EPOCH =~ ^[0-9]+$ ]] || die "$LOCK: no '# source-date-epoch: SECONDS' line"
export SOURCE_DATE_EPOCH
KEY=$(cat "$SELF" "$LOCK" "$ROOT"/hack/squidimage/*.go "$ROOT"/internal/devenv/ociimage/*.go 2>/dev/null | sha256sum | cut -c1-16)
CACHE=${EGRESSPROXY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/provider-egressproxy}
OUT="$CACHE/squid-image-$KEY.tar"
BAD="$CACHE/squid-image-crashing-$KEY.tar"
OCI="$CACHE/squid-image-$KEY.oci"
REF="localhost/egressproxy/squid:$KEY"
BADREF="localhost/egressproxy/squid-crashing:$KEY"
mkdir -p "$CACHE"
exec 9>"$CACHE/squid-image.lock"
flock -w 1800 9 || die "another build holds $CACHE/squid-image.lock"
print() {
  if [ "$MODE" = oci ]; then
    printf '%s\n%s\n' "$OCI" "$(cat "$OCI.digest")"
  else
    printf '%s\n%s\n%s\n%s\n' "$OUT" "$REF" "$BAD" "$BADREF"
  fi
}
if [ -z "$MODE" ] || [ "$MODE" = oci ]; then
  if [ -s "$OUT" ] && [ -s "$BAD" ] && [ -s "$OCI.digest" ] && [ -d "$OCI" ]; then
    # Not the layout folder itself: a caller may be reading it outside the
    # lock (make xpkg tars it), and tar fails on a folder that changes.
    touch "$OUT" "$BAD" "$OCI.digest"
    log "cached: $OUT"
    if [ "${SQUID_IMAGE_STRICT:-}" = 1 ] && ! cmp -s "$LOCK" "$OCI.packages"; then
      die "the cached image's packages differ from $LOCK (SQUID_IMAGE_STRICT=1): run hack/squid-image.sh lock and commit it"
    fi
    print
    exit 0
  fi
fi
# Stdout carries only the result: the build's tools talk on stderr.
exec 3>&1 1>&2

if [ ! -e /usr/bin/mmdebstrap ]; then
  log "installing mmdebstrap"
  # Under the project's apt lock, as the other install scripts.
  # shellcheck source=hack/lib-apt.sh
  source "$ROOT/hack/lib-apt.sh"
  apt_mmdebstrap() {
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq >&2 &&
      DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends mmdebstrap >&2
  }
  apt_no_start apt_mmdebstrap || die "apt-get failed"
fi

WORK=$(mktemp -d /var/tmp/egressproxy-squid.XXXXXX)
trap 'rm -rf "$WORK" "$OUT.tmp" "$BAD.tmp" "$OCI.tmp" "$OCI.tmp.digest" "$OCI.digest.tmp"' EXIT
t0=$SECONDS

# rootfs DIR: minbase + squid (no recommends), then everything a container
# never reads: documentation, manuals, locales, apt's lists and caches,
# logs, and what mmdebstrap copies from the host (resolv.conf, hostname;
# the runtime mounts its own). squid's own state folders stay (the pod
# mounts emptyDirs over them).
rootfs() {
  local t=$SECONDS
  log "mmdebstrap (bookworm, minbase, squid; SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH)"
  mmdebstrap --variant=minbase --mode=root --aptopt='APT::Install-Recommends "false"' \
    --include=squid \
    --customize-hook='rm -rf "$1"/usr/share/doc/* "$1"/usr/share/man/* "$1"/usr/share/info/* "$1"/usr/share/locale/* "$1"/usr/share/lintian "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*.log "$1"/var/log/apt/* "$1"/var/cache/ldconfig/aux-cache' \
    --customize-hook=': > "$1/etc/machine-id"; rm -f "$1/etc/resolv.conf" "$1/etc/hostname"' \
    bookworm "$1" http://deb.debian.org/debian >&2
  # The runtime mounts its own /dev: no device nodes in a layer.
  rm -rf "$1/dev"/*
  log "rootfs in $((SECONDS - t)) s ($(du -sh "$1" | cut -f1))"
}

# packages DIR: what the root filesystem at DIR holds, as packages.lock
# records it.
packages() {
  printf '# The Debian packages in the Squid image (hack/squid-image.sh lock),\n'
  printf '# and the SOURCE_DATE_EPOCH its build runs with.\n'
  printf '# source-date-epoch: %s\n' "$SOURCE_DATE_EPOCH"
  dpkg-query --admindir="$1/var/lib/dpkg" -W -f '${Package} ${Version} ${Architecture}\n' | LC_ALL=C sort
}

# image DIR OUT...: hack/squidimage on the root filesystem at DIR.
image() {
  local dir=$1; shift
  (cd "$ROOT" && GOWORK=off go run ./hack/squidimage -rootfs "$dir" "$@") >&2
}

case $MODE in
  twice)
    for i in 1 2; do
      rootfs "$WORK/root$i"
      image "$WORK/root$i" -oci-out "$WORK/oci$i" -ref "$REF"
      packages "$WORK/root$i" >"$WORK/packages$i"
    done
    cmp -s "$WORK/packages1" "$WORK/packages2" || log "the mirror changed between the builds: $(diff "$WORK/packages1" "$WORK/packages2" | tr '\n' ' ')"
    printf 'build 1: %s\nbuild 2: %s\n' "$(cat "$WORK/oci1.digest")" "$(cat "$WORK/oci2.digest")" >&3
    [ "$(cat "$WORK/oci1.digest")" = "$(cat "$WORK/oci2.digest")" ] || die "the two builds differ"
    exit 0
    ;;
esac

rootfs "$WORK/root"
packages "$WORK/root" >"$WORK/packages"
if [ "$MODE" = lock ]; then
  cp "$WORK/packages" "$LOCK"
  log "wrote $LOCK ($(grep -vc '^#' "$LOCK") packages)"
  # The lock is part of the key: the next build is another key's.
  exit 0
fi
if ! cmp -s "$LOCK" "$WORK/packages"; then
  log "the mirror's packages differ from $LOCK, so this image's digest is not the lock's:"
  diff "$LOCK" "$WORK/packages" | grep '^[<>]' | sed 's/^/squid-image:   /' >&2 || true
  [ "${SQUID_IMAGE_STRICT:-}" != 1 ] || die "SQUID_IMAGE_STRICT=1: run hack/squid-image.sh lock and commit it"
fi

rm -rf "$OCI" "$OCI.tmp"
image "$WORK/root" -out "$OUT.tmp" -ref "$REF" -crashing-out "$BAD.tmp" -crashing-ref "$BADREF" -oci-out "$OCI.tmp"
cp "$WORK/packages" "$OCI.packages"
mv "$OCI.tmp.digest" "$OCI.digest.tmp"
mv "$OCI.tmp" "$OCI"
mv "$OCI.digest.tmp" "$OCI.digest"
mv "$BAD.tmp" "$BAD"
mv "$OUT.tmp" "$OUT"
# Builds of other keys unused for a week go (other checkouts may still
# use a recent one).
find "$CACHE" -maxdepth 1 -type f -name 'squid-image-*' -mtime +7 -delete
# A layout folder goes with its digest file, which is kept fresh instead.
for d in "$CACHE"/squid-image-*.oci; do
  if [ -d "$d" ] && [ ! -e "$d.digest" ]; then rm -rf "$d"; fi
done
log "built $OUT in $((SECONDS - t0)) s ($(du -h "$OUT" | cut -f1)), digest $(cat "$OCI.digest")"
print >&3
