#!/usr/bin/env bash
# Soak: echo_server and K soak_client processes making N calls in total on
# loopback, while servers and clients are killed (SIGKILL) and restarted at
# random.  The clients pace their calls so that the calls take about
# --seconds (each makes calls / (clients x seconds) per second), which leaves
# time for kills to land while calls are in flight.
#
# Fails (exit 1) on any violation:
#   * a call outstanding longer than its deadline + margin (the client's
#     watchdog exits 4), or clients still running 2 x --seconds + 120 s
#     after the start;
#   * a call answered twice, or an OK reply with the wrong payload;
#   * a client that exits non-zero for any other reason (a crash included);
#   * after a wave in which the server was not restarted, once its clients
#     have gone: the server still holds more sockets than its listener(s)
#     10 s later; or, compared with the end of that server process's first
#     clean wave (its event loops open their epoll, event and timer fds with
#     the first session), a different fd count or an RSS larger by more than
#     --rss-slack-kib; on verbs, queue pairs (`rdma resource show`, the
#     device's count) other than with the idle server at the start, or
#     memory regions other than after that process's first clean wave (the
#     first session may register what the loop keeps, as with the fds); and a verbs run in which the device never had more
#     queue pairs than at the start (the sessions did not use verbs).
#
# Over verbs it runs where an RDMA device is: inside the Soft-RoCE VM,
#   tests/rxe/rxe-vm.sh --cache build/rxe-cache --timeout 1200 -- \
#     scripts/soak.sh --transport verbs --calls 30000 --seconds 60
# (the guest has iproute2's `rdma`, which reads the counts).
#
# The run is cut into --waves waves of N/waves calls.  Every third wave
# (2, 5, ...; never the last two) is a "chaos" wave: the server is killed
# and restarted on the same port up to --server-kills-per-wave times.  In
# every wave, clients are killed and restarted (each resumes from its state
# file) until --max-client-kills (default 2 x waves) is used up.  Kills come
# every 100-500 ms, chosen at random (--seed; printed, to replay a run).
#
#   scripts/soak.sh [--calls N] [--clients K] [--seconds S] [--transport tcp|verbs]
#                   [--waves W] [--seed X] [--outstanding O] [--server-kills-per-wave K]
#                   [--max-client-kills K] [--rss-slack-kib KIB] [--deadline-ms MS] [--margin-ms MS]
#                   [--server PATH] [--client PATH] [--keep]
set -euo pipefail

calls=200000 clients=3 seconds=120 transport=tcp waves=6 seed=$RANDOM outstanding=8
server_kills_per_wave=2 max_client_kills= rss_slack_kib=16384 deadline_ms=2000 margin_ms=3000
root=$(cd "$(dirname "$0")/.." && pwd)
server_bin=$root/build/examples/echo/echo_server
client_bin=$root/build/tests/soak/soak_client
keep=0

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --calls) calls=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --transport) transport=$2; shift 2 ;;
    --waves) waves=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --outstanding) outstanding=$2; shift 2 ;;
    --server-kills-per-wave) server_kills_per_wave=$2; shift 2 ;;
    --max-client-kills) max_client_kills=$2; shift 2 ;;
    --rss-slack-kib) rss_slack_kib=$2; shift 2 ;;
    --deadline-ms) deadline_ms=$2; shift 2 ;;
    --margin-ms) margin_ms=$2; shift 2 ;;
    --server) server_bin=$2; shift 2 ;;
    --client) client_bin=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) usage ;;
  esac
done
[[ $transport == tcp || $transport == verbs ]] || usage
max_client_kills=${max_client_kills:-$(( 2 * waves ))}
for n in "$calls" "$clients" "$seconds" "$waves"; do [[ $n =~ ^[1-9][0-9]*$ ]] || usage; done
[[ -x $server_bin && -x $client_bin ]] || { echo "soak: build echo_server and soak_client first" >&2; exit 2; }

RANDOM=$seed
export SLOTRPC_TRANSPORT=$transport
export SLOTRPC_LOG_LEVEL=${SLOTRPC_LOG_LEVEL:-warn}
# K clients and a server share the cores: spinning event loops would starve
# each other (and whatever else runs on the machine).
export SLOTRPC_POLL_MODE=${SLOTRPC_POLL_MODE:-blocking}
dir=$(mktemp -d "${TMPDIR:-/tmp}/slotrpc-soak-XXXXXX")
server_pid=
declare -a client_pid client_state
violations=()
server_kills=0 server_starts=0 client_kills=0 client_restarts=0

