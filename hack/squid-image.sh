#!/usr/bin/env bash
# Builds the Squid image the real-node tests run, with no registry and no
# docker: a minimal Debian bookworm root filesystem with squid (mmdebstrap,
# as hack/guest-image.sh), made into an image by hack/squidimage
# (go-containerregistry) and written as a `docker save` tarball, which
# containerd imports (ctr -n k8s.io images import). Next to it, the same
# image with a squid that prints a message and exits 1, for the
# crash-loop test. Cached outside the repo, keyed by this script and
# hack/squidimage, so it is built once:
#
#   hack/squid-image.sh    prints two lines: the image tarball and its name
#                          (then the crashing one's tarball and name)
#
# Needs root (mmdebstrap in root mode) and Debian's apt mirror; installs
# mmdebstrap when missing.
set -euo pipefail

log() { echo "squid-image: $*" >&2; }
die() { log "$*"; exit 1; }
[ "$(id -u)" -eq 0 ] || die "must run as root"

SELF=$(readlink -f "${BASH_SOURCE[0]}")
ROOT=$(cd "$(dirname "$SELF")/.." && pwd)
KEY=$(cat "$SELF" "$ROOT"/hack/squidimage/*.go "$ROOT"/internal/devenv/ociimage/*.go 2>/dev/null | sha256sum | cut -c1-16)
CACHE=${EGRESSPROXY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/provider-egressproxy}
OUT="$CACHE/squid-image-$KEY.tar"
BAD="$CACHE/squid-image-crashing-$KEY.tar"
REF="localhost/egressproxy/squid:$KEY"
BADREF="localhost/egressproxy/squid-crashing:$KEY"
mkdir -p "$CACHE"
exec 9>"$CACHE/squid-image.lock"
flock -w 1800 9 || die "another build holds $CACHE/squid-image.lock"
print() { printf '%s\n%s\n%s\n%s\n' "$OUT" "$REF" "$BAD" "$BADREF"; }
if [ -s "$OUT" ] && [ -s "$BAD" ]; then
  touch "$OUT" "$BAD"
  log "cached: $OUT"
  print
  exit 0
fi
# Stdout carries only the result: the build's tools talk on stderr.
exec 3>&1 1>&2

if [ ! -e /usr/bin/mmdebstrap ]; then
  log "installing mmdebstrap"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends mmdebstrap >&2
fi

WORK=$(mktemp -d /var/tmp/egressproxy-squid.XXXXXX)
trap 'rm -rf "$WORK" "$OUT.tmp" "$BAD.tmp"' EXIT
t0=$SECONDS

# minbase + squid (no recommends), then everything a container never
# reads: documentation, manuals, locales, apt's lists and caches, logs.
# squid's own state folders stay (the pod mounts emptyDirs over them).
log "mmdebstrap (bookworm, minbase, squid)"
mmdebstrap --variant=minbase --mode=root --aptopt='APT::Install-Recommends "false"' \
  --include=squid \
  --customize-hook='rm -rf "$1"/usr/share/doc/* "$1"/usr/share/man/* "$1"/usr/share/info/* "$1"/usr/share/locale/* "$1"/usr/share/lintian "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*.log "$1"/var/log/apt/*' \
  --customize-hook=': > "$1/etc/machine-id"' \
  bookworm "$WORK/root" http://deb.debian.org/debian >&2
# The runtime mounts its own /dev: no device nodes in a layer.
rm -rf "$WORK/root/dev"/*
log "rootfs in $((SECONDS - t0)) s ($(du -sh "$WORK/root" | cut -f1))"

(cd "$ROOT" && GOWORK=off go run ./hack/squidimage -rootfs "$WORK/root" \
  -out "$OUT.tmp" -ref "$REF" -crashing-out "$BAD.tmp" -crashing-ref "$BADREF") >&2
mv "$BAD.tmp" "$BAD"
mv "$OUT.tmp" "$OUT"
# Builds of other keys unused for a week go (other checkouts may still
# use a recent one).
find "$CACHE" -maxdepth 1 -name 'squid-image-*.tar' -mtime +7 -delete
log "built $OUT in $((SECONDS - t0)) s ($(du -h "$OUT" | cut -f1))"
print >&3
