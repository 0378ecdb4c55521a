"""Fixtures of the Python binding's tests: the generated modules, a Lab
server in this process and a channel to it."""

import importlib
import os
import subprocess
import sys
import threading

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _need(var):
    value = os.environ.get(var)
    if not value:
        raise RuntimeError(f"{var} is not set: run these tests with meson test "
                           "(meson test -C <build> python), which sets it")
    return value


@pytest.fixture(scope="session")
def gen_dir(tmp_path_factory):
    """slotrpc-gen --python of lab.fbs and ledger.fbs, on sys.path."""
    out = tmp_path_factory.mktemp("gen")
    gen = _need("PY_TEST_SLOTRPC_GEN")
    for schema in ("lab.fbs", "ledger.fbs"):
        subprocess.run([gen, "--python", "-o", str(out), os.path.join(HERE, schema)], check=True)
    sys.path.insert(0, str(out))
    yield out
    sys.path.remove(str(out))


@pytest.fixture(scope="session")
def lab(gen_dir):
    return importlib.import_module("lab_slotrpc")


class Types:
    def __init__(self):
        self.Ping = importlib.import_module("pylab.Ping")
        self.Pong = importlib.import_module("pylab.Pong")

    def ping(self, seq=0, text="", payload=b"", delay_ms=0, code=0):
        """A build callback for a Ping."""
        P = self.Ping

        def build(b):
            t = b.CreateString(text)
            p = b.CreateByteVector(bytes(payload))
            P.PingStart(b)
            P.PingAddSeq(b, seq)
            P.PingAddText(b, t)
            P.PingAddPayload(b, p)
            P.PingAddDelayMs(b, delay_ms)
            P.PingAddCode(b, code)
            return P.PingEnd(b)
        return build

    def pong(self, seq=0, text=b"", payload=b"", count=0):
        P = self.Pong

        def build(b):
            t = b.CreateString(text)
            p = b.CreateByteVector(bytes(payload))
            P.PongStart(b)
            P.PongAddSeq(b, seq)
            P.PongAddText(b, t)
            P.PongAddPayload(b, p)
            P.PongAddCount(b, count)
            return P.PongEnd(b)
        return build


@pytest.fixture(scope="session")
def types(gen_dir):
    return Types()


def make_servicer(lab, types):
    import numpy as np

    import slotrpc

    class Lab(lab.LabServicer):
        def __init__(self):
            self.slow_started = threading.Event()
            self.slow_cancelled = threading.Event()

        def Echo(self, request, context):
            p = request.message()
            return types.pong(p.Seq(), p.Text() or b"", p.PayloadAsNumpy().tobytes()
                              if p.PayloadLength() else b"", p.PayloadLength())

        def Count(self, request, context):
            p = request.message()
            for i in range(p.Seq()):
                if p.DelayMs():
                    slotrpc.sleep(p.DelayMs() / 1000)
                yield types.pong(i, b"n%d" % i)

        def Gather(self, request_iterator, context):
            total = 0
            n = 0
            text = b""
            for r in request_iterator:
                p = r.message()
                total += p.Seq()
                n += 1
                text += p.Text() or b""
            return types.pong(total, text, b"", n)

        def Chat(self, request_iterator, context):
            n = 0
            for r in request_iterator:
                p = r.message()
                n += 1
                yield types.pong(p.Seq() * 2, p.Text() or b"", b"", n)

        def Slow(self, request, context):
            p = request.message()
            self.slow_started.set()
            waited = 0.0
            while waited < p.DelayMs() / 1000:
                if context.cancelled():
                    self.slow_cancelled.set()
                    context.abort(slotrpc.StatusCode.CANCELLED, "noticed the cancel")
                slotrpc.sleep(0.005)
                waited += 0.005
            return types.pong(p.Seq())

        def Fail(self, request, context):
            code = request.message().Code()
            if code == 99:
                raise ValueError("boom")
            if code == 98:
                context.set_code(slotrpc.StatusCode.ALREADY_EXISTS)
                context.set_details("set, not raised")
                return types.pong()
            context.abort(code, "failing on purpose")

        def Bulk(self, request, context):
            total = 0
            for i in range(context.bulk_in_count):
                data = np.empty(context.bulk_in(i), dtype=np.uint8)
                context.read_bulk(i, into=data)
                total += data.size
                if i < context.bulk_out_count:
                    context.write_bulk(i, (data + 1).astype(np.uint8))
            return types.pong(count=total)

    return Lab()


@pytest.fixture(scope="module")
def lab_server(lab, types):
    import slotrpc
    servicer = make_servicer(lab, types)
    server = slotrpc.Server()
    server.add_servicer(servicer)
    server.start("127.0.0.1:0")
    server.servicer = servicer
    yield server
    server.stop()


@pytest.fixture(scope="module")
def channel(lab_server):
    import slotrpc
    ch = slotrpc.Channel(f"127.0.0.1:{lab_server.port}", transport="tcp")
    yield ch
    ch.close()


@pytest.fixture(scope="module")
def stub(lab, channel):
    return lab.LabStub(channel)
