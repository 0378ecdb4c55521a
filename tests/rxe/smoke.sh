#!/usr/bin/env bash
# Soft-RoCE smoke test; runs INSIDE the rxe VM:
#   tests/rxe/rxe-vm.sh -- tests/rxe/smoke.sh
# Checks that rxe0 is visible to libibverbs and ACTIVE, measures 64-byte
# ib_send_lat between two processes over rxe0 and lists rxe0's hw_counters.
set -euo pipefail

DEV=${RXE_DEV:-rxe0}
ITERS=${SMOKE_ITERS:-1000}
PORT=${SMOKE_PORT:-18515}
step() { printf '== %s\n' "$*"; }
fail() { printf 'smoke: FAIL: %s\n' "$*" >&2; exit 1; }

[[ ${RXE_VM:-} == 1 ]] || echo "smoke: warning: RXE_VM is not set; meant to run inside tests/rxe/rxe-vm.sh" >&2
for t in ibv_devices ibv_devinfo ib_send_lat; do
  command -v "$t" >/dev/null || fail "$t not found (ibverbs-utils / perftest)"
done

step "ibv_devices"
out=$(ibv_devices) || fail "ibv_devices failed"
printf '%s\n' "$out"
grep -qw "$DEV" <<<"$out" || fail "ibv_devices does not list $DEV"

step "ibv_devinfo -d $DEV"
out=$(ibv_devinfo -d "$DEV") || fail "ibv_devinfo -d $DEV failed"
printf '%s\n' "$out"
grep -q 'state:.*PORT_ACTIVE' <<<"$out" || fail "$DEV port is not PORT_ACTIVE"

step "ib_send_lat -d $DEV -x 0 -s 64 -n $ITERS (server + client on 127.0.0.1:$PORT)"
log_dir=$(mktemp -d)
srv_pid=
cleanup() { [[ -z $srv_pid ]] || kill "$srv_pid" 2>/dev/null || true; rm -rf -- "$log_dir"; }
trap cleanup EXIT

# run_lat [EXTRA ARGS]: one server + client pair; client output in $log_dir/client,
# the result line's fields in the array f.
run_lat() {
  local lat_args=(-d "$DEV" -x 0 -s 64 -n "$ITERS" -p "$PORT" "$@") i srv_rc hexport res
  timeout 120 ib_send_lat "${lat_args[@]}" >"$log_dir/server" 2>&1 &
  srv_pid=$!
  # wait until the server listens on PORT (state 0A in /proc/net/tcp{,6})
  hexport=$(printf '%04X' "$PORT")
  for ((i = 0; ; i++)); do
    cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk -v p=":$hexport" '$2 ~ p"$" && $4 == "0A" { f=1 } END { exit !f }' && break
    kill -0 "$srv_pid" 2>/dev/null || { cat "$log_dir/server" >&2; fail "ib_send_lat server exited early"; }
    ((i < 300)) || fail "ib_send_lat server not listening on port $PORT after 30 s"
    sleep 0.1
  done
  if ! timeout 120 ib_send_lat "${lat_args[@]}" 127.0.0.1 >"$log_dir/client" 2>&1; then
    cat "$log_dir/client" >&2
    echo "--- server:" >&2; cat "$log_dir/server" >&2
    fail "ib_send_lat client failed"
  fi
  srv_rc=0; wait "$srv_pid" || srv_rc=$?; srv_pid=
  ((srv_rc == 0)) || { cat "$log_dir/server" >&2; fail "ib_send_lat server exited with status $srv_rc"; }
  cat "$log_dir/client"
  # The result line follows the header that starts with "#bytes".
  grep -q '#bytes' "$log_dir/client" || fail "no result header in ib_send_lat output"
  res=$(grep -A1 -m1 '#bytes' "$log_dir/client" | tail -n 1)
  read -r -a f <<<"$res"
  [[ ${f[0]:-} == 64 && ${f[1]:-} == "$ITERS" ]] || fail "unexpected ib_send_lat result line: $res"
}
finite() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?$ ]]; }

# perftest converts cycles to us with a CPU MHz it measures against
# gettimeofday; under TCG on a busy host that regression often fails
# ("Correlation coefficient r^2 < 0.9") and every figure comes out as inf.
# Retry; then fall back to -C (cycles) converted with /proc/cpuinfo's MHz.
# SMOKE_LAT_ATTEMPTS (3) bounds the retries; 0 goes straight to -C.
unit_note=
f=()
for ((attempt = 1; attempt <= ${SMOKE_LAT_ATTEMPTS:-3}; attempt++)); do
  run_lat
  finite "${f[4]}" && break
  echo "smoke: attempt $attempt: perftest could not calibrate its clock (t_typical=${f[4]}); retrying"
done
if ! finite "${f[4]:-x}"; then
  mhz=$(awk -F: '/^cpu MHz/ { gsub(/ /, "", $2); print $2; exit }' /proc/cpuinfo)
  finite "${mhz:-}" || fail "perftest reports inf and /proc/cpuinfo has no cpu MHz"
  echo "smoke: falling back to -C (cycles), converted at $mhz MHz"
  run_lat -C
  for k in 2 3 4 5 7 8; do
    finite "${f[k]:-x}" || fail "unexpected ib_send_lat -C result: ${f[*]}"
    f[k]=$(awk -v c="${f[k]}" -v m="$mhz" 'BEGIN { printf "%.2f", c / m }')
  done
  unit_note=" (cycles / $mhz MHz)"
fi
# columns: #bytes #iterations t_min t_max t_typical t_avg t_stdev p99 p99.9
printf 'smoke: ib_send_lat %s B over %s: min %s us, typical %s us, avg %s us, p99 %s us, p99.9 %s us, max %s us (%s iterations)%s\n' \
  "${f[0]}" "$DEV" "${f[2]}" "${f[4]}" "${f[5]}" "${f[7]:-?}" "${f[8]:-?}" "${f[3]}" "${f[1]}" "$unit_note"

step "hw_counters of $DEV port 1"
hc=/sys/class/infiniband/$DEV/ports/1/hw_counters
[[ -d $hc ]] || fail "$hc missing"
for c in "$hc"/*; do
  [[ -f $c ]] || continue
  printf '%-28s %s\n' "$(basename "$c")" "$(cat "$c" 2>/dev/null || echo '?')"
done
for c in rcvd_rnr_err send_rnr_err retry_rnr_exceeded_err; do
  [[ -f $hc/$c ]] || fail "hw counter $c missing"
done

echo "smoke: PASS"
