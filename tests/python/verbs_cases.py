"""Python over RDMA verbs: run in the Soft-RoCE VM (or on a host's RDMA
device) by python_over_verbs.sh, suite rxe (meson test rxe_python).  Not a
test_*.py file: the plain `python` test, which has no device, does not
collect it.  Client and server share this process; their queue pairs meet
on the one rxe device."""

import asyncio
import os

import numpy as np
import pytest

import slotrpc
import slotrpc.aio

if not os.environ.get("SLOTRPC_PY_VERBS"):
    pytest.exit("verbs_cases.py runs under python_over_verbs.sh (suite rxe), which has an RDMA device",
                returncode=4)


@pytest.fixture(scope="module")
def verbs_server(lab, types):
    from conftest import make_servicer
    server = slotrpc.Server(transport="verbs")
    server.add_servicer(make_servicer(lab, types))
    server.start("127.0.0.1:0")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def vstub(lab, verbs_server):
    ch = slotrpc.Channel(f"127.0.0.1:{verbs_server.port}", transport="verbs")
    assert ch.transport == "verbs"
    yield lab.LabStub(ch)
    ch.close()


def test_unary_over_verbs(vstub, types):
    rng = np.random.default_rng(1)
    for i, size in enumerate([0, 1, 64, 1000, 3000]):
        payload = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        r = vstub.Echo(types.ping(i, "verbs", payload)).message()
        assert (r.Seq(), r.Text(), r.Count()) == (i, b"verbs", size)
        assert (r.PayloadAsNumpy().tobytes() if size else b"") == payload
    del r  # a reply holds its slot, hence a credit, while it lives
    # 32 in flight, within the 64 slots even with every reply held.
    futures = [vstub.Echo.future(types.ping(i)) for i in range(32)]
    assert [f.result().message().Seq() for f in futures] == list(range(32))


def test_streams_over_verbs(vstub, types):
    assert [m.message().Seq() for m in vstub.Count(types.ping(500))] == list(range(500))
    g = vstub.Gather(types.ping(i, "g") for i in range(200)).message()
    assert (g.Seq(), g.Count()) == (sum(range(200)), 200)
    got = [m.message().Seq() for m in vstub.Chat(types.ping(i) for i in range(200))]
    assert got == [2 * i for i in range(200)]


def test_bulk_numpy_over_verbs_every_byte(vstub, types, verbs_server):
    # RDMA READ of the request data into the handler's array, RDMA WRITE of
    # the reply data into `out`: 8 MiB each way (the VM moves ~36 MB/s).
    n = 8 << 20
    data = np.random.default_rng(2).integers(0, 256, n, dtype=np.uint8)
    out = np.zeros(n, dtype=np.uint8)
    r = vstub.Bulk(types.ping(), send_bulk=[data], receive_bulk=[out])
    assert r.message().Count() == n
    assert r.bulk_received(0) == n
    assert np.array_equal(out, (data + 1).astype(np.uint8))


def test_async_servicer_over_verbs(lab, types):
    from test_aio_server import make_async_servicer
    servicer = make_async_servicer(lab, types)

    async def main():
        async with slotrpc.aio.Server(transport="verbs") as server:
            server.add_servicer(servicer)
            await server.start("127.0.0.1:0")
            async with slotrpc.aio.Channel(f"127.0.0.1:{server.port}", transport="verbs") as ch:
                assert ch.sync.transport == "verbs"
                stub = lab.LabStub(ch)
                replies = await asyncio.gather(*(stub.Echo(types.ping(i)) for i in range(16)))
                assert [r.message().Seq() for r in replies] == list(range(16))
                assert [m.message().Seq() async for m in stub.Count(types.ping(50))] == list(range(50))
                data = np.random.default_rng(3).integers(0, 256, 1 << 20, dtype=np.uint8)
                out = np.zeros_like(data)
                r = await stub.Bulk(types.ping(), send_bulk=[data], receive_bulk=[out])
                assert r.message().Count() == data.size
                assert np.array_equal(out, (data + 1).astype(np.uint8))
    asyncio.run(asyncio.wait_for(main(), 120))
