#!/bin/sh
# Runs the verbs test binaries given as arguments, one after the other, in
# ONE boot of the Soft-RoCE VM (the rxe suite: tests/verbs/meson.build runs
#   tests/rxe/rxe-vm.sh -- tests/verbs/run_in_vm.sh BINARY...).
# Prints each binary's output, the rxe counters before and after, and a
# summary line; exits non-zero if any binary failed or was skipped (inside
# the VM a skip means the device is missing, which is a failure).
set -u
DEV=${RXE_DEV:-rxe0}
COUNTERS=/sys/class/infiniband/$DEV/ports/1/hw_counters

show_counters() {
  [ -d "$COUNTERS" ] || { echo "(no $COUNTERS)"; return; }
  for f in rcvd_rnr_err send_rnr_err retry_rnr_exceeded_err retry_exceeded_err rcvd_seq_err \
           out_of_seq_request duplicate_request send_err link_downed rdma_sends rdma_recvs; do
    [ -f "$COUNTERS/$f" ] && printf '  %-24s %s\n' "$f" "$(cat "$COUNTERS/$f")"
  done
}

echo "== rxe counters of $DEV before"
show_counters
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
echo "== rxe counters of $DEV after"
show_counters
echo "rxe suite: $passed passed, $failed failed${failures:+ (failed:$failures)}"
[ "$failed" -eq 0 ]
