#!/usr/bin/env bash
# The whole comparison in one command: slotrpc (tcp, shm) beside
# gRPC built from the same schema and a busy-polling socket ping-pong (the
# limit), two processes each, then PNG charts.  Optionally the Soft-RoCE VM
# part (perftest's limits and slotrpc over verbs, one boot; minutes).
#
#   scripts/bench.sh [--out DIR] [--build DIR] [--quick] [--rxe]
#
#   --out DIR    where the JSON, tables and PNGs go (default bench-results)
#   --build DIR  a release build dir (default build-rel; set up and built
#                here when missing: meson setup DIR --buildtype=release)
#   --quick      a few hundred calls per point instead of 20,000 (a check of
#                the pipeline, not figures to publish)
#   --rxe        also scripts/bench_rxe.sh (one VM boot; needs the test VM
#                packages, scripts/install-deps.sh --test-vm)
#
# Latency runs with SLOTRPC_POLL_MODE=busy on both ends (the socket limit
# busy-polls too); throughput with the library's default, adaptive (busy
# loops that outnumber the cores starve each other).  Override either with
# BENCH_LATENCY_POLL / BENCH_THROUGHPUT_POLL.
# Outputs: latency-small.json (64 B..4 KiB, 20,000 calls), latency-large.json
# (64 KiB..the largest a 2 MiB slot holds, 500 calls), throughput.json,
# fanout.json (bench/fanout: a frontend and three backends per system, open
# loop at rising load), a .txt table beside each, and the charts of
# bench/plot.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
OUT=bench-results
BUILD=build-rel
QUICK=0
RXE=0
while (($#)); do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --rxe) RXE=1; shift ;;
    -h | --help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) printf 'bench.sh: unknown argument %s (--help)\n' "$1" >&2; exit 2 ;;
  esac
done

log() { printf 'bench.sh: %s\n' "$*" >&2; }

cd "$ROOT"
if [[ ! -d $BUILD ]]; then
  log "setting up $BUILD (release)"
  meson setup "$BUILD" --buildtype=release >/dev/null
fi
buildtype=$(meson introspect "$BUILD" --buildoptions | python3 -c \
  'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]=="buildtype"))')
[[ $buildtype == release ]] || log "warning: $BUILD is a $buildtype build, not release"
meson compile -C "$BUILD" bench/slotrpc-bench bench/fanout/slotrpc-fanout >/dev/null
BENCH=$BUILD/bench/slotrpc-bench
FANOUT=$BUILD/bench/fanout/slotrpc-fanout

mkdir -p "$OUT"
systems=tcp,shm,socket
if "$BENCH" --transports grpc --modes latency --sizes 64 --warmup 0 --calls 1 >/dev/null 2>&1; then
  systems=grpc,$systems
else
  log "this build has no gRPC baseline (install libgrpc++-dev libprotobuf-dev and reconfigure); running without it"
fi

if ((QUICK)); then
  small=(--warmup 50 --calls 500); large=(--warmup 5 --calls 20); thr=(--warmup 100 --throughput-calls 2000)
else
  small=(--warmup 1000 --calls 20000); large=(--warmup 50 --calls 500); thr=(--warmup 1000 --throughput-calls 20000)
fi

{ echo "host: $(nproc) cores, kernel $(uname -r)"; echo "uptime: $(uptime)"; echo "build: $BUILD ($buildtype)"; } \
  | tee "$OUT/machine.txt" >&2

run() {  # NAME POLL SYSTEMS ARGS...
  local name=$1 poll=$2 sys=$3
  shift 3
  log "$name (SLOTRPC_POLL_MODE=$poll)"
  SLOTRPC_POLL_MODE=$poll "$BENCH" --transports "$sys" --json "$OUT/$name.json" "$@" | tee "$OUT/$name.txt"
}
run latency-small "${BENCH_LATENCY_POLL:-busy}" "$systems" --modes latency --sizes 64,1024,4096 "${small[@]}"
run latency-large "${BENCH_LATENCY_POLL:-busy}" "$systems" --modes latency --sizes 65536,1048576,max "${large[@]}"
# The ping-pong has no throughput mode (one outstanding by construction).
run throughput "${BENCH_THROUGHPUT_POLL:-adaptive}" "${systems/,socket/}" --modes throughput "${thr[@]}"

# The microservice fan-out (bench/fanout): five processes per system, open
# loop at rising offered load until a step saturates; library defaults
# (adaptive polling), as a deployed service would run.
fan_systems=tcp,shm
[[ $systems == grpc,* ]] && fan_systems=$fan_systems,grpc
if ((QUICK)); then
  fan=(--rates 500,2000 --seconds 0.5 --warmup 0.2)
else
  fan=(--rates 500,1000,2000,5000,10000,20000,40000,80000 --seconds 2 --warmup 0.5)
fi
log "fanout (library defaults)"
"$FANOUT" --systems "$fan_systems" --json "$OUT/fanout.json" "${fan[@]}" | tee "$OUT/fanout.txt"

if ((RXE)); then
  "$ROOT/scripts/bench_rxe.sh" --out "$OUT" --build "$BUILD"
fi

"$ROOT/bench/plot" --out "$OUT" "$OUT"/*.json
log "done: $OUT"
