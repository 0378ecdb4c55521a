#!/bin/bash
DEV=rxe0; PORT=18521
perf() {
  local test=$1 size=$2 iters=$3
  local args=(-d $DEV -x 0 -s $size -n $iters -p $PORT)
  timeout 300 $test "${args[@]}" >/tmp/$test.server 2>&1 & srv=$!
  sleep 1
  timeout 300 $test "${args[@]}" 127.0.0.1 > /tmp/$test.client 2>&1
  wait $srv
  echo "$test $size: $(grep -A1 -m1 '#bytes' /tmp/$test.client | tail -n1)"
}
B=/work/main/build/bench/slotrpc-bench
run() { # name env...
  local v=$1; shift
  env "$@" $B --modes bulk-read,bulk-write --transports bulk-verbs --address 127.0.0.1 --bulk-sizes 65536 --bulk-calls 500 --bulk-outstanding 1 --json /tmp/x.json 2>/tmp/err >/dev/null || tail -3 /tmp/err
  python3 -c "
import json
for r in json.load(open('/tmp/x.json'))['results']: print('$v', r['mode'], r['size'], round(r['mb_per_s'],1), 'p50', r['p50'], 'failed', r['failed'])
"
  cp /tmp/x.json $RXE_VM_RESULTS/$v-r$R.json
}
for R in 1 2 3; do
perf ib_read_bw 65536 2000
perf ib_write_bw 65536 2000
run adaptive X=1
run busy SLOTRPC_POLL_MODE=busy
run spin5ms SLOTRPC_SPIN_MAX_US=5000
done
