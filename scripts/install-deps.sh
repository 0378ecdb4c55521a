#!/usr/bin/env bash
# Install the Debian packages slotrpc needs to build and test.
#
#   scripts/install-deps.sh            build, examples, unit/integration tests
#   scripts/install-deps.sh --test-vm  also the Soft-RoCE VM test bed (tests/rxe)
#
# Idempotent: queries dpkg for each package and, only if something is missing,
# runs `apt-get update` followed by an install of just the missing packages.
# When everything is already installed it touches nothing (no apt-get at all).
# Only Debian's package mirrors are used; nothing else is downloaded.
set -euo pipefail

# ---------------------------------------------------------------------------
# Required Debian packages (the single source of truth for dependencies).
# ---------------------------------------------------------------------------
PACKAGES=(
  # Toolchain / build system
  g++
  meson
  ninja-build
  pkg-config
  # scripts/test.sh builds examples/kv with README's CMake recipe against an
  # installed slotrpc (scripts/consumer_check.sh)
  cmake
  # RDMA verbs (transport/verbs) and tools (ibv_devices, ibv_devinfo, ...)
  libibverbs-dev
  rdma-core
  ibverbs-utils
  # Libraries
  libboost-dev
  libboost-context-dev
  libflatbuffers-dev
  flatbuffers-compiler
  libspdlog-dev
  libfmt-dev
  # TLS on TCP sessions and the verbs handshake (lib/transport/tls)
  libssl-dev
  # Command-line parsing of tools/slotrpc-stat
  libcli11-dev
  # Discovery through etcd (lib/rpc/discovery): tests/etcd_discovery_test
  # starts a real etcd server on a loopback port; etcdctl to look into one
  etcd-server
  etcd-client
  # Tests (lld: scripts/test.sh links its builds with it, about twice as
  # fast as GNU ld; the project itself does not need it)
  doctest-dev
  lld
  # Benchmarks (bench/slotrpc-bench, scripts/bench.sh): the gRPC baseline is
  # built from the same echo.fbs with flatc --cpp --grpc (its generated
  # header includes protobuf's), and bench/plot draws with gnuplot
  libgrpc++-dev
  libprotobuf-dev
  gnuplot-nox
  # Fuzzing (tests/fuzz, phase 4 of scripts/test.sh): clang, and libFuzzer
  # with the sanitizer runtimes, which Debian ships in libclang-rt-14-dev
  clang
  libclang-rt-14-dev
  # Python binding (python/, -Dpython=auto): pybind11 and Debian's python3
  # headers build the extension; meson-python lets
  # `/usr/bin/python3 -m pip install --no-build-isolation .` build it with
  # nothing fetched; flatbuffers (the runtime of flatc --python's types),
  # numpy (bulk payloads) and pytest run tests/python.  All belong to
  # Debian's interpreter, /usr/bin/python3.
  python3-dev
  pybind11-dev
  python3-pybind11
  python3-mesonpy
  python3-flatbuffers
  python3-numpy
  python3-pytest
  # meson-python rewrites the RPATH of the wheel's ELF files with it
  patchelf
  # bench/python/vs_grpcio.py: the grpcio side of the comparison (small:
  # python3-grpcio and python3-protobuf)
  python3-grpcio
  # Not python3-torch: its apt install (51.5 MB fetched, about 180 MB
  # unpacked with libtorch) took 90 s on the CI host, beyond what the CI
  # budget has left; tests/python's torch cases skip naming it.  Install it
  # by hand to run them and examples/python.
)

# With --test-vm: the Soft-RoCE VM test bed.  tests/rxe/rxe-vm.sh boots
# Debian's kernel under qemu (TCG) from a busybox initramfs; it fetches the
# kernel package itself with `apt-get download` (not installed on the host).
TEST_VM_PACKAGES=(
  qemu-system-x86
  busybox-static
  cpio
  kmod
  xz-utils
  iproute2
  ibverbs-providers
  perftest
  # scripts/rxe_compare.sh: UCX's ucx_perftest (active messages over RC
  # verbs), the messaging floor slotrpc is compared with in the same boot
  ucx-utils
  # tests/verbs/echo_over_verbs.sh fetches the server's metrics port
  curl
)

case "${1:-}" in
  "") ;;
  --test-vm) PACKAGES+=("${TEST_VM_PACKAGES[@]}") ;;
  *) printf 'usage: install-deps.sh [--test-vm]\n' >&2; exit 2 ;;
esac

log() { printf 'install-deps: %s\n' "$*"; }
die() { printf 'install-deps: error: %s\n' "$*" >&2; exit 1; }

command -v dpkg-query >/dev/null 2>&1 \
  || die "dpkg-query not found; this script supports Debian/Ubuntu only"

# A package counts as installed when dpkg reports status "<want> ok installed"
# (e.g. "install ok installed" or "hold ok installed"). One status per line so
# that Multi-Arch packages installed for several architectures are handled.
is_installed() {
  local status
  status=$(dpkg-query -W -f='${Status}\n' "$1" 2>/dev/null) || return 1
  grep -q ' ok installed$' <<<"$status"
}

missing=()
for pkg in "${PACKAGES[@]}"; do
  is_installed "$pkg" || missing+=("$pkg")
done

if ((${#missing[@]} == 0)); then
  log "all ${#PACKAGES[@]} required packages are already installed"
  exit 0
fi

log "missing packages: ${missing[*]}"

SUDO=()
if ((EUID != 0)); then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
  else
    die "not running as root and sudo is not available; install as root: apt-get install ${missing[*]}"
  fi
fi

"${SUDO[@]}" apt-get update
# `env` so the variable survives sudo's environment reset.
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y --no-install-recommends "${missing[@]}"

still_missing=()
for pkg in "${missing[@]}"; do
  is_installed "$pkg" || still_missing+=("$pkg")
done
((${#still_missing[@]} == 0)) \
  || die "packages still not installed after apt-get: ${still_missing[*]}"

log "installed: ${missing[*]}"
