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
# The counters are shown to be live, not only readable: rxe's sent_pkts
# must rise by at least one message's packets per round trip during each
# slotrpc run, or the test fails (a check reading dead counters would pass
# whatever slotrpc did).
#
# A canary reports what a 1 ms ACK timeout (SLOTRPC_QP_TIMEOUT=8; rxe
# rounds it up to one jiffy) with 32 calls in flight causes, beside the
# bound.  It does not decide the test: whether such a timeout fires depends
# on how fast the emulated VM runs, not on slotrpc.  It exceeded the bound
# in every round in boots on a loaded host (10 to 22 retries), and caused
# none at all in any round of a boot on a quiet one (ASan build, 4 and 32
# in flight), and the VM has no netem to delay acknowledgements on purpose.
#
# Why a loaded host cannot make it pass or fail wrongly.  The emulated VM's
# speed follows the host's load, and so does what perftest causes per
# second.  Measured once up front, the bound came from one load and the
# slotrpc and canary runs ran under another, a minute later (the canary
# once stayed within its bound on a loaded host).  So the three runs are interleaved
# in ROUNDS rounds (perftest, slotrpc, canary; N / ROUNDS round trips each)
# and every run is held to the bound of its own round's perftest, measured
# seconds before it under the same load.  A fault shows in every round; a
# burst of load spans at most a round or two: slotrpc fails when it exceeds
# its round's bound in a majority of rounds.  Each bound
# also grows with the run's own seconds, so a run slowed by load gets more
# room from the timer term, never less.
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
# packets: rxe's sent_pkts now (0 without counters).
packets() { [ $counters = yes ] && [ -r "$C/sent_pkts" ] && cat "$C/sent_pkts" || echo 0; }
# snap: "retries duplicates" now.
snap() { [ $counters = yes ] && echo "$(cat "$C/completer_retry_err") $(cat "$C/duplicate_request")" || echo "0 0"; }
# delta BEFORE AFTER T0 T1: "retries duplicates seconds".
delta() { echo "$1 $2" | awk -v t0="$3" -v t1="$4" '{ printf "%d %d %.3f\n", $3 - $1, $4 - $2, t1 - t0 }'; }
mtu=$(ibv_devinfo -d "$DEV" -i "$PORT" 2>/dev/null | awk '/active_mtu/ { print $2; exit }')
[ -n "$mtu" ] || mtu=1024

ROUNDS=${RETRANSMIT_ROUNDS:-3}
CANARY_TIMEOUT=8  # 4.096 us x 2^8: about 1 ms
CANARY_OUTSTANDING=${RETRANSMIT_CANARY_OUTSTANDING:-32}
NR=$(( (N + ROUNDS - 1) / ROUNDS ))  # round trips per run

# perftest_run: NR round trips of 60 KB RDMA WRITEs at slotrpc's ACK
# timeout; prints "retries duplicates seconds" (exit 1 if it failed).
perftest_run() {
  PP=$((18700 + ($$ + round) % 1000))
  timeout 300 ib_write_lat -d "$DEV" -i "$PORT" -x 0 -s $SIZE -n "$NR" -u "$QP_TIMEOUT" -F -p $PP >"$dir/pt-server" 2>&1 &
  ps=$!
  i=0
  until awk -v p=":$(printf '%04X' $PP)" '$2 ~ p"$" && $4 == "0A" { f = 1 } END { exit !f }' /proc/net/tcp 2>/dev/null \
    || [ $i -ge 100 ]; do sleep 0.1; i=$((i + 1)); done
  b=$(snap); t0=$(now)
  timeout 300 ib_write_lat -d "$DEV" -i "$PORT" -x 0 -s $SIZE -n "$NR" -u "$QP_TIMEOUT" -F -p $PP 127.0.0.1 >"$dir/pt-client" 2>&1
  prc=$?
  t1=$(now); a=$(snap)
  wait $ps
  [ $prc -eq 0 ] || { cat "$dir/pt-client" "$dir/pt-server" >&2; return 1; }
  delta "$b" "$a" "$t0" "$t1"
}

