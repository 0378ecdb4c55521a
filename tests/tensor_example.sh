#!/bin/sh
# examples/tensor as two processes: tensor_server, and tensor_client moving
# TENSOR_SIZE bytes (tests/meson.build: 1G, 64M in sanitized builds) Put,
# Get, Reduce, Get, every byte checked by the client, plus a Get into a
# destination one element short (refused, nothing written).  The transport
# is what SLOTRPC_TRANSPORT says (tcp here; verbs in the rxe suite, through
# tests/verbs/tensor_over_verbs.sh), or TENSOR_WANT when the environment
# leaves the choice to transport=auto, and the client's first line must
# name it, so the run cannot pass over another one.
# Arguments (run_verbs_tests.sh passes doctest flags) are ignored.
set -u
: "${TENSOR_SERVER:?TENSOR_SERVER not set}" "${TENSOR_CLIENT:?TENSOR_CLIENT not set}"
SIZE=${TENSOR_SIZE:-64M}
WANT=${TENSOR_WANT:-${SLOTRPC_TRANSPORT:-tcp}}
dir=$(mktemp -d)
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; rm -rf "$dir"' EXIT
"$TENSOR_SERVER" --listen 127.0.0.1:0 --port-file "$dir/port" > "$dir/server.out" 2>&1 &
server=$!
i=0
while [ ! -s "$dir/port" ]; do
  i=$((i + 1))
  if [ "$i" -gt 600 ] || ! kill -0 "$server" 2>/dev/null; then
    echo "tensor_server did not start:"; cat "$dir/server.out"; exit 1
  fi
  sleep 0.1
done
"$TENSOR_CLIENT" --connect "127.0.0.1:$(cat "$dir/port")" --size "$SIZE" > "$dir/client.out" 2>&1
rc=$?
cat "$dir/client.out"
[ "$rc" -eq 0 ] || { echo "tensor_client failed (exit $rc); server said:"; cat "$dir/server.out"; exit 1; }
grep -q "bytes per tensor over $WANT\$" "$dir/client.out" || { echo "the client did not run over $WANT"; exit 1; }
grep -q "tensor_client: all checks passed" "$dir/client.out" || exit 1
echo "tensor example over $WANT with $SIZE tensors: PASS"
