# shellcheck shell=bash
# scripts/lib/softroce-guest.sh — the Soft-RoCE guest kernel, shared by scripts/softroce (one
# guest, veth pair) and scripts/softroce-twonode (two guests, one virtio NIC each). Sourced, not
# run: the caller defines say and fail; this sets cache and sudo and defines softroce_guest_setup,
# which installs the host packages that are missing and builds the guest kernel and initramfs once
# into $cache (vmlinuz, initrd.gz).
#
# The initramfs loads the modules below, mounts the host's / over 9p (mount tag hostroot) and
# runs `bash JOB/guest.sh` chrooted there, JOB being the kernel argument rdmx_job=JOB. When that
# returns it powers off from the initramfs: powering off from inside the chroot (sysrq) kills
# commands still reading the 9p root, and init with them, which panics the guest.

cache=${RDMX_SOFTROCE_CACHE:-/var/cache/rdmx-softroce}
sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
# rdma_rxe needs crc32_generic loaded first ("failed to init crc32 algorithm" otherwise);
# virtio_net is the two-node guests' NIC, sch_netem their loss and delay.
guest_modules="crc32_generic virtio_pci virtio_net 9pnet_virtio 9p veth rdma_rxe rdma_ucm ib_uverbs sch_netem"
guest_stamp="initramfs 2: $guest_modules"   # change it whenever the initramfs changes

softroce_kernel_pkg() {
  apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'
}

softroce_guest_setup() {
  local missing=() pkg_now
  command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
  [ -x /bin/busybox ] || missing+=(busybox-static)
  command -v cpio >/dev/null || missing+=(cpio)
  command -v depmod >/dev/null || missing+=(kmod)
  { command -v ip && command -v rdma && command -v tc && command -v ss; } >/dev/null || missing+=(iproute2)
  ls /usr/lib/*/libibverbs/librxe-rdmav*.so >/dev/null 2>&1 || missing+=(ibverbs-providers rdma-core)
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >/dev/null \
      || fail "could not install ${missing[*]} with apt-get"
  fi
  pkg_now=$(softroce_kernel_pkg || true)
  if [ ! -s "$cache/vmlinuz" ] || [ ! -s "$cache/initrd.gz" ] || ! grep -qF "$guest_stamp" "$cache/stamp" 2>/dev/null \
     || { [ -n "$pkg_now" ] && ! grep -q "^$pkg_now " "$cache/stamp"; }; then
    softroce_prepare_guest
  fi
}

softroce_prepare_guest() {
  local work pkg kver
  say "preparing the guest kernel in $cache (once; about a minute)"
  $sudo mkdir -p "$cache"
  compgen -G '/var/lib/apt/lists/*_Packages' >/dev/null || $sudo apt-get update -qq >/dev/null
  pkg=$(softroce_kernel_pkg)
  [ -n "$pkg" ] || fail "apt knows no linux-image-amd64 kernel package (run apt-get update)"
  work=$(mktemp -d /tmp/rdmx-softroce-prep.XXXXXX)
  trap 'rm -rf "$work"; trap - RETURN' RETURN
  (cd "$work" && apt-get download "$pkg" >/dev/null 2>&1) || fail "could not download $pkg"
  dpkg-deb -x "$work"/*.deb "$work/kernel"
  kver=$(basename "$(find "$work/kernel/lib/modules" -mindepth 1 -maxdepth 1 | head -1)")
  # The package's modules.dep is written by depmod at install time, not shipped.
  depmod -b "$work/kernel" "$kver"
  mkdir -p "$work/initramfs"/{bin,modules,newroot,proc,sys,dev}
  cp /bin/busybox "$work/initramfs/bin/"
  for m in $guest_modules; do
    modprobe -d "$work/kernel" -S "$kver" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
  done | awk '!seen[$0]++' > "$work/module-paths"
  while read -r path; do cp "$path" "$work/initramfs/modules/"; basename "$path"; done \
    < "$work/module-paths" > "$work/initramfs/modules/load-order"
  cat > "$work/initramfs/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
for m in $(cat /modules/load-order); do insmod "/modules/$m" || echo "softroce-guest: insmod $m failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=none hostroot /newroot \
  || { echo "softroce-guest: cannot mount the host's root over 9p"; poweroff -f; }
for d in proc sys dev; do mount --bind "/$d" "/newroot/$d"; done
job=$(sed -n 's/.*rdmx_job=\([^ ]*\).*/\1/p' /proc/cmdline)
chroot /newroot /bin/bash "$job/guest.sh"
sync; poweroff -f
INIT
  chmod +x "$work/initramfs/init"
  (cd "$work/initramfs" && find . | cpio -o -H newc 2>/dev/null | gzip -1) > "$work/initrd.gz"
  $sudo cp "$work"/kernel/boot/vmlinuz-* "$cache/vmlinuz.new"
  $sudo cp "$work/initrd.gz" "$cache/initrd.gz.new"
  $sudo mv "$cache/vmlinuz.new" "$cache/vmlinuz"
  $sudo mv "$cache/initrd.gz.new" "$cache/initrd.gz"
  echo "$pkg $guest_stamp" | $sudo tee "$cache/stamp" >/dev/null
}
