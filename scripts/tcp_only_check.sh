#!/usr/bin/env bash
# The TCP-only build: slotrpc configured on a machine without
# libibverbs builds without the verbs transport and works over TCP.
#
#   scripts/tcp_only_check.sh [BUILD_DIR]    (default: a temporary directory)
#
# "Without libibverbs" is simulated: pkg-config sees every .pc file of this
# machine except rdma-core's (PKG_CONFIG_LIBDIR), so -Dverbs=auto takes the
# path it takes on a machine without libibverbs-dev.  The headers are still
# in /usr/include, so the check proves the build does not need them from the
# compiler's own dependency lists (ninja -t deps): no source of the build
# includes an infiniband/ header.  Then:
#   * configure: -Dverbs=auto says it builds TCP-only (message() and the
#     summary); -Dverbs=enabled fails; -Dverbs=disabled is the same build
#     (reconfiguring to it leaves nothing to rebuild);
#   * build only the library, examples/echo and three tests (plain buildtype:
#     no optimisation, no debug information, to keep CI time low);
#   * the library: no ibv_ symbol in nm -D, no libibverbs in its NEEDED
#     entries, slotrpc.pc and the CMake package do not mention libibverbs;
#   * tests rpc_basic (Server and Channel, transport auto), symbols (the
#     export list) and fuzz_handshake (the verbs handshake extension's codec,
#     which a TCP-only peer still reads);
#   * echo_client against echo_server over TCP with the default
#     transport=auto; with SLOTRPC_TRANSPORT=verbs both fail, saying the
#     build has no verbs.
# Exit status 0 when all of that holds.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
ECHO_CALLS=2000
PORT_WAIT_SECONDS=30
# What the stubs say (lib/transport/verbs/verbs_disabled.h).
DISABLED_MESSAGE='slotrpc was built without verbs (-Dverbs=disabled or libibverbs not found); use SLOTRPC_TRANSPORT=tcp'

