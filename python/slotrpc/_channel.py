"""The client side: Channel and the four call shapes (grpcio's)."""

import threading
import weakref

from . import _core
from ._bulk import bulk_list, message_bytes

_live_channels = weakref.WeakSet()


def _method_id(method):
    return method if isinstance(method, int) else _core.method_id(method)


class Channel:
    """A session with one server: Channel("host:port", transport="tcp", ...).

    Settings are Config fields by name (transport, slot_size, slot_count,
    stream_window, connect_timeout_ms, ...); SLOTRPC_* environment variables
    apply on top, as in C++.  Raises RpcError(UNAVAILABLE) when it cannot
    connect."""

    def __init__(self, address, **settings):
        self._core = _core.Channel(address, settings)
        _live_channels.add(self)

    # grpcio's names: what generated stubs call.
    def unary_unary(self, method, reply_type=None, idempotent=False):
        """The method's callable: m(request, timeout=None, send_bulk=None,
        receive_bulk=None, max_retries=0) is the reply; m.future(...) a
        Future.  The call itself is native (_core.UnaryMethod): it is the
        per-call path of every synchronous unary call."""
        method_id = _method_id(method)
        futures = UnaryUnary(self, method_id, reply_type, idempotent)
        return _core.UnaryMethod(self._core, method_id, reply_type, idempotent, futures.future)

    def unary_stream(self, method, reply_type=None):
        return UnaryStream(self, _method_id(method), reply_type)

    def stream_unary(self, method, reply_type=None):
        return StreamUnary(self, _method_id(method), reply_type)

    def stream_stream(self, method, reply_type=None):
        return StreamStream(self, _method_id(method), reply_type)

    def register_memory(self, obj):
        """Registers a buffer (numpy array, bytearray, CPU torch tensor) for
        bulk payloads; the Region keeps `obj` alive."""
        from ._bulk import as_buffer
        return self._core.register_memory(as_buffer(obj))

    @property
    def transport(self):
        return self._core.transport

    @property
    def slot_size(self):
        return self._core.slot_size

    def close(self):
        """Fails outstanding calls with CANCELLED and closes the session."""
        if self._core is not None:
            self._core.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Future:
    """A unary or client-streaming call in flight (grpcio's shape)."""

    def __init__(self, core_future, reply_type):
        self._core = core_future
        self._reply_type = reply_type
        self._reply = None
        self._error = None

    def result(self):
        """Waits; the reply (a Message), or raises RpcError."""
        if self._reply is None and self._error is None:
            try:
                self._reply = self._core.result(self._reply_type)
            except _RpcError as e:
                self._error = e
        if self._error is not None:
            raise self._error
        return self._reply

    def exception(self):
        try:
            self.result()
        except _RpcError as e:
            return e
        return None

    def done(self):
        return self._core.done()

    def cancel(self):
        """Asks for the call to be cancelled; it fails with CANCELLED unless
        its reply was already on its way.  True if it was still running."""
        return self._core.cancel()

    def cancelled(self):
        e = self.exception() if self.done() else None
        return e is not None and e.code() == StatusCode.CANCELLED

    def add_done_callback(self, fn):
        """fn(future) runs on the channel's event loop thread when the call
        completes (at once if it has): keep it short."""
        self._core.add_done_callback(lambda: fn(self))


class UnaryUnary:
    """A unary method's Future form (Channel.unary_unary's `.future`)."""

    def __init__(self, channel, method_id, reply_type, idempotent):
        self._channel = channel
        self._id = method_id
        self._reply_type = reply_type
        self._idempotent = idempotent

    def future(self, request, timeout=None, send_bulk=None, receive_bulk=None, max_retries=0):
        core = self._channel._core.call(
            self._id, message_bytes(request), timeout, bulk_list(send_bulk), bulk_list(receive_bulk),
            self._idempotent, max_retries)
        return Future(core, self._reply_type)


class ReplyIterator:
    """A server stream's (or a bidi call's) replies; cancel() ends the call."""

    def __init__(self, core_stream, reply_type, on_cancel=None):
        self._core = core_stream
        self._reply_type = reply_type
        self._on_cancel = on_cancel
        self._done = False

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        try:
            m = self._core.next(self._reply_type)
        except BaseException:
            self._done = True
            raise
        if m is None:
            self._done = True
            raise StopIteration
        return m

    def cancel(self):
        self._core.cancel()
        if self._on_cancel is not None:
            self._on_cancel()


class UnaryStream:
    def __init__(self, channel, method_id, reply_type):
        self._channel = channel
        self._id = method_id
        self._reply_type = reply_type

    def __call__(self, request, timeout=None):
        """An iterator over the server's messages; RpcError from next() if
        the stream ends with an error."""
        core = self._channel._core.call_stream(self._id, message_bytes(request), timeout)
        return ReplyIterator(core, self._reply_type)


def _feed(call, requests, failure):
    """Writes `requests` into an outgoing stream, then half-closes.  A
    request iterator that raises cancels the call (as grpcio does)."""
    try:
        for r in requests:
            if not call.write(message_bytes(r)):
                return  # the call is over; its reply or status says why
        call.writes_done()
    except BaseException as e:  # noqa: B902 - re-raised by the caller's side
        failure.append(e)
        call.cancel()


class StreamUnary:
    def __init__(self, channel, method_id, reply_type):
        self._channel = channel
        self._id = method_id
        self._reply_type = reply_type

    def __call__(self, request_iterator, timeout=None):
        """Sends every request, half-closes, and returns the reply."""
        call = self._channel._core.open_stream(self._id, False, timeout)
        failure = []
        _feed(call, request_iterator, failure)
        if failure:
            raise failure[0]
        return Future(call.reply, self._reply_type).result()

    def future(self, request_iterator, timeout=None):
        """Feeds the requests from a thread; returns a Future."""
        call = self._channel._core.open_stream(self._id, False, timeout)
        threading.Thread(target=_feed, args=(call, request_iterator, []), daemon=True,
                         name="slotrpc-stream-writer").start()
        return Future(call.reply, self._reply_type)


class StreamStream:
    def __init__(self, channel, method_id, reply_type):
        self._channel = channel
        self._id = method_id
        self._reply_type = reply_type

    def __call__(self, request_iterator, timeout=None):
        """Feeds the requests from a thread; returns an iterator over the
        replies."""
        call = self._channel._core.open_stream(self._id, True, timeout)
        threading.Thread(target=_feed, args=(call, request_iterator, []), daemon=True,
                         name="slotrpc-stream-writer").start()
        return ReplyIterator(call.replies, self._reply_type, on_cancel=call.cancel)


from ._status import RpcError as _RpcError, StatusCode  # noqa: E402
