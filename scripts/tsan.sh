#!/usr/bin/env bash
# The unit and integration suites under ThreadSanitizer (not part of
# scripts/test.sh: the build and the run take about ten minutes on two
# cores, which the 20-minute suite has no room for).  Run it after a change
# to anything shared between threads: event loops and the threads that
# call into them, bulk lanes, shared loops, the release queue.
#
#   scripts/tsan.sh [--build DIR]          (default build-tsan/)
#
# Builds DIR with -Db_sanitize=thread (debugoptimized, no rxe suite: the
# verbs tests run in a VM whose kernel TSan cannot see), then runs every
# test of the unit and integration suites but the two that drive Debian's
# gRPC (slotrpc_bench_smoke, slotrpc_fanout_smoke: libgrpc is not built
# for TSan, which then sees its locks as races).  Handler fibers tell TSan
# about their stack switches (lib/base/fiber_pool.cc); the suppressions
# in tests/tsan.supp say why each is not ours.  Any report fails the test
# that made it (exit status 66) and this script.
set -euo pipefail
ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$ROOT/build-tsan
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) BUILD=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "tsan.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [[ ! -f $BUILD/build.ninja ]]; then
  meson setup "$BUILD" "$ROOT" --buildtype=debugoptimized -Db_sanitize=thread \
    -Drxe_suite=false -Dunity_library=true
fi
ninja -C "$BUILD"
export TSAN_OPTIONS="suppressions=$ROOT/tests/tsan.supp second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
mapfile -t TESTS < <(meson test -C "$BUILD" --list --suite unit --suite integration 2>/dev/null |
  sed -E 's/^[^/]+\/ *//' | grep -vE '^(slotrpc_bench_smoke|slotrpc_fanout_smoke)$')
[[ ${#TESTS[@]} -gt 10 ]] || { echo "tsan.sh: found only ${#TESTS[@]} tests in $BUILD" >&2; exit 1; }
meson test -C "$BUILD" --num-processes 2 "${TESTS[@]}"
