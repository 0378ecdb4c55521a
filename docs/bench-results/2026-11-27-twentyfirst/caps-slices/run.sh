#!/bin/bash
# interleaved bulk-load rounds over variants
B=/tmp/exp/build-x/bench/slotrpc-bench
export SLOTRPC_TRANSPORT=tcp SLOTRPC_LOG_LEVEL=error
declare -A V=(
 [default]=""
 [caps]="X_LANE_FRAME=131072"
 [slices]="X_LOOP_SLICE_US=100 X_CALLER_SLICE_US=100"
 [both]="X_LANE_FRAME=131072 X_LOOP_SLICE_US=100 X_CALLER_SLICE_US=100"
)
for r in $(seq 1 $1); do
  for v in default caps slices both; do
    env ${V[$v]} $B --modes bulk-load --transports bulk-tcp --load-size 1073741824 --load-idle-calls 2000 --json /tmp/x1/$v-$r.json > /tmp/x1/$v-$r.txt 2>&1
  done
done
python3 - <<'PY'
import json,glob,statistics
for v in ["default","caps","slices","both"]:
    rs=[]
    for f in sorted(glob.glob(f"/tmp/x1/{v}-*.json")):
        d=json.load(open(f))["results"]
        idle=[x for x in d if x["system"].endswith("idle")][0]; dur=[x for x in d if x["system"].endswith("during")][0]
        rs.append((dur["p99_us"]/idle["p99_us"], idle["p99_us"], dur["p99_us"], dur["p50_us"]))
    print(v, f"{sum(1 for r in rs if r[0]<=2)}/{len(rs)}", " ".join(f"{r[0]:.2f}" for r in rs), "| p99 during", " ".join(f"{r[2]:.0f}" for r in rs))
PY
