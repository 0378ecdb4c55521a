#!/bin/sh
# Runs the verbs test binaries given as arguments, one after the other, on
# one RDMA device: inside ONE boot of the Soft-RoCE VM (rxe0), or directly on
# a host's device. The `rxe` suite (tests/verbs/meson.build) runs
#   tests/verbs/run_device_suite.sh -- tests/verbs/run_verbs_tests.sh BINARY...
# and the launcher picks the place (see tests/rxe/README.md).
# The device is SLOTRPC_DEVICE (the launcher sets it when running directly;
# rxe0 in the VM), port SLOTRPC_PORT (1). Prints each binary's output, the
# device's counters before and after, and a summary line; exits non-zero if
# any binary failed or was skipped (a skip means the device is missing,
# which is a failure here).
set -u
DEV=${SLOTRPC_DEVICE:-rxe0}
PORT=${SLOTRPC_PORT:-1}
PORTDIR=/sys/class/infiniband/$DEV/ports/$PORT
. "$(dirname "$0")/rnr_counters.sh"
if [ -n "${RXE_VM:-}" ]; then WHERE="in the Soft-RoCE VM"; else WHERE="directly on this host"; fi
RNR=$(rnr_counter_names "$PORTDIR")

# The RNR counters, then others worth a look (rxe's and mlx5's names), those
# that exist.
show_counters() {
  [ -d "$PORTDIR" ] || { echo "  (no $PORTDIR)"; return; }
  for f in $RNR; do
    printf '  %-32s %s\n' "$f" "$(cat "$PORTDIR/$f" 2>/dev/null)"
  done
  for f in retry_rnr_exceeded_err retry_exceeded_err rcvd_seq_err out_of_seq_request duplicate_request \
           send_err link_downed rdma_sends rdma_recvs \
           out_of_sequence packet_seq_err local_ack_timeout_err implied_nak_seq_err \
           req_transport_retries_exceeded; do
    case " $RNR " in *"/$f "*) continue ;; esac
    [ -f "$PORTDIR/hw_counters/$f" ] && printf '  %-32s %s\n' "hw_counters/$f" "$(cat "$PORTDIR/hw_counters/$f")"
  done
}

echo "== verbs tests $WHERE on $DEV port $PORT"
if [ -n "$RNR" ]; then
  echo "== RNR counters of $DEV port $PORT: $RNR"
else
  echo "== $DEV port $PORT exposes no RNR counter (looked for rcvd_rnr_err and send_rnr_err, any *rnr* under hw_counters/ or counters/, hw_counters/out_of_buffer): RNR deltas not shown"
fi
echo "== counters of $DEV before"
show_counters
rnr0=$(rnr_read "$PORTDIR" $RNR)
passed=0
failed=0
failures=""
for bin in "$@"; do
  name=$(basename "$bin")
  echo "== $name"
  start=$(date +%s)
  "$bin" --duration=true
  rc=$?
  secs=$(( $(date +%s) - start ))
  if [ "$rc" -eq 0 ]; then
    echo "== $name: PASS (${secs} s)"
    passed=$((passed + 1))
  else
    echo "== $name: FAIL (exit $rc, ${secs} s)"
    failed=$((failed + 1))
    failures="$failures $name"
  fi
done
echo "== counters of $DEV after"
show_counters
# Over the whole run, for information only (not asserted here):
# echo_over_verbs.sh and the 100,000-call test assert their own deltas.
[ -n "$RNR" ] && echo "== RNR counter deltas over the whole run: $(rnr_deltas "$rnr0" "$(rnr_read "$PORTDIR" $RNR)")"
echo "verbs suite ($DEV, $WHERE): $passed passed, $failed failed${failures:+ (failed:$failures)}"
[ "$failed" -eq 0 ]