cleanup() {
  [[ -n $server_pid ]] && kill -9 "$server_pid" 2>/dev/null || true
  for p in "${client_pid[@]:-}"; do [[ -n $p ]] && kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [[ $keep == 0 ]]; then rm -rf "$dir"; else echo "soak: files kept in $dir"; fi
}
trap cleanup EXIT

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
violation() { violations+=("$*"); echo "soak: VIOLATION: $*" >&2; }

# Waits (bounded) for a condition given as a command.
wait_for() {
  local limit=$1; shift
  local until=$(( $(date +%s%N) + limit * 1000000 ))
  until "$@"; do
    (( $(date +%s%N) < until )) || return 1
    sleep 0.02
  done
}

# Counts of the server process (/proc; on verbs, iproute2's rdma tool).
fd_count() { ls "/proc/$1/fd" 2>/dev/null | wc -l; }
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
# Queue pairs or memory regions ($1 = qp or mr) on the device, from the
# count line of `rdma resource show` ("0: rxe0: pd 2 cq 2 qp 1 ... mr 1 ..."):
# device-wide, the kernel's own QP1 included.  The soak is then the device's
# only user, and once the clients have gone, what is left beyond the idle
# figures is the server's.  (Per process, `rdma resource show qp|mr` listed
# none of the server's objects under its pid in the Soft-RoCE VM, so a count
# by pid read 0 while sessions ran.)
rdma_count() {
  rdma resource show 2>/dev/null | awk -v k="$1" '{ for (i = 1; i < NF; i++) if ($i == k) { print $(i + 1); exit } }'
}
socket_count() { ls -l "/proc/$1/fd" 2>/dev/null | grep -c 'socket:' || true; }
server_sessions_gone() {
  # Every client connection is gone once the server holds as many sockets
  # as when it started (its listener).
  [[ $(socket_count "$server_pid") -le $server_idle_sockets ]]
}

port=0
# The port file is there, or the server has exited (no use waiting).
port_ready() { [[ -s $dir/port ]] || ! kill -0 "$server_pid" 2>/dev/null; }
start_server() {
  local listen=127.0.0.1:$port
  rm -f "$dir/port"
  "$server_bin" --listen "$listen" --port-file "$dir/port" >>"$dir/server.out" 2>>"$dir/server.err" &
  server_pid=$!
  server_starts=$((server_starts + 1))
  wait_for 15000 port_ready || true
  if [[ ! -s $dir/port ]]; then
    # The port may still be held for a moment after a kill: try again once.
    kill -9 "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true
    sleep 0.5
    "$server_bin" --listen "$listen" --port-file "$dir/port" >>"$dir/server.out" 2>>"$dir/server.err" &
    server_pid=$!
    wait_for 15000 port_ready || true
    [[ -s $dir/port ]] || { violation "echo_server did not start: $(tail -3 "$dir/server.err")"; exit 1; }
  fi
  port=$(cat "$dir/port")
}
kill_server() {
  kill -9 "$server_pid"
  wait "$server_pid" 2>/dev/null || true
  server_kills=$((server_kills + 1))
}

start_client() {  # index, calls
  "$client_bin" --connect "127.0.0.1:$port" --calls "$2" --outstanding "$outstanding" \
    --deadline-ms "$deadline_ms" --margin-ms "$margin_ms" --rate "$rate" --state "${client_state[$1]}" \
    >>"$dir/client$1.out" 2>>"$dir/client$1.err" &
  client_pid[$1]=$!
}

