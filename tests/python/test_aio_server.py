"""Async servicers: `async def` handlers of the four kinds, on a loop the
user owns (slotrpc.aio.Server) or one the server starts (slotrpc.Server),
sharing a server with sync handlers; errors, deadlines and cancellation
seen from the async side."""

import asyncio
import threading

import numpy as np
import pytest

import slotrpc
import slotrpc.aio


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def make_async_servicer(lab, types):
    class AsyncLab(lab.LabServicer):  # the generated base, async methods
        def __init__(self):
            self.slow_started = threading.Event()
            self.slow_cancelled = threading.Event()
            self.loops = set()
            self.count_stopped = threading.Event()

        async def Echo(self, request, context):
            self.loops.add(id(asyncio.get_running_loop()))
            p = request.message()
            await asyncio.sleep(0)  # a real suspension on the asyncio loop
            return types.pong(p.Seq(), p.Text() or b"", p.PayloadAsNumpy().tobytes()
                              if p.PayloadLength() else b"", p.PayloadLength())

        async def Count(self, request, context):
            p = request.message()
            try:
                for i in range(p.Seq()):
                    if p.DelayMs():
                        await asyncio.sleep(p.DelayMs() / 1000)
                    yield types.pong(i, b"n%d" % i)
            finally:
                self.count_stopped.set()

        async def Gather(self, request_iterator, context):
            total = n = 0
            text = b""
            async for r in request_iterator:
                p = r.message()
                total += p.Seq()
                n += 1
                text += p.Text() or b""
            return types.pong(total, text, b"", n)

        async def Chat(self, request_iterator, context):
            n = 0
            async for r in request_iterator:
                p = r.message()
                n += 1
                yield types.pong(p.Seq() * 2, p.Text() or b"", b"", n)

        async def Slow(self, request, context):
            self.slow_started.set()
            try:
                await asyncio.sleep(request.message().DelayMs() / 1000)
            except asyncio.CancelledError:
                self.slow_cancelled.set()
                raise
            return types.pong(request.message().Seq())

        async def Fail(self, request, context):
            code = request.message().Code()
            if code == 99:
                raise ValueError("async boom")
            if code == 98:
                context.set_code(slotrpc.StatusCode.ALREADY_EXISTS)
                context.set_details("set, not raised")
                return types.pong()
            await context.abort(code, "failing on purpose")

        async def Bulk(self, request, context):
            total = 0
            for i in range(context.bulk_in_count):
                data = np.empty(context.bulk_in(i), dtype=np.uint8)
                await context.read_bulk(i, into=data)
                total += data.size
                if i < context.bulk_out_count:
                    await context.write_bulk(i, (data + 1).astype(np.uint8))
            return types.pong(count=total)

    return AsyncLab()


