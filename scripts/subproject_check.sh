#!/usr/bin/env bash
# slotrpc as a Meson subproject: a consumer project outside the
# source tree, whose meson.build is docs/guide.md's subproject recipe
# exactly as the guide has it (the fenced block after
# `<!-- recipe:subproject -->`), with this checkout as subprojects/slotrpc
# (a symbolic link), builds examples/kv with `meson setup` (plus two
# compile-speed settings, see below) and `meson compile` as the guide says, then
# runs its kv_client against its kv_server.
#
#   scripts/subproject_check.sh
#
# The recipe turns the subproject's tests, examples and benchmarks off, so
# this compiles the library, slotrpc-gen, slotrpc-stat and the two kv
# programs.  Exit status 0 when the build and the run pass.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
KV_COUNT=2000         # keys kv_client puts; small: this checks the build, not speed
PORT_WAIT_SECONDS=30

log() { printf 'subproject_check: %s\n' "$*"; }
die() { printf 'subproject_check: error: %s\n' "$*" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/slotrpc-subproject.XXXXXX")
. "$ROOT/scripts/kv_check_lib.sh"
cleanup() {
  if [[ -n $server_pid ]]; then kill -KILL "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf -- "$work"
}
trap cleanup EXIT

src=$work/kv
copy_kv "$src"
mkdir -p "$src/subprojects"
recipe subproject docs/guide.md > "$src/meson.build"
[[ -s $src/meson.build ]] || die "docs/guide.md has no <!-- recipe:subproject --> block"
# The checkout itself: Meson ignores the build directories inside it
# (each has its own meson-private/ and is never read as source).
ln -s "$ROOT" "$src/subprojects/slotrpc"

log "the guide's subproject recipe in $src, subprojects/slotrpc -> $ROOT"
# README's `meson setup build`, plus two settings that change what the
# compiler does, not what the recipe wires up: no optimisation or debug
# information (plain), and the library as unity sources.  This checks the
# wiring; the suite's other builds check the code.
(cd "$src" && meson setup build --buildtype=plain -Dslotrpc:unity_library=true) > "$work/setup.log" 2>&1 \
  || { cat "$work/setup.log" >&2; die "meson setup of the guide's subproject recipe failed"; }
(cd "$src" && meson compile -C build) > "$work/compile.log" 2>&1 \
  || { tail -n 60 "$work/compile.log" >&2; die "meson compile of the guide's subproject recipe failed"; }
log "built: $(cd "$src/build" && ls kv_server kv_client | tr '\n' ' ')"

run_kv "$src/build"
