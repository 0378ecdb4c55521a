#!/bin/sh
# Run by run_verbs_tests.sh (in the Soft-RoCE VM or directly on a host's
# device): 60 KB echoes over verbs (examples/echo, one call at a time) must
# cause no more transport retransmissions than perftest's ib_write_lat
# causes for the same traffic in the same VM.
#
# Why a bound and not zero: rxe retransmits on its own.  Its retransmit
# timer is pushed back only when the completer finishes with packets still
# unacknowledged, so while messages keep it busy it fires about once per ACK
# timeout and the requester resends what is in flight (go-back-N): one
# completer_retry_err and up to one message's packets of duplicate_request,
# with nothing lost.  perftest shows the same at 60 KB (docs/benchmarks.md,
# "Verbs on Soft-RoCE").  So the bound is what perftest causes per second
# of traffic at the same ACK timeout, twice, over as long as slotrpc's run
# took, plus what the timer alone may cause: one expiry per timeout on each
# of the two QPs, plus two.  Duplicates are bounded by the same count times
# one message's packets (61440 / MTU, rounded up, + 1).
#
# A canary proves the counters and the bound can see a fault: the same run
# with a 16 ms ACK timeout (SLOTRPC_QP_TIMEOUT=12) must exceed the bound
# computed for the default timeout; if it does not, the test fails.
#
# Device counters: rxe's completer_retry_err and duplicate_request (inside
# the VM they must exist).  On a device without them the run is said to be
# NOT checked and the test fails only if the echo fails.
# QP_TIMEOUT: slotrpc's default ACK timeout exponent (tests/verbs/meson.build
# passes it; tests/config_test.cc pins the same default).
set -u
: "${ECHO_SERVER:?ECHO_SERVER not set}" "${ECHO_CLIENT:?ECHO_CLIENT not set}" "${QP_TIMEOUT:?QP_TIMEOUT not set}"
DEV=${SLOTRPC_DEVICE:-rxe0}
PORT=${SLOTRPC_PORT:-1}
C=/sys/class/infiniband/$DEV/ports/$PORT/hw_counters
N=${RETRANSMIT_CALLS:-500}
SIZE=61440
dir=$(mktemp -d)
fail=0
say() { echo "retransmits_over_verbs: $*"; }
if [ ! -r "$C/completer_retry_err" ] || [ ! -r "$C/duplicate_request" ]; then
  if [ -n "${RXE_VM:-}" ]; then say "inside the VM but no completer_retry_err/duplicate_request in $C"; exit 1; fi
  counters=no
else
  counters=yes
fi
now() { date +%s.%N; }
# snap: "retries duplicates" now.
snap() { [ $counters = yes ] && echo "$(cat "$C/completer_retry_err") $(cat "$C/duplicate_request")" || echo "0 0"; }
# delta BEFORE AFTER T0 T1: "retries duplicates seconds".
delta() { echo "$1 $2" | awk -v t0="$3" -v t1="$4" '{ printf "%d %d %.3f\n", $3 - $1, $4 - $2, t1 - t0 }'; }
mtu=$(ibv_devinfo -d "$DEV" -i "$PORT" 2>/dev/null | awk '/active_mtu/ { print $2; exit }')
[ -n "$mtu" ] || mtu=1024

# perftest: N round trips of 60 KB RDMA WRITEs, at slotrpc's ACK timeout.
PP=$((18700 + $$ % 1000))
timeout 300 ib_write_lat -d "$DEV" -i "$PORT" -x 0 -s $SIZE -n "$N" -u "$QP_TIMEOUT" -F -p $PP >"$dir/pt-server" 2>&1 &
ps=$!
i=0
until awk -v p=":$(printf '%04X' $PP)" '$2 ~ p"$" && $4 == "0A" { f = 1 } END { exit !f }' /proc/net/tcp 2>/dev/null \
  || [ $i -ge 100 ]; do sleep 0.1; i=$((i + 1)); done
