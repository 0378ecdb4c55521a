#!/usr/bin/env bash
# Contiguous-run merging over verbs, in ONE boot of the rxe VM: the server
# pulls a 64 MiB request segment (mode bulk-read) into one registered buffer
# as one range, as a scatter list of adjacent 4 KiB pages in one read_bulk,
# and page by page (one read_bulk each), in interleaved rounds; rxe0's
# sent_pkts is read around each.
#
#   scripts/bench_pages_rxe.sh [--out DIR] [--rounds N] [--build DIR] [--size BYTES]
#
# Writes DIR/pages-VARIANT-ROUND.json (slotrpc-bench's format) and
# DIR/pages-summary.txt.  Needs the test-VM packages
# (scripts/install-deps.sh --test-vm).  The figures are emulated CPU time.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)

if [[ ${1:-} == --guest ]]; then
  BENCH=$2 ROUNDS=$3 SIZE=$4
  OUT=${RXE_VM_RESULTS:?not inside rxe-vm.sh}
  HW=/sys/class/infiniband/rxe0/ports/1/hw_counters
  for ((r = 1; r <= ROUNDS; r++)); do
    for v in range pages per-page; do
      args=() calls=10
      case $v in
        pages) args=(--bulk-pages 4096) ;;
        per-page) args=(--bulk-pages 4096 --bulk-per-page) calls=2 ;;
      esac
      s0=$(cat "$HW/sent_pkts")
      "$BENCH" --modes bulk-read --transports bulk-verbs --address 127.0.0.1 --bulk-sizes "$SIZE" \
        --bulk-calls "$calls" "${args[@]}" --json "$OUT/pages-$v-$r.json" >/dev/null
      s1=$(cat "$HW/sent_pkts")
      python3 - "$OUT/pages-$v-$r.json" "$v" "$r" "$calls" "$((s1 - s0))" <<'PY' | tee -a "$OUT/pages-summary.txt"
import json, sys
path, v, r, calls, sent = sys.argv[1:6]
x = json.load(open(path))["results"][0]
# Every call is counted: the 2 warm-up calls too.
n = int(calls) + 2
print(f"{v:9} round {r}  {x['size']} B  p50 {x['p50_us'] / 1000:9.1f} ms  {x['mb_per_s']:8.1f} MB/s"
      f"  sent_pkts per call {int(sent) / n:10.1f}")
PY
    done
  done
  exit 0
fi

OUT=bench-results
ROUNDS=3
BUILD=build-rel
SIZE=67108864
while (($#)); do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    -h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) printf 'bench_pages_rxe.sh: unknown argument %s\n' "$1" >&2; exit 2 ;;
  esac
done
cd "$ROOT"
meson compile -C "$BUILD" bench/slotrpc-bench >/dev/null
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
pgrep -f qemu-system >/dev/null && { echo "bench_pages_rxe.sh: another VM is running" >&2; exit 1; }
results=$(mktemp -d)
trap 'rm -rf -- "$results"' EXIT
SLOTRPC_UNIX_PATH=off SLOTRPC_LOG_LEVEL=warn tests/rxe/rxe-vm.sh --cache "$BUILD/rxe-cache" --timeout 2400 \
  --results "$results" -- "$ROOT/scripts/bench_pages_rxe.sh" --guest "$ROOT/$BUILD/bench/slotrpc-bench" "$ROUNDS" "$SIZE"
cp "$results"/pages-* "$OUT"/
