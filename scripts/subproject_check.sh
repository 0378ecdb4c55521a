#!/usr/bin/env bash
# slotrpc as a Meson subproject (issue 15): a consumer project outside the
# source tree, whose meson.build is README's subproject recipe exactly as
# README has it (the fenced block after `<!-- recipe:subproject -->`), with
# this checkout as subprojects/slotrpc (a symbolic link), builds
# examples/kv with `meson setup` (plus two compile-speed settings, see below)
# and `meson compile` as README says, then
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

# recipe NAME: README's fenced block that follows <!-- recipe:NAME -->.
recipe() {
  awk -v marker="<!-- recipe:$1 -->" '
    $0 == marker { found = 1; next }
    found == 1 && /^```/ { found = 2; next }
    found == 2 && /^```/ { exit }
    found == 2 { print }
  ' "$ROOT/README.md"
}

work=$(mktemp -d "${TMPDIR:-/tmp}/slotrpc-subproject.XXXXXX")
server_pid=
cleanup() {
  if [[ -n $server_pid ]]; then kill -KILL "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf -- "$work"
}
trap cleanup EXIT

src=$work/kv
mkdir -p "$src/subprojects"
find "$ROOT/examples/kv" -maxdepth 1 -type f \( -name '*.cc' -o -name '*.h' -o -name '*.fbs' \) \
  -exec cp -t "$src" {} +
recipe subproject > "$src/meson.build"
[[ -s $src/meson.build ]] || die "README has no <!-- recipe:subproject --> block"
# The checkout itself: Meson ignores the build directories inside it
# (each has its own meson-private/ and is never read as source).
ln -s "$ROOT" "$src/subprojects/slotrpc"

log "README's subproject recipe in $src, subprojects/slotrpc -> $ROOT"
# README's `meson setup build`, plus two settings that change what the
# compiler does, not what the recipe wires up: no optimisation or debug
# information (plain), and the library as unity sources.  This checks the
# wiring; the suite's other builds check the code.
(cd "$src" && meson setup build --buildtype=plain -Dslotrpc:unity_library=true) > "$work/setup.log" 2>&1 \
  || { cat "$work/setup.log" >&2; die "meson setup of README's subproject recipe failed"; }
(cd "$src" && meson compile -C build) > "$work/compile.log" 2>&1 \
  || { tail -n 60 "$work/compile.log" >&2; die "meson compile of README's subproject recipe failed"; }
log "built: $(cd "$src/build" && ls kv_server kv_client | tr '\n' ' ')"

port_file=$work/port
"$src/build/kv_server" --listen 127.0.0.1:0 --port-file "$port_file" > "$work/server.log" 2>&1 &
server_pid=$!
deadline=$((SECONDS + PORT_WAIT_SECONDS))
until [[ -s $port_file ]]; do
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; die "kv_server exited before listening"; }
  ((SECONDS < deadline)) || die "kv_server did not write its port in ${PORT_WAIT_SECONDS}s"
  sleep 0.05
done
port=$(tr -d '[:space:]' < "$port_file")
rc=0
"$src/build/kv_client" --connect "127.0.0.1:$port" --count "$KV_COUNT" > "$work/client.log" 2>&1 || rc=$?
kill -TERM "$server_pid" 2>/dev/null || true
wait "$server_pid" 2>/dev/null || true
server_pid=
((rc == 0)) || { cat "$work/client.log" "$work/server.log" >&2; die "kv_client exited with status $rc"; }
log "kv_client against kv_server: OK"
