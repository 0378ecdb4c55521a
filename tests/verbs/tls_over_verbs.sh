#!/bin/sh
# Run by run_verbs_tests.sh (in the Soft-RoCE VM or directly on a host's
# device): a TLS server whose sessions run over verbs.  With TLS on, the
# verbs handshake (queue-pair numbers, GIDs, ring keys) travels inside TLS
# on the TCP handshake connection, and the RDMA data path after it is not
# encrypted (docs/design.md, "Trust and security").  Checked:
#   * a client that trusts the server's CA calls ECHO_OVER_VERBS_CALLS / 4
#     echoes (64 B, 8 outstanding, every payload checked by echo_client)
#     and says it ran "over verbs";
#   * the server logged the session as a TLS session on verbs (its PeerInfo:
#     "TLS session with ... (verbs)"), so the handshake really went
#     through TLS and the session really is a verbs one;
#   * the device moved the calls: its sent_pkts and rcvd_pkts (rxe's
#     hw_counters; on a device without them this is said and not checked)
#     grew by at least an eighth of the call count each (8 calls in flight
#     may share a write), so the data did not fall back to TCP;
#   * a client that does not have the CA (the system's trust store, and a
#     CA of its own that did not sign the server) is refused: its connect
#     fails with UNAUTHENTICATED naming the certificate check, and the
#     server sees no session from it;
#   * a plain (non-TLS) client is refused with a message saying the server
#     requires TLS.
# Certificates: P-256, made here with the openssl CLI in a temp dir.
# Arguments (run_verbs_tests.sh passes doctest flags) are ignored.
set -u
: "${ECHO_SERVER:?ECHO_SERVER not set}" "${ECHO_CLIENT:?ECHO_CLIENT not set}"
DEV=${SLOTRPC_DEVICE:-rxe0}
PORT=${SLOTRPC_PORT:-1}
HW=/sys/class/infiniband/$DEV/ports/$PORT/hw_counters
CALLS=$(( ${ECHO_OVER_VERBS_CALLS:-20000} / 4 ))
say() { echo "tls_over_verbs: $*"; }
command -v openssl >/dev/null || { say "no openssl CLI to make the test certificates"; exit 1; }
dir=$(mktemp -d)
fail=0

# mkca NAME: a self-signed CA, NAME-ca.crt and NAME-ca.key.
mkca() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -keyout "$dir/$1-ca.key" -out "$dir/$1-ca.crt" -subj "/CN=$1 test CA" >/dev/null 2>&1
}
mkca server || { say "openssl could not make a CA"; exit 1; }
mkca other || { say "openssl could not make a second CA"; exit 1; }
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$dir/server.key" \
  -out "$dir/server.csr" -subj "/CN=tls-over-verbs server" >/dev/null 2>&1 &&
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$dir/ext.cnf" &&
  openssl x509 -req -in "$dir/server.csr" -CA "$dir/server-ca.crt" -CAkey "$dir/server-ca.key" \
    -CAcreateserial -days 2 -extfile "$dir/ext.cnf" -out "$dir/server.crt" >/dev/null 2>&1 ||
  { say "openssl could not sign the server certificate"; exit 1; }

hw() { [ -r "$HW/$1" ] && cat "$HW/$1" || echo -; }
if [ -r "$HW/sent_pkts" ] && [ -r "$HW/rcvd_pkts" ]; then hwc=yes; else hwc=no; fi
if [ -n "${RXE_VM:-}" ] && [ $hwc = no ]; then say "inside the VM but no sent_pkts/rcvd_pkts in $HW"; exit 1; fi

SLOTRPC_LOG_LEVEL=info SLOTRPC_TRANSPORT=verbs SLOTRPC_TLS=on \
  SLOTRPC_TLS_CERT="$dir/server.crt" SLOTRPC_TLS_KEY="$dir/server.key" \
  "$ECHO_SERVER" --listen 127.0.0.1:0 --port-file "$dir/port" >"$dir/server.log" 2>&1 &