SLOTRPC_TRANSPORT=verbs "$ECHO_SERVER" --listen 127.0.0.1:0 --port-file "$dir/port" >"$dir/server.log" 2>&1 &
pid=$!
i=0
while [ ! -s "$dir/port" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
if [ ! -s "$dir/port" ]; then say "server did not start"; cat "$dir/server.log"; kill $pid 2>/dev/null; exit 1; fi
# echo_run OUTSTANDING [ENV...]: NR calls of 60 KB, OUTSTANDING at a time;
# prints "retries duplicates seconds" and leaves echo_client's output in
# client.log.
echo_run() {
  out=$1; shift
  b=$(snap); t0=$(now)
  env SLOTRPC_TRANSPORT=verbs "$@" "$ECHO_CLIENT" --connect "127.0.0.1:$(cat "$dir/port")" \
    --count "$NR" --size $SIZE --outstanding "$out" >"$dir/client.log" 2>&1
  echo $? >"$dir/client.rc"
  t1=$(now); a=$(snap)
  delta "$b" "$a" "$t0" "$t1"
}

# bound PERFTEST SECONDS: the retries allowed for a run of SECONDS next to
# perftest's "retries duplicates seconds"; prints "retries duplicates".
# perftest's rate per second, twice, plus what the timer alone may cause:
# one expiry per timeout on each of the two QPs, plus two.  Duplicates:
# the same count times one message's packets (61440 / MTU, rounded up, + 1).
bound() {
  echo "$1" | awk -v s="$2" -v to="$QP_TIMEOUT" -v size=$SIZE -v mtu="$mtu" '{
    timer = 4.096e-6 * 2 ^ to
    rate = $3 > 0 ? $1 / $3 : 0
    r = 2 * rate * s + 2 * int(s / timer + 1) + 2
    printf "%d %d\n", r, r * (int((size + mtu - 1) / mtu) + 1)
  }'
}

over=0    # rounds in which slotrpc exceeded its bound
seen=0    # rounds in which the canary exceeded its bound
round=1
while [ $round -le $ROUNDS ]; do
  perftest=$(perftest_run) || { say "round $round: ib_write_lat failed"; kill $pid 2>/dev/null; rm -rf "$dir"; exit 1; }
  say "round $round: perftest ib_write_lat $SIZE B x $NR, ACK timeout 2^$QP_TIMEOUT x 4.096 us: retries duplicates seconds = $perftest"
  p0=$(packets)
  slotrpc=$(echo_run 1)
  p1=$(packets)
  rc=$(cat "$dir/client.rc")
  if [ $counters = yes ]; then
    per_msg=$(( (SIZE + mtu - 1) / mtu ))
    if [ $((p1 - p0)) -lt $((NR * per_msg)) ]; then
      say "round $round: rxe0's sent_pkts rose by $((p1 - p0)), under the $((NR * per_msg)) packets $NR messages of $SIZE B need: the counters are not live"
      fail=1
    fi
  fi
  grep -q "$NR ok, 0 failed" "$dir/client.log" && grep -q "over verbs" "$dir/client.log" || rc=1
  [ "$rc" -eq 0 ] || { say "round $round: echo_client failed"; cat "$dir/client.log"; fail=1; }
  say "round $round: slotrpc echo $SIZE B x $NR, default ACK timeout: retries duplicates seconds = $slotrpc"
  canary=$(echo_run "$CANARY_OUTSTANDING" SLOTRPC_QP_TIMEOUT=$CANARY_TIMEOUT)
  say "round $round: canary (SLOTRPC_QP_TIMEOUT=$CANARY_TIMEOUT, $CANARY_OUTSTANDING in flight): retries duplicates seconds = $canary"
  if [ $counters = yes ]; then
    set -- $slotrpc; sr=$1 sd=$2 ss=$3
    set -- $(bound "$perftest" "$ss"); br=$1 bd=$2
    if [ "$sr" -gt "$br" ] || [ "$sd" -gt "$bd" ]; then
      over=$((over + 1))
      say "round $round: slotrpc caused $sr retries, $sd duplicates: over the bound of $br, $bd for $ss s"
    else
      say "round $round: slotrpc within the bound of $br retries, $bd duplicates for $ss s"
    fi
    set -- $canary; cr=$1 cs=$3
    set -- $(bound "$perftest" "$cs"); cb=$1
    if [ "$cr" -gt "$cb" ]; then
      seen=$((seen + 1))
      say "round $round: canary $cr retries, over the bound of $cb for $cs s (seen)"
    else
      say "round $round: canary $cr retries, within the bound of $cb for $cs s (not seen)"
    fi
  fi
  round=$((round + 1))
done
kill $pid 2>/dev/null; wait $pid 2>/dev/null

majority=$((ROUNDS / 2 + 1))
if [ $counters = yes ]; then
  if [ $over -ge $majority ]; then
    say "slotrpc exceeded its bound in $over of $ROUNDS rounds"; fail=1
  fi
  say "canary: a 1 ms ACK timeout exceeded the bound in $seen of $ROUNDS rounds (reported, not judged; see the top of this script)"
else
  say "$DEV exposes no completer_retry_err/duplicate_request: retransmits NOT checked"
fi
rm -rf "$dir"
[ $fail -eq 0 ] && say PASS
exit $fail
