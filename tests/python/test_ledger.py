"""The cross-language check: ledger.fbs, which no other test uses, compiled
by slotrpc-gen --python (here) and slotrpc-gen (ledger_peer, C++), with all
four call kinds: Python calls a C++ server, and a C++ client calls a Python
server."""

import importlib
import os
import subprocess
import threading

import pytest

import slotrpc


@pytest.fixture(scope="module")
def ledger(gen_dir):
    mod = importlib.import_module("ledger_slotrpc")
    mod.Entry = importlib.import_module("orchard.ledger.Entry")
    mod.Total = importlib.import_module("orchard.ledger.Total")
    return mod


def entry(ledger, account, cents, tags=()):
    E = ledger.Entry

    def build(b):
        a = b.CreateString(account)
        t = [b.CreateString(x) for x in tags]
        E.EntryStartTagsVector(b, len(t))
        for off in reversed(t):
            b.PrependUOffsetTRelative(off)
        tv = b.EndVector()
        E.EntryStart(b)
        E.EntryAddAccount(b, a)
        E.EntryAddCents(b, cents)
        E.EntryAddTags(b, tv)
        return E.EntryEnd(b)
    return build


def total(ledger, account, cents, entries):
    T = ledger.Total

    def build(b):
        a = b.CreateString(account)
        T.TotalStart(b)
        T.TotalAddAccount(b, a)
        T.TotalAddCents(b, cents)
        T.TotalAddEntries(b, entries)
        return T.TotalEnd(b)
    return build


def test_python_calls_cpp_server(ledger):
    peer = subprocess.Popen([os.environ["LEDGER_PEER"], "serve"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        line = peer.stdout.readline()
        assert line.startswith("PORT "), line
        with slotrpc.Channel(f"127.0.0.1:{int(line.split()[1])}", transport="tcp") as ch:
            stub = ledger.LedgerStub(ch)
            t = stub.Post(entry(ledger, "alice", 21, ["a", "b", "c"])).message()
            assert (t.Account(), t.Cents(), t.Entries()) == (b"alice", 42, 3)

            got = [(m.message().Cents(), m.message().Tags(0)) for m in stub.History(entry(ledger, "bob", 40))]
            assert got == [(i, str(i).encode()) for i in range(40)]

            t = stub.Sum(entry(ledger, "carol", k) for k in range(1, 101)).message()
            assert (t.Account(), t.Cents(), t.Entries()) == (b"carol", 5050, 100)

            running = [(m.message().Cents(), m.message().Entries())
                       for m in stub.Running(entry(ledger, "dave", k) for k in range(1, 21))]
            assert running == [(k * (k + 1) // 2, k) for k in range(1, 21)]

            with pytest.raises(slotrpc.RpcError) as e:
                list(stub.History(entry(ledger, "erin", 5000)))
            assert e.value.code() == slotrpc.StatusCode.OUT_OF_RANGE
    finally:
        peer.stdin.close()
        assert peer.wait(timeout=30) == 0


def make_ledger_servicer(ledger):
    class Ledger(ledger.LedgerServicer):
        def Post(self, request, context):
            e = request.message()
            return total(ledger, e.Account().decode(), e.Cents() * 2, e.TagsLength())

        def History(self, request, context):
            e = request.message()
            if not 0 <= e.Cents() <= 1000:
                context.abort(slotrpc.StatusCode.OUT_OF_RANGE, "History: cents must be 0..1000")
            for i in range(e.Cents()):
                yield entry(ledger, e.Account().decode(), i, [str(i)])

        def Sum(self, request_iterator, context):
            account, cents, n = "", 0, 0
            for r in request_iterator:
                e = r.message()
                if n == 0:
                    account = e.Account().decode()
                cents += e.Cents()
                n += 1
            return total(ledger, account, cents, n)

        def Running(self, request_iterator, context):
            cents, n = 0, 0
            for r in request_iterator:
                e = r.message()
                cents += e.Cents()
                n += 1
                yield total(ledger, e.Account().decode(), cents, n)
    return Ledger()


def test_cpp_client_calls_python_server(ledger):
    server = slotrpc.Server()
    ledger.add_LedgerServicer_to_server(make_ledger_servicer(ledger), server)
    server.start("127.0.0.1:0")
    try:
        # The peer runs while this process's handlers answer it: wait for it
        # without holding the GIL (subprocess.run waits in C).
        out = subprocess.run([os.environ["LEDGER_PEER"], "call", f"127.0.0.1:{server.port}"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "all four kinds answered right" in out.stdout
    finally:
        server.stop()


def make_async_ledger_servicer(ledger):
    """The same answers from async methods of the generated base."""
    class AsyncLedger(ledger.LedgerServicer):
        async def Post(self, request, context):
            e = request.message()
            return total(ledger, e.Account().decode(), e.Cents() * 2, e.TagsLength())

        async def History(self, request, context):
            e = request.message()
            if not 0 <= e.Cents() <= 1000:
                await context.abort(slotrpc.StatusCode.OUT_OF_RANGE, "History: cents must be 0..1000")
            for i in range(e.Cents()):
                yield entry(ledger, e.Account().decode(), i, [str(i)])

        async def Sum(self, request_iterator, context):
            account, cents, n = "", 0, 0
            async for r in request_iterator:
                e = r.message()
                if n == 0:
                    account = e.Account().decode()
                cents += e.Cents()
                n += 1
            return total(ledger, account, cents, n)

        async def Running(self, request_iterator, context):
            cents, n = 0, 0
            async for r in request_iterator:
                e = r.message()
                cents += e.Cents()
                n += 1
                yield total(ledger, e.Account().decode(), cents, n)
    return AsyncLedger()


def test_cpp_client_calls_async_python_server(ledger):
    import asyncio

    import slotrpc.aio

    async def main():
        async with slotrpc.aio.Server() as server:
            ledger.add_LedgerServicer_to_server(make_async_ledger_servicer(ledger), server)
            await server.start("127.0.0.1:0")
            peer = await asyncio.create_subprocess_exec(
                os.environ["LEDGER_PEER"], "call", f"127.0.0.1:{server.port}",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(peer.communicate(), 60)
            assert peer.returncode == 0, err.decode()
            assert "all four kinds answered right" in out.decode()
    asyncio.run(main())
