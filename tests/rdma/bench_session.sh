#!/bin/bash
# The Soft-RoCE benchmark session (inside the guest, in the repository; $RESULTS comes back):
# `dicomm-bench p2p --transport verbs` and perftest on the same rxe0, alternating in rounds so that
# both see the same load on the (shared) host. Under TCG a process pair runs in one of a few speed
# modes (perftest's 8 B typical 10.5 or 18-20 us from one run to the next), so each round measures
# the 8 B latency in PAIRS process pairs of each, alternating; the comparison takes the medians.
source tests/rdma/guest_lib.sh
PY=.venv/bin/python
for r in $(seq ${ROUNDS:-3}); do
  for k in $(seq ${PAIRS:-3}); do
    perftest write_lat_${r}_$k ib_write_lat 8 ${LAT_ITERS:-1000}
    step dicomm_lat_${r}_$k 120 "$PY" -m dicomm.bench.cli p2p --transport verbs --backends dicomm --api native \
      --no-memcpy --min-bytes 8 --max-bytes 8 --iters ${LAT_ITERS:-1000} --warmup 20 --rounds 5 \
      --op-timeout 60 --timeout 100 --quiet --json "$RESULTS/dicomm_lat_${r}_$k.json"
  done
  perftest write_bw_1m_$r ib_write_bw 1048576 100
  # Streaming, as ib_write_bw does (16 messages in flight): the Communicator's 1 MiB bandwidth like for like.
  step dicomm_stream_$r 150 "$PY" -m tests.rdma.guest_stream "$RESULTS/dicomm_stream_$r.json" --bytes 1048576 --window 16
  step dicomm_$r 280 "$PY" -m dicomm.bench.cli p2p --transport verbs --backends dicomm --api native,raw,torch --no-memcpy \
    --min-bytes 8 --max-bytes 1M --step 131072 --iters ${LAT_ITERS:-1000} --budget 64M --warmup 20 --rounds 5 \
    --op-timeout 60 --timeout 240 --json "$RESULTS/dicomm_$r.json"
done
exit 0
