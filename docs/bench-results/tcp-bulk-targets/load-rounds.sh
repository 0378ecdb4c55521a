#!/bin/bash
B=${B:-build/bench/slotrpc-bench}
export SLOTRPC_TRANSPORT=tcp SLOTRPC_LOG_LEVEL=error
declare -A V=(
 [off]="SLOTRPC_TCP_LANE_SPARE_RATE=0"
 [spare]=""
)
VS="spare off"
for r in $(seq 1 $1); do
  for v in $VS; do
    env ${V[$v]} $B --modes bulk-load --transports bulk-tcp --load-size 1073741824 --load-idle-calls 2000 --json ${OUT:-/tmp/x2}/$v-$r.json > ${OUT:-/tmp/x2}/$v-$r.txt 2>&1
  done
done
python3 - <<PY
import json,glob
for v in "$VS".split():
    rs=[]
    for f in sorted(glob.glob(f"${OUT:-/tmp/x2}/{v}-*.json")):
        d=json.load(open(f))["results"]
        idle=[x for x in d if x["system"].endswith("idle")][0]; dur=[x for x in d if x["system"].endswith("during")][0]
        rs.append((dur["p99_us"]/idle["p99_us"], idle["p99_us"], dur["p99_us"], dur["p50_us"], idle["p50_us"]))
    print(v, f"{sum(1 for r in rs if r[0]<=2)}/{len(rs)}", " ".join(f"{r[0]:.2f}" for r in rs), "| idle p50/p99", " ".join(f"{r[4]:.0f}/{r[1]:.0f}" for r in rs), "| during p50/p99", " ".join(f"{r[3]:.0f}/{r[2]:.0f}" for r in rs))
PY
