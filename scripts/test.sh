#!/usr/bin/env bash
# The complete slotrpc test suite (this is what CI runs via .ci/run).
#
#   ./scripts/test.sh
#
# Phases, each failing fast with a non-zero exit:
#   0. free disk space: 4 GiB under the checkout, 1 GiB in TMPDIR
#   1. install dependencies        (scripts/install-deps.sh --test-vm)
#   2. build-test/ -O2, no -g      -> meson setup, compile, test
#   2b. install check: build-test installs into a temporary prefix
#      (build-test/prefix); examples/kv, copied outside the source tree, is
#      built against it with README's Meson recipe and README's CMake
#      recipe, exactly as README has them (scripts/consumer_check.sh), and
#      each built kv_client runs against its kv_server
#   2c. the TCP-only build (scripts/tcp_only_check.sh: -Dverbs=auto where
#      pkg-config cannot find libibverbs builds without verbs, says so, and
#      serves over TCP), and slotrpc as a Meson subproject of a consumer
#      built with the guide's subproject recipe (scripts/subproject_check.sh);
#      both run in the background while step 2's tests run, and are
#      reported after 2b
#   3. build-asan/ debug + ASan/UBSan -> meson setup, compile, test; its
#      setup and compile start right after step 2's compile, at nice 19,
#      and run beside steps 2, 2b and 2c (see "3 (early)" below)
#   4. build-fuzz/ clang + ASan/UBSan + libFuzzer -> compile only the fuzz
#      targets (tests/fuzz) and run them, all at once, for FUZZ_SECONDS from
#      their seed corpora and regressions; a crash fails the run
#      (docs/fuzzing.md)
# and finally prints one line "N passed, N failed[, N skipped]" summed over
# both meson test runs and the fuzz runs (one each).
#
# The ASan run includes the `rxe` suite: the RDMA verbs tests, run inside a
# Soft-RoCE qemu VM (tests/rxe/rxe-vm.sh; one boot), or directly on this
# host's RDMA device when one has an ACTIVE port
# (tests/verbs/run_device_suite.sh decides; see tests/rxe/README.md).  The
# build-test run leaves it out: every verbs test binary and script runs in
# the ASan run, where a bad access or undefined behaviour in the verbs code
# is caught, and a second boot with the optimized binaries cost 87 s of a
# suite that was over its 20 minutes (fresh-clone CI: 20 min 40 s with
# both).  What it added was the full load counts (VERBS_LOAD_DIVISOR=1,
# 100,000 echo calls, a 64 MiB tensor).  build-test is configured with
# -Drxe_suite=false, which also leaves the nine device test binaries out of
# its compile (about a minute); to run them by hand:
#   meson configure build-test -Drxe_suite=true && meson test -C build-test --suite rxe
#
# The release, ASan, TCP-only and subproject builds compile the library as
# unity sources (-Dunity_library=true, see lib/meson.build): a CI run is a
# one-off build, and that halves the library's compile time.
#
# Environment:
#   SLOTRPC_TEST_SKIP_ASAN=1  skip phase 3 for quick local iteration.
#                             CI never sets this: CI always runs both phases.
#   SLOTRPC_TEST_SKIP_RXE=1   leave out the rxe suite (local iteration only;
#                             CI never sets this).
#   SLOTRPC_TEST_SKIP_FUZZ=1  skip phase 4 (local iteration only; CI never
#                             sets this).
#   SLOTRPC_TEST_DEVICE=NAME  run the rxe suite directly on RDMA device NAME
#                             (fails if NAME does not exist); =vm forces the
#                             Soft-RoCE VM; unset: a device with an ACTIVE
#                             port if there is one, else the VM.
#   SLOTRPC_TEST_SYSFS=DIR    used instead of /sys when looking for devices
#                             (for tests of that choice).
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

TEST_PROCESSES=2

TOTAL_PASSED=0
TOTAL_FAILED=0
TOTAL_SKIPPED=0

