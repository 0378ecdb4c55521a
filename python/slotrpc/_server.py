"""The server side: Server, servicers and what a handler sees."""

import weakref

from . import _aio_server, _core
from ._bulk import as_buffer, message_bytes
from ._status import RpcError, StatusCode

_live_servers = weakref.WeakSet()
_OK = StatusCode.OK


class MethodKind:
    UNARY = 0
    SERVER_STREAM = 1
    CLIENT_STREAM = 2
    BIDI_STREAM = 3


class MethodDescriptor:
    def __init__(self, name, kind, request_type=None, reply_type=None, idempotent=False, attr=None):
        self.name = name  # as in the schema: the method id is computed from it
        self.attr = attr or name  # the servicer's attribute (keywords get a '_')
        self.kind = kind
        self.request_type = request_type
        self.reply_type = reply_type
        self.idempotent = idempotent


class ServiceDescriptor:
    """A service as slotrpc-gen --python describes it: "ns.Svc" and its
    methods (what Server.add_servicer registers)."""

    def __init__(self, name, methods):
        self.name = name
        self.methods = list(methods)


class ServicerContext:
    """What a handler gets besides its request (grpcio's context).  Valid
    only while the handler runs."""

    # Made per call: slots make it cheaper to build and to drop.
    __slots__ = ("_call", "_code", "_details", "__dict__")

    def __init__(self, call):
        self._call = call
        self._code = _OK

    def abort(self, code, details=""):
        raise RpcError(code, details)

    def set_code(self, code):
        self._code = StatusCode(code)

    def set_details(self, details):
        self._details = details

    def is_active(self):
        return not self._call.cancelled()

    def cancelled(self):
        return self._call.cancelled()

    def time_remaining(self):
        return self._call.time_remaining()

    def peer(self):
        return self._call.peer()

    @property
    def method_name(self):
        return self._call.method_name

    # Bulk attachments of the call (send_bulk / receive_bulk on the client).
    @property
    def bulk_in_count(self):
        return self._call.bulk_in_count

    @property
    def bulk_out_count(self):
        return self._call.bulk_out_count

    def bulk_in(self, i):
        """Bytes of incoming segment i."""
        return self._call.bulk_in(i)

    def bulk_out(self, i):
        """Bytes the client offers in outgoing segment i."""
        return self._call.bulk_out(i)

    def read_bulk(self, i, into, offset=0):
        """Pulls len(into) bytes of incoming segment i (from `offset`) into
        `into` (a writable buffer, a CPU tensor, or a Region); waits
        without holding the GIL or the loop."""
        return self._call.read_bulk(i, into if isinstance(into, _core.Region) else as_buffer(into), offset)

    def write_bulk(self, i, src, offset=0):
        """Pushes `src` into outgoing segment i at `offset`, before the
        reply."""
        return self._call.write_bulk(i, src if isinstance(src, _core.Region) else as_buffer(src), offset)

    def _check(self):
        if self._code != StatusCode.OK:
            raise RpcError(self._code, getattr(self, "_details", ""))


class _Requests:
    """A client stream's messages, as the handler iterates them.  Each is
    valid until the next is read or the handler returns (.copy() keeps)."""

    def __init__(self, call, request_type):
        self._call = call
        self._type = request_type

    def __iter__(self):
        return self

    def __next__(self):
        m = self._call.read()
        if m is None:
            raise StopIteration
        if self._type is not None:
            m.type = self._type
        return m


