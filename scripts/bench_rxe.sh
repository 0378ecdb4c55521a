#!/usr/bin/env bash
# The Soft-RoCE part of the comparison, in ONE boot of the rxe VM
# (tests/rxe/rxe-vm.sh): perftest's ib_send_lat, ib_write_lat (64 B) and
# ib_write_bw (64 KiB) on rxe0, the limits of the device, then slotrpc-bench
# over verbs (and over TCP, beside the busy-polling socket ping-pong, in the
# same VM).  Takes minutes (TCG emulation); the figures are emulated CPU
# time, not a NIC's.
#
#   scripts/bench_rxe.sh [--out DIR] [--build DIR] [--timeout SECONDS]
#
# Writes DIR/rxe-perftest.json, DIR/rxe-latency.json, DIR/rxe-throughput.json
# (slotrpc-bench's format) and DIR/rxe-summary.txt: slotrpc's 64 B p50 over
# verbs against 2 x ib_send_lat typical (a round trip is two sends).
# Needs the test-VM packages (scripts/install-deps.sh --test-vm: qemu,
# perftest, ...); the guest runs the host's binaries (host / over 9p), so
# perftest installed on the host is what it runs.  Only one VM at a time:
# this script waits (up to 30 min) while another qemu-system runs.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)

# --- inside the VM ------------------------------------------------------------
if [[ ${1:-} == --guest ]]; then
  BENCH=$2
  OUT=${RXE_VM_RESULTS:?not inside rxe-vm.sh}
  DEV=rxe0
  PORT=18520
  mhz=$(awk -F: '/^cpu MHz/ { gsub(/ /, "", $2); print $2; exit }' /proc/cpuinfo)
  # perf TEST SIZE [ARGS]: server + client on 127.0.0.1; the client's result
  # line (after the "#bytes" header) goes to $OUT/TEST.txt.
  perf() {
    local test=$1 size=$2 srv i
    shift 2
    local args=(-d "$DEV" -x 0 -s "$size" -p "$PORT" "$@")
    timeout 300 "$test" "${args[@]}" >"/tmp/$test.server" 2>&1 &
    srv=$!
    for ((i = 0; i < 300; i++)); do
      ss -ltn 2>/dev/null | grep -q ":$PORT " && break
      cat /proc/net/tcp 2>/dev/null | awk -v p=":$(printf '%04X' "$PORT")" '$2 ~ p"$" && $4 == "0A" {f=1} END {exit !f}' && break
      sleep 0.1
    done
    timeout 300 "$test" "${args[@]}" 127.0.0.1 >"/tmp/$test.client" 2>&1 || { cat "/tmp/$test.client" "/tmp/$test.server"; return 1; }
    wait "$srv" || true
    cat "/tmp/$test.client"
    grep -A1 -m1 '#bytes' "/tmp/$test.client" | tail -n 1 >"$OUT/$test.txt"
  }
  echo "== perftest on $DEV (cpu MHz $mhz)"
  for t in ib_send_lat ib_write_lat; do
    perf "$t" 64 -n 2000
    # perftest calibrates its clock against gettimeofday; under TCG that
    # sometimes fails and every figure is inf: then cycles (-C) / MHz.
    if grep -q inf "$OUT/$t.txt"; then
      perf "$t" 64 -n 2000 -C
      echo "cycles" >"$OUT/$t.unit"
    fi
  done
  perf ib_write_bw 65536 -n 2000
  python3 - "$OUT" "$mhz" <<'PY'
import json, sys
out, mhz = sys.argv[1], float(sys.argv[2])
res = []
for t in ["ib_send_lat", "ib_write_lat"]:
    f = open(f"{out}/{t}.txt").read().split()
    scale = 1.0
    try:
        open(f"{out}/{t}.unit").read()
        scale = 1.0 / mhz  # cycles -> us
    except FileNotFoundError:
        pass
    v = [float(x) for x in f[2:9]]
    res.append({"test": t, "size": int(f[0]), "iterations": int(f[1]), "t_min_us": v[0] * scale,
                "t_max_us": v[1] * scale, "t_typical_us": v[2] * scale, "t_avg_us": v[3] * scale,
                "t_stdev_us": v[4] * scale, "p99_us": v[5] * scale, "p999_us": v[6] * scale})
