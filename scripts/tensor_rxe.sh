#!/usr/bin/env bash
# examples/tensor over verbs in the Soft-RoCE VM (tests/rxe/rxe-vm.sh) with
# 1 GiB tensors.  Put (RDMA READ into the server's
# tensor), Get (RDMA WRITE into the client's buffer), Reduce (RDMA READ in
# 64 MiB chunks), Get again; every byte checked by tensor_client.  The rxe
# suite runs the same with 64 MiB (tests/verbs/tensor_over_verbs.sh).
#
#   scripts/tensor_rxe.sh [--build DIR] [--size 1G] [--timeout SECONDS]
#
# The VM gets RXE_VM_MEM (default 6144) MiB: the client holds two tensors,
# the server one and its scratch buffer, all pinned.  Under TCG the device
# moves some tens of MB/s, so 1 GiB takes minutes.  The server registers a
# Put's 1 GiB on its event loop (pinning every page), which under TCG takes
# longer than the default 5 s peer timeout: SLOTRPC_PEER_TIMEOUT_MS is raised
# for this run (a production server would register its tensor pool ahead).
set -euo pipefail
ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=build
SIZE=1G
TIMEOUT=3000
while (($#)); do
  case $1 in
    --build) BUILD=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    -h | --help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) printf 'tensor_rxe.sh: unknown argument %s\n' "$1" >&2; exit 2 ;;
  esac
done
cd "$ROOT"
meson compile -C "$BUILD" examples/tensor/tensor_server examples/tensor/tensor_client >/dev/null
for ((i = 0; i < 180; i++)); do
  pgrep -f qemu-system >/dev/null || break
  ((i % 6 == 0)) && echo "tensor_rxe.sh: another VM is running; waiting for it" >&2
  sleep 10
done
pgrep -f qemu-system >/dev/null && { echo "tensor_rxe.sh: another VM still runs after 30 min" >&2; exit 1; }
export RXE_VM_MEM=${RXE_VM_MEM:-6144}
export TENSOR_SERVER="$ROOT/$BUILD/examples/tensor/tensor_server"
export TENSOR_CLIENT="$ROOT/$BUILD/examples/tensor/tensor_client"
export TENSOR_SIZE=$SIZE
export LD_LIBRARY_PATH="$ROOT/$BUILD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export RXE_VM_PASS_ENV="TENSOR_SERVER TENSOR_CLIENT TENSOR_SIZE LD_LIBRARY_PATH"
SLOTRPC_UNIX_PATH=off SLOTRPC_LOG_LEVEL=warn SLOTRPC_PEER_TIMEOUT_MS=${SLOTRPC_PEER_TIMEOUT_MS:-120000} \
  tests/rxe/rxe-vm.sh --cache "$BUILD/rxe-cache" --timeout "$TIMEOUT" -- "$ROOT/tests/verbs/tensor_over_verbs.sh"
