#!/bin/busybox sh
# /init of the rxe-vm initramfs (PID 1 in the guest, busybox sh).
#
# Built into the initramfs by rxe-vm.sh; not meant to be run on the host.
# 1. loads the modules listed in /etc/rxe-vm/modules (virtio, 9p, ib_core,
#    rdma_rxe, dummy, ...), in order;
# 2. mounts the writable results share (9p tag "results") and reads run.env
#    from it (written by the host: RXE_VM_CWD, ...);
# 3. mounts the host root (9p tag "hostroot", read-only) on /newroot and
#    /proc, /sys, /dev, /dev/pts, /dev/shm, /tmp, /run, /var/tmp inside it;
# 4. brings up lo and dummy0 and creates rxe0 on dummy0 (host's ip/rdma);
# 5. runs /run/rxe-vm/cmd.sh (written by the host) chrooted into the host
#    root, stdout/stderr/exit status into the results share;
# 6. powers off.
# Lines starting with "rxe-vm-init: FATAL:" are what the host shows when the
# VM fails before the command ran.

export PATH=/bin
R=/results          # results share, seen from the initramfs
N=/newroot          # host root
results_mounted=

log() { echo "rxe-vm-init: $*"; }

halt_now() {
  sync
  poweroff -f
  # poweroff -f should not return; make sure PID 1 never exits quietly.
  sleep 5
  echo o >/proc/sysrq-trigger 2>/dev/null
  while :; do sleep 60; done
}

fatal() {
  echo "rxe-vm-init: FATAL: $*"
  [ -n "$results_mounted" ] && echo "$*" >"$R/infra_error" 2>/dev/null
  halt_now
}

mkdir -p /proc /sys /dev "$R" "$N"
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
# The initramfs has no /dev/console node of its own (built without root).
[ -c /dev/console ] && exec </dev/console >/dev/console 2>&1
log "kernel $(uname -r), $(nproc) cpus"

# --- 1. modules -------------------------------------------------------------
# Each line: NAME REQUIRED(yes|no) [PARAMS...]; the file is /lib/rxe-vm/NAME.ko
while read -r name required params; do
  [ -n "$name" ] || continue
  case "$name" in \#*) continue ;; esac
  sysname=$(echo "$name" | tr - _)
  if [ -d "/sys/module/$sysname" ] && [ ! -f "/sys/module/$sysname/initstate" ]; then
    continue   # built in
  fi
  # shellcheck disable=SC2086  # params are word-split on purpose
  if out=$(insmod "/lib/rxe-vm/$name.ko" $params 2>&1); then
    log "loaded $name"
  elif [ -d "/sys/module/$sysname" ]; then
    log "$name already present"
  elif [ "$required" = yes ]; then
    dmesg | tail -n 20
    fatal "cannot load required module $name: $out"
  else
    log "warning: optional module $name not loaded: $out"
  fi
done </etc/rxe-vm/modules

# --- 2. results share -------------------------------------------------------
P9OPTS=trans=virtio,version=9p2000.L,msize=262144
mount -t 9p -o "$P9OPTS" results "$R" \
  || fatal "cannot mount the results share (9p tag 'results')"
results_mounted=1
[ -f "$R/run.env" ] || fatal "run.env missing in the results share"
# shellcheck source=/dev/null
. "$R/run.env"
log "results share mounted"

# --- 3. host root -----------------------------------------------------------
mount -t 9p -o "$P9OPTS,ro,cache=${RXE_VM_9P_CACHE:-loose}" hostroot "$N" \
  || fatal "cannot mount the host root (9p tag 'hostroot')"
[ -x "$N/bin/sh" ] || fatal "host root mounted but $N/bin/sh is missing"

# A working directory under /tmp or /run would be hidden by the tmpfs
# mounted there; keep a handle on it and bind it back afterwards.
cwd_hidden=
# (If the working directory IS /tmp, /run or /var/tmp, the guest's empty
# tmpfs wins and the host's files there are not visible.)
case "$RXE_VM_CWD" in
  /tmp/* | /run/* | /var/tmp/*)
    if [ -d "$N$RXE_VM_CWD" ]; then
      mkdir -p /hostcwd
      mount -o bind "$N$RXE_VM_CWD" /hostcwd && cwd_hidden=1
    fi
    ;;
esac

mount -t proc proc "$N/proc" || fatal "mount $N/proc"
mount -t sysfs sysfs "$N/sys" || fatal "mount $N/sys"
mount -t devtmpfs devtmpfs "$N/dev" || fatal "mount $N/dev"
mkdir -p "$N/dev/pts" "$N/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666 devpts "$N/dev/pts" 2>/dev/null
mount -t tmpfs -o mode=1777 tmpfs "$N/dev/shm"
mount -t tmpfs -o mode=1777 tmpfs "$N/tmp" || fatal "mount $N/tmp"
mount -t tmpfs -o mode=0755 tmpfs "$N/run" || fatal "mount $N/run"
[ -d "$N/var/tmp" ] && mount -t tmpfs -o mode=1777 tmpfs "$N/var/tmp"
mkdir -p "$N/run/rxe-vm"
mount -o bind "$R" "$N/run/rxe-vm" || fatal "bind results share into $N/run/rxe-vm"
if [ -n "$cwd_hidden" ]; then
  { mkdir -p "$N$RXE_VM_CWD" && mount -o bind /hostcwd "$N$RXE_VM_CWD"; } \
    || fatal "cannot re-expose working directory $RXE_VM_CWD"
fi
log "host root mounted"

# --- 4. network + rxe0 ------------------------------------------------------
hc() { chroot "$N" "$@"; }   # run a host tool (ip, rdma) inside the host root
hc ip link set lo up || fatal "ip link set lo up failed"
if [ ! -d /sys/class/net/dummy0 ]; then
  hc ip link add dummy0 type dummy || fatal "cannot create dummy0"
fi
if [ -n "$RXE_VM_MTU" ]; then
  hc ip link set dummy0 mtu "$RXE_VM_MTU" || fatal "cannot set dummy0 mtu $RXE_VM_MTU"
fi
hc ip link set dummy0 up || fatal "ip link set dummy0 up failed"
out=$(hc rdma link add rxe0 type rxe netdev dummy0 2>&1) \
  || fatal "rdma link add rxe0 type rxe netdev dummy0 failed: $out"
i=0
while :; do
  st=$(cat /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null)
  case "$st" in *ACTIVE*) break ;; esac
  i=$((i + 1))
  [ $i -le 100 ] || fatal "rxe0 port 1 not ACTIVE after 10 s (state: '${st:-missing}')"
  sleep 0.1
done
[ -c "$N/dev/infiniband/uverbs0" ] || fatal "/dev/infiniband/uverbs0 missing"
log "rxe0 up on dummy0 ($st)"

# --- 5. the command ---------------------------------------------------------
log "running command"
: >"$R/started"
chroot "$N" /usr/bin/env -i /bin/bash --noprofile --norc /run/rxe-vm/cmd.sh \
  </dev/null >"$R/stdout" 2>"$R/stderr"
rc=$?
echo "$rc" >"$R/rc.tmp" && mv "$R/rc.tmp" "$R/rc"
log "command exited with status $rc"

# --- 6. done ----------------------------------------------------------------
halt_now
