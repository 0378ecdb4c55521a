#!/bin/sh
# Inside the Soft-RoCE VM (run by run_in_vm.sh): examples/echo as two
# processes over verbs, 100,000 calls of 64 B with 32 outstanding, every
# reply payload checked by echo_client, and rxe's RNR counters unmoved.
# Arguments (run_in_vm.sh passes doctest flags) are ignored.
set -u
: "${ECHO_SERVER:?ECHO_SERVER not set}" "${ECHO_CLIENT:?ECHO_CLIENT not set}"
C=/sys/class/infiniband/${RXE_DEV:-rxe0}/ports/1/hw_counters
[ -r "$C/rcvd_rnr_err" ] || { echo "echo_over_verbs: no $C: not inside the VM?"; exit 1; }
r0=$(cat "$C/rcvd_rnr_err"); s0=$(cat "$C/send_rnr_err")
dir=$(mktemp -d)
SLOTRPC_TRANSPORT=verbs "$ECHO_SERVER" --listen 127.0.0.1:0 --port-file "$dir/port" >"$dir/server.log" 2>&1 &
pid=$!
i=0
while [ ! -s "$dir/port" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
if [ ! -s "$dir/port" ]; then
  echo "echo_over_verbs: server did not start"; cat "$dir/server.log"; kill $pid 2>/dev/null; exit 1
fi
SLOTRPC_TRANSPORT=verbs "$ECHO_CLIENT" --connect "127.0.0.1:$(cat "$dir/port")" \
  --count 100000 --size 64 --outstanding 32 >"$dir/client.log" 2>&1
rc=$?
kill $pid 2>/dev/null; wait $pid 2>/dev/null
cat "$dir/client.log"
r1=$(cat "$C/rcvd_rnr_err"); s1=$(cat "$C/send_rnr_err")
echo "echo_over_verbs: rcvd_rnr_err +$((r1 - r0)), send_rnr_err +$((s1 - s0))"
fail=0
[ $rc -eq 0 ] || { echo "echo_over_verbs: echo_client exited $rc"; fail=1; }
grep -q "over verbs" "$dir/client.log" || { echo "echo_over_verbs: not over verbs"; fail=1; }
grep -q "100000 ok, 0 failed" "$dir/client.log" || fail=1
grep -q "every reply payload verified" "$dir/client.log" || fail=1
[ $((r1 - r0)) -eq 0 ] && [ $((s1 - s0)) -eq 0 ] || { echo "echo_over_verbs: RNR counters moved"; fail=1; }
[ $fail -eq 0 ] && echo "echo_over_verbs: PASS"
exit $fail
