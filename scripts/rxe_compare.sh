#!/usr/bin/env bash
# The verbs comparison, in ONE boot of the Soft-RoCE VM (tests/rxe/rxe-vm.sh):
# the device's floor (perftest's ib_send_lat), UCX's active messages
# (ucx_perftest ucp_am_lat / ucp_am_bw over rc_verbs on rxe0), and slotrpc's
# echo_bench over verbs at 64 B, 4 KiB and 60 KB with 1 and 32 calls in
# flight, for one or more builds run alternately, round after round.  Every
# phase also reads rxe0's hardware counters before and after, so the
# retransmits each pattern causes are counted per message beside perftest's
# and UCX's.
#
#   scripts/rxe_compare.sh [--build DIR]... [--rounds N] [--sizes LIST] [--out DIR] [--timeout S]
#
#   --build DIR   a meson build directory (default: build); give it twice or
#                 more to compare builds (e.g. a branch and main) in the same
#                 boot: their runs alternate, in a rotated order each round.
#                 DIR/bench/echo_bench is built first when DIR has build.ninja.
#   --rounds N    slotrpc rounds per build (default 3)
#   --sizes LIST  slotrpc's message sizes, from 64, 4096 and 61440
#                 (default all three, comma-separated)
#   --out DIR     where the raw output and summary.txt go (default
#                 rxe-compare/, created)
#   --timeout S   host-side bound on the VM run (default 1800)
#
# Prints, per build and point, the median over rounds of p50 and calls/s,
# the p50's ratio to the device floor (2 x ib_send_lat typical: a round trip
# is two sends) and to UCX's ucp_am_lat round trip (2 x its one-way 50th
# percentile), and the retransmit counters (completer_retry_err,
# duplicate_request) per message sent, beside the same for perftest and UCX.
# The VM emulates the CPU (qemu TCG), so CPU per call is magnified many
# times: compare ratios in one boot, not absolute figures across boots.
# Needs scripts/install-deps.sh --test-vm (qemu, perftest, ucx-utils).
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
DEV=rxe0
COUNTERS=/sys/class/infiniband/$DEV/ports/1/hw_counters
# Calls per echo_bench point: enough for a stable p50 at each size, few
# enough that a round of one build stays near ten seconds under emulation.
declare -A CALLS=([64]=20000 [4096]=5000 [61440]=1000)

# --- inside the VM ------------------------------------------------------------
if [[ ${1:-} == --guest ]]; then
  ROUNDS=$2
  IFS=, read -r -a SIZES <<<"$3"
  shift 3
  BENCHES=("$@")
  OUT=${RXE_VM_RESULTS:?not inside rxe-vm.sh}
  # snap FILE: every hardware counter of rxe0, "name value" per line.
  snap() { for f in "$COUNTERS"/*; do echo "${f##*/} $(cat "$f")"; done >"$1"; }
  # phase NAME MESSAGES CMD...: runs CMD with counters read around it; the
  # counters' deltas and the messages the phase sent go to OUT/NAME.ctr.
  phase() {
    local name=$1 msgs=$2 rc=0
    shift 2
    snap /tmp/before
    "$@" >"$OUT/$name.out" 2>"$OUT/$name.err" || rc=$?
    snap /tmp/after
    { echo "messages $msgs"; join /tmp/before /tmp/after | awk '{ print $1, $3 - $2 }'; } >"$OUT/$name.ctr"
    ((rc == 0)) || { echo "phase $name failed (exit $rc)"; tail -n 20 "$OUT/$name.err"; }
    return $rc
  }
  # wait_port PORT: until a TCP listener is on PORT (10 s at most).
  wait_port() {
    local hex i
    hex=$(printf '%04X' "$1")
    for ((i = 0; i < 100; i++)); do
      awk -v p=":$hex" '$2 ~ p"$" && $4 == "0A" { f = 1 } END { exit !f }' /proc/net/tcp /proc/net/tcp6 && return 0
      sleep 0.1
    done
    return 1
  }
  # pair PORT SERVER_CMD -- CLIENT_CMD: a server in the background, then the
  # client against it on 127.0.0.1; the client's output is the phase's.
  pair() {
    local port=$1 srv rc=0
    shift
    local server=()
    while [[ $1 != -- ]]; do server+=("$1"); shift; done
    shift
    timeout 300 "${server[@]}" >/tmp/server.out 2>&1 &
    srv=$!
    wait_port "$port" || { cat /tmp/server.out >&2; kill "$srv" 2>/dev/null; return 1; }
    timeout 300 "$@" || rc=$?
    wait "$srv" || true
    return $rc
  }
  echo "guest: $(nproc) CPUs, $(awk -F: '/^model name/ { print $2; exit }' /proc/cpuinfo), kernel $(uname -r)"
  # The device's floor: ib_send_lat 64 B and 4 KiB (one-way, half the round trip).
  P=18520
  # perftest calibrates its clock against gettimeofday; under TCG that
  # sometimes fails and every figure is inf: then cycles (-C) / MHz.
  mhz=$(awk -F: '/^cpu MHz/ { gsub(/ /, "", $2); print $2; exit }' /proc/cpuinfo)
  for s in 64 4096; do
    for clock in "" -C; do
      phase "perftest-$s" $((2 * 2000)) pair $P ib_send_lat -d $DEV -x 0 -s $s -n 2000 -p $P -F $clock -- \
        ib_send_lat -d $DEV -x 0 -s $s -n 2000 -p $P -F $clock 127.0.0.1
      grep -A1 -m1 '#bytes' "$OUT/perftest-$s.out" | tail -n 1 | grep -q inf || break
      echo "$mhz" >"$OUT/perftest-$s.mhz"
    done
  done
  # UCX active messages over RC verbs on rxe0 (one-way latency, half the round trip).
  export UCX_TLS=rc_v UCX_NET_DEVICES=$DEV:1 UCX_WARN_UNUSED_ENV_VARS=n
  U=13337
  for s in 64 4096 61440; do
    phase "ucx-lat-$s" $((2 * 2000)) pair $U ucx_perftest -p $U -- \
      ucx_perftest 127.0.0.1 -p $U -t ucp_am_lat -s $s -n 2000
  done
  for s in 64 4096; do
    phase "ucx-bw-$s" 20000 pair $U ucx_perftest -p $U -- \
      ucx_perftest 127.0.0.1 -p $U -t ucp_am_bw -s $s -n 20000
  done
  unset UCX_TLS UCX_NET_DEVICES
  # slotrpc: every build once per round, in a rotated order.
  n=${#BENCHES[@]}
  for ((r = 1; r <= ROUNDS; r++)); do
    for ((k = 0; k < n; k++)); do
      b=$(((k + r - 1) % n))
      for s in "${SIZES[@]}"; do
        c=${CALLS[$s]}
        # A call is two messages; echo_bench runs 1 and then 32 outstanding.
        phase "slotrpc-b$b-r$r-$s" $((2 * 2 * c)) env SLOTRPC_TRANSPORT=verbs SLOTRPC_POLL_MODE=busy \
          "${BENCHES[$b]}" --calls "$c" --sizes "$s" --outstanding 1,32
      done
    done
  done
  exit 0
fi

# --- on the host -----------------------------------------------------------------
BUILDS=()
ROUNDS=3
SIZE_LIST=64,4096,61440
OUT=rxe-compare
TIMEOUT=1800
while (($#)); do
  case "$1" in
    --build) BUILDS+=("$2"); shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --sizes) SIZE_LIST=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    -h | --help) sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) printf 'rxe_compare.sh: unknown argument %s (see --help)\n' "$1" >&2; exit 2 ;;
  esac