declare -A total_code
total_done=0 total_twice=0 total_bad=0 total_sessions=0 total_connect_failures=0
collect() {  # state file
  local kv k v
  for kv in $(cat "$1"); do
    k=${kv%%=*}; v=${kv#*=}
    case $k in
      done) total_done=$((total_done + v)) ;;
      twice) total_twice=$((total_twice + v)) ;;
      bad_reply) total_bad=$((total_bad + v)) ;;
      sessions) total_sessions=$((total_sessions + v)) ;;
      connect_failures) total_connect_failures=$((total_connect_failures + v)) ;;
      code*) total_code[${k#code}]=$(( ${total_code[${k#code}]:-0} + v )) ;;
    esac
  done
}

t0=$(now)
deadline_s=$(( $(date +%s) + 2 * seconds + 120 ))
rate=$(( (calls + clients * seconds - 1) / (clients * seconds) ))
start_server
server_idle_fds=$(fd_count "$server_pid")
server_idle_sockets=$(socket_count "$server_pid")
server_idle_rss=$(rss_kib "$server_pid")
first_fds=$server_idle_fds first_rss=$server_idle_rss
peak_qp=0 peak_mr=0 last_sample=-1 instance_mr_baseline= last_qp= last_mr=
if [[ $transport == verbs ]]; then
  server_idle_qp=$(rdma_count qp) server_idle_mr=$(rdma_count mr)
  echo "soak: device QPs $server_idle_qp, MRs $server_idle_mr with the idle server; device: $(rdma resource show 2>&1 | tr '\n' ' ')"
fi
# RSS and fds after the first clean wave of this server process (its event
# loops create their epoll, event and timer fds with the first session).
instance_rss_baseline= instance_fd_baseline=
last_fds=$server_idle_fds last_rss=$server_idle_rss
echo "soak: $calls calls, $clients clients at $rate calls/s each, $waves waves, transport $transport, seed $seed, files in $dir"
echo "soak: server pid $server_pid on port $port: $server_idle_fds fds, RSS $server_idle_rss KiB at start"

per_wave=$(( calls / waves ))
for (( w = 0; w < waves; w++ )); do
  wave_calls=$per_wave
  (( w == waves - 1 )) && wave_calls=$(( calls - per_wave * (waves - 1) ))
  # The last two waves are clean, so the last server process is measured
  # against its own first wave.
  chaos=$(( w % 3 == 2 && w < waves - 2 ))
  server_restarted=0
  left_server_kills=$(( chaos ? server_kills_per_wave : 0 ))
  for (( c = 0; c < clients; c++ )); do
    client_state[$c]=$dir/wave$w-client$c.state
    quota[$c]=$(( wave_calls / clients ))
    (( c == clients - 1 )) && quota[$c]=$(( wave_calls - (wave_calls / clients) * (clients - 1) ))
    start_client "$c" "${quota[$c]}"
  done
  # Until every client has finished: kill something every 100-500 ms.  A
  # chaos wave's first event kills the server, so each chaos wave has one.
  next_event=$(( $(date +%s%N) + (100 + RANDOM % 400) * 1000000 ))
  while :; do
    running=0
    for (( c = 0; c < clients; c++ )); do
      p=${client_pid[$c]}
      [[ -z $p ]] && continue
      if kill -0 "$p" 2>/dev/null && [[ $(awk '{ print $3 }' "/proc/$p/stat" 2>/dev/null) != Z ]]; then
        running=$((running + 1))
        continue
      fi
      rc=0; wait "$p" || rc=$?
      client_pid[$c]=
      if (( rc != 0 )); then
        violation "wave $w client $c exited with status $rc: $(tail -2 "$dir/client$c.err" | tr '\n' ' ')"
      fi
    done
    (( running == 0 )) && break
    # Once a second (SECONDS): a fork of rdma per loop turn is slow in the VM.
    if [[ $transport == verbs ]] && (( SECONDS != last_sample )); then
      last_sample=$SECONDS
      qp=$(rdma_count qp); (( qp > peak_qp )) && peak_qp=$qp
      mr=$(rdma_count mr); (( mr > peak_mr )) && peak_mr=$mr
    fi
    if (( $(date +%s) > deadline_s )); then
      violation "wave $w: clients still running after $(( 2 * seconds + 120 )) s (a hang)"
      break
    fi
    if (( $(date +%s%N) >= next_event )); then
      next_event=$(( $(date +%s%N) + (100 + RANDOM % 400) * 1000000 ))
      if (( left_server_kills > 0 && (server_restarted == 0 || RANDOM % 2 == 0) )); then
        kill_server; start_server; server_restarted=1
        left_server_kills=$((left_server_kills - 1))
      elif (( client_kills < max_client_kills && RANDOM % 3 != 0 )); then
        c=$(( RANDOM % clients ))
        p=${client_pid[$c]}
        if [[ -n $p ]] && kill -9 "$p" 2>/dev/null; then
          wait "$p" 2>/dev/null || true
          client_kills=$((client_kills + 1))
          # Resumes from its state file; made its quota already if it says so.
          start_client "$c" "${quota[$c]}"
          client_restarts=$((client_restarts + 1))
        fi
      fi
    fi
    sleep 0.05
  done
  (( ${#violations[@]} == 0 )) || break
  for (( c = 0; c < clients; c++ )); do collect "${client_state[$c]}"; done

  if (( server_restarted )); then
    # A new server process: its own idle figures, measured now.
    instance_rss_baseline= instance_fd_baseline= instance_mr_baseline=
    echo "soak: wave $w: server restarted (now pid $server_pid)"
    continue
  fi
  # The clients have gone: the server must let go of everything they held.
  if ! wait_for 10000 server_sessions_gone; then
    violation "wave $w: server holds $(socket_count "$server_pid") sockets 10 s after its clients left, $server_idle_sockets at start"
  fi
  last_fds=$(fd_count "$server_pid") last_rss=$(rss_kib "$server_pid")
  if [[ -z $instance_rss_baseline ]]; then
    instance_rss_baseline=$last_rss instance_fd_baseline=$last_fds
  else
    (( last_rss <= instance_rss_baseline + rss_slack_kib )) ||
      violation "wave $w: server RSS $last_rss KiB, $instance_rss_baseline KiB after its first wave"
    (( last_fds == instance_fd_baseline )) ||
      violation "wave $w: server holds $last_fds fds, $instance_fd_baseline after its first wave"
  fi
  if [[ $transport == verbs ]]; then
    last_qp=$(rdma_count qp) last_mr=$(rdma_count mr)
    [[ $last_qp == "$server_idle_qp" ]] ||
      violation "wave $w: the device has $last_qp QPs once the clients left, $server_idle_qp with the idle server at the start"
    if [[ -z $instance_mr_baseline ]]; then
      instance_mr_baseline=$last_mr
    else
      [[ $last_mr == "$instance_mr_baseline" ]] ||
        violation "wave $w: the device has $last_mr MRs, $instance_mr_baseline after the server's first wave"
    fi
    echo "soak: wave $w: device QPs $last_qp (idle at the start $server_idle_qp), MRs $last_mr (first-wave baseline $instance_mr_baseline)"
  fi
  echo "soak: wave $w done after $(elapsed "$t0") s: server $last_fds fds (first-wave baseline $instance_fd_baseline), RSS $last_rss KiB (first-wave baseline $instance_rss_baseline)"
  (( ${#violations[@]} == 0 )) || break
done

duration=$(elapsed "$t0")
ok=${total_code[0]:-0}
echo "soak: ---- summary ----"
echo "soak: calls ended: $total_done of $calls in $duration s (transport $transport, seed $seed)"
code_name() {
  case $1 in 1) echo CANCELLED ;; 3) echo INVALID_ARGUMENT ;; 4) echo DEADLINE_EXCEEDED ;;
    8) echo RESOURCE_EXHAUSTED ;; 12) echo UNIMPLEMENTED ;; 13) echo INTERNAL ;; 14) echo UNAVAILABLE ;;
    *) echo "code $1" ;; esac
}
failed=
for k in $(printf '%s\n' "${!total_code[@]}" | sort -n); do
  [[ $k != 0 && ${total_code[$k]} != 0 ]] && failed+=" $(code_name "$k") ${total_code[$k]};"
