#!/bin/bash
# Installs what the Soft-RoCE interop suite needs on Debian 12 and builds the peer VM:
# Debian's own kernel (its rdma_rxe module) and a small initramfs holding rdma-core,
# perftest and busybox taken from this machine's packages, with tests/interop/guest-init as
# PID 1. Everything goes to $FERROCE_INTEROP_STATE (default /var/tmp/ferroce-interop).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
STATE=${FERROCE_INTEROP_STATE:-/var/tmp/ferroce-interop}
mkdir -p "$STATE/debs"

pkgs=(qemu-system-x86 busybox-static perftest ibverbs-utils ibverbs-providers rdmacm-utils
      rdma-core kmod cpio gzip iproute2 tcpdump)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The guest kernel: the package linux-image-amd64 points at.
kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
[ -n "$kpkg" ] || { echo "setup: cannot tell which kernel linux-image-amd64 is" >&2; exit 1; }
if ! ls "$STATE/debs/${kpkg}"_*.deb >/dev/null 2>&1; then
  # (apt warns that it downloads unsandboxed into a root-owned folder; that is expected)
  (cd "$STATE/debs" && apt-get download -qq "$kpkg" 2>&1 | grep -v unsandboxed || true)
fi
deb=$(ls "$STATE/debs/${kpkg}"_*.deb | head -1)
if [ ! -f "$STATE/kernel.stamp" ] || [ "$(cat "$STATE/kernel.stamp")" != "$deb" ]; then
  rm -rf "$STATE/kernel"; mkdir -p "$STATE/kernel"
  dpkg-deb -x "$deb" "$STATE/kernel"
  echo "$deb" > "$STATE/kernel.stamp"
fi
kver=$(ls "$STATE/kernel/lib/modules" | head -1)
depmod -b "$STATE/kernel" "$kver"

# The initramfs.
root=$STATE/rootfs
rm -rf "$root"
mkdir -p "$root"/{usr/bin,usr/lib/x86_64-linux-gnu,usr/lib64,etc,proc,sys,dev,tmp,run,root}
ln -s usr/bin "$root/bin"; ln -s usr/bin "$root/sbin"; ln -s usr/lib "$root/lib"; ln -s usr/lib64 "$root/lib64"
ln -s bin "$root/usr/sbin"

# A program and the shared libraries ldd says it loads, at their /usr paths.
add() {
  local src=$1 dst=$root/usr/bin/$(basename "$1")
  [ "${2:-}" ] && dst=$root$2
  install -D -m 0755 "$(readlink -f "$src")" "$dst"
  ldd "$src" 2>/dev/null | grep -o '/[^ ]*' | while read -r lib; do
    local at=$lib
    case $at in /usr/*) ;; *) at=/usr$at ;; esac
    [ -e "$root$at" ] || install -D -m 0755 "$(readlink -f "$lib")" "$root$at"
  done
}
for p in /bin/dash /sbin/ip /sbin/tc /usr/bin/rdma /bin/kmod \
         /usr/bin/ibv_devinfo /usr/bin/ibv_rc_pingpong /usr/bin/ibv_ud_pingpong \
         /usr/bin/ib_write_bw /usr/bin/ib_read_bw /usr/bin/ib_send_bw /usr/bin/ib_atomic_bw \
         /usr/bin/ib_write_lat /usr/bin/ib_read_lat /usr/bin/ib_send_lat /usr/bin/ib_atomic_lat \
         /usr/bin/rping /usr/bin/ucmatose /usr/bin/udaddy /usr/bin/rdma_server /usr/bin/rdma_client; do
  add "$p"
done
prov=$(ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so | head -1)
add "$prov" "$prov"
install -D -m 0644 "$(readlink -f /lib/x86_64-linux-gnu/libgcc_s.so.1)" "$root/usr/lib/x86_64-linux-gnu/libgcc_s.so.1"
mkdir -p "$root/etc/libibverbs.d"
cp /etc/libibverbs.d/rxe.driver "$root/etc/libibverbs.d/"
cp -a /etc/ld.so.conf /etc/ld.so.conf.d "$root/etc/"
ldconfig -r "$root"
install -m 0755 /bin/busybox "$root/usr/bin/busybox"
for a in modprobe insmod lsmod depmod; do ln -sf kmod "$root/usr/bin/$a"; done
for a in $(/bin/busybox --list); do
  [ -e "$root/usr/bin/$a" ] || ln -s busybox "$root/usr/bin/$a"
done

# Modules: rxe and what it needs, the NIC, and netem for loss and ECN marking.
mods="virtio_pci virtio_net rdma_rxe ib_uverbs rdma_ucm crc32_generic sch_netem"
for m in $mods; do
  modprobe -d "$STATE/kernel" -S "$kver" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
done | sort -u | while read -r ko; do
  install -D -m 0644 "$ko" "$root${ko#"$STATE/kernel"}"
done
cp "$STATE/kernel/lib/modules/$kver"/modules.{order,builtin,builtin.modinfo} "$root/lib/modules/$kver/"
depmod -b "$root" "$kver"
echo "$mods" > "$root/etc/modules-to-load"
install -m 0755 "$HERE/guest-init" "$root/init"
echo "root:x:0:0:root:/root:/bin/sh" > "$root/etc/passwd"

cp "$STATE/kernel/boot/vmlinuz-$kver" "$STATE/vmlinuz"
(cd "$root" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 > "$STATE/initramfs.img"
echo "setup: kernel $kver, initramfs $(du -h "$STATE/initramfs.img" | cut -f1) in $STATE"
