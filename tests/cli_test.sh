#!/usr/bin/env bash
# slotrpc-cli against examples/kv's server: list, describe, and a call of
# every method kind (unary, server stream, client stream from stdin, bidi),
# then the errors a user meets (unknown service or method, bad JSON, no
# server); then a server that cannot send a schema (no slotrpc.Reflection,
# or a service without one): the error says so and what to do, and
# --schema FILE.bfbs makes describe and call work.
# Run by meson test:  cli_test.sh SLOTRPC_CLI KV_SERVER BARE_SERVER FLATC ECHO_FBS
set -uo pipefail
cli=$1
kv_server=$2
bare_server=$3
flatc=$4
echo_fbs=$5
dir=$(mktemp -d)
server_pid=
bare_pid=
cleanup() {
  [[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  [[ -n $bare_pid ]] && kill "$bare_pid" 2>/dev/null && wait "$bare_pid" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
failures=0
fail() { printf 'FAIL: %s\n' "$*"; failures=$((failures + 1)); }
# expect NAME WANTED_TEXT ACTUAL_TEXT
expect() {
  if [[ $3 == *"$2"* ]]; then printf 'ok: %s\n' "$1"; else fail "$1: wanted '$2' in: $3"; fi
}

"$kv_server" --listen 127.0.0.1:0 --port-file "$dir/port" >"$dir/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 200); do [[ -s $dir/port ]] && break; sleep 0.1; done
[[ -s $dir/port ]] || { echo "kv_server did not start: $(cat "$dir/server.log")"; exit 1; }
addr=127.0.0.1:$(cat "$dir/port")
kv=slotrpc.examples.kv.KV

out=$("$cli" "$addr" list 2>&1)
expect "list names the kv service" "$kv" "$out"
expect "list names reflection" "slotrpc.Reflection" "$out"
expect "list names health" "slotrpc.Health" "$out"

out=$("$cli" "$addr" describe $kv 2>&1)
expect "describe: unary" "rpc Get(slotrpc.examples.kv.GetRequest) returns (slotrpc.examples.kv.GetReply);  // unary" "$out"
expect "describe: server stream" "rpc Scan(slotrpc.examples.kv.ScanRequest) returns (stream slotrpc.examples.kv.Entry)" "$out"
expect "describe: client stream" "rpc PutMany(stream slotrpc.examples.kv.Entry) returns (slotrpc.examples.kv.PutReply)" "$out"
expect "describe: bidi" "rpc Watch(stream slotrpc.examples.kv.WatchRequest) returns (stream slotrpc.examples.kv.WatchEvent)" "$out"
expect "describe: a table the methods use" "value: slotrpc.examples.kv.Value;" "$out"
expect "describe: a type from the included file" "table slotrpc.examples.common.Label" "$out"

# Unary.
out=$("$cli" "$addr" call $kv/Put '{"entries":[{"key":"a","value_type":"Text","value":{"text":"alpha"}}]}' 2>&1)
expect "unary Put" '"stored": 1' "$out"
out=$("$cli" "$addr" call $kv/Get '{"key":"a"}' 2>&1)
expect "unary Get" '"text": "alpha"' "$out"
[[ $(wc -l <<<"$out") == 1 ]] || fail "a unary reply is one line: $out"

# Client stream: one Entry per line of stdin.
out=$(printf '%s\n' '{"key":"b","value_type":"Number","value":{"value":2.5}}' '' \
        '{"key":"c","value_type":"Text","value":{"text":"gamma"}}' | "$cli" "$addr" call $kv/PutMany 2>&1)
expect "client stream PutMany" '"stored": 2' "$out"

# Server stream: one line per message.
out=$("$cli" "$addr" call $kv/Scan '{}' 2>&1)
[[ $(grep -c '"key"' <<<"$out") == 3 ]] || fail "Scan: wanted 3 lines, got: $out"
expect "server stream Scan, first" '"key": "a"' "$(sed -n 1p <<<"$out")"
expect "server stream Scan, last" '"text": "gamma"' "$(sed -n 3p <<<"$out")"

# Bidi: the subscription from stdin, the events printed as they come.
out=$(printf '%s\n' '{"add":["a","zz"]}' | "$cli" "$addr" call $kv/Watch 2>&1)
expect "bidi Watch: current value" '"kind": "Current"' "$out"
expect "bidi Watch: the value" '"text": "alpha"' "$out"
expect "bidi Watch: missing key" '"kind": "Missing"' "$out"

# Errors: exit 1 and a message that says what is wrong.
out=$("$cli" "$addr" call nope.Svc/Get '{}' 2>&1); rc=$?
[[ $rc == 1 ]] || fail "unknown service: exit $rc"
expect "unknown service" "runs no service 'nope.Svc'; it runs:" "$out"
out=$("$cli" "$addr" describe nope.Svc 2>&1)
expect "describe an unknown service" "runs no service 'nope.Svc'" "$out"
out=$("$cli" "$addr" call $kv/Nope '{}' 2>&1); rc=$?
[[ $rc == 1 ]] || fail "unknown method: exit $rc"
expect "unknown method" "has no method 'Nope'; its methods: Get, Put, Delete, Scan, PutMany, Watch" "$out"
out=$("$cli" "$addr" call $kv/Get '{"key": 12' 2>&1); rc=$?
[[ $rc == 1 ]] || fail "bad JSON: exit $rc"
expect "bad JSON names the type and the parser's reason" "bad JSON for slotrpc.examples.kv.GetRequest:" "$out"
out=$("$cli" "$addr" call $kv/Get '{"nokey":"x"}' 2>&1)
expect "an unknown field" "unknown field: nokey" "$out"
out=$(printf '%s\n' '{"key":"d"}' 'not json' | "$cli" "$addr" call $kv/PutMany 2>&1); rc=$?
[[ $rc == 1 ]] || fail "bad JSON on stdin: exit $rc"
expect "bad JSON on stdin" "bad JSON for slotrpc.examples.kv.Entry" "$out"
out=$("$cli" "$addr" call $kv/PutMany '{}' 2>&1)
expect "a client stream takes stdin" "reads its requests from stdin" "$out"
out=$("$cli" "$addr" bogus 2>&1); rc=$?
[[ $rc == 2 ]] || fail "unknown command: exit $rc"
out=$("$cli" 127.0.0.1:1 list 2>&1); rc=$?
[[ $rc == 1 ]] || fail "no server: exit $rc ($out)"

# A server that cannot send schemas.  `bare MODE`: starts cli_bare_server
# in MODE (reflection: refuses slotrpc.Reflection; schema: Echo without
# one) and sets $bare to its address.
bare() {
  [[ -n $bare_pid ]] && kill "$bare_pid" 2>/dev/null && wait "$bare_pid" 2>/dev/null
  rm -f "$dir/bare.port"
  "$bare_server" "$1" "$dir/bare.port" >"$dir/bare.log" 2>&1 &
  bare_pid=$!
  for _ in $(seq 200); do [[ -s $dir/bare.port ]] && break; sleep 0.1; done
  [[ -s $dir/bare.port ]] || { echo "cli_bare_server did not start: $(cat "$dir/bare.log")"; exit 1; }
  bare=127.0.0.1:$(cat "$dir/bare.port")
}
"$flatc" --binary --schema -o "$dir" "$echo_fbs" || { echo "flatc could not write echo.bfbs"; exit 1; }
echo_svc=slotrpc.examples.Echo
request='{"seq": 7, "payload": [1, 2, 3]}'

bare reflection
out=$("$cli" "$bare" list 2>&1); rc=$?
[[ $rc == 1 ]] || fail "list without reflection: exit $rc"
expect "list without reflection names what is missing" "does not run slotrpc.Reflection" "$out"
expect "list without reflection says what still works" "--schema FILE.bfbs" "$out"
out=$("$cli" "$bare" call $echo_svc/Echo "$request" 2>&1); rc=$?
[[ $rc == 1 ]] || fail "call without reflection: exit $rc"
expect "call without reflection names the service's schema to give" "give the schema of $echo_svc with --schema" "$out"
out=$("$cli" --schema "$dir/echo.bfbs" "$bare" call $echo_svc/Echo "$request" 2>&1)
expect "call without reflection, with --schema" '"seq": 7' "$out"
out=$("$cli" --schema "$dir/echo.bfbs" "$bare" describe $echo_svc 2>&1)
expect "describe without reflection, with --schema" "rpc Echo(slotrpc.examples.EchoRequest) returns (slotrpc.examples.EchoReply)" "$out"
out=$("$cli" --schema "$dir/nope.bfbs" "$bare" call $echo_svc/Echo "$request" 2>&1)
expect "an unreadable --schema file is named" "--schema $dir/nope.bfbs: cannot read it" "$out"

bare schema
out=$("$cli" "$bare" describe $echo_svc 2>&1); rc=$?
[[ $rc == 1 ]] || fail "a service without a schema: exit $rc"
expect "a service without a schema: why" "has no schema" "$out"
expect "a service without a schema: what to do" "give its schema with --schema FILE.bfbs" "$out"
out=$("$cli" --schema "$dir/echo.bfbs" "$bare" call $echo_svc/Echo "$request" 2>&1)
expect "a service without a schema, with --schema" '"seq": 7' "$out"

if ((failures > 0)); then
  printf '%d check(s) failed\n' "$failures"
  exit 1
fi
echo "all slotrpc-cli checks passed"
