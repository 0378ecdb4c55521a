"""Async servicers: `async def` handlers (and async generators) on an
asyncio loop, served by the same C++ event loops as synchronous ones.

How a call runs.  The C++ handler runs on a fiber of the server's event
loop, as for a synchronous handler.  It starts the handler's coroutine as a
task on the asyncio loop, then waits on a Notifier (the fiber suspends and
the GIL is released: the event loop serves other calls meanwhile).  What
must happen on the fiber (stream reads and writes, bulk transfers) the
task asks for through the call's _Bridge: it queues the operation, wakes
the fiber, and awaits an asyncio future the fiber resolves with
call_soon_threadsafe.  Reads run on a fiber of their own, so a bidi
handler may write while a read waits.  When the task ends (its reply, an
error, or cancelled) the fiber wakes, waits for the operations still
running, and returns the reply or the status.

A handler task is cancelled when the client cancels, the call's deadline
passes, or the server stops: a timer on the asyncio loop checks the running
calls every CANCEL_POLL seconds (the C++ call has no callback for it)."""

import asyncio
import collections
import inspect
import threading

from . import _core
from ._bulk import as_buffer, message_bytes
from ._status import RpcError, StatusCode

# How often a running async handler's call is checked for a cancel or a
# passed deadline (seconds).
CANCEL_POLL = 0.01

UNARY, SERVER_STREAM, CLIENT_STREAM, BIDI_STREAM = range(4)


def is_async(fn):
    return inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)


class _Bridge:
    """One async handler call: operations the task asks its fiber to run."""

    __slots__ = ("call", "loop", "ops", "wake", "busy", "finished", "reply", "error")

    def __init__(self, call, loop):
        self.call = call
        self.loop = loop
        self.ops = collections.deque()
        self.wake = _core.Notifier()
        self.busy = 0  # operations running on fibers (fiber side only)
        self.finished = False
        self.reply = None
        self.error = None

    # -- on the asyncio loop
    def run(self, fn, *args, own_fiber=False):
        """Runs fn(*args) on the handler's fiber; an awaitable of its result."""
        if self.finished:
            raise RuntimeError("this call is over: its handler returned")
        fut = self.loop.create_future()
        self.ops.append((fn, args, fut, own_fiber))
        self.wake.notify()
        return fut

    def finish(self):
        self.finished = True
        self.wake.notify()

    # -- on the handler's fiber
    def serve(self):
        while True:
            self.wake.wait()  # suspends the fiber, without the GIL
            while self.ops:
                op = self.ops.popleft()
                self.busy += 1
                if op[3]:
                    _core.spawn(lambda op=op: self._run_op(*op))
                else:
                    self._run_op(*op)
            if self.finished and self.busy == 0 and not self.ops:
                return

    def _run_op(self, fn, args, fut, _own_fiber):
        try:
            result, error = fn(*args), None
        except BaseException as e:  # noqa: B902 - handed to the awaiting task
            result, error = None, e
        self.busy -= 1
        self.wake.notify()
        try:
            self.loop.call_soon_threadsafe(_resolve, fut, result, error)
        except RuntimeError:
            pass  # the asyncio loop is closed: nothing awaits any more


def _resolve(fut, result, error):
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class AsyncServicerContext:
    """What an async handler gets besides its request (grpcio.aio's
    context).  Valid while the handler runs; use it from the handler's
    asyncio loop."""

    def __init__(self, bridge):
        self._bridge = bridge
        self._call = bridge.call
        self._code = StatusCode.OK
        self._details = ""

    def abort(self, code, details=""):
        """Ends the call with `code` (raises; `await context.abort(...)`
        works too)."""
        raise RpcError(code, details)

    def set_code(self, code):
        self._code = StatusCode(code)

    def set_details(self, details):
        self._details = details

    def cancelled(self):
        return self._call.cancelled()

    def is_active(self):
        return not self._call.cancelled()

    def time_remaining(self):
        return self._call.time_remaining()

    def peer(self):
        return self._call.peer()

    @property
    def method_name(self):
        return self._call.method_name

    async def read(self):
        """The client stream's next message (valid until the next read or
        the handler's return; .copy() keeps it), or None once the client
        half-closed."""
        return await self._bridge.run(self._call.read, own_fiber=True)

    async def write(self, reply):
        """Sends one message of the server stream; False once the stream is
        over (the client cancelled or went away)."""
        return await self._bridge.run(self._call.write, message_bytes(reply, "a reply"))

    # Bulk attachments of the call (send_bulk / receive_bulk on the client).
    @property
    def bulk_in_count(self):
        return self._call.bulk_in_count

    @property
    def bulk_out_count(self):
        return self._call.bulk_out_count

    def bulk_in(self, i):
        return self._call.bulk_in(i)

    def bulk_out(self, i):
        return self._call.bulk_out(i)

    async def read_bulk(self, i, into, offset=0):
        """Pulls len(into) bytes of incoming segment i into `into` (a
        writable buffer, a CPU tensor or a Region)."""
        target = into if isinstance(into, _core.Region) else as_buffer(into)
        return await self._bridge.run(self._call.read_bulk, i, target, offset)

    async def write_bulk(self, i, src, offset=0):
        """Pushes `src` into outgoing segment i at `offset`, before the reply."""
        source = src if isinstance(src, _core.Region) else as_buffer(src)
        return await self._bridge.run(self._call.write_bulk, i, source, offset)

    def _check(self):
        if self._code != StatusCode.OK:
            raise RpcError(self._code, self._details)