async def exercise(lab, types, port, servicer):
    """Every kind, errors, a deadline and a client cancel, against `port`."""
    async with slotrpc.aio.Channel(f"127.0.0.1:{port}", transport="tcp") as ch:
        stub = lab.LabStub(ch)
        replies = await asyncio.gather(*(stub.Echo(types.ping(i, "x", b"abc")) for i in range(32)))
        assert [r.message().Seq() for r in replies] == list(range(32))
        assert replies[5].message().PayloadAsNumpy().tobytes() == b"abc"

        assert [m.message().Seq() async for m in stub.Count(types.ping(25))] == list(range(25))

        async def requests():
            for i in range(10):
                yield types.ping(i, "a")
        g = (await stub.Gather(requests())).message()
        assert (g.Seq(), g.Count(), g.Text()) == (45, 10, b"a" * 10)

        got = [m.message().Seq() async for m in stub.Chat(types.ping(i) for i in range(40))]
        assert got == [2 * i for i in range(40)]

        with pytest.raises(slotrpc.RpcError) as e:
            await stub.Fail(types.ping(code=int(slotrpc.StatusCode.PERMISSION_DENIED)))
        assert e.value.code() == slotrpc.StatusCode.PERMISSION_DENIED
        assert "failing on purpose" in e.value.details()
        with pytest.raises(slotrpc.RpcError) as e:
            await stub.Fail(types.ping(code=99))
        assert e.value.code() == slotrpc.StatusCode.UNKNOWN
        assert "async boom" in e.value.details()
        with pytest.raises(slotrpc.RpcError) as e:
            await stub.Fail(types.ping(code=98))
        assert (e.value.code(), e.value.details()) == (slotrpc.StatusCode.ALREADY_EXISTS, "set, not raised")

        # A deadline: the client gives up, and the handler's task is cancelled.
        servicer.slow_cancelled.clear()
        with pytest.raises(slotrpc.RpcError) as e:
            await stub.Slow(types.ping(delay_ms=30000), timeout=0.2)
        assert e.value.code() == slotrpc.StatusCode.DEADLINE_EXCEEDED
        ok = await asyncio.get_running_loop().run_in_executor(None, servicer.slow_cancelled.wait, 10)
        assert ok, "the deadline did not cancel the async handler's task"

        # A client cancel reaches the handler's task as CancelledError.
        servicer.slow_started.clear()
        servicer.slow_cancelled.clear()
        task = asyncio.ensure_future(stub.Slow(types.ping(delay_ms=60000)))
        await asyncio.get_running_loop().run_in_executor(None, servicer.slow_started.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        ok = await asyncio.get_running_loop().run_in_executor(None, servicer.slow_cancelled.wait, 10)
        assert ok, "the client's cancel did not cancel the async handler's task"

        # A server stream the client cancels: the async generator is closed.
        servicer.count_stopped.clear()
        replies = stub.Count(types.ping(100000, delay_ms=1))
        async for m in replies:
            if m.message().Seq() == 3:
                break
        replies.cancel()
        ok = await asyncio.get_running_loop().run_in_executor(None, servicer.count_stopped.wait, 10)
        assert ok, "the cancelled stream's async generator was never closed"

        # Bulk, every byte checked.
        data = np.random.default_rng(7).integers(0, 256, 1 << 20, dtype=np.uint8)
        out = np.zeros_like(data)
        r = await stub.Bulk(types.ping(), send_bulk=[data], receive_bulk=[out])
        assert r.message().Count() == data.size
        assert np.array_equal(out, (data + 1).astype(np.uint8))


def test_aio_server_on_the_users_loop(lab, types):
    servicer = make_async_servicer(lab, types)

    async def main():
        async with slotrpc.aio.Server() as server:
            server.add_servicer(servicer)
            await server.start("127.0.0.1:0")
            await exercise(lab, types, server.port, servicer)
            assert servicer.loops == {id(asyncio.get_running_loop())}
    run(main())


def test_sync_server_starts_its_own_loop_for_async_handlers(lab, types):
    servicer = make_async_servicer(lab, types)
    server = slotrpc.Server()
    server.add_servicer(servicer)
    server.start("127.0.0.1:0")
    try:
        run(exercise(lab, types, server.port, servicer))
        assert len(servicer.loops) == 1
    finally:
        server.stop()


def test_sync_and_async_servicers_share_one_server(lab, types, gen_dir):
    from conftest import make_servicer

    sync_servicer = make_servicer(lab, types)
    async_servicer = make_async_servicer(lab, types)

    async def main():
        server = slotrpc.aio.Server()
        # One service, its methods split between a sync and an async servicer.
        for m in lab.LabServicer.SERVICE.methods:
            owner = async_servicer if m.name in ("Echo", "Chat") else sync_servicer
            server.add_method(lab.LabServicer.SERVICE.name, m.name, m.kind, getattr(owner, m.attr),
                              m.request_type)
        await server.start("127.0.0.1:0")
        try:
            async with slotrpc.aio.Channel(f"127.0.0.1:{server.port}", transport="tcp") as ch:
                stub = lab.LabStub(ch)
                assert (await stub.Echo(types.ping(7))).message().Seq() == 7
                assert [m.message().Seq() async for m in stub.Count(types.ping(5))] == list(range(5))
                got = [m.message().Count() async for m in stub.Chat(types.ping(i) for i in range(5))]
                assert got == [1, 2, 3, 4, 5]
            # A sync client from another thread, while the loop serves.
            def sync_calls():
                with slotrpc.Channel(f"127.0.0.1:{server.port}", transport="tcp") as ch:
                    stub = lab.LabStub(ch)
                    return [stub.Echo(types.ping(i)).message().Seq() for i in range(20)]
            assert await asyncio.get_running_loop().run_in_executor(None, sync_calls) == list(range(20))
        finally:
            await server.stop()
    run(main())


def test_aio_bidi_writes_while_a_read_waits(lab, types):
    """A bidi handler that answers before the next request arrives: its
    write is not held behind the pending read."""
    class Greeter(lab.LabServicer):
        async def Chat(self, request_iterator, context):
            await context.write(types.pong(1000))  # before any request
            async for r in request_iterator:
                await context.write(types.pong(r.message().Seq()))

    async def main():
        server = slotrpc.aio.Server()
        server.add_servicer(Greeter())
        await server.start("127.0.0.1:0")
        try:
            async with slotrpc.aio.Channel(f"127.0.0.1:{server.port}", transport="tcp") as ch:
                first = asyncio.Event()

                async def requests():
                    await first.wait()  # no request until the greeting came
                    for i in range(3):
                        yield types.ping(i)
                got = []
                async for m in lab.LabStub(ch).Chat(requests()):
                    got.append(m.message().Seq())
                    first.set()
                assert got == [1000, 0, 1, 2]
        finally:
            await server.stop()
    run(main())


def test_aio_server_stop_cancels_running_handlers(lab, types):
    servicer = make_async_servicer(lab, types)

    async def main():
        server = slotrpc.aio.Server()
        server.add_servicer(servicer)
        await server.start("127.0.0.1:0")
        ch = slotrpc.aio.Channel(f"127.0.0.1:{server.port}", transport="tcp")
        call = asyncio.ensure_future(lab.LabStub(ch).Slow(types.ping(delay_ms=60000)))
        await asyncio.get_running_loop().run_in_executor(None, servicer.slow_started.wait, 10)
        await server.stop()
        assert servicer.slow_cancelled.is_set()
        with pytest.raises(slotrpc.RpcError) as e:
            await call
        assert e.value.code() in (slotrpc.StatusCode.CANCELLED, slotrpc.StatusCode.UNAVAILABLE)
        ch.close()
    run(main())


def test_async_generator_for_a_unary_method_is_refused(lab):
    class Wrong(lab.LabServicer):
        async def Echo(self, request, context):
            yield b""

    with pytest.raises(TypeError, match="async generator"):
        slotrpc.aio.Server().add_servicer(Wrong())


def test_aio_stream_errors_and_time_remaining(lab, types):
    class Failing(lab.LabServicer):
        async def Echo(self, request, context):
            left = context.time_remaining()
            return types.pong(count=int(left * 1000) if left is not None else 0)

        async def Count(self, request, context):
            for i in range(3):
                yield types.pong(i)
            raise slotrpc.RpcError(slotrpc.StatusCode.DATA_LOSS, "after three")

        async def Gather(self, request_iterator, context):
            async for r in request_iterator:
                if r.message().Seq() == 2:
                    raise KeyError("no two")
            return types.pong()

    async def main():
        async with slotrpc.aio.Server() as server:
            server.add_servicer(Failing())
            await server.start("127.0.0.1:0")
            async with slotrpc.aio.Channel(f"127.0.0.1:{server.port}", transport="tcp") as ch:
                stub = lab.LabStub(ch)
                assert 0 < (await stub.Echo(types.ping(), timeout=5)).message().Count() <= 5000
                assert (await stub.Echo(types.ping())).message().Count() == 0  # no deadline

                got = []
                with pytest.raises(slotrpc.RpcError) as e:
                    async for m in stub.Count(types.ping()):
                        got.append(m.message().Seq())
                assert got == [0, 1, 2]
                assert (e.value.code(), e.value.details()) == (slotrpc.StatusCode.DATA_LOSS, "after three")

                with pytest.raises(slotrpc.RpcError) as e:
                    await stub.Gather(types.ping(i) for i in range(5))
                assert e.value.code() == slotrpc.StatusCode.UNKNOWN
                assert "no two" in e.value.details()
    run(main())
