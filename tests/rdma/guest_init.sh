#!/bin/busybox sh
# Stage 1 of the Soft-RoCE guest: mount the host root (read-only, 9p) under a tmpfs overlay with
# the unpacked rdma packages as an extra lower layer, mount the lab folder read-write at its host
# path, then switch_root into the stage-2 script named on the kernel command line.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
for m in virtio_pci 9pnet_virtio 9p overlay; do modprobe $m || echo "[init] modprobe $m failed"; done
arg() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
LAB=$(arg rdmalab); STAGE2=$(arg stage2)
mkdir -p /host /pkgs /rw /newroot
O="trans=virtio,version=9p2000.L,msize=512000"
mount -t 9p -o ro,$O,cache=loose hostroot /host || { echo "[init] mount hostroot failed"; poweroff -f; }
mount -t 9p -o ro,$O,cache=loose pkgs /pkgs || { echo "[init] mount pkgs failed"; poweroff -f; }
mount -t tmpfs -o mode=0755 rw /rw; mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/pkgs:/host,upperdir=/rw/upper,workdir=/rw/work overlay /newroot \
  || { echo "[init] overlay mount failed"; poweroff -f; }
mount --move /dev /newroot/dev; mount --move /proc /newroot/proc; mount --move /sys /newroot/sys
mount -t tmpfs -o mode=0755 run /newroot/run
mkdir -p /newroot$LAB
mount -t 9p -o $O lab /newroot$LAB || { echo "[init] mount lab failed"; poweroff -f; }
KV=$(uname -r); mkdir -p /newroot/usr/lib/modules/$KV
mount --bind /newroot$LAB/kernel/lib/modules/$KV /newroot/usr/lib/modules/$KV
exec switch_root /newroot $STAGE2
