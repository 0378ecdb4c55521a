#!/bin/sh
# Suite unit: where run_device_suite.sh runs the verbs device tests (this
# host's device or the Soft-RoCE VM), checked against fake sysfs trees
# (SLOTRPC_TEST_SYSFS) with --which, so nothing boots; the direct path is run
# once with a stand-in command. Also which RNR counters rnr_counters.sh picks
# for rxe-like, mlx5-like and counter-less ports.
set -u
HERE=$(cd -- "$(dirname -- "$0")" && pwd)
LAUNCHER="$HERE/run_device_suite.sh"
. "$HERE/rnr_counters.sh"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
unset SLOTRPC_TEST_DEVICE SLOTRPC_PORT SLOTRPC_DEVICE

checks=0
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# port ROOT DEV PORT STATE: a port as sysfs shows it ("4: ACTIVE").
port() {
  mkdir -p "$1/class/infiniband/$2/ports/$3"
  echo "$4" >"$1/class/infiniband/$2/ports/$3/state"
}

# expect NAME ROOT WANT_RC WANT_TEXT [VAR=VALUE...]: run the launcher with
# --which on ROOT (and the variables), compare its exit status, and look for
# WANT_TEXT in its output (stdout and stderr).
expect() {
  name=$1 root=$2 want_rc=$3 want=$4
  shift 4
  checks=$((checks + 1))
  out=$(env "$@" SLOTRPC_TEST_SYSFS="$root" "$LAUNCHER" --which 2>&1)
  rc=$?
  echo "[$name] (exit $rc) $out"
  [ "$rc" -eq "$want_rc" ] || fail "$name: exit $rc, expected $want_rc"
  case "$out" in
    *"$want"*) ;;
    *) fail "$name: output lacks '$want'" ;;
  esac
}

# --- the launcher's choice ----------------------------------------------------
mkdir -p "$T/none/class/infiniband"
expect "no devices -> vm" "$T/none" 0 "verbs device suite: Soft-RoCE VM (no RDMA device with an ACTIVE port"
expect "no /sys/class/infiniband at all -> vm" "$T/missing" 0 "Soft-RoCE VM"

port "$T/active" mlx5_0 1 "4: ACTIVE"
expect "an ACTIVE port -> direct" "$T/active" 0 "verbs device suite: direct on mlx5_0 port 1, no VM (auto-detected"

port "$T/down" mlx5_0 1 "1: DOWN"
port "$T/down" mlx5_1 1 "2: INIT"
port "$T/down" mlx5_1 2 "5: ACTIVE_DEFER"
expect "only DOWN/INIT/ACTIVE_DEFER ports -> vm" "$T/down" 0 "Soft-RoCE VM (no RDMA device with an ACTIVE port"
expect "the VM line lists what was found" "$T/down" 0 "mlx5_0 (port 1 DOWN); mlx5_1 (port 1 INIT, port 2 ACTIVE_DEFER)"

port "$T/second" mlx5_0 1 "1: DOWN"
port "$T/second" mlx5_1 1 "1: DOWN"
port "$T/second" mlx5_1 2 "4: ACTIVE"
expect "the first device with an ACTIVE port, on that port" "$T/second" 0 "direct on mlx5_1 port 2"
expect "SLOTRPC_PORT limits the ports looked at" "$T/second" 0 "Soft-RoCE VM (no RDMA device with an ACTIVE port 1" SLOTRPC_PORT=1
expect "SLOTRPC_PORT=2" "$T/second" 0 "direct on mlx5_1 port 2" SLOTRPC_PORT=2

expect "SLOTRPC_TEST_DEVICE=nosuch -> error listing the devices" "$T/second" 125 \
  "SLOTRPC_TEST_DEVICE=nosuch: no such RDMA device under $T/second/class/infiniband; found: mlx5_0 (port 1 DOWN); mlx5_1 (port 1 DOWN, port 2 ACTIVE)" \
  SLOTRPC_TEST_DEVICE=nosuch
expect "SLOTRPC_TEST_DEVICE=nosuch, no devices -> error, found: none" "$T/none" 125 "found: none" SLOTRPC_TEST_DEVICE=nosuch
expect "SLOTRPC_TEST_DEVICE=vm beats an ACTIVE device" "$T/active" 0 "verbs device suite: Soft-RoCE VM (SLOTRPC_TEST_DEVICE=vm)" \
  SLOTRPC_TEST_DEVICE=vm
expect "SLOTRPC_TEST_DEVICE=auto" "$T/active" 0 "direct on mlx5_0 port 1" SLOTRPC_TEST_DEVICE=auto
expect "SLOTRPC_TEST_DEVICE names a device" "$T/second" 0 "direct on mlx5_1 port 2, no VM (SLOTRPC_TEST_DEVICE=mlx5_1" \
  SLOTRPC_TEST_DEVICE=mlx5_1
