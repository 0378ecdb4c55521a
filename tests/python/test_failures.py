"""A server that dies mid-stream: the client raises UNAVAILABLE and lives."""

import os
import signal
import subprocess
import sys
import textwrap

import slotrpc
from slotrpc import RpcError, StatusCode

SERVER = textwrap.dedent("""
    import sys, slotrpc
    def count(request, context):
        i = 0
        while True:
            yield b"%08d" % i
            i += 1
            slotrpc.sleep(0.002)
    s = slotrpc.Server()
    s.add_method("t.Dying", "Count", slotrpc.MethodKind.SERVER_STREAM, count)
    s.start("127.0.0.1:0")
    print(s.port, flush=True)
    sys.stdin.read()
""")


def test_server_killed_mid_stream():
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=os.environ)
    try:
        port = int(server.stdout.readline())
        with slotrpc.Channel(f"127.0.0.1:{port}", transport="tcp") as ch:
            stream = ch.unary_stream("t.Dying.Count")(b"")
            for i in range(5):
                assert next(stream).copy() == b"%08d" % i
            server.send_signal(signal.SIGKILL)
            server.wait(timeout=30)
            try:
                for _ in stream:
                    pass
                raise AssertionError("the stream ended without an error")
            except RpcError as e:
                assert e.code() == StatusCode.UNAVAILABLE, e
            # The channel is dead too: calls fail fast, the process lives on.
            try:
                ch.unary_unary("t.Dying.Count")(b"", timeout=10)
                raise AssertionError("a call on a dead session succeeded")
            except RpcError as e:
                assert e.code() == StatusCode.UNAVAILABLE, e
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
