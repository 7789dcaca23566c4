# Shell helpers of the guest sessions (sourced; run inside the guest with $RESULTS set).
# Each step writes <name>.txt and <name>.rc; a step never blocks past its timeout.
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
perftest() {  # perftest NAME TOOL SIZE ITERS: TOOL (ib_write_lat, ib_write_bw) server and client on rxe0
  # perftest turns cycles into time with a CPU frequency it measures itself; under TCG that
  # measurement sometimes fails (r^2 < 0.9): the row then reads inf, or there is no report. A rerun
  # measures anew.
  local name=$1 tool=$2 size=$3 iters=$4 try
  for try in 1 2 3; do
    pair "$name" 120 "$tool" -d rxe0 -x 1 -s "$size" -n "$iters" -- "$tool" -d rxe0 -x 1 -s "$size" -n "$iters" 127.0.0.1
    grep -Eq "^[[:space:]]*$size[[:space:]]+[0-9]+([[:space:]]+[0-9.]+){3}" "$RESULTS/$name.txt" && return
    echo "$name: no finite result row (try $try)"
  done
}