# Each banner says how long the run has taken so far and how long the step
# before it took, so CI logs show where the time goes.
LAST_BANNER=0
banner() {
  local t=$SECONDS
  printf '\n'
  printf '=%.0s' {1..78}
  printf '\n==== [+ %dm%02ds, previous step %ds] %s\n' $((t / 60)) $((t % 60)) \
    $((t - LAST_BANNER)) "$*"
  LAST_BANNER=$t
  printf '=%.0s' {1..78}
  printf '\n'
}

die() { printf 'test.sh: error: %s\n' "$*" >&2; exit 1; }

print_summary() {
  local line="$TOTAL_PASSED passed, $TOTAL_FAILED failed"
  ((TOTAL_SKIPPED > 0)) && line+=", $TOTAL_SKIPPED skipped"
  printf '%s\n' "$line"
}

# The suite's own builds link with lld when it is there (install-deps.sh
# installs it): it links a test binary in about half the CPU time of GNU ld,
# and the suite links ~50 of them per build.  A choice of this script only:
# the project, and README's recipes for users, build with the default linker.
SUITE_LD=()
command -v ld.lld >/dev/null && SUITE_LD=(CXX_LD=lld CC_LD=lld)

# meson_setup DIR ARGS...: configure DIR, or reconfigure it if it already is.
meson_setup() {
  local dir=$1; shift
  if [[ -f "$dir/meson-private/coredata.dat" ]]; then
    env "${SUITE_LD[@]}" meson setup --reconfigure "$dir" "$@"
  else
    env "${SUITE_LD[@]}" meson setup "$dir" "$@"
  fi
}

# summary_count LOG LABEL: the number on meson's last "LABEL: N" summary line
# in LOG (empty if absent). Anchored at line start, so "Fail:" does not match
# "Expected Fail:"; the last match wins, so test output printed by
# --print-errorlogs cannot shadow the real summary at the end.
summary_count() {
  sed -e 's/\x1b\[[0-9;]*[A-Za-z]//g' -e 's/\r$//' "$1" \
    | grep -E "^$2:[[:space:]]+[0-9]+[[:space:]]*$" \
    | tail -n 1 | awk '{print $NF}' || true
}

# run_meson_tests DIR [MESON_TEST_ARGS...]: run meson test in DIR, streaming
# output and teeing it to a log, add its summary to the totals, and fail
# fast if it failed.
run_meson_tests() {
  local dir=$1
  shift
  local log="$dir/meson-logs/test-sh-output.log"
  mkdir -p "$dir/meson-logs"

  local extra=("$@")
  [[ "${SLOTRPC_TEST_SKIP_RXE:-0}" == 1 ]] && extra+=(--no-suite rxe)

  local rc=0
  meson test -C "$dir" --print-errorlogs --num-processes "$TEST_PROCESSES" "${extra[@]}" 2>&1 \
    | tee "$log" || rc=$?

  local ok xfail fail upass skipped timeout
  ok=$(summary_count "$log" 'Ok')
  xfail=$(summary_count "$log" 'Expected Fail')
  fail=$(summary_count "$log" 'Fail')
  upass=$(summary_count "$log" 'Unexpected Pass')
  skipped=$(summary_count "$log" 'Skipped')
  timeout=$(summary_count "$log" 'Timeout')

  if [[ -z "$ok" || -z "$fail" ]]; then
    if ((rc != 0)); then
      printf 'test.sh: meson test in %s failed (exit %d) without a summary\n' "$dir" "$rc" >&2
      print_summary
      exit "$rc"
    fi
    if grep -q 'No tests defined' "$log"; then
      printf 'test.sh: WARNING: no tests are defined in %s\n' "$dir" >&2
      return 0
    fi
    die "could not parse meson test summary from $log"
  fi

  TOTAL_PASSED=$((TOTAL_PASSED + ok + ${xfail:-0}))
  TOTAL_FAILED=$((TOTAL_FAILED + fail + ${upass:-0} + ${timeout:-0}))
  TOTAL_SKIPPED=$((TOTAL_SKIPPED + ${skipped:-0}))

  if ((rc != 0)); then
    printf 'test.sh: meson test in %s failed (exit %d)\n' "$dir" "$rc" >&2
    print_summary
    exit "$rc"
  fi
}

