#!/usr/bin/python3
"""A parameter server in Python: named tensors (numpy arrays, or torch CPU
tensors) that move as bulk payloads, zero copy from the caller's array to
the server's and back.

    slotrpc-gen --python -o gen examples/python/params.fbs
    PYTHONPATH=gen:... /usr/bin/python3 examples/python/param_server.py serve 127.0.0.1:7000
    PYTHONPATH=gen:... /usr/bin/python3 examples/python/param_server.py check 127.0.0.1:7000 --size 1G

`check` puts a tensor of --size bytes (float32), gets it back, reduces a
second tensor into it twice and checks every element; exit status 0 when all
is right.  `demo` runs both in one process.
"""

import argparse
import sys
import time

import numpy as np

import params_slotrpc
import slotrpc
from params import Ack, Tensor


def tensor_msg(name, array):
    def build(b):
        n = b.CreateString(name)
        d = b.CreateString(str(array.dtype))
        Tensor.StartShapeVector(b, array.ndim)
        for dim in reversed(array.shape):
            b.PrependUint64(dim)
        shape = b.EndVector()
        Tensor.Start(b)
        Tensor.AddName(b, n)
        Tensor.AddDtype(b, d)
        Tensor.AddShape(b, shape)
        return Tensor.End(b)
    return build


def ack(name, nbytes):
    def build(b):
        n = b.CreateString(name)
        Ack.Start(b)
        Ack.AddName(b, n)
        Ack.AddBytes(b, nbytes)
        return Ack.End(b)
    return build


class ParameterServer(params_slotrpc.ParameterServerServicer):
    def __init__(self):
        self.tensors = {}

    def Put(self, request, context):
        t = request.message()
        shape = tuple(t.Shape(i) for i in range(t.ShapeLength()))
        array = np.empty(shape, dtype=t.Dtype().decode())
        if array.nbytes != context.bulk_in(0):
            context.abort(slotrpc.StatusCode.INVALID_ARGUMENT,
                          f"{array.nbytes} bytes of shape {shape}, {context.bulk_in(0)} sent")
        context.read_bulk(0, into=array)  # straight into the server's array
        self.tensors[t.Name().decode()] = array
        return ack(t.Name().decode(), array.nbytes)

    def _get(self, name, context):
        array = self.tensors.get(name)
        if array is None:
            context.abort(slotrpc.StatusCode.NOT_FOUND, f"no tensor {name!r}")
        return array

    def Get(self, request, context):
        t = request.message()
        array = self._get(t.Name().decode(), context)
        context.write_bulk(0, array)
        return tensor_msg(t.Name().decode(), array)

    def Reduce(self, request, context):
        t = request.message()
        array = self._get(t.Name().decode(), context)
        delta = np.empty_like(array)
        context.read_bulk(0, into=delta)
        array += delta  # numpy releases the GIL for large arrays
        if context.bulk_out_count:
            context.write_bulk(0, array)
        return ack(t.Name().decode(), array.nbytes)


def check(address, size):
    n = size // 4
    with slotrpc.Channel(address) as channel:
        stub = params_slotrpc.ParameterServerStub(channel)
        weights = np.arange(n, dtype=np.float32) % 1024
        t0 = time.perf_counter()
        stub.Put(tensor_msg("w", weights), send_bulk=[weights], timeout=600)
        back = np.zeros_like(weights)
        reply = stub.Get(tensor_msg("w", weights), receive_bulk=[back], timeout=600)
        elapsed = time.perf_counter() - t0
        assert reply.bulk_received(0) == weights.nbytes
        assert np.array_equal(back, weights), "Get returned other bytes than Put stored"
        grad = np.ones(n, dtype=np.float32)
        for _ in range(2):
            stub.Reduce(tensor_msg("w", grad), send_bulk=[grad], receive_bulk=[back], timeout=600)
        assert np.array_equal(back, weights + 2), "Reduce's sum is wrong"
        print(f"param_server: put and got {weights.nbytes} bytes in {elapsed:.2f} s "
              f"({2 * weights.nbytes / elapsed / 1e9:.2f} GB/s), reduced twice, all checked "
              f"(transport {channel.transport})")


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["serve", "check", "demo"])
    ap.add_argument("address", nargs="?", default="127.0.0.1:0")
    ap.add_argument("--size", default="64M", help="tensor bytes for check/demo (K, M, G suffixes)")
    args = ap.parse_args()
    if args.mode == "check":
        return check(args.address, parse_size(args.size))
    server = slotrpc.Server()
    server.add_servicer(ParameterServer())
    server.start(args.address)
    if args.mode == "demo":
        check(f"127.0.0.1:{server.port}", parse_size(args.size))
        server.stop()
        return
    print(f"param_server: serving on port {server.port}", flush=True)
    try:
        sys.stdin.read()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
