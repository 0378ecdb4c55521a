"""The synchronous unary call (_core.UnaryMethod, python/src/unary.cc):
its arguments, the request read in place, a signal during the wait, and
replies whose slot is given back without a view ever taken."""

import os
import signal
import threading

import numpy as np
import pytest

import slotrpc
from slotrpc import RpcError, StatusCode


def test_arguments_by_position_and_name(stub, types):
    req = types.ping(3, "args")
    assert stub.Echo(req).message().Seq() == 3
    assert stub.Echo(req, 5).message().Seq() == 3  # timeout by position
    assert stub.Echo(request=req, timeout=5, max_retries=1).message().Seq() == 3
    assert stub.Echo(req, None, None, None, 0).message().Seq() == 3
    with pytest.raises(TypeError, match="unexpected keyword argument 'timout'.*known: request, timeout"):
        stub.Echo(req, timout=1)
    with pytest.raises(TypeError, match="multiple values for argument 'timeout'"):
        stub.Echo(req, 1, timeout=1)
    with pytest.raises(TypeError, match="at most 5 arguments"):
        stub.Echo(req, None, None, None, 0, 1)
    with pytest.raises(TypeError, match="needs its request"):
        stub.Echo()
    with pytest.raises(TypeError, match="request is None"):
        stub.Echo(None)
    with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0"):
        stub.Echo(req, timeout=-1)
    assert stub.Echo.future(req).result().message().Seq() == 3
    assert stub.Echo.method_id == slotrpc.method_id("pylab.Lab.Echo")


def test_request_buffers_read_in_place(stub, types):
    import flatbuffers
    b = flatbuffers.Builder(64)
    b.Finish(types.ping(21, "in place")(b))
    raw = bytes(b.Output())
    for request in (raw, bytearray(raw), memoryview(raw), np.frombuffer(raw, dtype=np.uint8)):
        reply = stub.Echo(request)
        assert (reply.message().Seq(), reply.message().Text()) == (21, b"in place"), type(request)
    # A strided view is no contiguous buffer: refused, naming what is accepted.
    with pytest.raises(TypeError, match="not a contiguous buffer"):
        stub.Echo(np.frombuffer(raw * 2, dtype=np.uint8)[::2])


def test_replies_dropped_without_a_view_give_their_slot_back(lab_server, lab, types):
    # 4 slots: a reply that kept its slot after being dropped (copied,
    # measured or ignored, never viewed) would stall the fifth call.
    with slotrpc.Channel(f"127.0.0.1:{lab_server.port}", transport="tcp", slot_count=4) as ch:
        stub = lab.LabStub(ch)
        for i in range(64):
            reply = stub.Echo(types.ping(i), timeout=10)
            if i % 3 == 0:
                assert len(reply) > 0 and reply.copy()
            elif i % 3 == 1:
                reply.release()
                with pytest.raises(ValueError, match="message released"):
                    reply.copy()
        kept = [stub.Echo(types.ping(i), timeout=10) for i in range(3)]
        assert [k.message().Seq() for k in kept] == [0, 1, 2]


def test_signal_during_a_sync_call_cancels_it(stub, types, lab_server):
    # Only the main thread runs Python's signal handlers: the call waits
    # there, in 100 ms slices, and a handler that raises cancels it.
    assert threading.current_thread() is threading.main_thread()
    servicer = lab_server.servicer
    servicer.slow_started.clear()
    servicer.slow_cancelled.clear()

    class Interrupted(Exception):
        pass

    def on_alarm(signum, frame):
        raise Interrupted()

    old = signal.signal(signal.SIGUSR1, on_alarm)
    sender = threading.Thread(target=lambda: servicer.slow_started.wait(10) and os.kill(os.getpid(), signal.SIGUSR1))
    sender.start()
    try:
        with pytest.raises(Interrupted):
            stub.Slow(types.ping(delay_ms=60000))
    finally:
        sender.join()
        signal.signal(signal.SIGUSR1, old)
    assert servicer.slow_cancelled.wait(10), "the handler never saw the cancel"
    # The channel serves on.
    assert stub.Echo(types.ping(8)).message().Seq() == 8


def test_closed_channel(lab_server, lab, types):
    ch = slotrpc.Channel(f"127.0.0.1:{lab_server.port}", transport="tcp")
    stub = lab.LabStub(ch)
    assert stub.Echo(types.ping(1)).message().Seq() == 1
    ch.close()
    with pytest.raises(ValueError, match="channel is closed"):
        stub.Echo(types.ping(2))


def test_error_status(stub, types):
    with pytest.raises(RpcError) as e:
        stub.Slow(types.ping(delay_ms=20000), timeout=0.05)
    assert e.value.code() == StatusCode.DEADLINE_EXCEEDED


def test_message_object(stub, types):
    # _core.Message is a plain CPython type (python/src/message.cc).
    reply = stub.Echo(types.ping(9, "msg"))
    assert isinstance(reply, slotrpc.Message)
    assert len(reply) == len(reply.copy()) == len(bytes(reply)) > 0
    assert reply.message(types.Pong.Pong).Seq() == 9
    assert reply.message(type=types.Pong.Pong).Text() == b"msg"
    assert reply.type is types.Pong.Pong and reply.message().Seq() == 9
    reply.type = None
    with pytest.raises(TypeError, match="no type given"):
        reply.message()
    with pytest.raises(TypeError, match="unexpected keyword argument 'kind'"):
        reply.message(kind=None)
    assert reply.bulk_received(0) == 0 and reply.bulk_received(99) == 0
    assert reply.valid
    reply.release()
    assert not reply.valid
    with pytest.raises(ValueError, match="message released"):
        reply.data
    reply.release()  # twice is harmless
    with pytest.raises(TypeError):
        slotrpc.Message()
