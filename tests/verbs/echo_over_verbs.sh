#!/bin/sh
# Run by run_verbs_tests.sh (in the Soft-RoCE VM or directly on a host's
# device): examples/echo as two processes over verbs, 100,000 calls of 64 B
# with 32 outstanding, every reply payload checked by echo_client, and the
# device's RNR counters unmoved (see rnr_counters.sh for which ones).
# Device: SLOTRPC_DEVICE (rxe0 in the VM), port SLOTRPC_PORT (1). Inside the
# VM, rxe0's rcvd_rnr_err and send_rnr_err must exist and stay put; on
# another device the RNR counters it exposes are compared (named in the
# output), and if it exposes none that is said and nothing is compared.
# Arguments (run_verbs_tests.sh passes doctest flags) are ignored.
set -u
: "${ECHO_SERVER:?ECHO_SERVER not set}" "${ECHO_CLIENT:?ECHO_CLIENT not set}"
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
SLOTRPC_TRANSPORT=verbs "$ECHO_SERVER" --listen 127.0.0.1:0 --port-file "$dir/port" >"$dir/server.log" 2>&1 &
pid=$!
i=0
while [ ! -s "$dir/port" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
if [ ! -s "$dir/port" ]; then
  echo "echo_over_verbs: server did not start"; cat "$dir/server.log"; kill $pid 2>/dev/null; exit 1
fi
CALLS=${VERBS_ECHO_CALLS:-100000}  # fewer under the sanitizers (tests/verbs/meson.build)
SLOTRPC_TRANSPORT=verbs "$ECHO_CLIENT" --connect "127.0.0.1:$(cat "$dir/port")" \
  --count "$CALLS" --size 64 --outstanding 32 >"$dir/client.log" 2>&1
rc=$?
kill $pid 2>/dev/null; wait $pid 2>/dev/null
cat "$dir/client.log"
fail=0
if [ -n "$RNR" ]; then
  deltas=$(rnr_deltas "$rnr0" "$(rnr_read "$P" $RNR)") || fail=1
  echo "echo_over_verbs: RNR counters of $DEV port $PORT: $deltas"
  if [ $fail -ne 0 ]; then
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
