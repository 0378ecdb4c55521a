"""asyncio for slotrpc: clients (`await stub.Get(request)`, `async for`
over streams) and servers with `async def` handlers, on the same C++ event
loops.

    server = slotrpc.aio.Server()
    server.add_servicer(MyServicer())          # async def methods, or plain ones
    await server.start("0.0.0.0:7000")         # handlers run on this loop
    ...
    await server.stop()

    channel = slotrpc.aio.Channel("host:7000")
    stub = kv_slotrpc.KvStub(channel)          # the generated stub, unchanged
    reply = await stub.Get(request, timeout=1)
    async for m in stub.Scan(request): ...

A unary call's completion reaches the asyncio loop through an eventfd it
watches (one wake-up for all the replies that arrived meanwhile): no thread
waits for it.
Stream messages arrive the same way; stream writes wait for a credit on
the loop's default executor.  Cancelling the awaiting task cancels the call."""

import asyncio

from . import _channel, _core
from ._aio_server import CANCEL_POLL, AsyncServicerContext  # noqa: F401
from ._server import Server as _SyncServer
from ._bulk import bulk_list, message_bytes



class Channel:
    """An asyncio view of a slotrpc.Channel (same arguments)."""

    def __init__(self, address, **settings):
        self.sync = _channel.Channel(address, **settings)

    def unary_unary(self, method, reply_type=None, idempotent=False):
        return _UnaryUnary(self.sync, _channel._method_id(method), reply_type, idempotent)

    def unary_stream(self, method, reply_type=None):
        return _UnaryStream(self.sync, _channel._method_id(method), reply_type)

    def stream_unary(self, method, reply_type=None):
        return _StreamUnary(self.sync, _channel._method_id(method), reply_type)

    def stream_stream(self, method, reply_type=None):
        return _StreamStream(self.sync, _channel._method_id(method), reply_type)

    def register_memory(self, obj):
        return self.sync.register_memory(obj)

    def close(self):
        self.sync.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.close()


class _Completions:
    """One asyncio loop's view of completed calls: a C++ CompletionQueue
    whose eventfd the loop watches.  The channel's event loop posts a
    finished call's token without the GIL and wakes the asyncio loop only
    when the queue was empty, so one wake-up resolves every reply that
    arrived meanwhile (rather than a call_soon_threadsafe per reply)."""

    def __init__(self, loop):
        self.loop = loop
        self.queue = _core.CompletionQueue()
        self.waiting = {}
        self.next_token = 0
        loop.add_reader(self.queue.fileno(), self._drain)

    def wait(self, core):
        fut = self.loop.create_future()
        self.next_token += 1
        token = self.next_token
        self.waiting[token] = fut
        core.notify_queue(self.queue, token)
        return fut, token

    def _drain(self):
        waiting = self.waiting
        for token in self.queue.drain():
            fut = waiting.pop(token, None)
            if fut is not None and not fut.done():
                fut.set_result(None)

    def close(self):
        try:
            self.loop.remove_reader(self.queue.fileno())
        except Exception:  # noqa: BLE001 - the loop may be closed already
            pass


def _completions_of(loop):
    # Kept on the loop itself (a WeakKeyDictionary would keep every loop
    # alive through its value's reference to it).
    c = getattr(loop, "_slotrpc_completions", None)
    if c is None:
        c = loop._slotrpc_completions = _Completions(loop)
    return c


async def _completion(core, reply_type):
    """Awaits a core CallFuture without a thread; cancels it if the task is."""
    completions = _completions_of(asyncio.get_running_loop())
    done, token = completions.wait(core)
    try:
        await done
    except asyncio.CancelledError:
        completions.waiting.pop(token, None)
        core.cancel()
        raise
    return core.result(reply_type)  # ready: does not wait


class _UnaryUnary:
    def __init__(self, channel, method_id, reply_type, idempotent):
        self._channel = channel
        self._id = method_id
        self._reply_type = reply_type
        self._idempotent = idempotent

    async def __call__(self, request, timeout=None, send_bulk=None, receive_bulk=None, max_retries=0):
        # _completion() inlined, and the call issued with its queue and
        # token in one step: this is the per-call path of asyncio clients.
        loop = asyncio.get_running_loop()
        completions = getattr(loop, "_slotrpc_completions", None) or _completions_of(loop)
        done = loop.create_future()
        completions.next_token = token = completions.next_token + 1
        completions.waiting[token] = done
        if type(request) is not bytes:
            request = message_bytes(request)
        if send_bulk is not None:
            send_bulk = bulk_list(send_bulk)
        if receive_bulk is not None:
            receive_bulk = bulk_list(receive_bulk)
        try:
            core = self._channel._core.call_queued(self._id, request, completions.queue, token, timeout, send_bulk,
                                                   receive_bulk, self._idempotent, max_retries)
        except BaseException:
            completions.waiting.pop(token, None)
            raise
        try:
            await done
        except asyncio.CancelledError:
            completions.waiting.pop(token, None)
            core.cancel()
            raise
        return core.result(self._reply_type)  # ready: does not wait


