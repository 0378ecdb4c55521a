#!/usr/bin/env bash
# A fleet on one machine: etcd, three echo servers that register in it, and
# echo_client reaching all three through one etcd:// target with
# round_robin.  Then one server is killed with SIGKILL and a second client
# run must still succeed on the two that remain.  Each server's call count
# comes from slotrpc-stat, so the spread is visible.
#
#   examples/fleet/run.sh [BUILD_DIR]      # default: build
#
# Needs Debian's etcd-server (scripts/install-deps.sh installs it).  The
# test suite runs this script (meson test fleet_example).
set -euo pipefail
ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=$(cd -- "${1:-$ROOT/build}" && pwd)
SERVER=$BUILD/examples/echo/echo_server
CLIENT=$BUILD/examples/echo/echo_client
STAT=$BUILD/tools/slotrpc-stat/slotrpc-stat
CALLS=${FLEET_CALLS:-30000}

say() { printf 'fleet: %s\n' "$*"; }
die() { printf 'fleet: error: %s\n' "$*" >&2; exit 1; }

ETCD=$(command -v etcd || true)
[[ -n $ETCD ]] || die "etcd is not installed: run scripts/install-deps.sh (Debian's etcd-server)"
for b in "$SERVER" "$CLIENT" "$STAT"; do [[ -x $b ]] || die "$b is missing: build $BUILD first"; done

work=$(mktemp -d "${TMPDIR:-/tmp}/slotrpc-fleet.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf -- "$work"
}
trap cleanup EXIT

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# wait_for SECONDS COMMAND...: runs COMMAND until it succeeds, for at most SECONDS.
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 0.05
  done
}

client_port=$(free_port)
peer_port=$(free_port)
etcd_url=http://127.0.0.1:$client_port
"$ETCD" --name fleet --data-dir "$work/etcd" --listen-client-urls "$etcd_url" \
  --advertise-client-urls "$etcd_url" --listen-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-cluster "fleet=http://127.0.0.1:$peer_port" > "$work/etcd.log" 2>&1 &
pids+=($!)
command -v etcdctl >/dev/null || die "etcdctl is not installed: run scripts/install-deps.sh (Debian's etcd-client)"
wait_for 30 env ETCDCTL_API=3 etcdctl --endpoints "$etcd_url" endpoint health || { tail -n 20 "$work/etcd.log" >&2; die "etcd did not come up on port $client_port"; }
target=etcd://127.0.0.1:$client_port/slotrpc/echo
say "etcd on port $client_port; servers register under $target"

ports=()
for i in 1 2 3; do
  SLOTRPC_LOG_LEVEL=warn "$SERVER" --listen 127.0.0.1:0 --port-file "$work/port$i" --register "$target" \
    > "$work/server$i.log" 2>&1 &
  pids+=($!)
done
for i in 1 2 3; do
  wait_for 30 test -s "$work/port$i" || { cat "$work/server$i.log" >&2; die "echo server $i did not start"; }
  ports+=("$(cat "$work/port$i")")
done
say "echo servers on ports ${ports[*]}"

calls_of() {  # calls_of PORT: the Echo calls server PORT finished OK
  "$STAT" --address "127.0.0.1:$1" --prometheus |
    awk -F' ' '/^slotrpc_method_calls_finished_total\{side="server",method="slotrpc.examples.Echo\/Echo",code="OK"\}/ { print $2; found = 1 }
               END { if (!found) print 0 }'
}

# round_robin is the default policy; it is named here for the reader.
export SLOTRPC_LB_POLICY=round_robin SLOTRPC_LOG_LEVEL=warn
"$CLIENT" --connect "$target" --count "$CALLS" --outstanding 8 | tee "$work/client1.log" ||
  die "echo_client failed against the fleet"
total=0
counts=()
for p in "${ports[@]}"; do c=$(calls_of "$p"); counts+=("$c"); total=$((total + c)); done
say "calls per server: ${counts[*]} (of $CALLS)"
((total == CALLS)) || die "the servers answered $total calls, not $CALLS"
for c in "${counts[@]}"; do
  # round_robin: each within 10 % of a third.
  ((c * 30 >= CALLS * 9 && c * 30 <= CALLS * 11)) || die "round_robin spread ${counts[*]} is uneven"
done

# Now kill a server while a client is in the middle of its calls: with
# --retries, a call its server died under is sent again to another one, so
# none fails.  The client runs until server 1 has answered 2,000 more calls,
# then server 1 dies.
long=$((CALLS * 10))
"$CLIENT" --connect "$target" --count "$long" --outstanding 8 --retries 5 > "$work/client2.log" 2>&1 &
client=$!
pids+=("$client")
before=${counts[0]}
answered_at_least() { (( $(calls_of "$1") >= $2 )); }  # answered_at_least PORT N
wait_for 60 answered_at_least "${ports[0]}" $((before + 2000)) ||
  die "server 1 did not answer the second client's calls"
kill -0 "$client" 2>/dev/null || die "the client finished before the kill; raise FLEET_CALLS"
kill -KILL "${pids[1]}"
wait "${pids[1]}" 2>/dev/null || true
say "killed the server on port ${ports[0]} while the client ran; its lease outlives it for a few seconds"
rc=0
wait "$client" || rc=$?
cat "$work/client2.log"
((rc == 0)) || die "echo_client failed when one of three servers died under it"
grep -q " 0 failed" "$work/client2.log" || die "calls failed when one of three servers died"
say "OK: $CALLS calls spread over three servers, then $long with one of them killed midway, none failed"