expect "SLOTRPC_TEST_DEVICE names a device without an ACTIVE port -> error" "$T/second" 125 \
  "SLOTRPC_TEST_DEVICE=mlx5_0: no ACTIVE port" SLOTRPC_TEST_DEVICE=mlx5_0
expect "SLOTRPC_TEST_DEVICE is a name, not a path" "$T/second" 125 "is not a device name" SLOTRPC_TEST_DEVICE=../x

# The error goes to stderr, the choice to stdout.
checks=$((checks + 1))
[ -z "$(SLOTRPC_TEST_SYSFS="$T/none" SLOTRPC_TEST_DEVICE=nosuch "$LAUNCHER" --which 2>/dev/null)" ] ||
  fail "the error for an unknown device is not on stderr alone"

# --- the direct path: the command runs here, on the chosen device -----------
checks=$((checks + 1))
out=$(SLOTRPC_TEST_SYSFS="$T/second" RXE_VM=1 SLOTRPC_DEVICE=other "$LAUNCHER" --cache "$T/c" --timeout 60 -- \
  sh -c 'echo "ran: $SLOTRPC_DEVICE $SLOTRPC_PORT ${RXE_VM:-no-vm} $*"; exit 3' sh a "b c" 2>&1)
rc=$?
echo "[direct run] (exit $rc) $out"
[ "$rc" -eq 3 ] || fail "direct run: exit $rc, expected the command's 3"
case "$out" in
  *"ran: mlx5_1 2 no-vm a b c"*) ;;
  *) fail "direct run: command did not run with SLOTRPC_DEVICE=mlx5_1 SLOTRPC_PORT=2 and RXE_VM unset" ;;
esac
checks=$((checks + 1))
out=$(SLOTRPC_TEST_SYSFS="$T/active" "$LAUNCHER" --timeout 1 -- sleep 30 2>&1)
rc=$?
echo "[direct run, --timeout 1] (exit $rc)"
[ "$rc" -eq 124 ] || fail "direct run with --timeout 1: exit $rc, expected 124"

# --- which RNR counters are compared ------------------------------------------
# rnr_case NAME PORTDIR WANT: rnr_counter_names PORTDIR must print WANT.
rnr_case() {
  checks=$((checks + 1))
  got=$(rnr_counter_names "$2")
  echo "[rnr: $1] ${got:-(none)}"
  [ "$got" = "$3" ] || fail "rnr: $1: got '$got', expected '$3'"
}
R="$T/rxe/ports/1"
mkdir -p "$R/hw_counters"
for c in rcvd_rnr_err send_rnr_err retry_rnr_exceeded_err rcvd_seq_err; do echo 0 >"$R/hw_counters/$c"; done
rnr_case "rxe: exactly rcvd_rnr_err and send_rnr_err" "$R" "hw_counters/rcvd_rnr_err hw_counters/send_rnr_err"
M="$T/mlx5/ports/1"
mkdir -p "$M/hw_counters" "$M/counters"
for c in rnr_nak_retry_err out_of_buffer out_of_sequence duplicate_request local_ack_timeout_err; do
  echo 5 >"$M/hw_counters/$c"
done
for c in port_rcv_errors port_xmit_discards; do echo 1 >"$M/counters/$c"; done
rnr_case "mlx5: rnr_nak_retry_err and out_of_buffer" "$M" "hw_counters/rnr_nak_retry_err hw_counters/out_of_buffer"
E="$T/empty/ports/1"
mkdir -p "$E/counters"
echo 1 >"$E/counters/port_rcv_errors"
rnr_case "no RNR counter" "$E" ""
rnr_case "no port dir" "$T/nosuch/ports/1" ""

checks=$((checks + 1))
before=$(rnr_read "$M" hw_counters/rnr_nak_retry_err hw_counters/out_of_buffer)
d=$(rnr_deltas "$before" "$before") || fail "rnr_deltas: unchanged counters reported as moved: $d"
[ "$d" = "rnr_nak_retry_err +0, out_of_buffer +0" ] || fail "rnr_deltas: '$d'"
echo 7 >"$M/hw_counters/out_of_buffer"
d=$(rnr_deltas "$before" "$(rnr_read "$M" hw_counters/rnr_nak_retry_err hw_counters/out_of_buffer)") &&
  fail "rnr_deltas: a moved counter was not reported"
[ "$d" = "rnr_nak_retry_err +0, out_of_buffer +2" ] || fail "rnr_deltas: '$d'"
rm "$M/hw_counters/out_of_buffer"
d=$(rnr_deltas "$before" "$(rnr_read "$M" hw_counters/rnr_nak_retry_err hw_counters/out_of_buffer)") &&
  fail "rnr_deltas: an unreadable counter was not reported"
echo "[rnr_deltas] $d"

echo "device_suite_choice: $checks checks, $failures failed"
[ "$failures" -eq 0 ]