pid=$!
i=0
while [ ! -s "$dir/port" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
if [ ! -s "$dir/port" ]; then say "server did not start"; cat "$dir/server.log"; kill $pid 2>/dev/null; exit 1; fi
addr=127.0.0.1:$(cat "$dir/port")

# client NAME [ENV...]: echo_client over verbs with TLS on and ENV; output
# in NAME.log, exit status in NAME.rc.
client() {
  name=$1; shift
  env SLOTRPC_TRANSPORT=verbs "$@" "$ECHO_CLIENT" --connect "$addr" --count "$CALLS" --size 64 \
    --outstanding 8 >"$dir/$name.log" 2>&1
  echo $? >"$dir/$name.rc"
}
s0=$(hw sent_pkts); r0=$(hw rcvd_pkts)
client good SLOTRPC_TLS=on SLOTRPC_TLS_CA="$dir/server-ca.crt"
s1=$(hw sent_pkts); r1=$(hw rcvd_pkts)
client no_ca SLOTRPC_TLS=on SLOTRPC_TLS_CA=
client other_ca SLOTRPC_TLS=on SLOTRPC_TLS_CA="$dir/other-ca.crt"
client plain SLOTRPC_TLS=off
kill $pid 2>/dev/null; wait $pid 2>/dev/null

say "client with the CA (exit $(cat "$dir/good.rc")):"; sed 's/^/  /' "$dir/good.log"
[ "$(cat "$dir/good.rc")" -eq 0 ] || { say "the client with the CA failed"; fail=1; }
grep -q "over verbs" "$dir/good.log" || { say "the client with the CA did not run over verbs"; fail=1; }
grep -q "$CALLS ok, 0 failed" "$dir/good.log" || { say "not $CALLS ok, 0 failed"; fail=1; }
grep -q "every reply payload verified" "$dir/good.log" || { say "payloads not verified"; fail=1; }
sessions=$(grep -c "TLS session with .* (verbs)" "$dir/server.log")
say "server's TLS verbs sessions: $sessions"
grep "TLS session with" "$dir/server.log" | sed 's/^/  /'
[ "$sessions" -eq 1 ] || { say "expected exactly one TLS session over verbs on the server (the refused clients must get none)"; fail=1; }
if [ $hwc = yes ]; then
  ds=$((s1 - s0)); dr=$((r1 - r0))
  say "$DEV sent_pkts +$ds, rcvd_pkts +$dr during the $CALLS calls"
  [ $ds -ge $((CALLS / 8)) ] && [ $dr -ge $((CALLS / 8)) ] || { say "the device did not carry the calls"; fail=1; }
else
  say "$DEV exposes no sent_pkts/rcvd_pkts: the device's share NOT checked"
fi
for c in no_ca other_ca; do
  say "client $c (exit $(cat "$dir/$c.rc")): $(head -c 600 "$dir/$c.log")"
  [ "$(cat "$dir/$c.rc")" -ne 0 ] || { say "client $c was not refused"; fail=1; }
  grep -q "UNAUTHENTICATED" "$dir/$c.log" && grep -q "certificate verify failed" "$dir/$c.log" ||
    { say "client $c: no UNAUTHENTICATED / certificate verify failed"; fail=1; }
done
say "plain client (exit $(cat "$dir/plain.rc")): $(head -c 600 "$dir/plain.log")"
[ "$(cat "$dir/plain.rc")" -ne 0 ] || { say "the plain client was not refused"; fail=1; }
grep -q "TLS" "$dir/plain.log" || { say "the plain client's error does not say the server requires TLS"; fail=1; }
[ $fail -eq 0 ] || { say "server log:"; sed 's/^/  /' "$dir/server.log" | tail -40; }
rm -rf "$dir"
[ $fail -eq 0 ] && say PASS
exit $fail
