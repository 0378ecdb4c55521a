#!/bin/bash
# before/after at 64 KiB (and 1 MiB), interleaved, beside perftest
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
run() { # name binary
  local v=$1 B=$2
  for o in 1 32; do
    $B --modes bulk-read,bulk-write --transports bulk-verbs --address 127.0.0.1 --bulk-sizes 65536 --bulk-calls 400 --bulk-outstanding $o --json /tmp/x.json 2>/tmp/err >/dev/null || tail -3 /tmp/err
    python3 -c "
import json
for r in json.load(open('/tmp/x.json'))['results']: print('$v out=$o', r['mode'], r['size'], round(r['mb_per_s'],1), 'failed', r['failed'], r.get('error',''))
"
    cp /tmp/x.json $RXE_VM_RESULTS/$v-out$o-r$R.json
  done
}
for R in 1 2 3; do
perf ib_read_bw 65536 2000
perf ib_write_bw 65536 2000
run before /work/before/bench/slotrpc-bench
run after /work/main/build/bench/slotrpc-bench
done
