#!/bin/bash
# scripts/cpu_per_call.sh: CPU per call end to end, two processes at
# saturation -- examples/echo's echo_server and echo_client, 64 B calls,
# many outstanding -- over shm and TCP.  The measure of bench/core_bench
# (the core alone, one thread), where users see it: the user + system time
# of both processes divided by the calls.
#
#   scripts/cpu_per_call.sh                      # build-h, shm and tcp, 1000000 calls, 128 outstanding
#   BUILD=build CALLS=200000 OUTSTANDING=32 TRANSPORTS=shm scripts/cpu_per_call.sh
#
# The client's CPU is its whole process (bash's `time`: start-up and
# connect included, a few ms); the server's is read from /proc/PID/stat
# (utime + stime, in clock ticks) just before and after each client, so
# it includes the server's idle spin (SLOTRPC_POLL_MODE, adaptive by default,
# as the library's) after the last call.  Both are small beside a run of a
# second or more; a tick (10 ms) over a million calls is 10 ns a call.  One line per transport, key=value:
#   transport=shm outstanding=128 calls=500000 calls_per_s=... client_cpu_s=... server_cpu_s=... cpu_ns_per_call=...
set -euo pipefail

BUILD=${BUILD:-build-h}
CALLS=${CALLS:-1000000}
OUTSTANDING=${OUTSTANDING:-128}
SIZE=${SIZE:-64}
TRANSPORTS=${TRANSPORTS:-"shm tcp"}
MODE=${SLOTRPC_POLL_MODE:-adaptive}
E=$BUILD/examples/echo
for b in echo_server echo_client; do
  [[ -x $E/$b ]] || { echo "cpu_per_call.sh: no $E/$b (ninja -C $BUILD examples/echo/$b)" >&2; exit 1; }
done

tmp=$(mktemp -d)
SP=
cleanup() {
  [[ -n $SP ]] && kill "$SP" 2>/dev/null && wait "$SP" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

SLOTRPC_POLL_MODE=$MODE SLOTRPC_LOG_LEVEL=warn "$E/echo_server" --listen 127.0.0.1:0 \
  --port-file "$tmp/port" > "$tmp/server.log" 2>&1 &
SP=$!
for _ in $(seq 200); do [[ -s $tmp/port ]] && break; sleep 0.05; done
[[ -s $tmp/port ]] || { echo "cpu_per_call.sh: echo_server did not start:" >&2; cat "$tmp/server.log" >&2; exit 1; }
PORT=$(cat "$tmp/port")
TICK=$(getconf CLK_TCK)

# utime + stime of the server, in clock ticks (fields 14 and 15 of stat;
# the command name in field 2 has no spaces here).
server_ticks() { awk '{ print $14 + $15 }' "/proc/$SP/stat"; }

for T in $TRANSPORTS; do
  s0=$(server_ticks)
  TIMEFORMAT='%3U %3S %3R'
  { time SLOTRPC_TRANSPORT=$T SLOTRPC_POLL_MODE=$MODE SLOTRPC_LOG_LEVEL=warn "$E/echo_client" \
      --connect "127.0.0.1:$PORT" --count "$CALLS" --size "$SIZE" --outstanding "$OUTSTANDING" \
      > "$tmp/client.out" 2>&1 ; } 2> "$tmp/time" || {
    echo "cpu_per_call.sh: echo_client over $T failed:" >&2; cat "$tmp/client.out" >&2; exit 1; }
  s1=$(server_ticks)
  grep -q "over $T to" "$tmp/client.out" || {
    echo "cpu_per_call.sh: the client did not run over $T:" >&2; cat "$tmp/client.out" >&2; exit 1; }
  rate=$(grep -oE '[0-9]+ calls/s' "$tmp/client.out" | head -1 | cut -d' ' -f1)
  read -r cu cs _ < "$tmp/time"
  awk -v t="$T" -v o="$OUTSTANDING" -v n="$CALLS" -v r="$rate" -v cu="$cu" -v cs="$cs" \
      -v s="$((s1 - s0))" -v tick="$TICK" 'BEGIN {
    client = cu + cs; server = s / tick;
    printf "transport=%s outstanding=%s calls=%s calls_per_s=%s client_cpu_s=%.3f server_cpu_s=%.3f cpu_ns_per_call=%.0f\n",
           t, o, n, r, client, server, (client + server) * 1e9 / n }'
done
