#!/usr/bin/env bash
# Run a command inside a throw-away qemu VM that has a Soft-RoCE device.
#
# usage: rxe-vm.sh [--cache DIR] [--timeout SECONDS] [--results DIR] -- COMMAND [ARGS...]
#
# The VM (TCG, no network) runs Debian's stock kernel (fetched once with
# `apt-get download`, cached in DIR) with a busybox initramfs that loads
# rdma_rxe, creates rxe0 on dummy0, mounts the host's / read-only over 9p and
# runs COMMAND chrooted into it, in the caller's working directory. The
# command's stdout/stderr are printed on the host afterwards and its exit
# status is this script's exit status.
#
# Exit status: COMMAND's status; 124 if the host-side timeout killed the VM;
# 125 if the VM could not be prepared, booted, or rxe0 could not be set up.
# See tests/rxe/README.md.
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
GUEST_INIT="$SCRIPT_DIR/guest-init.sh"

EXIT_TIMEOUT=124
EXIT_INFRA=125

# Modules loaded by the initramfs, in this order (dependencies found by
# modprobe --show-depends are inserted before each one). Modules built into
# the kernel or absent from it are skipped, except the required ones.
MODULES=(virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev
  virtio_pci netfs fscache 9pnet 9pnet_virtio 9p configfs ib_core ib_uverbs
  udp_tunnel ip6_udp_tunnel crc32_generic rdma_rxe dummy
  # optional extras: the rdma_cm stack (/dev/infiniband/rdma_cm, perftest -R)
  rdma_ucm)
REQUIRED_MODULES=(virtio_pci 9pnet_virtio 9p ib_core ib_uverbs rdma_rxe)
# Module parameters (the host's /lib/modprobe.d may say numdummies=0).
declare -A MODULE_PARAMS=([dummy]="numdummies=1")
# Bump when the initramfs layout changes in a way the hash below can't see.
INITRAMFS_FORMAT=1

log() { printf 'rxe-vm: %s\n' "$*" >&2; }
die() { printf 'rxe-vm: error: %s\n' "$*" >&2; exit "$EXIT_INFRA"; }

usage() {
  cat <<'EOF'
usage: rxe-vm.sh [--cache DIR] [--timeout SECONDS] [--results DIR] -- COMMAND [ARGS...]

Boots a qemu (TCG) VM with a Soft-RoCE device rxe0 on dummy0, runs COMMAND
there in the current directory (host / mounted read-only), prints its output
and exits with its exit status (124: timed out, 125: VM/rxe setup failed).

  --cache DIR        cache for the kernel package and initramfs
                     (default: ./build-rxe-cache; console logs go to DIR/logs)
  --timeout SECONDS  host-side limit for the whole VM run (default: 600)
  --results DIR      use DIR as the writable share (visible in the guest as
                     $RXE_VM_RESULTS = /run/rxe-vm) and keep it afterwards
                     (default: a temporary directory, removed at exit)

Environment: variables named SLOTRPC_* and those listed (space-separated) in
RXE_VM_PASS_ENV are forwarded to COMMAND, as are PATH, LANG and LC_ALL.
RXE_VM_MEM (MiB, 2048), RXE_VM_SMP (2), RXE_VM_MTU (dummy0 MTU, default 1500),
RXE_VM_KERNEL_PKG (kernel package; default: what linux-image-amd64 depends
on), RXE_VM_APPEND (extra kernel command line).
EOF
}

