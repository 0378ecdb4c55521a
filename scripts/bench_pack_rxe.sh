#!/usr/bin/env bash
# Packing before and after, in ONE boot of the rxe VM
# (tests/rxe/rxe-vm.sh): 64 B calls at 1 and 32 outstanding over verbs and
# TCP, for each slotrpc-bench given, in interleaved rounds (A B C A B C ...)
# so that drift in the emulated machine hits every variant alike.  Around
# each verbs run the script reads rxe0's hw_counters (sent_pkts, rcvd_pkts)
# and reports packets per call.
#
#   scripts/bench_pack_rxe.sh [--out DIR] [--rounds N] [--calls N] NAME=BENCH[@ENV=VALUE] ...
#
# e.g. scripts/bench_pack_rxe.sh before=../build-before/bench/slotrpc-bench \
#        off=build-rel/bench/slotrpc-bench@SLOTRPC_PACK_SMALL=0 on=build-rel/bench/slotrpc-bench
#
# Writes DIR/pack-NAME-ROUND-TRANSPORT.json (slotrpc-bench's format) and
# DIR/pack-summary.txt (one line per run: calls/s and p50 at 1 and 32
# outstanding; verbs: packets per call at 32).  Needs the test-VM packages
# (scripts/install-deps.sh --test-vm).  The figures are emulated CPU time.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)

# --- inside the VM ------------------------------------------------------------
if [[ ${1:-} == --guest ]]; then
  shift
  ROUNDS=$1 CALLS=$2
  shift 2
  OUT=${RXE_VM_RESULTS:?not inside rxe-vm.sh}
  HW=/sys/class/infiniband/rxe0/ports/1/hw_counters
  counter() { cat "$HW/$1" 2>/dev/null || echo 0; }
  for ((r = 1; r <= ROUNDS; r++)); do
    for spec in "$@"; do
      name=${spec%%=*}
      rest=${spec#*=}
      bench=${rest%%@*}
      envs=()
      [[ $rest == *@* ]] && envs=("${rest#*@}")
      for t in verbs tcp; do
        # 32 outstanding first (packets per call are read around it), then 1.
        s0=$(counter sent_pkts)
        r0=$(counter rcvd_pkts)
        env "${envs[@]}" "$bench" --modes throughput --transports "$t" --address 127.0.0.1 \
          --outstanding 32 --channels 1 --warmup 0 --throughput-calls "$CALLS" \
          --json "$OUT/pack-$name-$r-$t-32.json" >/dev/null
        s1=$(counter sent_pkts)
        r1=$(counter rcvd_pkts)
        env "${envs[@]}" "$bench" --modes throughput --transports "$t" --address 127.0.0.1 \
          --outstanding 1 --channels 1 --warmup 200 --throughput-calls "$CALLS" \
          --json "$OUT/pack-$name-$r-$t-1.json" >/dev/null
        python3 - "$OUT" "$name" "$r" "$t" "$CALLS" "$((s1 - s0))" "$((r1 - r0))" <<'PY' | tee -a "$OUT/pack-summary.txt"
import json, sys
out, name, r, t, calls, sent, rcvd = sys.argv[1:8]
def point(n):
    res = json.load(open(f"{out}/pack-{name}-{r}-{t}-{n}.json"))["results"]
    return next(x for x in res if x.get("outstanding") == n)
p32, p1 = point(32), point(1)
line = (f"{name:8} round {r} {t:5}  32 outstanding: {p32['calls_per_s']:9.0f} calls/s p50 {p32['p50_us']:8.1f} us"
        f"   1 outstanding: {p1['calls_per_s']:8.0f} calls/s p50 {p1['p50_us']:7.1f} us")
if t == "verbs":
    line += f"   packets/call at 32: {int(sent) / int(calls):.2f} sent (rcvd {int(rcvd) / int(calls):.2f})"
print(line)
PY
      done
    done
  done
  exit 0
fi

# --- on the host -----------------------------------------------------------------
OUT=bench-results
ROUNDS=3
CALLS=20000
TIMEOUT=2400
specs=()
while (($#)); do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --calls) CALLS=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *=*) specs+=("$1"); shift ;;
    *) printf 'bench_pack_rxe.sh: unknown argument %s\n' "$1" >&2; exit 2 ;;
  esac
done
((${#specs[@]})) || { echo "bench_pack_rxe.sh: name at least one NAME=BENCH" >&2; exit 2; }
cd "$ROOT"
abs=()
for spec in "${specs[@]}"; do
  name=${spec%%=*}
  rest=${spec#*=}
  bench=$(realpath "${rest%%@*}")
  [[ -x $bench ]] || { echo "bench_pack_rxe.sh: $bench is not executable" >&2; exit 2; }
  [[ $rest == *@* ]] && bench="$bench@${rest#*@}"
  abs+=("$name=$bench")
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
pgrep -f qemu-system >/dev/null && { echo "bench_pack_rxe.sh: another VM is running" >&2; exit 1; }
results=$(mktemp -d)
trap 'rm -rf -- "$results"' EXIT
SLOTRPC_UNIX_PATH=off SLOTRPC_LOG_LEVEL=warn tests/rxe/rxe-vm.sh --cache build-rel/rxe-cache --timeout "$TIMEOUT" \
  --results "$results" -- "$ROOT/scripts/bench_pack_rxe.sh" --guest "$ROUNDS" "$CALLS" "${abs[@]}"
cp "$results"/pack-* "$OUT"/