done
((${#BUILDS[@]})) || BUILDS=(build)
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "rxe_compare.sh: --rounds takes a whole number from 1, not '$ROUNDS'" >&2; exit 2; }
IFS=, read -r -a sizes <<<"$SIZE_LIST"
for s in "${sizes[@]}"; do
  [[ -n ${CALLS[$s]:-} ]] || { echo "rxe_compare.sh: --sizes takes 64, 4096 and 61440, not '$s'" >&2; exit 2; }
done
for t in ib_send_lat ucx_perftest qemu-system-x86_64; do
  command -v "$t" >/dev/null || { echo "rxe_compare.sh: $t missing (scripts/install-deps.sh --test-vm)" >&2; exit 2; }
done
BENCHES=()
for b in "${BUILDS[@]}"; do
  b=$(cd "$b" && pwd) || { echo "rxe_compare.sh: no build directory $b" >&2; exit 2; }
  [[ -f $b/build.ninja ]] && meson compile -C "$b" bench/echo_bench >/dev/null
  [[ -x $b/bench/echo_bench ]] || { echo "rxe_compare.sh: $b/bench/echo_bench missing (configure with -Dbench=true)" >&2; exit 2; }
  BENCHES+=("$b/bench/echo_bench")
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT"/*.out "$OUT"/*.err "$OUT"/*.ctr "$OUT"/*.mhz
printf '%s\n' "${BENCHES[@]}" >"$OUT/builds.txt"
for ((i = 0; i < 180; i++)); do
  pgrep -f qemu-system >/dev/null || break
  ((i % 6 == 0)) && echo "rxe_compare.sh: another VM is running; waiting for it" >&2
  sleep 10
done
pgrep -f qemu-system >/dev/null && { echo "rxe_compare.sh: another VM still runs after 30 min" >&2; exit 1; }
cache=${RXE_VM_CACHE:-$ROOT/build-rxe-cache}
SLOTRPC_UNIX_PATH=off SLOTRPC_LOG_LEVEL=warn "$ROOT/tests/rxe/rxe-vm.sh" --cache "$cache" --timeout "$TIMEOUT" \
  --results "$OUT" -- "$ROOT/scripts/rxe_compare.sh" --guest "$ROUNDS" "$SIZE_LIST" "${BENCHES[@]}"
python3 "$ROOT/scripts/rxe_compare_summary.py" "$OUT" | tee "$OUT/summary.txt"
