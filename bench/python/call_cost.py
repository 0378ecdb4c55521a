#!/usr/bin/python3
"""One Python client's cost per call against a running echo server, for
profiles and interleaved A/B runs of two builds of the binding:

    build/examples/echo/echo_server --listen 127.0.0.1:0 --port-file /tmp/port &
    PYTHONPATH=python:build/python /usr/bin/python3 bench/python/call_cost.py \
        --address 127.0.0.1:$(cat /tmp/port) --transport shm --mode sync --calls 20000

Modes: sync (64 B unary calls one after the other: p50 and mean, in us),
aio (calls/s with --outstanding asyncio calls in flight), data (as sync,
reading each reply's bytes through .data).  Under callgrind, --calls small
and --quiet give a per-call instruction count with few warm-up effects.
--serve runs the Python server side instead, for the handler's cost.
"""

import argparse
import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vs_grpcio import SERVICE, echo_request  # noqa: E402


def serve(port_file, stop_file):
    """A Python server's handler cost, for a profile of its loop thread
    under a C++ client (examples/echo's echo_client)."""
    import slotrpc
    server = slotrpc.Server()
    server.add_method(SERVICE, "Echo", slotrpc.MethodKind.UNARY, lambda req, ctx: req.copy())
    server.start("127.0.0.1:0")
    with open(port_file, "w") as f:
        f.write(str(server.port))
    while not os.path.exists(stop_file):
        time.sleep(0.2)
    server.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--address")
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--mode", default="sync", choices=("sync", "aio", "data"))
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--outstanding", type=int, default=32)
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--serve", metavar="PORT_FILE",
                    help="instead: serve Echo from Python (the handler returns req.copy()) on a free port, "
                         "written to PORT_FILE, until --stop-file exists")
    ap.add_argument("--stop-file", default="stop")
    args = ap.parse_args()
    if args.serve:
        return serve(args.serve, args.stop_file)

    import slotrpc
    import slotrpc.aio

    request = echo_request(1, bytes(range(40)))  # 64 B with its framing
    if args.mode == "aio":
        async def run():
            async with slotrpc.aio.Channel(args.address, transport=args.transport) as ch:
                echo = ch.unary_unary(SERVICE + ".Echo")
                left = [args.calls]

                async def worker():
                    while left[0] > 0:
                        left[0] -= 1
                        await echo(request)
                for _ in range(args.calls // 10):
                    await echo(request)
                t0 = time.perf_counter()
                await asyncio.gather(*(worker() for _ in range(args.outstanding)))
                return args.calls / (time.perf_counter() - t0)
        rate = asyncio.run(run())
        if not args.quiet:
            print(f"calls/s {rate:.0f}")
        return

    ch = slotrpc.Channel(args.address, transport=args.transport)
    echo = ch.unary_unary(SERVICE + ".Echo")
    read = args.mode == "data"
    for _ in range(max(args.calls // 10, 1)):
        echo(request)
    times = []
    clock = time.perf_counter_ns
    t_all = clock()
    for _ in range(args.calls):
        t0 = clock()
        r = echo(request)
        if read:
            assert len(r.data) > 0
        times.append(clock() - t0)
    t_all = clock() - t_all
    ch.close()
    if not args.quiet:
        print(f"p50_us {statistics.median(times) / 1000:.2f} mean_us {t_all / args.calls / 1000:.2f}")


if __name__ == "__main__":
    main()
