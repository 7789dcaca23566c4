#!/bin/bash
# Stage 2 of the Soft-RoCE guest (PID 1 on the host's userland): Soft-RoCE device rxe0 on eth0,
# then the session's command from $RUN/cmd.sh in the repository; its output and exit status go
# to $RUN (QEMU's own exit status does not carry the guest's result). Always powers off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
RUN=$(sed -n 's/.*rdmarun=\([^ ]*\).*/\1/p' /proc/cmdline)
REPO=$(sed -n 's/.*rdmarepo=\([^ ]*\).*/\1/p' /proc/cmdline)
log() { echo "[guest $(cut -d' ' -f1 /proc/uptime)s] $*"; }
finish() { sync; echo o > /proc/sysrq-trigger; sleep 30; }
trap finish EXIT
mkdir -p /dev/shm /dev/pts
mount -t tmpfs -o mode=1777 shm /dev/shm; mount -t devpts devpts /dev/pts
# /tmp stays the overlay's (writable through its tmpfs upper layer): a tmpfs here would hide a
# checkout, and the lab folder mounted inside it, that live under the host's /tmp.
hostname rxe-guest; ip link set lo up
for m in virtio_net rdma_rxe; do modprobe $m || log "modprobe $m failed"; done
NIC=$(ls /sys/class/net | grep -v '^lo$' | head -1)
ip link set "$NIC" up; ip addr add 10.0.2.15/24 dev "$NIC"
rdma link add rxe0 type rxe netdev "$NIC" || log "rdma link add rxe0 failed"
for i in $(seq 50); do  # the port turns ACTIVE once the netdev carrier is up
  grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null && break; sleep 0.1
done
log "rxe0 on $NIC: $(cat /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null || echo missing)"
cd "$REPO"
export RESULTS=$RUN/results; mkdir -p "$RESULTS"
bash "$RUN/cmd.sh" > "$RUN/output.txt" 2>&1
echo $? > "$RUN/rc"
log "command exited with $(cat $RUN/rc)"