# setup_and_compile DIR SETUP_ARGS...: configure DIR and build it.
setup_and_compile() {
  local dir=$1; shift
  banner "[$dir] meson setup $*"
  meson_setup "$dir" "$@"
  banner "[$dir] meson compile"
  meson compile -C "$dir"
}

# --- 0. free disk space ----------------------------------------------------------
# A full disk does not fail clearly: the linker of some test aborted with
# "LLVM ERROR: IO failure on output stream" six minutes into a CI run whose
# disk had 2.7 GB free.  The suite's builds take about 2.8 GB under the
# checkout (build-asan 2.2 GB: its tests link a shared copy of the
# instrumented library, lib/meson.build says why; build-test 0.4 GB); the
# compilers' temporary files and the rxe VM's share go to TMPDIR.  Say so
# up front instead.
SUITE_DISK_GIB=4
TMP_DISK_GIB=1
# need_space DIR GIB HINT: fails unless DIR's filesystem has GIB GiB available.
need_space() {
  local dir=$1 gib=$2 hint=$3 avail_kib
  avail_kib=$(df -Pk -- "$dir" | awk 'NR == 2 { print $4 }')
  [[ $avail_kib =~ ^[0-9]+$ ]] || die "cannot read the free space of $dir (df -Pk)"
  if ((avail_kib < gib * 1024 * 1024)); then
    die "$dir has $((avail_kib / 1024)) MiB free; the suite needs $gib GiB there ($hint)"
  fi
}
need_space "$ROOT" "$SUITE_DISK_GIB" "its builds go under the checkout"
need_space "${TMPDIR:-/tmp}" "$TMP_DISK_GIB" "for temporary files; TMPDIR may name another filesystem"

# --- 1. dependencies ---------------------------------------------------------
banner "Installing dependencies"
./scripts/install-deps.sh --test-vm  # the rxe suite boots a Soft-RoCE VM

# --- 2. regular build --------------------------------------------------------
# The prefix is where phase 2b installs to (inside the build dir: scratch).
# -Doptimization=2 -Ddebug=false: the library, examples and benchmarks at
# -O2 without debug information (the tests at -O1, tests/meson.build): this
# one-off build's compile took 222 s instead of 303 s (fresh-clone CI runs
# on this 2-core machine), and the ASan build below runs the same tests
# with -g everywhere, for stack traces with lines.  No rxe suite here (see
# the top of this file).
setup_and_compile build-test -Doptimization=2 -Ddebug=false --prefix="$ROOT/build-test/prefix" \
  -Dunity_library=true -Drxe_suite=false

# --- 2c. TCP-only build and Meson subproject use, in the background ----------
# Both build slotrpc again in directories of their own and run a few
# programs on free ports; they start here and run while build-test's tests
# do, whose integration tests run one at a time and leave a core idle much
# of the time (fresh-clone CI: the two checks took 102 s after the tests;
# beside them they cost the test phase less than that).  Their output is
# printed, and their result counted, once both are done (after 2b).  Not
# beside phase 3's tests, though those leave CPU idle too: tried there at
# nice 19, they slowed the rxe VM enough (verbs_rpc_test 100 s against 62)
# that verbs_failure_test's connect, under its 1 s peer timeout, timed out.
BG_DIR=$(mktemp -d "${TMPDIR:-/tmp}/slotrpc-test-bg.XXXXXX")
# setsid: a process group of their own, so that a failure below (which
# exits the script) stops them and everything they started.
setsid bash -c '
  rc=0
  ./scripts/tcp_only_check.sh "$1/build-tcp-only" > "$2/tcp_only_check.log" 2>&1 || rc=$?
  echo "$rc" > "$2/tcp_only_check.rc"
  rc=0
  ./scripts/subproject_check.sh > "$2/subproject_check.log" 2>&1 || rc=$?
  echo "$rc" > "$2/subproject_check.rc"
