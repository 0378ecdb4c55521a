#!/usr/bin/env bash
# The TCP bulk-payload targets on loopback, in rounds (bulk payloads beside a
# busy-polling socket of the same sizes; docs/benchmarks.md):
#
#   1. 1 MiB echo p50 within 1.2x of the socket ping-pong's;
#   2. 64 MiB .. 1 GiB at least 90 % of a plain socket's MB/s: the echo
#      against the ping-pong, and bulk-read / bulk-write against one-way
#      socket transfers;
#   3. 64 B calls beside a 1 GiB echo on the same channel: p99 within 2x of
#      their idle p99.
#
#   scripts/bench_bulk_tcp.sh [--rounds N] [--build DIR] [--out DIR]
#                             [--variant NAME='VAR=VALUE ...']...
#
# Each round runs every figure once, so a machine whose speed drifts over
# minutes (a shared VM) weighs on all of them alike; the summary counts the
# rounds that met each target, with the lowest, median and highest ratio.
# One round takes about a minute on a 2-vCPU machine.  Writes
# DIR/round-K-{echo1,echo,oneway,load}.json (slotrpc-bench's format) and
# DIR/summary.txt.  Needs nothing but the release build's slotrpc-bench
# and python3.
#
# --variant (repeatable) compares settings under the same drift: each
# round runs every variant in turn, with its variables set (e.g.
# --variant default='' --variant pinned='SLOTRPC_LOOP_CPUS=0'), into
# DIR/NAME/, and the summary has a block per variant.
set -euo pipefail
ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=5
BUILD=$ROOT/build
OUT=""
VARIANTS=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --variant) VARIANTS+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "bench_bulk_tcp.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "bench_bulk_tcp.sh: --rounds $ROUNDS: want a whole number of 1 or more" >&2; exit 2; }
BENCH=$BUILD/bench/slotrpc-bench
[[ -x $BENCH ]] || { echo "bench_bulk_tcp.sh: no $BENCH (build with meson first; --build DIR)" >&2; exit 2; }
OUT=${OUT:-$(mktemp -d /tmp/bench-bulk-tcp.XXXXXX)}
mkdir -p "$OUT"
# Each variant: a name (its folder under OUT) and the assignments it runs
# with.  None given: one unnamed variant, straight into OUT.
NAMES=()
ENVS=()
for v in "${VARIANTS[@]}"; do
  name=${v%%=*}
  [[ $v == *=* && $name =~ ^[A-Za-z0-9_.-]+$ ]] ||
    { echo "bench_bulk_tcp.sh: --variant $v: want NAME='VAR=VALUE ...' (a NAME of letters, digits, _ . -)" >&2; exit 2; }
  for a in ${v#*=}; do
    [[ $a =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] ||
      { echo "bench_bulk_tcp.sh: --variant $name: '$a' is not VAR=VALUE" >&2; exit 2; }
  done
  NAMES+=("$name")
  ENVS+=("${v#*=}")
done
if [[ ${#NAMES[@]} -eq 0 ]]; then NAMES=(""); ENVS=(""); fi
for name in "${NAMES[@]}"; do mkdir -p "$OUT${name:+/$name}"; done
export SLOTRPC_LOG_LEVEL=${SLOTRPC_LOG_LEVEL:-error}
# TCP on loopback whatever this host has (transport=auto would take shm or
# verbs for some rows; the bulk-tcp rows set tcp themselves).
export SLOTRPC_TRANSPORT=tcp

DIR=$OUT    # the variant's folder
ASSIGN=()   # the variant's assignments
run() {  # run NAME ARGS...: one slotrpc-bench run, its JSON kept
  local name=$1
  shift
  env "${ASSIGN[@]}" "$BENCH" "$@" --json "$DIR/$name.json" > "$DIR/$name.txt" 2>&1 ||
    { echo "bench_bulk_tcp.sh: ${ASSIGN[*]} slotrpc-bench $* failed:"; cat "$DIR/$name.txt"; exit 1; } >&2
}

for ((k = 1; k <= ROUNDS; k++)); do
  for i in "${!NAMES[@]}"; do
    DIR=$OUT${NAMES[i]:+/${NAMES[i]}}
    read -r -a ASSIGN <<< "${ENVS[i]}"
    echo "bench_bulk_tcp.sh: round $k of $ROUNDS${NAMES[i]:+, ${NAMES[i]}}" >&2
    run "round-$k-echo1" --modes bulk --transports socket,bulk-tcp --bulk-sizes 1048576 --bulk-calls 1000
    run "round-$k-echo" --modes bulk --transports socket,bulk-tcp \
      --bulk-sizes 67108864,268435456,1073741824 --bulk-calls 5
    run "round-$k-oneway" --modes bulk-read,bulk-write --transports socket,bulk-tcp \
      --bulk-sizes 67108864,268435456 --bulk-calls 10
    run "round-$k-load" --modes bulk-load --transports bulk-tcp --load-size 1073741824 --load-idle-calls 2000
  done
done

for i in "${!NAMES[@]}"; do
  [[ -z ${NAMES[i]} ]] || echo "== ${NAMES[i]}: ${ENVS[i]:-(no variables)}"
  python3 - "$OUT${NAMES[i]:+/${NAMES[i]}}" "$ROUNDS" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def rows(k, name):
    with open(f"{out}/round-{k}-{name}.json") as f:
        return json.load(f)["results"]
def one(rs, mode, system, size):
    got = [r for r in rs if r["mode"] == mode and r["system"] == system and r["size"] == size]
    if len(got) != 1 or got[0]["failed"] != 0:
        sys.exit(f"no clean {mode} row for {system} at {size} bytes")
    return got[0]
def line(what, ratios, ok, target):
    met = sum(1 for r in ratios if ok(r))
    print(f"{what:<44} {met:>2} of {len(ratios)} {target:<9} "
          f"{min(ratios):.2f} / {statistics.median(ratios):.2f} / {max(ratios):.2f}")
MiB = 1 << 20
print(f"bulk payloads, TCP loopback, {rounds} round(s); ratios lowest / median / highest")
line("1 MiB echo p50 / socket ping-pong p50",
     [one(rows(k, "echo1"), "bulk", "slotrpc-bulk-tcp", MiB)["p50_us"] /
      one(rows(k, "echo1"), "bulk", "socket", MiB)["p50_us"] for k in range(1, rounds + 1)],
     lambda r: r <= 1.2, "<= 1.2")
for size in (64 * MiB, 256 * MiB, 1024 * MiB):
    line(f"{size // MiB} MiB echo MB/s / socket ping-pong's",
         [one(rows(k, "echo"), "bulk", "slotrpc-bulk-tcp", size)["mb_per_s"] /
          one(rows(k, "echo"), "bulk", "socket", size)["mb_per_s"] for k in range(1, rounds + 1)],
         lambda r: r >= 0.9, ">= 0.9")
for mode in ("bulk-read", "bulk-write"):
    for size in (64 * MiB, 256 * MiB):
        line(f"{size // MiB} MiB {mode} MB/s / one-way socket's",
             [one(rows(k, "oneway"), mode, "slotrpc-bulk-tcp", size)["mb_per_s"] /
              one(rows(k, "oneway"), mode, "socket", size)["mb_per_s"] for k in range(1, rounds + 1)],
             lambda r: r >= 0.9, ">= 0.9")
line("64 B p99 during a 1 GiB echo / idle p99",
     [one(rows(k, "load"), "bulk-load", "slotrpc-bulk-tcp during", 1024 * MiB)["p99_us"] /
      one(rows(k, "load"), "bulk-load", "slotrpc-bulk-tcp idle", 1024 * MiB)["p99_us"]
      for k in range(1, rounds + 1)],
     lambda r: r <= 2, "<= 2")
print(f"JSON: {out}")
EOF
done | tee "$OUT/summary.txt"
