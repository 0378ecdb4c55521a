#!/usr/bin/env bash
# Bulk payloads on verbs beside perftest, in ONE boot of the
# Soft-RoCE VM (tests/rxe/rxe-vm.sh): perftest's ib_read_bw and ib_write_bw
# on rxe0, then slotrpc-bench's bulk-read (the handler pulls SIZE bytes:
# RDMA READ) and bulk-write (it pushes them: RDMA WRITE) over verbs, at the
# same sizes.  Under TCG the device moves tens of MB/s; the ratios are what
# this is for, not the absolute figures.
#
#   scripts/bench_bulk_rxe.sh [--out DIR] [--build DIR] [--timeout SECONDS]
#
# Writes DIR/rxe-bulk-perftest.json, DIR/rxe-bulk.json and
# DIR/rxe-bulk-deep.json (slotrpc-bench's format), and
# DIR/rxe-bulk-summary.txt: per size, slotrpc's MB/s over perftest's
# (perftest's MB is 2^20 bytes, slotrpc-bench's 10^6: both are turned
# into bytes per second here).  slotrpc moves one call at a time
# (request, transfer, reply) in the first pass, DEEP calls at once in the
# second; perftest keeps its send queue full.
# Only one VM at a time: waits (up to 30 min) while another qemu-system runs.
set -euo pipefail
ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
SIZES=(65536 1048576 16777216 268435456)
ITERS=(500 50 10 5)
# The second slotrpc pass: DEEP calls in flight (BULK_RXE_DEEP, default 8),
# each with its own 2 x SIZE buffers (the VM has 2 GiB), at the sizes where
# one call at a time is bound by the per-call round trips.
DEEP=${BULK_RXE_DEEP:-8}
DEEP_SIZES=(65536 1048576 16777216)

if [[ ${1:-} == --guest ]]; then
  BENCH=$2
  OUT=${RXE_VM_RESULTS:?not inside rxe-vm.sh}
  DEV=rxe0
  PORT=18521
  perf() {  # perf TEST SIZE ITERS: server + client on 127.0.0.1
    local test=$1 size=$2 iters=$3 srv i
    local args=(-d "$DEV" -x 0 -s "$size" -n "$iters" -p "$PORT")
    timeout 600 "$test" "${args[@]}" >"/tmp/$test.server" 2>&1 &
    srv=$!
    for ((i = 0; i < 300; i++)); do
      cat /proc/net/tcp 2>/dev/null | awk -v p=":$(printf '%04X' "$PORT")" '$2 ~ p"$" && $4 == "0A" {f=1} END {exit !f}' && break
      sleep 0.1
    done
    timeout 600 "$test" "${args[@]}" 127.0.0.1 >"/tmp/$test.client" 2>&1 || { cat "/tmp/$test.client" "/tmp/$test.server"; return 1; }
    wait "$srv" || true
    grep -A1 -m1 '#bytes' "/tmp/$test.client" | tail -n 1 | tee -a "$OUT/$test.txt"
  }
  echo "== perftest on $DEV"
  for t in ib_read_bw ib_write_bw; do
    for k in "${!SIZES[@]}"; do perf "$t" "${SIZES[$k]}" "${ITERS[$k]}"; done
  done
  # One run per size, with as many calls as perftest's iterations of that
  # size (SIZE x ITERS bytes; 5 calls of 64 KiB measured mostly noise);
  # the --guest-merge step joins their JSON files.
  echo "== slotrpc-bench bulk-read, bulk-write over verbs"
  for k in "${!SIZES[@]}"; do
    "$BENCH" --modes bulk-read,bulk-write --transports bulk-verbs --address 127.0.0.1 \
      --bulk-sizes "${SIZES[$k]}" --bulk-calls "${ITERS[$k]}" --json "$OUT/rxe-bulk-$k.json"
  done
  echo "== the same with ${DEEP} calls in flight (perftest keeps its queue full too)"
  for k in "${!DEEP_SIZES[@]}"; do
    "$BENCH" --modes bulk-read,bulk-write --transports bulk-verbs --address 127.0.0.1 \
      --bulk-sizes "${DEEP_SIZES[$k]}" --bulk-calls "$((ITERS[k] > 8 * DEEP ? ITERS[k] : 8 * DEEP))" \
      --bulk-outstanding "$DEEP" --json "$OUT/rxe-bulk-deep-$k.json"
  done
  exit 0