' bash "$ROOT" "$BG_DIR" &
BG_PID=$!
FUZZ_BG_PID=""  # phase 4's build, when it runs beside the ASan tests (phase 3)
ASAN_BG_PID=""  # phase 3's build, when it runs beside build-test's tests
trap 'kill -TERM -- "-$BG_PID" 2>/dev/null || true
      [[ -n "$ASAN_BG_PID" ]] && kill -TERM -- "-$ASAN_BG_PID" 2>/dev/null
      [[ -n "$FUZZ_BG_PID" ]] && kill -TERM -- "-$FUZZ_BG_PID" 2>/dev/null
      rm -rf -- "$BG_DIR"' EXIT

# start_bg_build DIR TARGETS [VAR=VALUE ...] -- SETUP_ARGS...: configures
# DIR (or reconfigures it) and compiles TARGETS (space-separated; empty:
# everything) in the background, with the VAR=VALUE settings, at nice 19
# so that it takes only the CPU the tests beside it leave, and in a process
# group of its own (setsid: the EXIT trap stops it on failure).  Its output
# goes to $BG_DIR/DIR.log and its exit status to $BG_DIR/DIR.rc; the
# group's id to BG_BUILD_PID.
start_bg_build() {
  local dir=$1 targets=$2
  shift 2
  local vars=()
  while [[ $1 != -- ]]; do vars+=("$1"); shift; done
  shift
  local reconfigure=()
  [[ -f $dir/meson-private/coredata.dat ]] && reconfigure=(--reconfigure)
  setsid nice -n 19 env "${SUITE_LD[@]}" "${vars[@]}" bash -c '
    out=$1 dir=$2 targets=$3
    shift 3
    rc=0
    { meson setup "$dir" "$@" && meson compile -C "$dir" $targets; } > "$out/$dir.log" 2>&1 || rc=$?
    echo "$rc" > "$out/$dir.rc"
  ' bash "$BG_DIR" "$dir" "$targets" "${reconfigure[@]}" "$@" &
  BG_BUILD_PID=$!
}

# finish_bg_build PID DIR: waits for start_bg_build's build of DIR, then
# prints the end of its log; or, if it failed, all of it, and stops the
# suite.
finish_bg_build() {
  local pid=$1 dir=$2 rc
  wait "$pid" || true
  rc=$(cat "$BG_DIR/$dir.rc" 2>/dev/null || echo 1)
  if ((rc != 0)); then
    cat "$BG_DIR/$dir.log" >&2
    printf 'test.sh: the %s build failed (exit %s)\n' "$dir" "$rc" >&2
    TOTAL_FAILED=$((TOTAL_FAILED + 1))
    print_summary
    exit 1
  fi
  tail -n 5 "$BG_DIR/$dir.log"
}

# --- 3 (early): the sanitizer build, in the background ------------------------
# build-test's tests (integration tests run one at a time) and the install
# check leave a core idle much of the time; the ASan build (configure +
# compile, 390 to 460 s of a fresh-clone CI run on its own, the suite's
# longest step) starts here at nice 19, so it takes what they leave and
# slows them little.  Phase 3 waits for it.
# -Dbench=false: the benchmarks are never run by the suite, and compiling
# them under the sanitizers only costs time.
ASAN_BUILD_ARGS=(--buildtype=debug -Db_sanitize=address,undefined -Db_lundef=false -Dbench=false
                 -Dunity_library=true)
if [[ "${SLOTRPC_TEST_SKIP_ASAN:-0}" != 1 ]]; then
  start_bg_build build-asan "" -- "${ASAN_BUILD_ARGS[@]}"
  ASAN_BG_PID=$BG_BUILD_PID
fi

banner "[build-test] meson test (2c and the ASan build run beside it)"
run_meson_tests build-test