f = open(f"{out}/ib_write_bw.txt").read().split()
res.append({"test": "ib_write_bw", "size": int(f[0]), "iterations": int(f[1]), "bw_peak_MBps": float(f[2]),
            "bw_avg_MBps": float(f[3]), "msg_rate_Mpps": float(f[4])})
json.dump({"tool": "perftest", "device": "rxe0 (Soft-RoCE under qemu TCG)", "results": res},
          open(f"{out}/rxe-perftest.json", "w"), indent=1)
PY
  echo "== slotrpc-bench over verbs (and tcp, socket) in the VM"
  SLOTRPC_POLL_MODE=busy "$BENCH" --modes latency --transports verbs,tcp,socket --address 127.0.0.1 \
    --sizes 64,1024,4096,65536 --slot-size 131072 --warmup 200 --calls 2000 --json "$OUT/rxe-latency.json"
  "$BENCH" --modes throughput --transports verbs,tcp --address 127.0.0.1 --outstanding 1,8,32 \
    --channels 1 --warmup 200 --throughput-calls 5000 --json "$OUT/rxe-throughput.json"
  exit 0
fi

# --- on the host -----------------------------------------------------------------
OUT=bench-results
BUILD=build-rel
TIMEOUT=1500
while (($#)); do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) printf 'bench_rxe.sh: unknown argument %s\n' "$1" >&2; exit 2 ;;
  esac
done
cd "$ROOT"
command -v ib_send_lat >/dev/null || { echo "bench_rxe.sh: perftest missing (scripts/install-deps.sh --test-vm)" >&2; exit 2; }
meson compile -C "$BUILD" bench/slotrpc-bench >/dev/null
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
for ((i = 0; i < 180; i++)); do
  pgrep -f qemu-system >/dev/null || break
  ((i % 6 == 0)) && echo "bench_rxe.sh: another VM is running; waiting for it" >&2
  sleep 10
done
pgrep -f qemu-system >/dev/null && { echo "bench_rxe.sh: another VM still runs after 30 min" >&2; exit 1; }
results=$(mktemp -d)
trap 'rm -rf -- "$results"' EXIT
SLOTRPC_UNIX_PATH=off SLOTRPC_LOG_LEVEL=warn tests/rxe/rxe-vm.sh --cache "$BUILD/rxe-cache" --timeout "$TIMEOUT" \
  --results "$results" -- "$ROOT/scripts/bench_rxe.sh" --guest "$ROOT/$BUILD/bench/slotrpc-bench"
cp "$results"/rxe-*.json "$OUT"/
python3 - "$OUT" <<'PY' | tee "$OUT/rxe-summary.txt"
import json, sys
out = sys.argv[1]
perf = {r["test"]: r for r in json.load(open(f"{out}/rxe-perftest.json"))["results"]}
lat = json.load(open(f"{out}/rxe-latency.json"))["results"]
send = perf["ib_send_lat"]["t_typical_us"]
write = perf["ib_write_lat"]["t_typical_us"]
print("rxe0 (Soft-RoCE, qemu TCG): ib_send_lat 64 B typical %.2f us, ib_write_lat 64 B typical %.2f us, "
      "ib_write_bw 64 KiB %.1f MB/s" % (send, write, perf["ib_write_bw"]["bw_avg_MBps"]))
for r in lat:
    if r["system"] == "slotrpc-verbs" and r["size"] == 64 and r["failed"] == 0:
        print("slotrpc-verbs 64 B p50 %.2f us = %.2fx 2 x ib_send_lat typical (%.2f us), %.2fx 2 x ib_write_lat"
              % (r["p50_us"], r["p50_us"] / (2 * send), 2 * send, r["p50_us"] / (2 * write)))
PY
