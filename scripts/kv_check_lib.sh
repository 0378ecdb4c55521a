# Sourced by consumer_check.sh and subproject_check.sh, which both build
# examples/kv from a copy outside the tree with one of README's recipes and
# run the result.  The sourcing script sets ROOT, work (its scratch
# directory), KV_COUNT and PORT_WAIT_SECONDS, and defines log() and die();
# its EXIT trap kills server_pid if a run is cut short.

server_pid=

# recipe NAME [FILE]: the fenced block that follows <!-- recipe:NAME --> in
# FILE (a path under the checkout; README.md when omitted).
recipe() {
  awk -v marker="<!-- recipe:$1 -->" '
    $0 == marker { found = 1; next }
    found == 1 && /^```/ { found = 2; next }
    found == 2 && /^```/ { exit }
    found == 2 { print }
  ' "$ROOT/${2:-README.md}"
}

# copy_kv DIR: the example's sources, without its in-tree meson.build.
copy_kv() {
  mkdir -p "$1"
  find "$ROOT/examples/kv" -maxdepth 1 -type f \( -name '*.cc' -o -name '*.h' -o -name '*.fbs' \) \
    -exec cp -t "$1" {} +
}

# run_kv DIR: DIR/kv_server on a free loopback port, DIR/kv_client against it.
run_kv() {
  local dir=$1 port_file="$work/port" port= rc=0
  rm -f "$port_file"
  "$dir/kv_server" --listen 127.0.0.1:0 --port-file "$port_file" > "$work/server.log" 2>&1 &
  server_pid=$!
  local deadline=$((SECONDS + PORT_WAIT_SECONDS))
  until [[ -s $port_file ]]; do
    kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; die "$dir/kv_server exited before listening"; }
    ((SECONDS < deadline)) || die "$dir/kv_server did not write its port in ${PORT_WAIT_SECONDS}s"
    sleep 0.05
  done
  port=$(tr -d '[:space:]' < "$port_file")
  "$dir/kv_client" --connect "127.0.0.1:$port" --count "$KV_COUNT" || rc=$?
  kill -TERM "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=
  ((rc == 0)) || { cat "$work/server.log" >&2; die "$dir/kv_client exited with status $rc"; }
  log "$dir: kv_client against kv_server: OK"
}
