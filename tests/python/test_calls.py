"""The four call kinds, replies read in place, errors, deadlines and
cancellation, over TCP within one process."""

import threading
import time

import flatbuffers
import pytest

import slotrpc
from slotrpc import RpcError, StatusCode


def test_unary_reply_read_in_place(stub, types):
    reply = stub.Echo(types.ping(7, "hello", b"\x01\x02\x03"))
    assert isinstance(reply.data, memoryview) and reply.data.readonly
    pong = reply.message()
    assert (pong.Seq(), pong.Text(), pong.Count()) == (7, b"hello", 3)
    assert pong.PayloadAsNumpy().tobytes() == b"\x01\x02\x03"
    kept = reply.copy()
    assert isinstance(kept, bytes) and kept == bytes(reply.data)
    view = reply.data
    reply.release()  # the slot goes back; the view must not read it any more
    with pytest.raises(ValueError):
        bytes(view)
    with pytest.raises(ValueError):
        reply.message()
    assert types.Pong.Pong.GetRootAs(kept, 0).Seq() == 7


def test_request_as_prebuilt_bytes_and_builder(stub, types):
    b = flatbuffers.Builder(64)
    b.Finish(types.ping(11, "prebuilt")(b))
    assert stub.Echo(b.Output()).message().Seq() == 11
    assert stub.Echo(b).message().Text() == b"prebuilt"
    unfinished = flatbuffers.Builder(64)
    with pytest.raises(ValueError, match="not finished"):
        stub.Echo(unfinished)


def test_server_stream(stub):
    replies = [m.message().Seq() for m in stub.Count(lambda b: _ping_seq(b, 100))]
    assert replies == list(range(100))


def _ping_seq(b, seq):
    import pylab.Ping as P
    P.PingStart(b)
    P.PingAddSeq(b, seq)
    return P.PingEnd(b)


def test_client_stream(stub, types):
    reply = stub.Gather(types.ping(i, "x") for i in range(50)).message()
    assert (reply.Seq(), reply.Count(), reply.Text()) == (sum(range(50)), 50, b"x" * 50)


def test_bidi(stub, types):
    got = [(m.message().Seq(), m.message().Count()) for m in stub.Chat(types.ping(i) for i in range(30))]
    assert got == [(2 * i, i + 1) for i in range(30)]


def test_future_and_callback(stub, types):
    done = threading.Event()
    fut = stub.Echo.future(types.ping(5))
    fut.add_done_callback(lambda f: done.set())
    assert fut.result().message().Seq() == 5
    assert fut.result().message().Seq() == 5  # cached
    assert done.wait(10)


def test_handler_errors(stub, types):
    with pytest.raises(RpcError) as e:
        stub.Fail(types.ping(code=int(StatusCode.NOT_FOUND)))
    assert e.value.code() == StatusCode.NOT_FOUND and e.value.details() == "failing on purpose"
    with pytest.raises(RpcError) as e:
        stub.Fail(types.ping(code=99))
    assert e.value.code() == StatusCode.UNKNOWN and "boom" in e.value.details()
    with pytest.raises(RpcError) as e:
        stub.Fail(types.ping(code=98))
    assert e.value.code() == StatusCode.ALREADY_EXISTS and e.value.details() == "set, not raised"


def test_unimplemented(lab, types):
    server = slotrpc.Server()
    server.add_servicer(lab.LabServicer())  # implements nothing
    server.start("127.0.0.1:0")
    with slotrpc.Channel(f"127.0.0.1:{server.port}", transport="tcp") as ch:
        with pytest.raises(RpcError) as e:
            lab.LabStub(ch).Echo(types.ping())
        assert e.value.code() == StatusCode.UNIMPLEMENTED
        with pytest.raises(RpcError) as e:
            list(lab.LabStub(ch).Count(types.ping(3)))
        assert e.value.code() == StatusCode.UNIMPLEMENTED
        with pytest.raises(RpcError) as e:  # a method no one registered
            ch.unary_unary("pylab.Lab.Nothing")(b"\0\0\0\0")
        assert e.value.code() == StatusCode.UNIMPLEMENTED
    server.stop()


def test_connect_failure_is_unavailable():
    with pytest.raises(RpcError) as e:
        slotrpc.Channel("127.0.0.1:1", transport="tcp", connect_timeout_ms=2000)
    assert e.value.code() == StatusCode.UNAVAILABLE


def test_bad_setting_names_it():
    with pytest.raises(TypeError, match="unknown setting 'slot_sise'"):
        slotrpc.Channel("127.0.0.1:1", slot_sise=4096)
    with pytest.raises(ValueError, match="transport='carrier-pigeon'"):
        slotrpc.Channel("127.0.0.1:1", transport="carrier-pigeon")


def test_deadline(stub, types):
    t0 = time.monotonic()
    with pytest.raises(RpcError) as e:
        stub.Slow(types.ping(delay_ms=20000), timeout=0.2)
    assert e.value.code() == StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - t0 < 10


def test_cancel_unary(stub, types, lab_server):
    servicer = lab_server.servicer
    servicer.slow_started.clear()
    servicer.slow_cancelled.clear()
    fut = stub.Slow.future(types.ping(delay_ms=60000))
    assert servicer.slow_started.wait(10)
    assert fut.cancel()
    with pytest.raises(RpcError) as e:
        fut.result()
    assert e.value.code() == StatusCode.CANCELLED
    assert servicer.slow_cancelled.wait(10), "the handler never saw the cancel"


