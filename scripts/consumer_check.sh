#!/usr/bin/env bash
# Builds examples/kv as a user of an installed slotrpc would, with the
# README's Meson recipe and the README's CMake recipe exactly as README has
# them (the fenced block after `<!-- recipe:meson.build -->` and after
# `<!-- recipe:CMakeLists.txt -->`), each from a copy of examples/kv outside
# the source tree, then runs each built kv_client against its kv_server.
#
#   scripts/consumer_check.sh PREFIX     (PREFIX: where `meson install` put slotrpc)
#
# scripts/test.sh runs it after installing build-test into a temporary
# prefix.  Exit status 0 when both builds and both runs pass.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PREFIX=${1:?usage: consumer_check.sh PREFIX}
KV_COUNT=2000         # keys kv_client puts; small: this checks the build, not speed
PORT_WAIT_SECONDS=20

log() { printf 'consumer_check: %s\n' "$*"; }
die() { printf 'consumer_check: error: %s\n' "$*" >&2; exit 1; }

# recipe NAME: README's fenced block that follows <!-- recipe:NAME -->.
recipe() {
  awk -v marker="<!-- recipe:$1 -->" '
    $0 == marker { found = 1; next }
    found == 1 && /^```/ { found = 2; next }
    found == 2 && /^```/ { exit }
    found == 2 { print }
  ' "$ROOT/README.md"
}

pc=$(find "$PREFIX" -name slotrpc.pc -path '*/pkgconfig/*' | head -n 1)
[[ -n $pc ]] || die "no slotrpc.pc under $PREFIX"
[[ -n $(find "$PREFIX" -name slotrpcConfig.cmake) ]] || die "no slotrpcConfig.cmake under $PREFIX"

work=$(mktemp -d "${TMPDIR:-/tmp}/slotrpc-consumer.XXXXXX")
server_pid=
cleanup() {
  if [[ -n $server_pid ]]; then kill -KILL "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf -- "$work"
}
trap cleanup EXIT

# run_kv DIR: kv_server on a free loopback port, kv_client against it.
run_kv() {
  local dir=$1 port_file="$work/port" port= rc=0
  rm -f "$port_file"
  "$dir/kv_server" --listen 127.0.0.1:0 --port-file "$port_file" > "$work/server.log" 2>&1 &
  server_pid=$!
  local deadline=$((SECONDS + PORT_WAIT_SECONDS))
  until [[ -s $port_file ]]; do
    kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; die "$dir/kv_server exited before listening"; }
    ((SECONDS < deadline)) || die "$dir/kv_server did not write its port in ${PORT_WAIT_SECONDS}s"
    sleep 0.05
  done
  port=$(tr -d '[:space:]' < "$port_file")
  "$dir/kv_client" --connect "127.0.0.1:$port" --count "$KV_COUNT" || rc=$?
  kill -TERM "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=
  ((rc == 0)) || die "$dir/kv_client exited with status $rc"
  log "$dir: kv_client against kv_server: OK"
}

# copy_kv DIR: the example's sources, without its in-tree meson.build.
copy_kv() {
  mkdir -p "$1"
  find "$ROOT/examples/kv" -maxdepth 1 -type f \( -name '*.cc' -o -name '*.h' -o -name '*.fbs' \) \
    -exec cp -t "$1" {} +
}

# --- Meson, through pkg-config ------------------------------------------------
copy_kv "$work/meson-src"
recipe meson.build > "$work/meson-src/meson.build"
[[ -s $work/meson-src/meson.build ]] || die "README has no <!-- recipe:meson.build --> block"
log "Meson recipe (README), PKG_CONFIG_PATH=$(dirname "$pc")"
PKG_CONFIG_PATH=$(dirname "$pc") meson setup "$work/meson-build" "$work/meson-src" > "$work/meson-setup.log" 2>&1 \
  || { cat "$work/meson-setup.log" >&2; die "meson setup of README's recipe failed"; }
meson compile -C "$work/meson-build" > "$work/meson-compile.log" 2>&1 \
  || { cat "$work/meson-compile.log" >&2; die "meson compile of README's recipe failed"; }
run_kv "$work/meson-build"

# --- CMake, through the installed package ---------------------------------------
copy_kv "$work/cmake-src"
recipe CMakeLists.txt > "$work/cmake-src/CMakeLists.txt"
[[ -s $work/cmake-src/CMakeLists.txt ]] || die "README has no <!-- recipe:CMakeLists.txt --> block"
log "CMake recipe (README), CMAKE_PREFIX_PATH=$PREFIX"
cmake -S "$work/cmake-src" -B "$work/cmake-build" -G Ninja -DCMAKE_PREFIX_PATH="$PREFIX" \
  > "$work/cmake-setup.log" 2>&1 || { cat "$work/cmake-setup.log" >&2; die "cmake configure of README's recipe failed"; }
cmake --build "$work/cmake-build" > "$work/cmake-build.log" 2>&1 \
  || { cat "$work/cmake-build.log" >&2; die "cmake --build of README's recipe failed"; }
run_kv "$work/cmake-build"
