#!/bin/bash
# bench/shm_echo_bench.sh: echo_server + echo_client, two processes on one host,
# busy poll, shm beside tcp (docs/benchmarks.md).  BUILD=build by default;
# N1, N32, NBIG: the call counts of the three runs (defaults below; smaller
# ones on a heavily loaded machine).
set -e
B=${BUILD:-build}/examples/echo
rm -f /tmp/slotrpc-shm-bench-port
SLOTRPC_SLOT_SIZE=131072 SLOTRPC_POLL_MODE=busy SLOTRPC_LOG_LEVEL=warn $B/echo_server --listen 127.0.0.1:0 --port-file /tmp/slotrpc-shm-bench-port > /tmp/slotrpc-shm-bench-server.log 2>&1 &
SP=$!
for i in $(seq 100); do [ -s /tmp/slotrpc-shm-bench-port ] && break; sleep 0.1; done
P=$(cat /tmp/slotrpc-shm-bench-port)
for T in shm tcp; do
  echo "== transport $T"
  SLOTRPC_TRANSPORT=$T SLOTRPC_POLL_MODE=busy SLOTRPC_LOG_LEVEL=warn $B/echo_client --connect 127.0.0.1:$P --count ${N1:-20000} --size 64 --outstanding 1 | grep -E "over|p50"
  SLOTRPC_TRANSPORT=$T SLOTRPC_POLL_MODE=busy SLOTRPC_LOG_LEVEL=warn $B/echo_client --connect 127.0.0.1:$P --count ${N32:-100000} --size 64 --outstanding 32 | grep -E "p50"
  SLOTRPC_SLOT_SIZE=131072 SLOTRPC_TRANSPORT=$T SLOTRPC_POLL_MODE=busy SLOTRPC_LOG_LEVEL=warn $B/echo_client --connect 127.0.0.1:$P --count ${NBIG:-2000} --size 65536 --outstanding 1 | grep -E "p50"
done
echo "== auto"
SLOTRPC_POLL_MODE=busy SLOTRPC_LOG_LEVEL=info $B/echo_client --connect 127.0.0.1:$P --count 1000 --size 64 --outstanding 1 2>&1 | grep -E "uses|over"
kill $SP; wait $SP || true
