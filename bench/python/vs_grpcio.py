#!/usr/bin/python3
"""slotrpc's Python binding beside grpcio, the same messages, two processes.

    PYTHONPATH=python:build/python /usr/bin/python3 bench/python/vs_grpcio.py

Starts one server process serving both (slotrpc and grpcio, each its own
port), then measures from this process:
  * unary 64 B request, p50 at 1 outstanding (sync stubs);
  * calls/s at 32 outstanding (asyncio: slotrpc.aio and grpc.aio);
  * a 64 MiB tensor round trip (slotrpc: send_bulk/receive_bulk, a numpy
    array each way; grpcio: 64 MiB request and reply messages).
slotrpc over TCP and over shared memory, grpcio over TCP.  The messages are
examples/echo/echo.fbs's EchoRequest (seq and a payload); both servers
answer with the request's bytes, which is a valid EchoReply (same layout).

The C++ client's figures come from the same run, between the Python ones
(--cxx-bench, default build/bench/slotrpc-bench: its latency mode with
Future::get() and its bulk mode's 64 MiB echo), and so does the Python
client against the C++ examples/echo server (--echo-server), which
separates the client's cost from the Python server's.  --rounds repeats
the whole set, interleaved.
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

SERVICE = "slotrpc.examples.Echo"
TENSOR = 64 << 20


def echo_request(seq, payload):
    import flatbuffers
    b = flatbuffers.Builder(256)
    p = b.CreateByteVector(payload)
    b.StartObject(2)
    b.PrependUOffsetTRelativeSlot(1, p, 0)
    b.PrependUint64Slot(0, seq, 0)
    b.Finish(b.EndObject())
    return bytes(b.Output())


def serve():
    from concurrent import futures

    import grpc

    import slotrpc

    server = slotrpc.Server()
    # The handler's tensor, allocated and registered once, as a worker
    # keeps its buffers (a fresh 64 MiB array per call would time the
    # kernel's page faults).
    scratch = np.empty(TENSOR, dtype=np.uint8)
    scratch_region = server.register_memory(scratch)

    def tensor(request, context):
        n = context.bulk_in(0)
        into = scratch_region if n == TENSOR else np.empty(n, dtype=np.uint8)
        context.read_bulk(0, into=into)
        context.write_bulk(0, into)
        return request.copy()

    server.add_method(SERVICE, "Echo", slotrpc.MethodKind.UNARY, lambda req, ctx: req.copy())
    server.add_method(SERVICE, "Tensor", slotrpc.MethodKind.UNARY, tensor)
    server.start("127.0.0.1:0")

    handlers = {
        "Echo": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req),
        "Tensor": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req),
    }
    limit = [("grpc.max_receive_message_length", 2 * TENSOR), ("grpc.max_send_message_length", 2 * TENSOR)]
    gserver = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=limit)
    gserver.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    gport = gserver.add_insecure_port("127.0.0.1:0")
    gserver.start()
    print(server.port, gport, flush=True)
    sys.stdin.read()
    gserver.stop(0)
    server.stop()


def p50_us(call, request, n):
    for _ in range(n // 10):
        call(request)
    times = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        call(request)
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1000


async def rate(call, request, outstanding, seconds):
    stop = time.monotonic() + seconds
    done = [0]

    async def worker():
        while time.monotonic() < stop:
            await call(request)
            done[0] += 1

    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(outstanding)))
    return done[0] / (time.monotonic() - t0)


def cxx_figures(bench, calls):
    """The C++ client's p50 (Future::get(), 64 B) and 64 MiB bulk echo p50
    over shm and tcp, from slotrpc-bench (its own C++ server)."""
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "lat.json")
        subprocess.run([bench, "--modes", "latency", "--transports", "shm,tcp", "--sizes", "64", "--wait", "future",
                        "--warmup", str(calls // 10), "--calls", str(calls), "--json", out],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for r in json.load(open(out))["results"]:
            rows.setdefault(r["system"].replace("slotrpc-", ""), {})["p50"] = r["p50_us"]
        out = os.path.join(tmp, "bulk.json")
        subprocess.run([bench, "--modes", "bulk", "--transports", "bulk-shm,bulk-tcp", "--bulk-sizes", str(TENSOR),
                        "--bulk-calls", "5", "--json", out],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for r in json.load(open(out))["results"]:
            rows.setdefault(r["system"].replace("slotrpc-bulk-", ""), {})["tensor_ms"] = r["p50_us"] / 1000
    return rows


def python_vs_cxx_server(echo_server, transport, calls):
    """The Python client's 64 B p50 against examples/echo's C++ server."""
    import slotrpc
    with tempfile.TemporaryDirectory() as tmp:
        port_file = os.path.join(tmp, "port")
        srv = subprocess.Popen([echo_server, "--listen", "127.0.0.1:0", "--port-file", port_file],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while not os.path.exists(port_file) or not open(port_file).read().strip():
                if srv.poll() is not None:
                    raise RuntimeError(f"{echo_server} exited with {srv.returncode}")
                time.sleep(0.01)
            port = int(open(port_file).read())
            with slotrpc.Channel(f"127.0.0.1:{port}", transport=transport) as ch:
                return p50_us(ch.unary_unary(SERVICE + ".Echo"), echo_request(1, bytes(range(40))), calls)
        finally:
            srv.terminate()
            srv.wait()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    build = os.path.join(here, "..", "..", "build")
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", action="store_true")
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--cxx-bench", default=os.path.join(build, "bench", "slotrpc-bench"),
                    help="slotrpc-bench for the C++ client's figures ('' to skip)")
    ap.add_argument("--echo-server", default=os.path.join(build, "examples", "echo", "echo_server"),
                    help="examples/echo's C++ server for the Python client alone ('' to skip)")
    args = ap.parse_args()
    if args.serve:
        return serve()
    for r in range(args.rounds):
        if args.rounds > 1:
            print(f"\nround {r + 1} of {args.rounds}", flush=True)
        one_round(args)


def one_round(args):
    import grpc

    import slotrpc
    import slotrpc.aio

    server = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    port, gport = map(int, server.stdout.readline().split())
    small = echo_request(1, bytes(range(40)))  # 64 B with its FlatBuffers framing
    limit = [("grpc.max_receive_message_length", 2 * TENSOR), ("grpc.max_send_message_length", 2 * TENSOR)]
    rows = []
    try:
        for transport in ("tcp", "shm"):
            ch = slotrpc.Channel(f"127.0.0.1:{port}", transport=transport)
            echo = ch.unary_unary(SERVICE + ".Echo")
            p50 = p50_us(echo, small, args.calls)

            async def aio_rate():
                async with slotrpc.aio.Channel(f"127.0.0.1:{port}", transport=transport) as ach:
                    return await rate(ach.unary_unary(SERVICE + ".Echo"), small, 32, args.seconds)
            cps = asyncio.run(aio_rate())

            src = np.random.default_rng(1).integers(0, 256, TENSOR, dtype=np.uint8)
            out = np.empty_like(src)
            rs = ch.register_memory(src)
            ro = ch.register_memory(out)
            tensor = ch.unary_unary(SERVICE + ".Tensor")
            times = []
            for _ in range(5):
                out[:] = 0
                t0 = time.perf_counter()
                tensor(small, send_bulk=[rs], receive_bulk=[ro], timeout=60)
                times.append(time.perf_counter() - t0)
                assert np.array_equal(src, out)
            rows.append((f"slotrpc {transport}", p50, cps, statistics.median(times) * 1000))
            ch.close()

        gch = grpc.insecure_channel(f"127.0.0.1:{gport}", options=limit)
        gecho = gch.unary_unary(f"/{SERVICE}/Echo")
        gp50 = p50_us(gecho, small, max(args.calls // 5, 500))

        async def grpc_rate():
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gport}") as ach:
                return await rate(ach.unary_unary(f"/{SERVICE}/Echo"), small, 32, args.seconds)
        gcps = asyncio.run(grpc_rate())
        big = os.urandom(TENSOR)
        gtensor = gch.unary_unary(f"/{SERVICE}/Tensor")
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            r = gtensor(big, timeout=60)
            times.append(time.perf_counter() - t0)
            assert r == big
        rows.append(("grpcio tcp", gp50, gcps, statistics.median(times) * 1000))
        gch.close()
    finally:
        server.stdin.close()
        server.wait(timeout=30)

    cxx = cxx_figures(args.cxx_bench, args.calls) if args.cxx_bench else {}
    for transport in ("tcp", "shm"):
        if transport in cxx:
            c = cxx[transport]
            rows.append((f"C++ {transport}", c.get("p50", float("nan")), float("nan"), c.get("tensor_ms", float("nan"))))
    if args.echo_server:
        for transport in ("tcp", "shm"):
            rows.append((f"py->C++ {transport}", python_vs_cxx_server(args.echo_server, transport, args.calls),
                         float("nan"), float("nan")))

    print(f"{'':14} {'64 B p50 (us)':>14} {'calls/s @32':>12} {'64 MiB round trip (ms)':>23}")
    for name, p50, cps, ms in rows:
        print(f"{name:14} {p50:14.1f} {cps:12.0f} {ms:23.1f}")
    fig = {name: (p50, cps, ms) for name, p50, cps, ms in rows}
    g = fig["grpcio tcp"]
    t = fig["slotrpc tcp"]
    print(f"slotrpc tcp / grpcio: p50 1/{g[0] / t[0]:.1f}, calls/s {t[1] / g[1]:.1f}x")
    for transport in ("tcp", "shm"):
        if f"C++ {transport}" in fig:
            c = fig[f"C++ {transport}"]
            p = fig[f"slotrpc {transport}"]
            line = f"python / C++ over {transport}: p50 {p[0] / c[0]:.1f}x, 64 MiB {p[2] / c[2]:.2f}x"
            if f"py->C++ {transport}" in fig:
                line += f"; python client against the C++ server: p50 {fig[f'py->C++ {transport}'][0] / c[0]:.1f}x"
            print(line)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
