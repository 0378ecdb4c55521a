#!/usr/bin/env bash
# Quickstart: install dependencies, build slotrpc (release) and run the echo
# demo over TCP on loopback.
#
#   ./scripts/quickstart.sh
#
# It builds only what the demo needs: the library, slotrpc-gen (which makes
# the echo service's headers) and the two echo programs.  The build
# directory is configured as usual, so `meson compile -C build` builds the
# rest (tests, benchmarks, the other examples) whenever wanted;
# scripts/test.sh builds and runs everything in directories of its own.
#
# Exits with the echo client's exit status.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

BUILD_DIR=build
SERVER="$BUILD_DIR/examples/echo/echo_server"
CLIENT="$BUILD_DIR/examples/echo/echo_client"
PORT_WAIT_SECONDS=10

banner() { printf '\n==== %s ====\n' "$*"; }

# --- dependencies ------------------------------------------------------------
banner "Installing dependencies"
./scripts/install-deps.sh

# --- configure + build -------------------------------------------------------
# unity_library: the library compiled a few sources per compiler run, about
# half the CPU time of a one-off build (lib/meson.build).
SETUP_OPTIONS=(--buildtype=release -Dunity_library=true)
banner "Configuring $BUILD_DIR (release)"
if [[ -f "$BUILD_DIR/meson-private/coredata.dat" ]]; then
  meson setup --reconfigure "$BUILD_DIR" "${SETUP_OPTIONS[@]}"
else
  meson setup "$BUILD_DIR" "${SETUP_OPTIONS[@]}"
fi

# Only the demo's targets; their dependencies (libslotrpc, slotrpc-gen, the
# echo service's generated headers) come with them.
banner "Building the library, slotrpc-gen and the echo demo in $BUILD_DIR"
meson compile -C "$BUILD_DIR" codegen/slotrpc-gen lib/slotrpc \
  examples/echo/echo_server examples/echo/echo_client

# --- echo demo ---------------------------------------------------------------
banner "Running echo demo"

tmpdir=$(mktemp -d "${TMPDIR:-/tmp}/slotrpc-quickstart.XXXXXX")
port_file="$tmpdir/port"
server_pid=""

stop_server() {
  [[ -n "$server_pid" ]] || return 0
  if kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    # Give it a moment to exit cleanly, then insist.
    for _ in $(seq 1 50); do
      kill -0 "$server_pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$server_pid" 2>/dev/null || true
  fi
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}

# shellcheck disable=SC2317  # invoked via trap
cleanup() {
  stop_server
  rm -rf -- "$tmpdir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$SERVER" --listen 127.0.0.1:0 --port-file "$port_file" &
server_pid=$!

# Wait (bounded) for the server to publish its port. Accept either "PORT" or
# "HOST:PORT" in the file; re-read until it holds a complete, valid port so a
# partially written file is never used.
port=""
deadline=$((SECONDS + PORT_WAIT_SECONDS))
while :; do
  if [[ -s "$port_file" ]]; then
    content=$(tr -d '[:space:]' <"$port_file")
    candidate=${content##*:}
    if [[ "$candidate" =~ ^[0-9]+$ ]] && ((10#$candidate > 0 && 10#$candidate <= 65535)); then
      port=$((10#$candidate))
      break
    fi
  fi
  if ! kill -0 "$server_pid" 2>/dev/null; then
    server_status=0
    wait "$server_pid" || server_status=$?
    server_pid=""
    echo "quickstart: echo_server exited (status $server_status) before writing its port file" >&2
    exit 1
  fi
  if ((SECONDS >= deadline)); then
    echo "quickstart: timed out after ${PORT_WAIT_SECONDS}s waiting for $port_file" >&2
    exit 1
  fi
  sleep 0.1
done

echo "quickstart: echo_server listening on 127.0.0.1:$port (pid $server_pid)"

client_status=0
"$CLIENT" --connect "127.0.0.1:$port" --count 100000 --size 64 --outstanding 32 \
  || client_status=$?

stop_server

if ((client_status == 0)); then
  banner "Echo demo succeeded"
else
  echo "quickstart: echo_client failed with status $client_status" >&2
fi
exit "$client_status"