fi

OUT=bench-results
BUILD=build-rel
TIMEOUT=2400
while (($#)); do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) printf 'bench_bulk_rxe.sh: unknown argument %s\n' "$1" >&2; exit 2 ;;
  esac
done
cd "$ROOT"
command -v ib_read_bw >/dev/null || { echo "bench_bulk_rxe.sh: perftest missing (scripts/install-deps.sh --test-vm)" >&2; exit 2; }
meson compile -C "$BUILD" bench/slotrpc-bench >/dev/null
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
for ((i = 0; i < 180; i++)); do
  pgrep -f qemu-system >/dev/null || break
  ((i % 6 == 0)) && echo "bench_bulk_rxe.sh: another VM is running; waiting for it" >&2
  sleep 10
done
pgrep -f qemu-system >/dev/null && { echo "bench_bulk_rxe.sh: another VM still runs after 30 min" >&2; exit 1; }
results=$(mktemp -d)
trap 'rm -rf -- "$results"' EXIT
BULK_RXE_DEEP=$DEEP RXE_VM_PASS_ENV=BULK_RXE_DEEP SLOTRPC_UNIX_PATH=off SLOTRPC_LOG_LEVEL=warn tests/rxe/rxe-vm.sh --cache "$BUILD/rxe-cache" --timeout "$TIMEOUT" \
  --results "$results" -- "$ROOT/scripts/bench_bulk_rxe.sh" --guest "$ROOT/$BUILD/bench/slotrpc-bench"
cp "$results"/ib_read_bw.txt "$results"/ib_write_bw.txt "$OUT"/
python3 - "$OUT" "$results" <<'PY' | tee "$OUT/rxe-bulk-summary.txt"
import glob, json, sys
out, results = sys.argv[1], sys.argv[2]
# The per-size runs, joined: one file per pass (run info of the first).
for name in ("rxe-bulk", "rxe-bulk-deep"):
    files = sorted(glob.glob(f"{results}/{name}-[0-9]*.json"))
    doc = json.load(open(files[0]))
    for f in files[1:]:
        doc["results"] += json.load(open(f))["results"]
    json.dump(doc, open(f"{out}/{name}.json", "w"), indent=1)
perf = {}
res = []
for t in ("ib_read_bw", "ib_write_bw"):
    for line in open(f"{out}/{t}.txt"):
        f = line.split()
        if len(f) < 5:
            continue
        size, bw = int(f[0]), float(f[3]) * 1048576  # BW average, MB = 2^20
        perf[(t, size)] = bw
        res.append({"test": t, "size": size, "iterations": int(f[1]), "bw_avg_bytes_per_s": bw})
json.dump({"tool": "perftest", "device": "rxe0 (Soft-RoCE under qemu TCG)", "results": res},
          open(f"{out}/rxe-bulk-perftest.json", "w"), indent=1)
rows = json.load(open(f"{out}/rxe-bulk.json"))["results"] + json.load(open(f"{out}/rxe-bulk-deep.json"))["results"]
print("%-12s %11s %11s %14s %14s %8s" % ("mode", "size_B", "outstanding", "slotrpc_MB/s", "perftest_MB/s", "ratio"))
for r in rows:
    t = {"bulk-read": "ib_read_bw", "bulk-write": "ib_write_bw"}.get(r["mode"])
    if t is None or r["failed"]:
        continue
    mine = r["mb_per_s"] * 1e6
    p = perf.get((t, r["size"]))
    print("%-12s %11d %11d %14.1f %14s %8s" % (r["mode"], r["size"], r["outstanding"], mine / 1e6,
          "%.1f" % (p / 1e6) if p else "-", "%.2f" % (mine / p) if p else "-"))
PY