class _AsyncRequests:
    """A client stream's messages, for `async for` in an async handler."""

    def __init__(self, ctx, request_type):
        self._ctx = ctx
        self._type = request_type

    def __aiter__(self):
        return self

    async def __anext__(self):
        m = await self._ctx.read()
        if m is None:
            raise StopAsyncIteration
        if self._type is not None:
            m.type = self._type
        return m


async def _write_replies(ctx, replies):
    """Writes what an async (or plain) generator yields; stops early once
    the stream is over."""
    if hasattr(replies, "__aiter__"):
        try:
            async for r in replies:
                if not await ctx.write(r):
                    break
        finally:
            await replies.aclose()
    else:
        for r in replies:
            if not await ctx.write(r):
                break


async def _drive(bridge, fn, kind, request, request_type):
    """The task of one call, on the asyncio loop."""
    ctx = AsyncServicerContext(bridge)
    try:
        if kind == UNARY or kind == SERVER_STREAM:
            if request_type is not None:
                request.type = request_type
            arg = request
        else:
            arg = _AsyncRequests(ctx, request_type)
        if kind == UNARY or kind == CLIENT_STREAM:
            reply = await fn(arg, ctx)
            ctx._check()
            if reply is None:
                raise RpcError(StatusCode.INTERNAL, f"{bridge.call.method_name}: the handler returned no reply")
            bridge.reply = message_bytes(reply, "a reply")
        else:
            result = fn(arg, ctx)
            if inspect.isawaitable(result):  # a coroutine that writes with context.write()
                result = await result
            if result is not None:
                await _write_replies(ctx, result)
            ctx._check()
    except asyncio.CancelledError:
        remaining = bridge.call.time_remaining()
        if remaining is not None and remaining <= 0:
            bridge.error = RpcError(StatusCode.DEADLINE_EXCEEDED, "the call's deadline passed")
        else:
            bridge.error = RpcError(StatusCode.CANCELLED, "the handler's task was cancelled")
    except BaseException as e:  # noqa: B902 - the call's status (on the fiber)
        bridge.error = e
    finally:
        bridge.finish()


class LoopRunner:
    """The asyncio loop async handlers run on: one the user gives (it must
    be running while the server serves), or one of the server's own, on a
    thread it starts when the first async handler is registered.

    Handler fibers hand their coroutines over through an inbox and a
    CompletionQueue whose eventfd the loop watches: a burst of calls costs
    one wake-up of the loop, not a call_soon_threadsafe each.  One timer,
    running while handlers do, checks their calls for a cancel or a passed
    deadline every CANCEL_POLL seconds."""

    def __init__(self, loop=None):
        self.loop = None
        self._thread = None
        self.tasks = {}  # task -> its _Bridge; touched on the loop only
        self._inbox = collections.deque()  # (coroutine, bridge) from fibers
        self._queue = _core.CompletionQueue()
        self._sweeping = None
        if loop is not None:
            self.attach(loop)

    def attach(self, loop):
        self.loop = loop
        if loop.is_running() and _running_loop() is not loop:
            loop.call_soon_threadsafe(loop.add_reader, self._queue.fileno(), self._take)
        else:
            loop.add_reader(self._queue.fileno(), self._take)

    def ensure(self):
        if self.loop is None:
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def main():
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()
            self.attach(loop)
            self._thread = threading.Thread(target=main, name="slotrpc-asyncio", daemon=True)
            self._thread.start()
            ready.wait()
        return self.loop

    def submit(self, coro, bridge):  # on a handler's fiber
        self._inbox.append((coro, bridge))
        self._queue.post(0)

    def _take(self):  # on the loop: start what the fibers handed over
        self._queue.drain()
        inbox = self._inbox
        while inbox:
            coro, bridge = inbox.popleft()
            t = self.loop.create_task(coro)
            self.tasks[t] = bridge
            t.add_done_callback(self._done)
        if self.tasks and self._sweeping is None:
            self._sweeping = self.loop.call_later(CANCEL_POLL, self._sweep)

    def _done(self, task):
        bridge = self.tasks.pop(task, None)
        if bridge is not None and not bridge.finished:
            # Cancelled before its first step: _drive never ran to say so.
            bridge.error = RpcError(StatusCode.CANCELLED, "the server is stopping")
            bridge.finish()

    def _sweep(self):
        self._sweeping = None
        for task, bridge in list(self.tasks.items()):
            if not bridge.finished and bridge.call.cancelled():
                task.cancel()
        if self.tasks:
            self._sweeping = self.loop.call_later(CANCEL_POLL, self._sweep)

    def cancel_all(self):  # on the loop
        self._take()
        for t in list(self.tasks):
            t.cancel()

    def cancel_all_threadsafe(self):
        if self.loop is not None and not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self.cancel_all)
            except RuntimeError:
                pass

    def close(self):
        """Stops the server's own loop (not a user's)."""
        if self._thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
            self.loop.close()
            self._thread = None


def _running_loop():
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def adapt_async(fn, kind, request_type, runner):
    """The (request, core call) function the core runs for an async handler."""
    if kind == UNARY or kind == CLIENT_STREAM:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"{getattr(fn, '__qualname__', fn)}: a unary or client-streaming handler "
                            "must be a plain or an `async def` function, not an async generator")

    def on_fiber(request, call):
        loop = runner.loop
        if loop is None or loop.is_closed():
            raise RpcError(StatusCode.UNAVAILABLE, "the server's asyncio loop is not running")
        bridge = _Bridge(call, loop)
        runner.submit(_drive(bridge, fn, kind, request, request_type), bridge)
        bridge.serve()
        if bridge.error is not None:
            raise bridge.error
        return bridge.reply
    return on_fiber
