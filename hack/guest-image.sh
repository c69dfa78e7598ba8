#!/usr/bin/env bash
# Builds the small Debian guest image the kvm end-to-end test boots:
# bookworm (minbase) with the cloud kernel, systemd, cloud-init,
# qemu-guest-agent and squid already installed (the test's guest has no
# network beyond the host, so nothing can be installed at boot), BIOS GRUB,
# NoCloud as the only datasource. The result is cached outside the repo,
# keyed by this script's content, so it is built once (and the image of
# the script's previous content removed):
#
#   hack/guest-image.sh    prints the path of the qcow2 image
#
# Needs root (mmdebstrap in root mode) and Debian's apt mirror; installs
# mmdebstrap, qemu-utils, fdisk and the GRUB binaries when missing.
set -euo pipefail

log() { echo "guest-image: $*" >&2; }
die() { log "$*"; exit 1; }
[ "$(id -u)" -eq 0 ] || die "must run as root"

SELF=$(readlink -f "${BASH_SOURCE[0]}")
KEY=$(sha256sum "$SELF" | cut -c1-16)
CACHE=${EGRESSPROXY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/provider-egressproxy}
OUT="$CACHE/guest-bookworm-$KEY.qcow2"
mkdir -p "$CACHE"
exec 9>"$CACHE/guest-image.lock"
flock -w 1800 9 || die "another build holds $CACHE/guest-image.lock"
if [ -s "$OUT" ]; then
  log "cached: $OUT"
  echo "$OUT"
  exit 0
fi
# Stdout carries only the image's path: the build's tools (mkfs, sfdisk,
# mmdebstrap) talk on stderr.
exec 3>&1 1>&2

need=
for b in /usr/bin/mmdebstrap /usr/bin/qemu-img /usr/sbin/sfdisk /usr/bin/grub-mkimage /usr/lib/grub/i386-pc/boot.img /usr/sbin/mkfs.ext4; do
  [ -e "$b" ] || need=1
done
if [ -n "$need" ]; then
  log "installing the image tools"
  # Under the project's apt lock and waiting for dpkg's: on a fresh
  # machine the other test packages install theirs at the same time.
  # shellcheck source=hack/lib-apt.sh
  source "$(dirname "$SELF")/lib-apt.sh"
  apt_image_tools() {
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq >&2 &&
      DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends mmdebstrap qemu-utils fdisk grub-pc-bin grub-common e2fsprogs >&2
  }
  apt_no_start apt_image_tools || die "apt-get failed"
fi

WORK=$(mktemp -d /var/tmp/egressproxy-guest.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
t0=$SECONDS

# The guest: no root password, no SSH; cloud-init configures it from the
# seed, the guest agent reports its address, squid is set up by the
# provider's user-data.
cat >"$WORK/99-egressproxy.cfg" <<'CFG'
datasource_list: [NoCloud, ConfigDrive]
locale: C.UTF-8
CFG

log "mmdebstrap (bookworm, minbase)"
mmdebstrap --variant=minbase --mode=root \
  --include=linux-image-cloud-amd64,systemd,systemd-sysv,udev,dbus,ifupdown,isc-dhcp-client,iproute2,qemu-guest-agent,squid,cloud-init,cloud-guest-utils,e2fsprogs \
  --customize-hook="copy-in $WORK/99-egressproxy.cfg /etc/cloud/cloud.cfg.d/" \
  --customize-hook='echo "/dev/vda1 / ext4 errors=remount-ro 0 1" > "$1/etc/fstab"' \
  --customize-hook='echo localhost > "$1/etc/hostname"' \
  --customize-hook=': > "$1/etc/machine-id"; rm -f "$1/var/lib/dbus/machine-id"' \
  --customize-hook='chroot "$1" systemctl enable squid qemu-guest-agent cloud-init cloud-config cloud-final >/dev/null 2>&1 || true' \
  --customize-hook='rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*' \
  bookworm "$WORK/root" http://deb.debian.org/debian >&2
log "rootfs in $((SECONDS - t0)) s ($(du -sh "$WORK/root" | cut -f1))"

KERNEL=$(cd "$WORK/root" && ls boot/vmlinuz-* | head -n1)
INITRD=$(cd "$WORK/root" && ls boot/initrd.img-* | head -n1)
mkdir -p "$WORK/root/boot/grub"
cat >"$WORK/root/boot/grub/grub.cfg" <<CFG
set timeout=0
menuentry debian {
  linux /$KERNEL root=/dev/vda1 ro console=ttyS0 net.ifnames=0
  initrd /$INITRD
}
CFG

# A disk without loop devices: the root filesystem is made from the
# directory (mkfs.ext4 -d) and written at 1 MiB; GRUB's boot.img goes into
# the MBR and a core.img right after it.
ROOT_MIB=2048
mkfs.ext4 -q -F -L root -d "$WORK/root" "$WORK/root.ext4" "${ROOT_MIB}M"
truncate -s $((ROOT_MIB + 1))M "$WORK/disk.raw"
echo 'start=2048, type=83, bootable' | sfdisk -q "$WORK/disk.raw"
dd if="$WORK/root.ext4" of="$WORK/disk.raw" bs=1M seek=1 conv=notrunc,sparse status=none
grub-mkimage -O i386-pc -o "$WORK/core.img" -p '(hd0,msdos1)/boot/grub' \
  biosdisk part_msdos ext2 normal linux configfile search echo
dd if=/usr/lib/grub/i386-pc/boot.img of="$WORK/disk.raw" bs=446 count=1 conv=notrunc status=none
dd if="$WORK/core.img" of="$WORK/disk.raw" bs=512 seek=1 conv=notrunc status=none
qemu-img convert -f raw -O qcow2 "$WORK/disk.raw" "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
log "built $OUT in $((SECONDS - t0)) s ($(du -h "$OUT" | cut -f1))"
# An image of another version of this script is half a gigabyte no one
# needs any more (a test that has it open keeps reading it).
for old in "$CACHE"/guest-bookworm-*.qcow2; do
  [ "$old" = "$OUT" ] || [ ! -e "$old" ] || { rm -f "$old"; log "removed $old (another version of this script)"; }
done
echo "$OUT" >&3