log() { printf 'tcp_only_check: %s\n' "$*"; }
die() { printf 'tcp_only_check: error: %s\n' "$*" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/slotrpc-tcp-only.XXXXXX")
B=${1:-$work/build}
server_pid=
cleanup() {
  if [[ -n $server_pid ]]; then kill -KILL "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf -- "$work"
}
trap cleanup EXIT

# --- pkg-config without rdma-core ------------------------------------------------
pcdir=$work/pkgconfig
mkdir -p "$pcdir"
IFS=: read -r -a pc_path <<< "$(pkg-config --variable pc_path pkg-config)"
for d in "${pc_path[@]}"; do
  [[ -d $d ]] || continue
  for pc in "$d"/*.pc; do
    [[ -e $pc ]] || continue
    case $(basename "$pc") in
      libibverbs.pc | librdmacm.pc | libibumad.pc | libibmad.pc | libmlx*.pc | libefa.pc | libhns.pc | libmana.pc) continue ;;
    esac
    [[ -e $pcdir/$(basename "$pc") ]] || ln -s "$pc" "$pcdir/"
  done
done
export PKG_CONFIG_LIBDIR=$pcdir
unset PKG_CONFIG_PATH
if pkg-config --exists libibverbs; then die "pkg-config still finds libibverbs"; fi

# --- configure -----------------------------------------------------------------------
opts=(--buildtype=plain -Dtests=true -Dexamples=true -Dbench=false -Dunity_library=true)
if meson setup "$work/enabled" "$ROOT" "${opts[@]}" -Dverbs=enabled > "$work/enabled.log" 2>&1; then
  die "-Dverbs=enabled configured without libibverbs"
fi
grep -q 'libibverbs' "$work/enabled.log" || { cat "$work/enabled.log" >&2; die "-Dverbs=enabled failed without naming libibverbs"; }
log "-Dverbs=enabled without libibverbs: fails (as it must)"

# A fresh build directory each run (ccache keeps later runs fast); one that
# is not a Meson build directory is not ours to delete.
if [[ -e $B && ! -d $B/meson-private && -n $(ls -A "$B") ]]; then
  die "$B exists and is not a Meson build directory"
fi
rm -rf -- "$B"
meson setup "$B" "$ROOT" "${opts[@]}" -Dverbs=auto > "$work/setup.log" 2>&1 \
  || { cat "$work/setup.log" >&2; die "meson setup -Dverbs=auto failed without libibverbs"; }
grep -q 'Message: slotrpc: building TCP-only, without the RDMA verbs transport: libibverbs not found' "$work/setup.log" \
  || { cat "$work/setup.log" >&2; die "-Dverbs=auto did not say it builds TCP-only"; }
grep -q 'RDMA verbs transport: NO: TCP only' "$work/setup.log" || die "the summary does not say TCP only"
log "-Dverbs=auto without libibverbs: configures TCP-only and says so"

# --- build -------------------------------------------------------------------------------
targets=(slotrpc echo_server echo_client rpc_basic_test symbols_test fuzz_handshake_replay)
meson compile -C "$B" "${targets[@]}" > "$work/compile.log" 2>&1 \
  || { tail -n 60 "$work/compile.log" >&2; die "the TCP-only build failed"; }
log "built ${targets[*]}"

# -Dverbs=disabled is this very build: nothing to recompile.
meson configure "$B" -Dverbs=disabled > "$work/disabled.log" 2>&1 || { cat "$work/disabled.log" >&2; die "meson configure -Dverbs=disabled failed"; }
meson compile -C "$B" "${targets[@]}" > "$work/disabled.log" 2>&1 || { cat "$work/disabled.log" >&2; die "rebuild after -Dverbs=disabled failed"; }
grep -q 'Message: slotrpc: building TCP-only, without the RDMA verbs transport: -Dverbs=disabled' "$work/disabled.log" \
  || { cat "$work/disabled.log" >&2; die "-Dverbs=disabled did not say it builds TCP-only"; }
if grep -q -E '\.cc\.o$|Compiling C\+\+ object' "$work/disabled.log"; then
  cat "$work/disabled.log" >&2; die "-Dverbs=disabled recompiled something: it is not the same build as auto without libibverbs"
fi
log "-Dverbs=disabled: the same build (nothing recompiled)"

# --- what the build consists of -----------------------------------------------------------
if ninja -C "$B" -t deps | grep -q 'infiniband/'; then
  ninja -C "$B" -t deps | grep -B3 'infiniband/' | head -n 20 >&2
  die "a source of the TCP-only build includes an infiniband/ header"
fi
lib=$B/lib/libslotrpc.so.1
[[ -e $lib ]] || die "no $lib"
if nm -D "$lib" | grep -q 'ibv_'; then nm -D "$lib" | grep 'ibv_' | head >&2; die "nm -D $lib lists ibv_ symbols"; fi
if readelf -d "$lib" | grep NEEDED | grep -q -i verbs; then die "$lib needs libibverbs"; fi
pcfile=$B/meson-private/slotrpc.pc
[[ -e $pcfile ]] || die "no $pcfile"
if grep -q -i 'ibverbs' "$pcfile"; then cat "$pcfile" >&2; die "slotrpc.pc mentions libibverbs"; fi
cmake_cfg=$(find "$B" -name 'slotrpcConfig.cmake' | head -n 1)
[[ -n $cmake_cfg ]] || die "no slotrpcConfig.cmake in $B"
if grep -q -i 'ibverbs' "$cmake_cfg"; then die "$cmake_cfg mentions libibverbs"; fi
log "no infiniband/ header compiled, no ibv_ symbol, no libibverbs in NEEDED, slotrpc.pc or the CMake package"

# --- tests ----------------------------------------------------------------------------------
meson test -C "$B" --no-rebuild rpc_basic symbols fuzz_handshake > "$work/test.log" 2>&1 \
  || { cat "$work/test.log" >&2; cat "$B/meson-logs/testlog.txt" >&2 || true; die "tests failed in the TCP-only build"; }
log "tests rpc_basic, symbols, fuzz_handshake: OK"

# --- examples/echo -----------------------------------------------------------------------------
server=$B/examples/echo/echo_server
client=$B/examples/echo/echo_client
# start_server ENV...: echo_server on a free loopback port; sets $port.
start_server() {
  local port_file=$work/port
  rm -f "$port_file"
  env "$@" "$server" --listen 127.0.0.1:0 --port-file "$port_file" > "$work/server.log" 2>&1 &
  server_pid=$!
  local deadline=$((SECONDS + PORT_WAIT_SECONDS))
  until [[ -s $port_file ]]; do
    kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; die "echo_server exited before listening"; }
    ((SECONDS < deadline)) || die "echo_server did not write its port in ${PORT_WAIT_SECONDS}s"
    sleep 0.05
  done
  port=$(tr -d '[:space:]' < "$port_file")
}
stop_server() {
  kill -TERM "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=
}

start_server SLOTRPC_LOG_LEVEL=info
grep -q -F "tcp only: $DISABLED_MESSAGE" "$work/server.log" \
  || { cat "$work/server.log" >&2; die "echo_server (transport auto) did not log that it serves tcp only and why"; }
SLOTRPC_LOG_LEVEL=warn "$client" --connect "127.0.0.1:$port" --count "$ECHO_CALLS" > "$work/client.log" 2>&1 \
  || { cat "$work/client.log" "$work/server.log" >&2; die "echo_client over TCP failed"; }
log "echo_client against echo_server, transport auto: $ECHO_CALLS calls over TCP OK"

rc=0
SLOTRPC_TRANSPORT=verbs "$client" --connect "127.0.0.1:$port" --count 10 > "$work/client-verbs.log" 2>&1 || rc=$?
stop_server
((rc != 0)) || die "echo_client with SLOTRPC_TRANSPORT=verbs succeeded in a TCP-only build"
grep -q -F "$DISABLED_MESSAGE" "$work/client-verbs.log" \
  || { cat "$work/client-verbs.log" >&2; die "echo_client with SLOTRPC_TRANSPORT=verbs failed without saying the build has no verbs"; }
log "echo_client with SLOTRPC_TRANSPORT=verbs: fails: $(head -n 1 "$work/client-verbs.log")"

rc=0
SLOTRPC_TRANSPORT=verbs timeout 60 "$server" --listen 127.0.0.1:0 > "$work/server-verbs.log" 2>&1 || rc=$?
((rc != 0 && rc != 124)) || { cat "$work/server-verbs.log" >&2; die "echo_server with SLOTRPC_TRANSPORT=verbs did not fail (status $rc)"; }
grep -q -F "$DISABLED_MESSAGE" "$work/server-verbs.log" \
  || { cat "$work/server-verbs.log" >&2; die "echo_server with SLOTRPC_TRANSPORT=verbs failed without saying the build has no verbs"; }
log "echo_server with SLOTRPC_TRANSPORT=verbs: fails: $(head -n 1 "$work/server-verbs.log")"
log "OK"