# --- arguments --------------------------------------------------------------
CACHE=./build-rxe-cache
TIMEOUT=600
RESULTS=
while (($#)); do
  case "$1" in
    --cache) (($# >= 2)) || die "--cache needs a value"; CACHE=$2; shift 2 ;;
    --cache=*) CACHE=${1#*=}; shift ;;
    --timeout) (($# >= 2)) || die "--timeout needs a value"; TIMEOUT=$2; shift 2 ;;
    --timeout=*) TIMEOUT=${1#*=}; shift ;;
    --results) (($# >= 2)) || die "--results needs a value"; RESULTS=$2; shift 2 ;;
    --results=*) RESULTS=${1#*=}; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    -*) usage >&2; die "unknown option: $1" ;;
    *) break ;;
  esac
done
(($# >= 1)) || { usage >&2; die "no command given"; }
[[ $TIMEOUT =~ ^[0-9]+$ && $TIMEOUT -gt 0 ]] || die "--timeout must be a positive integer (got '$TIMEOUT')"
MEM=${RXE_VM_MEM:-2048}
SMP=${RXE_VM_SMP:-2}
[[ $MEM =~ ^[0-9]+$ ]] || die "RXE_VM_MEM must be a number of MiB"
[[ $SMP =~ ^[0-9]+$ ]] || die "RXE_VM_SMP must be a number"
if [[ -n ${RXE_VM_MTU:-} ]]; then
  [[ $RXE_VM_MTU =~ ^[0-9]+$ ]] || die "RXE_VM_MTU must be a number"
fi

CWD=$(pwd -P)
case "$CWD" in
  /tmp | /run | /var/tmp)
    log "warning: the working directory $CWD is an empty tmpfs in the guest; host files there are not visible" ;;
esac
mkdir -p -- "$CACHE" || die "cannot create cache dir $CACHE"
CACHE=$(cd -- "$CACHE" && pwd -P)

# --- host tools -------------------------------------------------------------
need() {
  command -v "$1" >/dev/null 2>&1 \
    || die "'$1' not found (Debian package: $2; see scripts/install-deps.sh --test-vm)"
}
need qemu-system-x86_64 qemu-system-x86
need timeout coreutils
need flock util-linux
need cpio cpio
need gzip gzip
[[ -f $GUEST_INIT ]] || die "missing $GUEST_INIT"
[[ -x /usr/bin/env && -x /bin/bash ]] || die "the host root needs /usr/bin/env and /bin/bash"
for t in ip rdma; do
  command -v "$t" >/dev/null 2>&1 || die "'$t' not found on the host root (Debian package: iproute2)"
done

# --- cache: kernel package + initramfs (serialised by a lock) ---------------
exec {lockfd}>"$CACHE/.lock"
flock "$lockfd"
trap 'rm -rf -- "$CACHE/unpacked.tmp" "$CACHE/initramfs.tmp"' EXIT

# The cache keeps the .deb (deb/), the kernel image + version (kernel/) and the
# initramfs; the package is unpacked (dpkg -x) only while building those.
KDIR="$CACHE/kernel"
UNPACKED="$CACHE/unpacked.tmp"
unpack_kernel() {  # $1 = .deb; sets UNPACKED_KVER
  rm -rf -- "$UNPACKED"
  dpkg -x "$1" "$UNPACKED" || die "dpkg -x $1 failed"
  local kvers=("$UNPACKED"/lib/modules/*/)
  [[ -d ${kvers[0]} ]] || die "$(basename "$1") has no /lib/modules/<version>"
  UNPACKED_KVER=$(basename "${kvers[0]}")
  [[ -f $UNPACKED/boot/vmlinuz-$UNPACKED_KVER ]] || die "$(basename "$1") has no /boot/vmlinuz-$UNPACKED_KVER"
  depmod -b "$UNPACKED" "$UNPACKED_KVER" || die "depmod for $UNPACKED_KVER failed"
}
if [[ ! -f $KDIR/.ready ]]; then
  need dpkg dpkg
  need apt-get apt
  need depmod kmod
  pkg=${RXE_VM_KERNEL_PKG:-}
  if [[ -z $pkg ]]; then
    resolve() { apt-cache depends linux-image-amd64 2>/dev/null | awk '$1 == "Depends:" && $2 ~ /^linux-image-/ { print $2; exit }'; }
    pkg=$(resolve || true)
    if [[ -z $pkg ]]; then
      log "apt-cache does not know linux-image-amd64; running apt-get update"
      apt-get update >&2 || die "apt-get update failed (needed to find the kernel package)"
      pkg=$(resolve || true)
    fi
    [[ -n $pkg ]] || die "cannot determine the kernel package (apt-cache depends linux-image-amd64); set RXE_VM_KERNEL_PKG"
  fi
  log "fetching kernel package $pkg into $CACHE (one-off)"
  rm -rf -- "$CACHE/deb" "$KDIR" "$KDIR.tmp"
  mkdir -p "$CACHE/deb"
  if ! (cd "$CACHE/deb" && apt-get download "$pkg") >"$CACHE/apt-download.log" 2>&1; then
    log "apt-get download $pkg failed; running apt-get update and retrying"
    apt-get update >&2 || die "apt-get update failed; cannot download $pkg (see $CACHE/apt-download.log)"
    (cd "$CACHE/deb" && apt-get download "$pkg") >"$CACHE/apt-download.log" 2>&1 \
      || { tail -n 5 "$CACHE/apt-download.log" >&2; die "apt-get download $pkg failed"; }
  fi
  debs=("$CACHE"/deb/*.deb)
  [[ -f ${debs[0]} ]] || die "apt-get download $pkg produced no .deb"
  unpack_kernel "${debs[0]}"
  mkdir -p "$KDIR.tmp"
  cp -- "$UNPACKED/boot/vmlinuz-$UNPACKED_KVER" "$KDIR.tmp/vmlinuz"
  printf '%s\n%s\n' "$UNPACKED_KVER" "$(basename "${debs[0]}")" >"$KDIR.tmp/.ready"
  mv -- "$KDIR.tmp" "$KDIR"
fi
KVER=$(sed -n 1p "$KDIR/.ready")
KPKG=$(sed -n 2p "$KDIR/.ready")
VMLINUZ="$KDIR/vmlinuz"
[[ -f $VMLINUZ && -f $CACHE/deb/$KPKG ]] || die "the kernel cache is broken; remove $KDIR and retry"

BUSYBOX=$(command -v busybox || true)
[[ -n $BUSYBOX ]] || die "busybox not found (Debian package: busybox-static)"
if ldd "$BUSYBOX" 2>/dev/null | grep -q '=>'; then
  die "$BUSYBOX is dynamically linked; install busybox-static"
fi

key=$( {
  echo "$INITRAMFS_FORMAT $KVER $KPKG"
  echo "${MODULES[*]} / ${REQUIRED_MODULES[*]}"
  for m in "${!MODULE_PARAMS[@]}"; do echo "$m=${MODULE_PARAMS[$m]}"; done | sort
  cat -- "$GUEST_INIT"
  cksum <"$BUSYBOX"
} | sha256sum | cut -c1-16)
INITRD="$CACHE/initramfs-$key.cpio.gz"

build_initramfs() {
  need modprobe kmod
  need depmod kmod
  [[ -n ${UNPACKED_KVER:-} ]] || unpack_kernel "$CACHE/deb/$KPKG"
  [[ $UNPACKED_KVER == "$KVER" ]] || die "$KPKG unpacks to kernel $UNPACKED_KVER, expected $KVER"
  local root="$CACHE/initramfs.tmp" m kind path base
  local -A seen=()
  local -a order=()
  rm -rf -- "$root"
  mkdir -p "$root"/{bin,dev,proc,sys,results,newroot,tmp,etc/rxe-vm,lib/rxe-vm}
  cp -- "$BUSYBOX" "$root/bin/busybox"
  local applet
  for applet in $("$BUSYBOX" --list); do
    [[ $applet == busybox ]] || ln -s busybox "$root/bin/$applet"
  done
  install -m 0755 -- "$GUEST_INIT" "$root/init"

  is_required() { local r; for r in "${REQUIRED_MODULES[@]}"; do [[ $r == "$1" ]] && return 0; done; return 1; }
  for m in "${MODULES[@]}"; do
    local deps
    if ! deps=$(modprobe -d "$UNPACKED" -S "$KVER" -C /dev/null --show-depends "$m" 2>&1); then
      is_required "$m" && die "required module $m is not in kernel $KVER ($KPKG): $deps"
      log "note: module $m not in kernel $KVER; skipping"
      continue
    fi
    while read -r kind path _; do
      case "$kind" in
        builtin) continue ;;
        insmod) ;;
        *) continue ;;
      esac
      base=$(basename -- "$path"); base=${base%%.ko*}
      [[ -n ${seen[$base]:-} ]] && continue
      seen[$base]=1
      case "$path" in
        *.ko) cp -- "$path" "$root/lib/rxe-vm/$base.ko" ;;
        *.ko.xz) xz -dc -- "$path" >"$root/lib/rxe-vm/$base.ko" || die "xz -d $path failed (install xz-utils)" ;;
        *.ko.zst) zstd -qdc -- "$path" >"$root/lib/rxe-vm/$base.ko" || die "zstd -d $path failed (install zstd)" ;;
        *.ko.gz) gzip -dc -- "$path" >"$root/lib/rxe-vm/$base.ko" || die "gzip -d $path failed" ;;
        *) die "unexpected module file $path" ;;
      esac
      local mod=${base//-/_} req=no
      is_required "$mod" && req=yes
      order+=("$base $req ${MODULE_PARAMS[$mod]:-}")
    done <<<"$deps"
  done
  printf '%s\n' "${order[@]}" >"$root/etc/rxe-vm/modules"
  cp -- "$root/etc/rxe-vm/modules" "$INITRD.modules"
  [[ -f $root/lib/rxe-vm/rdma_rxe.ko ]] \
    || grep -q '/rdma_rxe\.ko' "$UNPACKED/lib/modules/$KVER/modules.builtin" \
    || die "rdma_rxe is neither a module nor built into kernel $KVER"

  (cd "$root" && find . -print | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) \
    | gzip -1 >"$INITRD.tmp" || die "cpio/gzip of the initramfs failed"
  mv -- "$INITRD.tmp" "$INITRD"
  rm -rf -- "$root" "$UNPACKED"
  log "built $(basename "$INITRD") for kernel $KVER; modules: $(cut -d' ' -f1 "$INITRD.modules" 2>/dev/null | tr '\n' ' ')"
}

if [[ ! -f $INITRD ]]; then
  rm -f -- "$CACHE"/initramfs-*.cpio.gz "$CACHE"/initramfs-*.cpio.gz.modules
  build_initramfs
fi
flock -u "$lockfd"
exec {lockfd}>&-
trap - EXIT

# --- the run ----------------------------------------------------------------
if [[ -n $RESULTS ]]; then
  mkdir -p -- "$RESULTS" || die "cannot create $RESULTS"
  SHARE=$(cd -- "$RESULTS" && pwd -P)
  rm -f -- "$SHARE"/{run.env,cmd.sh,stdout,stderr,rc,rc.tmp,started,infra_error}
  KEEP_SHARE=1
else
  SHARE=$(mktemp -d "${TMPDIR:-/tmp}/rxe-vm.XXXXXX") || die "mktemp failed"
  KEEP_SHARE=
fi

mkdir -p "$CACHE/logs"
LOG="$CACHE/logs/console-$(date +%Y%m%d-%H%M%S)-$$.log"
ln -sfn -- "$(basename "$LOG")" "$CACHE/logs/latest.log"
# keep the 20 newest console logs
# shellcheck disable=SC2012  # our own file names
old_logs=$(ls -1t "$CACHE"/logs/console-*.log 2>/dev/null | tail -n +21) || true
[[ -z $old_logs ]] || while read -r f; do rm -f -- "$f"; done <<<"$old_logs"

QPID=
# shellcheck disable=SC2317  # invoked via trap
cleanup() {
  if [[ -n $QPID ]]; then kill -TERM "$QPID" 2>/dev/null || true; wait "$QPID" 2>/dev/null || true; fi
  [[ -n $KEEP_SHARE ]] || rm -rf -- "$SHARE"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT
trap 'log "terminated"; exit 143' TERM

q() { printf '%q' "$1"; }
{
  printf 'RXE_VM_CWD=%s\n' "$(q "$CWD")"
  [[ -n ${RXE_VM_MTU:-} ]] && printf 'RXE_VM_MTU=%s\n' "$RXE_VM_MTU"
  printf 'RXE_VM_9P_CACHE=%s\n' "$(q "${RXE_VM_9P_CACHE:-loose}")"
} >"$SHARE/run.env"

{
  echo '#!/bin/bash'
  echo '# generated by rxe-vm.sh; run by the guest init inside the host root'
  printf 'export PATH=%s\n' "$(q "${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}")"
  printf 'export LANG=%s\n' "$(q "${LANG:-C.UTF-8}")"
  [[ -n ${LC_ALL:-} ]] && printf 'export LC_ALL=%s\n' "$(q "$LC_ALL")"
  echo 'export HOME=/tmp/home TMPDIR=/tmp TERM=dumb'
  echo 'export RXE_VM=1 RXE_VM_RESULTS=/run/rxe-vm'
  names=()
  while read -r n; do [[ $n == SLOTRPC_* ]] && names+=("$n"); done < <(compgen -e)
  for n in ${RXE_VM_PASS_ENV:-}; do
    [[ $n =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || die "RXE_VM_PASS_ENV: bad variable name '$n'"
    [[ -n ${!n+set} ]] && names+=("$n")
  done
  for n in "${names[@]}"; do printf 'export %s=%s\n' "$n" "$(q "${!n}")"; done
  echo 'mkdir -p /tmp/home 2>/dev/null'
  printf 'cd -- %s || { echo "rxe-vm: cannot cd to %s in the guest" >&2; exit 125; }\n' "$(q "$CWD")" "$(q "$CWD")"
  printf 'exec'
  for a in "$@"; do printf ' %s' "$(q "$a")"; done
  printf '\n'
} >"$SHARE/cmd.sh"
chmod +x "$SHARE/cmd.sh"

APPEND="console=ttyS0 panic=-1 loglevel=5 rdinit=/init ${RXE_VM_APPEND:-}"
# shellcheck disable=SC2054  # commas are qemu's
QEMU=(qemu-system-x86_64 -nodefaults -no-user-config -machine pc
  -accel tcg,thread=multi -cpu max -m "$MEM" -smp "$SMP"
  -nic none -display none -vga none -no-reboot
  -chardev "file,id=con,path=$LOG,append=on" -serial chardev:con
  -kernel "$VMLINUZ" -initrd "$INITRD" -append "$APPEND"
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap
  -virtfs "local,path=$SHARE,mount_tag=results,security_model=none")

{
  echo "### rxe-vm $(date -Is): kernel $KVER ($KPKG), timeout ${TIMEOUT}s"
  echo "### cwd: $CWD"
  echo "### command: $*"
  echo "### ${QEMU[*]}"
} >"$LOG"

start=$SECONDS
timeout -k 10 "$TIMEOUT" "${QEMU[@]}" </dev/null >>"$LOG" 2>&1 &
QPID=$!
set +e
wait "$QPID"
qrc=$?
set -e
QPID=
elapsed=$((SECONDS - start))
echo "### qemu exited with status $qrc after ${elapsed}s" >>"$LOG"

show_output() {
  [[ -f $SHARE/stdout ]] && cat -- "$SHARE/stdout"
  [[ -f $SHARE/stderr ]] && cat -- "$SHARE/stderr" >&2
  return 0
}
show_log_tail() {
  log "last lines of the VM console log ($LOG):"
  tail -n 40 -- "$LOG" | sed 's/^/  | /' >&2
}

if [[ -f $SHARE/rc ]]; then
  rc=$(<"$SHARE/rc")
  show_output
  [[ $rc =~ ^[0-9]+$ ]] || die "bad exit status '$rc' from the guest"
  if ((rc != 0)); then
    log "command exited with status $rc (VM run took ${elapsed}s; console log: $LOG)"
  fi
  exit "$rc"
fi

if ((qrc == 124 || qrc == 137)); then
  [[ -f $SHARE/started ]] && show_output
  show_log_tail
  log "error: timed out after ${TIMEOUT}s; qemu killed$([[ -f $SHARE/started ]] && echo ' (command had started; partial output above)')"
  exit "$EXIT_TIMEOUT"
fi

[[ -f $SHARE/started ]] && show_output
show_log_tail
if [[ -f $SHARE/infra_error ]]; then
  die "VM setup failed: $(<"$SHARE/infra_error")"
elif grep -q 'rxe-vm-init: FATAL:' "$LOG"; then
  die "VM setup failed: $(grep -m1 'rxe-vm-init: FATAL:' "$LOG" | sed 's/.*FATAL: //')"
elif ((qrc != 0)); then
  die "qemu failed with status $qrc (see $LOG)"
else
  die "the VM powered off without reporting an exit status (see $LOG)"
fi
