#!/bin/bash
# The Soft-RoCE guest session (runs inside the guest, in the repository; $RESULTS comes back).
BIN=${RDMA_BIN:?}
source tests/rdma/guest_lib.sh
step probe 60 "$BIN/verbs_pingpong" probe
step pingpong 240 "$BIN/verbs_pingpong" run ${PINGPONG_ITERS:-1000}
DICOMM_IB_FORCE_STAGING=1 step staging 240 "$BIN/verbs_pingpong" run 100
# The kernel's rdma cgroup limit on the device's objects makes Channel constructors fail part-way.
grep -q cgroup2 /proc/mounts || mount -t cgroup2 none /sys/fs/cgroup
echo +rdma > /sys/fs/cgroup/cgroup.subtree_control; mkdir -p /sys/fs/cgroup/dicomm-limits
step channel_limits 60 "$BIN/verbs_pingpong" channel-limits /sys/fs/cgroup/dicomm-limits
# pyverbs, the independent reference: its view of rxe0 (the first step to import torch: slow), and
# an RDMA WRITE into a buffer that dicomm registered.
step pyverbs_probe 180 .venv/bin/python tests/rdma/guest_pyverbs.py probe
mkdir -p /tmp/pyverbs-8 /tmp/pyverbs-1m
step pyverbs_write_8 120 .venv/bin/python tests/rdma/guest_pyverbs.py write 8 /tmp/pyverbs-8 "$BIN/verbs_pingpong"
step pyverbs_write_1m 120 .venv/bin/python tests/rdma/guest_pyverbs.py write 1048579 /tmp/pyverbs-1m "$BIN/verbs_pingpong"
# A rank written with pyverbs from docs/rdma.md's wire protocol, messages both ways with the transport.
mkdir -p /tmp/pyverbs-exchange
step pyverbs_exchange 200 .venv/bin/python -m tests.rdma.guest_pyverbs exchange /tmp/pyverbs-exchange "$BIN/verbs_pingpong"
step p2p 400 .venv/bin/python -m tests.rdma.guest_p2p  # the engine on verbs (scenarios in its JSON)
perftest write_lat ib_write_lat 8 1000
perftest write_bw_64k ib_write_bw 65536 1000
perftest write_bw_1m ib_write_bw 1048576 100
# Last: takes rxe0's network interface down (and up again).
step port_down 150 .venv/bin/python -m tests.rdma.guest_p2p port_down
exit 0
