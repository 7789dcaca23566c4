#!/bin/bash
# The Soft-RoCE guest session (runs inside the guest, in the repository; $RESULTS comes back).
# Each step writes <name>.txt and <name>.rc; a step never blocks past its timeout.
BIN=${RDMA_BIN:?}
step() {  # step NAME TIMEOUT CMD...
  local name=$1 t=$2; shift 2
  local t0=$(cut -d' ' -f1 /proc/uptime)
  timeout -k 5 "$t" "$@" > "$RESULTS/$name.txt" 2>&1
  echo $? > "$RESULTS/$name.rc"
  echo "$name: exit $(cat $RESULTS/$name.rc) ($(awk "BEGIN{print $(cut -d' ' -f1 /proc/uptime) - $t0}") s)"
}
pair() {  # pair NAME TIMEOUT SERVER_CMD -- CLIENT_CMD: two processes on rxe0 (perftest)
  local name=$1 t=$2; shift 2
  local srv=() cli=()
  while [ "$1" != "--" ]; do srv+=("$1"); shift; done; shift; cli=("$@")
  timeout -k 5 "$t" "${srv[@]}" > "$RESULTS/$name.server.txt" 2>&1 & local sp=$!
  sleep 1
  timeout -k 5 "$t" "${cli[@]}" > "$RESULTS/$name.txt" 2>&1; local rc=$?
  wait $sp; local src=$?
  echo $(( rc | src )) > "$RESULTS/$name.rc"
  echo "$name: client $rc server $src"
}
step probe 60 "$BIN/verbs_pingpong" probe
step pingpong 240 "$BIN/verbs_pingpong" run ${PINGPONG_ITERS:-1000}
DICOMM_IB_FORCE_STAGING=1 step staging 240 "$BIN/verbs_pingpong" run 100
step p2p 300 .venv/bin/python -m tests.rdma.guest_p2p  # the engine on verbs (scenarios in its JSON)
pair write_lat 120 ib_write_lat -d rxe0 -x 1 -s 8 -n 1000 -- ib_write_lat -d rxe0 -x 1 -s 8 -n 1000 127.0.0.1
pair write_bw_64k 120 ib_write_bw -d rxe0 -x 1 -s 65536 -n 1000 -- ib_write_bw -d rxe0 -x 1 -s 65536 -n 1000 127.0.0.1
pair write_bw_1m 120 ib_write_bw -d rxe0 -x 1 -s 1048576 -n 100 -- ib_write_bw -d rxe0 -x 1 -s 1048576 -n 100 127.0.0.1
exit 0