# --- 2b. install check ----------------------------------------------------------
# What a user of the installed library does, with README's recipes as
# written: any drift between README and the packaging fails here.
banner "[build-test] install into build-test/prefix; examples/kv with README's Meson and CMake recipes"
rm -rf build-test/prefix
meson install -C build-test --quiet
if ./scripts/consumer_check.sh "$ROOT/build-test/prefix"; then
  TOTAL_PASSED=$((TOTAL_PASSED + 1))
else
  TOTAL_FAILED=$((TOTAL_FAILED + 1))
  print_summary
  exit 1
fi

# --- 2c (continued): the background checks' results ------------------------
# finish_check NAME: prints NAME's log and counts it as one more passed
# check, or stops the suite.
finish_check() {
  local name=$1 rc
  rc=$(cat "$BG_DIR/$name.rc" 2>/dev/null || echo 1)
  cat "$BG_DIR/$name.log"
  if ((rc == 0)); then
    TOTAL_PASSED=$((TOTAL_PASSED + 1))
  else
    printf 'test.sh: %s failed (exit %s)\n' "$name" "$rc" >&2
    TOTAL_FAILED=$((TOTAL_FAILED + 1))
    print_summary
    exit 1
  fi
}
banner "waiting for 2c: [build-tcp-only] -Dverbs=auto without libibverbs, and examples/kv with README's subproject recipe"
wait "$BG_PID" || true
banner "[build-tcp-only] -Dverbs=auto without libibverbs: a TCP-only library, echo over TCP"
finish_check tcp_only_check
banner "examples/kv with README's subproject recipe (subprojects/slotrpc -> this checkout)"
finish_check subproject_check

# --- 4 (early): the fuzz build, in the background -------------------------
# Phase 3's tests run one at a time for the most part (the rxe VM alone
# takes over three minutes) and leave CPU idle; the fuzz targets' build
# (configure + compile, 85 s on its own) runs beside them at nice 19, so it
# takes only what they leave and slows them little.  Phase 4 waits for it.
FUZZ_TARGETS=(header handshake tcp_session method_verify pack)
FUZZ_BUILD_ARGS=(-Doptimization=2 -Ddebug=false -Dfuzzing=true -Db_sanitize=address,undefined -Db_lundef=false)
start_fuzz_build() {
  start_bg_build build-fuzz "${FUZZ_TARGETS[*]/#/tests/fuzz/fuzz_}" CXX=clang++ -- "${FUZZ_BUILD_ARGS[@]}"
  FUZZ_BG_PID=$BG_BUILD_PID
}

# --- 3. sanitizer build ------------------------------------------------------
# SLOTRPC_TEST_SKIP_ASAN=1 is for local iteration only; CI never sets it.
if [[ "${SLOTRPC_TEST_SKIP_ASAN:-0}" == 1 ]]; then
  banner "Skipping ASan/UBSan phase (SLOTRPC_TEST_SKIP_ASAN=1)"
else
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  banner "[build-asan] waiting for its build (${ASAN_BUILD_ARGS[*]}; begun beside build-test's tests)"
  finish_bg_build "$ASAN_BG_PID" build-asan
  ASAN_BG_PID=""
  if [[ "${SLOTRPC_TEST_SKIP_FUZZ:-0}" != 1 ]]; then
    start_fuzz_build
    banner "[build-asan] meson test (the fuzz build runs beside it at nice 19)"
  else
    banner "[build-asan] meson test"
  fi
  run_meson_tests build-asan
fi

# --- 4. fuzzing ---------------------------------------------------------------
# Every run fuzzes each target briefly; the long runs are in docs/fuzzing.md.
# The five targets run at the same time (the machine's cores share them),
# each for FUZZ_SECONDS of wall time from an empty work corpus plus its seed
# corpus and regressions, so the phase costs the same on every run:
# configure + compile + FUZZ_SECONDS.
FUZZ_SECONDS=30