done
echo "soak: OK $ok; failed:${failed:- none}"
echo "soak: answered twice $total_twice, wrong replies $total_bad, sessions $total_sessions, failed connects $total_connect_failures"
echo "soak: server kills $server_kills, server starts $server_starts; client kills $client_kills, client restarts $client_restarts"
echo "soak: server fds: $first_fds at first start; last server ${instance_fd_baseline:-?} after its first clean wave, $last_fds after its last"
echo "soak: server RSS: $first_rss KiB at first start; last server ${instance_rss_baseline:-?} KiB after its first clean wave, $last_rss KiB after its last"
if [[ $transport == verbs ]]; then
  echo "soak: device QPs (all processes): $server_idle_qp at first start, peak $peak_qp during the waves (server and clients), ${last_qp:-?} after the last wave"
  echo "soak: device MRs: $server_idle_mr at first start, peak $peak_mr during the waves; last server ${instance_mr_baseline:-?} after its first clean wave, ${last_mr:-?} after its last"
  echo "soak: device at the end: $(rdma resource show 2>&1 | tr '\n' ' ')"
  (( peak_qp > server_idle_qp )) || violation "the device never had more queue pairs than at the start: the sessions did not use verbs"
fi
(( total_twice == 0 )) || violation "$total_twice calls answered twice"
(( total_bad == 0 )) || violation "$total_bad OK replies with a wrong payload"
if (( ${#violations[@]} == 0 )) && (( total_done < calls )); then
  violation "only $total_done of $calls calls ended"
fi
if (( ${#violations[@]} != 0 )); then
  echo "soak: FAILED: ${#violations[@]} violation(s)"
  exit 1
fi
echo "soak: PASSED"
