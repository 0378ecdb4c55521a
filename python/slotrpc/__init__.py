"""slotrpc: low-latency RPC over RDMA verbs, shared memory and TCP.

The same schemas, wire and C++ event loops as the C++ library; grpcio's
shapes (stub.Get(request), iterators for streams, RpcError with .code()).
See docs/python.md."""

import atexit
import pkgutil

# In the build tree the extension (slotrpc/_core) sits in the build
# directory and these files in python/: both on sys.path, one package.
__path__ = pkgutil.extend_path(__path__, __name__)

from . import _core  # noqa: E402
from ._status import RpcError, StatusCode  # noqa: E402
from ._channel import Channel, Future, ReplyIterator, _live_channels  # noqa: E402
from ._server import (MethodDescriptor, MethodKind, Server, ServiceDescriptor,  # noqa: E402
                      ServicerContext, _live_servers)

Message = _core.Message
Region = _core.Region
method_id = _core.method_id
# In a handler, waits without holding its event loop (time.sleep would).
sleep = _core.sleep

__all__ = ["Channel", "Future", "Message", "MethodDescriptor", "MethodKind", "Region",
           "ReplyIterator", "RpcError", "Server", "ServiceDescriptor", "ServicerContext",
           "StatusCode", "method_id", "sleep"]


@atexit.register
def _shutdown():
    # Handlers run Python on the event loops: stop them before the
    # interpreter goes away.
    for server in list(_live_servers):
        try:
            Server.stop(server)  # the synchronous stop, also for a slotrpc.aio.Server
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
    for channel in list(_live_channels):
        try:
            channel.close()
        except Exception:  # noqa: BLE001
            pass