# start_fuzzer DIR TARGET: runs fuzz_TARGET in the background; its exit
# status goes to DIR/fuzz-work/TARGET.rc.
start_fuzzer() {
  local dir=$1 t=$2
  local work="$dir/fuzz-work/$t" artifacts="$dir/fuzz-artifacts"
  rm -rf "$work" "$dir/fuzz-work/$t.rc"
  mkdir -p "$work" "$artifacts" "$dir/meson-logs"
  local corpora=("tests/fuzz/corpus/$t")
  [[ -d "tests/fuzz/regressions/$t" ]] && corpora+=("tests/fuzz/regressions/$t")
  (
    rc=0
    "$dir/tests/fuzz/fuzz_$t" -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$artifacts/$t-" "$work" "${corpora[@]}" \
      > "$dir/meson-logs/fuzz_$t.log" 2>&1 || rc=$?
    echo "$rc" > "$dir/fuzz-work/$t.rc"
  ) &
}

# check_fuzzer DIR TARGET: after it ended, count it, or fail with the input.
check_fuzzer() {
  local dir=$1 t=$2
  local log="$dir/meson-logs/fuzz_$t.log" artifacts="$dir/fuzz-artifacts"
  local rc
  rc=$(cat "$dir/fuzz-work/$t.rc" 2>/dev/null || echo 1)
  printf 'fuzz_%s: ' "$t"
  grep -E '^Done [0-9]+ runs' "$log" || printf 'no summary\n'
  if ((rc != 0)); then
    tail -n 60 "$log" >&2
    printf 'test.sh: fuzz_%s failed (exit %d); the input is in %s, log in %s\n' \
      "$t" "$rc" "$artifacts" "$log" >&2
    printf 'test.sh: reproduce with %s/tests/fuzz/fuzz_%s FILE; commit FILE under tests/fuzz/regressions/%s/\n' \
      "$dir" "$t" "$t" >&2
    TOTAL_FAILED=$((TOTAL_FAILED + 1))
    return 1
  fi
  TOTAL_PASSED=$((TOTAL_PASSED + 1))
}

if [[ "${SLOTRPC_TEST_SKIP_FUZZ:-0}" == 1 ]]; then
  banner "Skipping fuzzing phase (SLOTRPC_TEST_SKIP_FUZZ=1)"
else
  fuzz_start=$SECONDS
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  # No -g (-Ddebug=false in FUZZ_BUILD_ARGS): a crash still names its
  # functions, and its input replays with tests/fuzz/fuzz_TARGET_replay in
  # a debug build (docs/fuzzing.md); the compile took 80 s instead of 88 s.
  if [[ -n "$FUZZ_BG_PID" ]]; then
    banner "[build-fuzz] waiting for its build (clang, ASan/UBSan, libFuzzer; begun beside the ASan tests)"
    finish_bg_build "$FUZZ_BG_PID" build-fuzz
    FUZZ_BG_PID=""
  else
    banner "[build-fuzz] meson setup (clang, ASan/UBSan, libFuzzer)"
    CXX=clang++ meson_setup build-fuzz "${FUZZ_BUILD_ARGS[@]}"
    banner "[build-fuzz] meson compile (fuzz targets only)"
    meson compile -C build-fuzz "${FUZZ_TARGETS[@]/#/tests/fuzz/fuzz_}"
  fi
  banner "[build-fuzz] ${FUZZ_TARGETS[*]}: ${FUZZ_SECONDS}s each, at the same time"
  for t in "${FUZZ_TARGETS[@]}"; do start_fuzzer build-fuzz "$t"; done
  wait
  fuzz_failed=0
  for t in "${FUZZ_TARGETS[@]}"; do check_fuzzer build-fuzz "$t" || fuzz_failed=1; done
  printf 'test.sh: fuzzing phase took %d s\n' $((SECONDS - fuzz_start))
  if ((fuzz_failed)); then
    print_summary
    exit 1
  fi
fi

banner "Summary"
print_summary
