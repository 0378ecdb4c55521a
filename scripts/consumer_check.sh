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

pc=$(find "$PREFIX" -name slotrpc.pc -path '*/pkgconfig/*' | head -n 1)
[[ -n $pc ]] || die "no slotrpc.pc under $PREFIX"
[[ -n $(find "$PREFIX" -name slotrpcConfig.cmake) ]] || die "no slotrpcConfig.cmake under $PREFIX"

work=$(mktemp -d "${TMPDIR:-/tmp}/slotrpc-consumer.XXXXXX")
. "$ROOT/scripts/kv_check_lib.sh"
cleanup() {
  if [[ -n $server_pid ]]; then kill -KILL "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf -- "$work"
}
trap cleanup EXIT

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
# Two targets generate from the same schemas: slotrpc_generate runs
# slotrpc-gen once per schema, not once per target.
for schema in common kv; do
  runs=$(grep -c "slotrpc-gen $schema.fbs" "$work/cmake-build.log" || true)
  [[ $runs == 1 ]] || { cat "$work/cmake-build.log" >&2; die "slotrpc-gen ran $runs times for $schema.fbs (expected once for both targets)"; }
done
run_kv "$work/cmake-build"