b=$(snap); t0=$(now)
timeout 300 ib_write_lat -d "$DEV" -i "$PORT" -x 0 -s $SIZE -n "$N" -u "$QP_TIMEOUT" -F -p $PP 127.0.0.1 >"$dir/pt-client" 2>&1
prc=$?
t1=$(now); a=$(snap)
wait $ps
perftest=$(delta "$b" "$a" "$t0" "$t1")
if [ $prc -ne 0 ]; then say "ib_write_lat failed (exit $prc)"; cat "$dir/pt-client" "$dir/pt-server"; rm -rf "$dir"; exit 1; fi
say "perftest ib_write_lat $SIZE B x $N, ACK timeout 2^$QP_TIMEOUT x 4.096 us: retries duplicates seconds = $perftest"

SLOTRPC_TRANSPORT=verbs "$ECHO_SERVER" --listen 127.0.0.1:0 --port-file "$dir/port" >"$dir/server.log" 2>&1 &
pid=$!
i=0
while [ ! -s "$dir/port" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
if [ ! -s "$dir/port" ]; then say "server did not start"; cat "$dir/server.log"; kill $pid 2>/dev/null; exit 1; fi
# echo_run [ENV...]: N calls of 60 KB, one at a time; prints "retries
# duplicates seconds" and leaves echo_client's output in client.log.
echo_run() {
  b=$(snap); t0=$(now)
  env SLOTRPC_TRANSPORT=verbs "$@" "$ECHO_CLIENT" --connect "127.0.0.1:$(cat "$dir/port")" \
    --count "$N" --size $SIZE --outstanding 1 >"$dir/client.log" 2>&1
  echo $? >"$dir/client.rc"
  t1=$(now); a=$(snap)
  delta "$b" "$a" "$t0" "$t1"
}
slotrpc=$(echo_run)
rc=$(cat "$dir/client.rc")
grep -q "$N ok, 0 failed" "$dir/client.log" && grep -q "over verbs" "$dir/client.log" || rc=1
[ "$rc" -eq 0 ] || { say "echo_client failed"; cat "$dir/client.log"; fail=1; }
say "slotrpc echo $SIZE B x $N, default ACK timeout: retries duplicates seconds = $slotrpc"
canary=$(echo_run SLOTRPC_QP_TIMEOUT=12)
say "canary (SLOTRPC_QP_TIMEOUT=12): retries duplicates seconds = $canary"
kill $pid 2>/dev/null; wait $pid 2>/dev/null

# bound SECONDS: the retries allowed for a run of SECONDS; prints "retries duplicates".
bound() {
  echo "$perftest" | awk -v s="$1" -v to="$QP_TIMEOUT" -v size=$SIZE -v mtu="$mtu" '{
    timer = 4.096e-6 * 2 ^ to
    rate = $3 > 0 ? $1 / $3 : 0
    r = 2 * rate * s + 2 * int(s / timer + 1) + 2
    printf "%d %d\n", r, r * (int((size + mtu - 1) / mtu) + 1)
  }'
}
if [ $counters = yes ]; then
  set -- $slotrpc; sr=$1 sd=$2 ss=$3
  set -- $(bound "$ss"); br=$1 bd=$2
  say "bound for $ss s: $br retries, $bd duplicates"
  [ "$sr" -le "$br" ] || { say "slotrpc caused $sr retries, over the bound of $br"; fail=1; }
  [ "$sd" -le "$bd" ] || { say "slotrpc caused $sd duplicate requests, over the bound of $bd"; fail=1; }
  set -- $canary; cr=$1 cs=$3
  set -- $(bound "$cs"); cb=$1
  if [ "$cr" -le "$cb" ]; then
    say "canary: $cr retries with a 16 ms ACK timeout, within the bound of $cb: the check cannot see a fault"
    fail=1
  fi
else
  say "$DEV exposes no completer_retry_err/duplicate_request: retransmits NOT checked"
fi
rm -rf "$dir"
[ $fail -eq 0 ] && say PASS
exit $fail
