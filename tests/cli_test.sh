#!/usr/bin/env bash
# slotrpc-cli against examples/kv's server: list, describe, and a call of
# every method kind (unary, server stream, client stream from stdin, bidi),
# then the errors a user meets (unknown service or method, bad JSON, no
# server).  Run by meson test:  cli_test.sh SLOTRPC_CLI KV_SERVER
set -uo pipefail
cli=$1
kv_server=$2
dir=$(mktemp -d)
server_pid=
cleanup() {
  [[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
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

if ((failures > 0)); then
  printf '%d check(s) failed\n' "$failures"
  exit 1
fi
echo "all slotrpc-cli checks passed"