def _adapt(fn, kind, request_type, pool=None):
    """The (request, core call) -> reply bytes function the core runs."""
    if kind == MethodKind.UNARY and pool is not None:
        def unary_on_worker(request, call):
            if request_type is not None:
                request.type = request_type
            ctx = ServicerContext(call)
            done = _core.Notifier()
            box = {}

            def work():
                try:
                    box["reply"] = message_bytes(fn(request, ctx), "a reply")
                except BaseException as e:  # noqa: B902 - re-raised on the loop
                    box["error"] = e
                finally:
                    done.notify()
            pool.submit(work)
            done.wait()  # suspends the handler's fiber only, without the GIL
            if "error" in box:
                raise box["error"]
            ctx._check()
            return box["reply"]
        return unary_on_worker
    if kind == MethodKind.UNARY:
        def unary(request, call):
            # The per-call path of every synchronous unary handler.
            if request_type is not None:
                request.type = request_type
            ctx = ServicerContext(call)
            reply = fn(request, ctx)
            if ctx._code != StatusCode.OK:
                ctx._check()
            return reply if type(reply) is bytes else message_bytes(reply, "a reply")
        return unary
    if kind == MethodKind.SERVER_STREAM:
        def server_stream(request, call):
            if request_type is not None:
                request.type = request_type
            ctx = ServicerContext(call)
            replies = fn(request, ctx)
            _write_all(call, replies)
            ctx._check()
        return server_stream
    if kind == MethodKind.CLIENT_STREAM:
        def client_stream(_request, call):
            ctx = ServicerContext(call)
            reply = fn(_Requests(call, request_type), ctx)
            ctx._check()
            return message_bytes(reply, "a reply")
        return client_stream
    if kind == MethodKind.BIDI_STREAM:
        def bidi(_request, call):
            ctx = ServicerContext(call)
            _write_all(call, fn(_Requests(call, request_type), ctx))
            ctx._check()
        return bidi
    raise ValueError(f"unknown method kind {kind!r}")


def _write_all(call, replies):
    if replies is None:
        return
    try:
        for r in replies:
            if not call.write(message_bytes(r, "a reply")):
                break  # the client is gone; the call's status says why
    finally:
        close = getattr(replies, "close", None)
        if close is not None:
            close()


class Server:
    """Server(**settings).add_servicer(servicer); start("0.0.0.0:7000").

    Handlers run on the server's event loop fibers with the GIL held: a
    handler holds its loop while it runs Python code, and releases both
    whenever it waits on the network (docs/python.md, "Threads")."""

    def __init__(self, max_workers=None, loop=None, **settings):
        """max_workers: run unary handlers on a thread pool of that many
        threads, so a handler that computes does not hold its event loop
        (its fiber waits without the GIL); streaming handlers, and bulk
        transfers, stay on the loop.

        loop: the asyncio loop `async def` handlers run on (it must be
        running while the server serves).  Without one, the server starts
        its own loop on a thread when the first async handler is added.
        Sync and async handlers share the server."""
        self._core = _core.Server(settings)
        self._runner = _aio_server.LoopRunner(loop)
        self._has_async = False
        self._pool = None
        if max_workers:
            from concurrent.futures import ThreadPoolExecutor
            self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="slotrpc-handler")
        _live_servers.add(self)

    def add_servicer(self, servicer, service=None):
        """Registers every method of `service` (default: the servicer
        class's SERVICE, as slotrpc-gen --python writes it)."""
        desc = service if service is not None else getattr(type(servicer), "SERVICE", None)
        if desc is None:
            raise TypeError(f"{type(servicer).__name__} has no SERVICE descriptor: subclass a "
                            "generated <Service>Servicer, or pass service=")
        for m in desc.methods:
            self.add_method(desc.name, m.name, m.kind, getattr(servicer, m.attr), m.request_type)

    def add_method(self, service, method, kind, handler, request_type=None):
        """Registers handler(request, context) for "service.method": a
        function, or an `async def` one (an async generator for server
        streaming and bidi), which runs on the server's asyncio loop."""
        if _aio_server.is_async(handler):
            adapted = _aio_server.adapt_async(handler, kind, request_type, self._runner)
            if not self._has_async:
                self._has_async = True
                self._need_loop()
        else:
            adapted = _adapt(handler, kind, request_type, self._pool)
        return self._core.add_method(service, method, kind, adapted)

    def _need_loop(self):
        self._runner.ensure()

    def start(self, address="127.0.0.1:0"):
        self._core.start(address)
        return self

    @property
    def port(self):
        return self._core.port

    @property
    def session_count(self):
        return self._core.session_count

    def register_memory(self, obj):
        return self._core.register_memory(as_buffer(obj))

    def stop(self):
        """Closes every session (running handlers finish first; async
        handlers' tasks are cancelled).  From a coroutine on the loop the
        async handlers run on, use slotrpc.aio.Server's `await stop()`."""
        self._runner.cancel_all_threadsafe()
        self._core.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        self._runner.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