class _Replies:
    """`async for` over a stream's replies: a message already there is taken
    at once; otherwise the stream posts to the loop's completion queue when
    the next one (or the end) arrives, so no thread waits for it."""

    def __init__(self, core_stream, reply_type, on_cancel=None):
        self._core = core_stream
        self._reply_type = reply_type
        self._on_cancel = on_cancel
        self._done = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._done:
            raise StopAsyncIteration
        try:
            while True:
                m = self._core.try_next(self._reply_type)
                if m is not Ellipsis:
                    break
                completions = _completions_of(asyncio.get_running_loop())
                fut, token = completions.wait(self._core)
                try:
                    await fut
                except asyncio.CancelledError:
                    completions.waiting.pop(token, None)
                    self.cancel()
                    raise
        except BaseException:
            self._done = True
            raise
        if m is None:
            self._done = True
            raise StopAsyncIteration
        return m

    def cancel(self):
        self._core.cancel()
        if self._on_cancel is not None:
            self._on_cancel()


class _UnaryStream:
    def __init__(self, channel, method_id, reply_type):
        self._sync = _channel.UnaryStream(channel, method_id, reply_type)

    def __call__(self, request, timeout=None):
        core = self._sync._channel._core.call_stream(self._sync._id, message_bytes(request), timeout)
        return _Replies(core, self._sync._reply_type)


async def _feed(call, requests):
    """Writes an async (or plain) iterable of requests, then half-closes;
    each write may wait for a credit, on the default executor."""
    loop = asyncio.get_running_loop()
    try:
        if hasattr(requests, "__aiter__"):
            async for r in requests:
                if not await loop.run_in_executor(None, call.write, message_bytes(r)):
                    return
        else:
            for r in requests:
                if not await loop.run_in_executor(None, call.write, message_bytes(r)):
                    return
        call.writes_done()
    except BaseException:
        call.cancel()
        raise


class _StreamUnary:
    def __init__(self, channel, method_id, reply_type):
        self._channel = channel
        self._id = method_id
        self._reply_type = reply_type

    async def __call__(self, request_iterator, timeout=None):
        call = self._channel._core.open_stream(self._id, False, timeout)
        await _feed(call, request_iterator)
        return await _completion(call.reply, self._reply_type)


class _StreamStream:
    def __init__(self, channel, method_id, reply_type):
        self._channel = channel
        self._id = method_id
        self._reply_type = reply_type

    def __call__(self, request_iterator, timeout=None):
        call = self._channel._core.open_stream(self._id, True, timeout)
        writer = asyncio.get_running_loop().create_task(_feed(call, request_iterator))
        replies = _Replies(call.replies, self._reply_type, on_cancel=call.cancel)
        replies.writer = writer  # keeps the task referenced
        return replies


class Server(_SyncServer):
    """A slotrpc.Server whose async handlers run on the asyncio loop that
    awaits start() (or `loop=`).  Sync handlers may be added too; they run
    on the server's event loops as in slotrpc.Server."""

    def _need_loop(self):
        pass  # the loop is the one start() runs on

    async def start(self, address="127.0.0.1:0"):
        if self._runner.loop is None:
            self._runner.attach(asyncio.get_running_loop())
        self._core.start(address)
        return self

    async def stop(self, grace=None):
        """Cancels the running async handlers (after `grace` seconds, if
        given) and closes every session, without blocking the loop."""
        loop = asyncio.get_running_loop()
        tasks = [t for t in list(self._runner.tasks) if not t.done()]
        if grace and tasks:
            await asyncio.wait(tasks, timeout=grace)
        if loop is self._runner.loop:
            self._runner.cancel_all()
        else:
            self._runner.cancel_all_threadsafe()
        await loop.run_in_executor(None, self._core.stop)
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.stop()