def test_cancel_server_stream(stub, types):
    it = stub.Count(types.ping(1000000, delay_ms=1))
    assert next(it).message().Seq() == 0
    it.cancel()
    with pytest.raises(RpcError) as e:
        for _ in it:
            pass
    assert e.value.code() == StatusCode.CANCELLED


def test_gil_released_while_waiting(stub, types):
    """A thread waiting on a call lets other Python threads run, and a
    handler sleeping with slotrpc.sleep lets its loop serve other calls."""
    ticks = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    slow = stub.Slow.future(types.ping(delay_ms=300))
    # The same server loop answers an Echo while Slow's handler sleeps.
    assert stub.Echo(types.ping(1), timeout=5).message().Seq() == 1
    slow.result()
    stop.set()
    t.join()
    assert ticks[0] > 1000


def test_error_while_another_handler_is_suspended(stub, types, lab_server):
    """Two handlers interleave on one loop thread: Slow suspended in
    slotrpc.sleep, Fail raising.  Each fiber has its own Python thread
    state; pybind11's must follow the running fiber, or Fail's error would
    wait for the GIL under Slow's thread state, forever."""
    servicer = lab_server.servicer
    servicer.slow_started.clear()
    slow = stub.Slow.future(types.ping(3, delay_ms=500))
    assert servicer.slow_started.wait(10)
    for _ in range(3):
        with pytest.raises(RpcError) as e:
            stub.Fail(types.ping(code=int(StatusCode.NOT_FOUND)), timeout=10)
        assert e.value.code() == StatusCode.NOT_FOUND
    assert slow.result().message().Seq() == 3


def test_handlers_suspend_and_resume_out_of_order(stub, types):
    """Handlers sleeping at once on one loop resume in any order: each
    fiber keeps its own pybind11 argument frames (they are a per-thread
    LIFO stack in pybind11)."""
    futures = [stub.Slow.future(types.ping(i, delay_ms=100 + 10 * i)) for i in range(4)]
    assert [f.result().message().Seq() for f in futures] == list(range(4))


def test_handler_calls_another_service(stub, types, lab_server):
    """A handler's own call waits on its fiber: the loop serves on."""
    inner = slotrpc.Channel(f"127.0.0.1:{lab_server.port}", transport="tcp")

    def relay(request, context):
        seq = request.message(types.Ping.Ping).Seq()
        return inner.unary_unary("pylab.Lab.Echo")(types.ping(seq + 1), timeout=10).copy()

    front = slotrpc.Server()
    front.add_method("pylab.Relay", "Relay", slotrpc.MethodKind.UNARY, relay)
    front.start("127.0.0.1:0")
    try:
        with slotrpc.Channel(f"127.0.0.1:{front.port}", transport="tcp") as ch:
            call = ch.unary_unary("pylab.Relay.Relay", reply_type=types.Pong.Pong)
            futures = [call.future(types.ping(i)) for i in range(8)]
            assert [f.result().message().Seq() for f in futures] == [i + 1 for i in range(8)]
    finally:
        front.stop()
        inner.close()


def test_close_while_other_threads_call(lab_server, types):
    """close() while threads are issuing calls: each call succeeds or fails
    cleanly (CANCELLED, UNAVAILABLE, or 'channel is closed')."""
    ch = slotrpc.Channel(f"127.0.0.1:{lab_server.port}", transport="tcp")
    echo = ch.unary_unary("pylab.Lab.Echo")
    outcomes = []
    started = threading.Barrier(5)
    first = threading.Event()

    def caller():
        started.wait()
        for i in range(200):
            try:
                echo(types.ping(i), timeout=10)
                outcomes.append("ok")
                first.set()
            except RpcError as e:
                assert e.code() in (StatusCode.CANCELLED, StatusCode.UNAVAILABLE), e
                outcomes.append("failed")
            except ValueError as e:
                assert "closed" in str(e)
                outcomes.append("closed")
                return

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for t in threads:
        t.start()
    started.wait()
    assert first.wait(10), "no call succeeded"
    ch.close()
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    assert "closed" in outcomes


@pytest.mark.parametrize("workers", [None, 2])
def test_computing_handler_and_the_loop(workers):
    """A unary handler that computes holds its loop, unless the server runs
    handlers on worker threads (max_workers): then a call to another method
    of the same loop is answered meanwhile."""
    started = threading.Event()
    release = threading.Event()

    def compute(request, context):
        started.set()
        # Python work that never waits on the network: holds the loop
        # unless on a worker thread.
        while not release.is_set():
            sum(range(1000))
        return b"done"

    server = slotrpc.Server(max_workers=workers)
    server.add_method("t.W", "Compute", slotrpc.MethodKind.UNARY, compute)
    server.add_method("t.W", "Quick", slotrpc.MethodKind.UNARY, lambda r, c: b"quick")
    server.start("127.0.0.1:0")
    try:
        with slotrpc.Channel(f"127.0.0.1:{server.port}", transport="tcp") as ch:
            slow = ch.unary_unary("t.W.Compute").future(b"")
            assert started.wait(10)
            try:
                quick = ch.unary_unary("t.W.Quick")(b"", timeout=0.5).copy()
            except RpcError as e:
                quick = e.code()
            release.set()
            assert slow.result().copy() == b"done"
            if workers:
                assert quick == b"quick"
            else:
                assert quick == StatusCode.DEADLINE_EXCEEDED  # the loop was held
    finally:
        release.set()
        server.stop()
