#!/bin/sh
# The `rxe` meson suite's launcher: runs the verbs device tests where an RDMA
# device is, directly on this host when it has one, otherwise inside the
# Soft-RoCE VM (tests/rxe/rxe-vm.sh).
#
# usage: run_device_suite.sh [--which] [RXE_VM_OPTIONS...] -- COMMAND [ARGS...]
#
# The choice, printed as one line "verbs device suite: ..." with its reason:
#   SLOTRPC_TEST_DEVICE unset, empty or "auto": the first device (by name)
#       under $SLOTRPC_TEST_SYSFS/class/infiniband (default /sys) that has a
#       port in state ACTIVE (only port $SLOTRPC_PORT counts when that is set)
#       -> direct on it; no such device -> the VM.
#   SLOTRPC_TEST_DEVICE=vm: the VM, whatever this host has.
#   SLOTRPC_TEST_DEVICE=NAME: direct on NAME. A NAME that does not exist, or
#       has no ACTIVE port, is an error (exit 125) listing what exists; never
#       a fallback to the VM, never a skip.
# Direct: COMMAND ARGS run here with SLOTRPC_DEVICE=NAME and SLOTRPC_PORT set
# to the chosen port (RXE_VM unset); of RXE_VM_OPTIONS only --timeout is used
# (coreutils timeout; 124 when it fires, like rxe-vm.sh). VM: exec
# tests/rxe/rxe-vm.sh RXE_VM_OPTIONS -- COMMAND ARGS.
#
# --which: print the choice and exit (0, or 125 as above); runs nothing.
# Tested without hardware by device_suite_choice_test.sh (suite unit).
set -u

EXIT_INFRA=125
HERE=$(cd -- "$(dirname -- "$0")" && pwd)
SYSFS=${SLOTRPC_TEST_SYSFS:-/sys}
IB="$SYSFS/class/infiniband"
WANT=${SLOTRPC_TEST_DEVICE:-auto}
ONLY_PORT=${SLOTRPC_PORT:-}
WHICH_PORT="port${ONLY_PORT:+ $ONLY_PORT}"  # for messages

die() {
  echo "run_device_suite: error: $*" >&2
  exit "$EXIT_INFRA"
}

WHICH=0
if [ "${1:-}" = "--which" ] || [ "${1:-}" = "--dry-run" ]; then
  WHICH=1
  shift
fi

# The state word of one port ("4: ACTIVE" in sysfs -> ACTIVE).
port_state() {
  s=
  read -r s <"$1/state" 2>/dev/null || s=unreadable
  echo "${s##*: }"
}

# Every device with its ports' states: "mlx5_0 (port 1 ACTIVE), rxe0 (...)".
inventory() {
  out=
  for d in "$IB"/*; do
    [ -d "$d" ] || continue
    ports=
    for p in "$d"/ports/*; do
      [ -d "$p" ] || continue
      ports="$ports${ports:+, }port ${p##*/} $(port_state "$p")"
    done
    out="$out${out:+; }${d##*/} (${ports:-no ports})"
  done
  echo "${out:-none}"
}

# first_active_port DEVDIR: the first port in state ACTIVE (only
# $ONLY_PORT when set); empty when there is none.
first_active_port() {
  for p in "$1"/ports/*; do
    [ -d "$p" ] || continue
    [ -n "$ONLY_PORT" ] && [ "${p##*/}" != "$ONLY_PORT" ] && continue
    if [ "$(port_state "$p")" = ACTIVE ]; then
      echo "${p##*/}"
      return
    fi
  done
}

MODE=vm
DEV=
PORT=
case "$WANT" in
  vm)
    WHY="SLOTRPC_TEST_DEVICE=vm"
    ;;
  auto)
    for d in "$IB"/*; do
      [ -d "$d" ] || continue
      PORT=$(first_active_port "$d")
      if [ -n "$PORT" ]; then
        MODE=direct
        DEV=${d##*/}
        break
      fi
    done
    if [ "$MODE" = direct ]; then
      WHY="auto-detected: port $PORT of $DEV is ACTIVE under $IB"
    else
      WHY="no RDMA device with an ACTIVE $WHICH_PORT under $IB; found: $(inventory)"
    fi
    ;;
  */* | . | ..)
    die "SLOTRPC_TEST_DEVICE='$WANT' is not a device name; devices under $IB: $(inventory)"
    ;;
  *)
    [ -d "$IB/$WANT" ] ||
      die "SLOTRPC_TEST_DEVICE=$WANT: no such RDMA device under $IB; found: $(inventory) (set SLOTRPC_TEST_DEVICE=vm for the Soft-RoCE VM)"
    PORT=$(first_active_port "$IB/$WANT")
    [ -n "$PORT" ] ||
      die "SLOTRPC_TEST_DEVICE=$WANT: no ACTIVE $WHICH_PORT; found: $(inventory)"
    MODE=direct
    DEV=$WANT
    WHY="SLOTRPC_TEST_DEVICE=$WANT, port $PORT ACTIVE"
    ;;
esac

if [ "$MODE" = direct ]; then
  echo "verbs device suite: direct on $DEV port $PORT, no VM ($WHY)"
else
  echo "verbs device suite: Soft-RoCE VM ($WHY)"
fi
[ "$WHICH" -eq 1 ] && exit 0

if [ "$MODE" = vm ]; then
  exec "$HERE/../rxe/rxe-vm.sh" "$@"
fi

# Direct: skip rxe-vm.sh's options (keeping --timeout), then run COMMAND.
TIMEOUT=
while [ $# -gt 0 ]; do
  case "$1" in
    --timeout) [ $# -ge 2 ] || die "--timeout needs a value"; TIMEOUT=$2; shift 2 ;;
    --timeout=*) TIMEOUT=${1#*=}; shift ;;
    --cache | --results) [ $# -ge 2 ] || die "$1 needs a value"; shift 2 ;;
    --cache=* | --results=*) shift ;;
    --) shift; break ;;
    -*) die "unknown option: $1" ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || die "no command given"
unset RXE_VM RXE_VM_RESULTS
SLOTRPC_DEVICE=$DEV
SLOTRPC_PORT=$PORT
export SLOTRPC_DEVICE SLOTRPC_PORT
if [ -n "$TIMEOUT" ]; then
  exec timeout --kill-after=10 "$TIMEOUT" "$@"
fi
exec "$@"
