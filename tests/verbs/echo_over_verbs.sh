#!/bin/sh
# Run by run_verbs_tests.sh (in the Soft-RoCE VM or directly on a host's
# device): examples/echo as two processes over verbs, ECHO_OVER_VERBS_CALLS
# (tests/verbs/meson.build: 20,000, 5,000 sanitized) calls of 64 B with 32
# outstanding, every reply payload checked by echo_client, and the
# device's RNR counters unmoved (see rnr_counters.sh for which ones).
# Device: SLOTRPC_DEVICE (rxe0 in the VM), port SLOTRPC_PORT (1). Inside the
# VM, rxe0's rcvd_rnr_err and send_rnr_err must exist and stay put; on
# another device the RNR counters it exposes are compared (named in the
# output), and if it exposes none that is said and nothing is compared.
# Then, with the server still up, its metrics two ways (docs/design.md,
# "Metrics and the monitor"): slotrpc-stat --address (the built-in
# slotrpc.Admin/Metrics method, over the ordinary port) must show the
# Echo method with exactly CALLS calls, 0 errors, and a verbs transport;
# curl of its metrics port (SLOTRPC_METRICS_ADDRESS) must return Prometheus
# text with the same count and the device's RNR counters, sampled by the
# monitor.
# Arguments (run_verbs_tests.sh passes doctest flags) are ignored.
set -u
: "${ECHO_SERVER:?ECHO_SERVER not set}" "${ECHO_CLIENT:?ECHO_CLIENT not set}" "${STAT_TOOL:?STAT_TOOL not set}"
. "$(dirname "$0")/rnr_counters.sh"
DEV=${SLOTRPC_DEVICE:-rxe0}
PORT=${SLOTRPC_PORT:-1}
P=/sys/class/infiniband/$DEV/ports/$PORT
RNR=$(rnr_counter_names "$P")
if [ -n "${RXE_VM:-}" ] && [ "$RNR" != "hw_counters/rcvd_rnr_err hw_counters/send_rnr_err" ]; then
  echo "echo_over_verbs: inside the VM but no rcvd_rnr_err/send_rnr_err in $P/hw_counters"; exit 1
fi
[ -d "$P" ] || { echo "echo_over_verbs: no $P: device $DEV port $PORT missing"; exit 1; }
rnr0=$(rnr_read "$P" $RNR)
dir=$(mktemp -d)
# A metrics port of its own (inside the VM nothing else listens; directly on
# a host, a port from this shell's pid, so parallel runs do not collide).
MPORT=$((20000 + $$ % 20000))
SLOTRPC_METRICS_ADDRESS=127.0.0.1:$MPORT SLOTRPC_MONITOR_INTERVAL_MS=200 \
  SLOTRPC_TRANSPORT=verbs "$ECHO_SERVER" --listen 127.0.0.1:0 --port-file "$dir/port" >"$dir/server.log" 2>&1 &
pid=$!
i=0
while [ ! -s "$dir/port" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
if [ ! -s "$dir/port" ]; then
  echo "echo_over_verbs: server did not start"; cat "$dir/server.log"; kill $pid 2>/dev/null; exit 1
fi
CALLS=${ECHO_OVER_VERBS_CALLS:-20000}  # fewer under the sanitizers (tests/verbs/meson.build)
SLOTRPC_TRANSPORT=verbs "$ECHO_CLIENT" --connect "127.0.0.1:$(cat "$dir/port")" \
  --count "$CALLS" --size 64 --outstanding 32 >"$dir/client.log" 2>&1
rc=$?
fail=0
# The server's metrics, while it runs.
"$STAT_TOOL" --address "127.0.0.1:$(cat "$dir/port")" --count 1 >"$dir/stat.txt" 2>"$dir/stat.err"
src=$?
curl -sf "http://127.0.0.1:$MPORT/metrics" >"$dir/metrics.txt"
crc=$?
kill $pid 2>/dev/null; wait $pid 2>/dev/null
cat "$dir/client.log"
echo "echo_over_verbs: slotrpc-stat --address (exit $src):"
sed 's/^/  /' "$dir/stat.txt"
if [ $src -ne 0 ]; then
  echo "echo_over_verbs: slotrpc-stat failed"; cat "$dir/stat.err"; fail=1
fi
grep -Eq "^server +slotrpc\.examples\.Echo/Echo +$CALLS +0 " "$dir/stat.txt" \
  || { echo "echo_over_verbs: slotrpc-stat does not show $CALLS Echo calls, 0 errors"; fail=1; }
grep -q "^transport verbs" "$dir/stat.txt" || { echo "echo_over_verbs: slotrpc-stat shows no verbs transport"; fail=1; }
if [ $crc -ne 0 ]; then
  echo "echo_over_verbs: curl of the metrics port 127.0.0.1:$MPORT failed (exit $crc)"; fail=1
fi
grep -q "^# TYPE slotrpc_method_calls_finished_total counter" "$dir/metrics.txt" \
  || { echo "echo_over_verbs: metrics port: no # TYPE line for slotrpc_method_calls_finished_total"; fail=1; }
grep -Fq "slotrpc_method_calls_finished_total{side=\"server\",method=\"slotrpc.examples.Echo/Echo\",code=\"OK\"} $CALLS" \
  "$dir/metrics.txt" || { echo "echo_over_verbs: metrics port: Echo OK count is not $CALLS"; fail=1; }
if [ -n "${RXE_VM:-}" ]; then
  grep -Eq "^slotrpc_hw_counter_total\{device=\"$DEV\",port=\"$PORT\",counter=\"rcvd_rnr_err\"" "$dir/metrics.txt" \
    || { echo "echo_over_verbs: metrics port: no rcvd_rnr_err of $DEV from the monitor"; fail=1; }
fi
echo "echo_over_verbs: metrics port: $(grep -c '^slotrpc_' "$dir/metrics.txt") samples, $(grep -c '^slotrpc_hw_counter_total' "$dir/metrics.txt") hardware counters"
if [ -n "$RNR" ]; then
  moved=0
  deltas=$(rnr_deltas "$rnr0" "$(rnr_read "$P" $RNR)") || moved=1
  echo "echo_over_verbs: RNR counters of $DEV port $PORT: $deltas"
  if [ $moved -ne 0 ]; then
    fail=1
    echo "echo_over_verbs: RNR counters moved"
    [ -n "${RXE_VM:-}" ] || echo "echo_over_verbs: (they count the whole port: other traffic on it counts too)"
  fi
else
  echo "echo_over_verbs: $DEV port $PORT exposes no RNR counter: RNR deltas NOT checked"
fi
[ $rc -eq 0 ] || { echo "echo_over_verbs: echo_client exited $rc"; fail=1; }
grep -q "over verbs" "$dir/client.log" || { echo "echo_over_verbs: not over verbs"; fail=1; }
grep -q "$CALLS ok, 0 failed" "$dir/client.log" || fail=1
grep -q "every reply payload verified" "$dir/client.log" || fail=1
rm -rf "$dir"
[ $fail -eq 0 ] && echo "echo_over_verbs: PASS"
exit $fail
