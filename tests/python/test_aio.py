"""slotrpc.aio: the generated stub over an asyncio channel."""

import asyncio

import pytest

import slotrpc
import slotrpc.aio


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_aio_four_kinds_and_errors(lab, types, lab_server):
    async def main():
        async with slotrpc.aio.Channel(f"127.0.0.1:{lab_server.port}", transport="tcp") as ch:
            stub = lab.LabStub(ch)
            replies = await asyncio.gather(*(stub.Echo(types.ping(i)) for i in range(32)))
            assert [r.message().Seq() for r in replies] == list(range(32))

            assert [m.message().Seq() async for m in stub.Count(types.ping(20))] == list(range(20))

            async def requests():
                for i in range(10):
                    yield types.ping(i, "a")
            g = (await stub.Gather(requests())).message()
            assert (g.Seq(), g.Count()) == (45, 10)

            got = [m.message().Seq() async for m in stub.Chat(types.ping(i) for i in range(10))]
            assert got == [2 * i for i in range(10)]

            with pytest.raises(slotrpc.RpcError) as e:
                await stub.Fail(types.ping(code=int(slotrpc.StatusCode.PERMISSION_DENIED)))
            assert e.value.code() == slotrpc.StatusCode.PERMISSION_DENIED

            with pytest.raises(slotrpc.RpcError) as e:
                await stub.Slow(types.ping(delay_ms=20000), timeout=0.1)
            assert e.value.code() == slotrpc.StatusCode.DEADLINE_EXCEEDED
    run(main())


def test_aio_task_cancel_cancels_the_call(lab, types, lab_server):
    servicer = lab_server.servicer

    async def main():
        servicer.slow_started.clear()
        servicer.slow_cancelled.clear()
        async with slotrpc.aio.Channel(f"127.0.0.1:{lab_server.port}", transport="tcp") as ch:
            task = asyncio.ensure_future(lab.LabStub(ch).Slow(types.ping(delay_ms=60000)))
            await asyncio.get_running_loop().run_in_executor(None, servicer.slow_started.wait, 10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            ok = await asyncio.get_running_loop().run_in_executor(None, servicer.slow_cancelled.wait, 10)
            assert ok, "the handler never saw the cancel"
    run(main())
