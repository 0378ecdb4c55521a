"""Bulk payloads: numpy arrays (and CPU torch tensors when torch is
installed) as send_bulk / receive_bulk, read and written by a Python
handler; every byte checked."""

import numpy as np
import pytest

import slotrpc

SIZES = [1, 4095, 1 << 20, (8 << 20) + 3]


@pytest.mark.parametrize("size", SIZES)
def test_numpy_round_trip(stub, types, size):
    rng = np.random.default_rng(size)
    src = rng.integers(0, 256, size, dtype=np.uint8)
    out = np.zeros(size, dtype=np.uint8)
    reply = stub.Bulk(types.ping(), send_bulk=[src], receive_bulk=[out], timeout=60)
    assert reply.message().Count() == size
    assert reply.bulk_received(0) == size
    assert np.array_equal(out, (src + 1).astype(np.uint8))


def test_registered_regions_and_ranges(channel, stub, types):
    src = np.arange(1 << 16, dtype=np.uint32)  # 256 KiB, not bytes: any dtype
    out = np.zeros(1 << 18, dtype=np.uint8)
    src_region = channel.register_memory(src)
    out_region = channel.register_memory(out)
    assert src_region.size == src.nbytes and out_region.obj is out
    half = src.nbytes // 2
    stub.Bulk(types.ping(), send_bulk=[(src_region, half, half)], receive_bulk=[(out_region, 0, half)],
              timeout=60)
    expected = (src.view(np.uint8)[half:] + 1).astype(np.uint8)
    assert np.array_equal(out[:half], expected)
    assert not out[half:].any()
    with pytest.raises(ValueError, match="beyond the region"):
        stub.Bulk(types.ping(), send_bulk=[(src_region, half, half + 1)])


def test_several_segments(stub, types):
    srcs = [np.full(1000 * (i + 1), i, dtype=np.uint8) for i in range(4)]
    outs = [np.zeros_like(s) for s in srcs]
    reply = stub.Bulk(types.ping(), send_bulk=srcs, receive_bulk=outs, timeout=60)
    assert reply.message().Count() == sum(s.size for s in srcs)
    for i, o in enumerate(outs):
        assert (o == i + 1).all()


def test_read_only_destination_refused(stub, types):
    src = np.ones(16, dtype=np.uint8)
    with pytest.raises(TypeError, match="not a writable"):
        stub.Bulk(types.ping(), send_bulk=[src], receive_bulk=[bytes(16)])


def test_torch_tensors(stub, types):
    torch = pytest.importorskip("torch", reason="python3-torch not installed")
    src = torch.arange(1 << 20, dtype=torch.int32)
    out = torch.zeros(4 << 20, dtype=torch.uint8)
    reply = stub.Bulk(types.ping(), send_bulk=[src], receive_bulk=[out], timeout=60)
    assert reply.message().Count() == 4 << 20
    expected = (src.view(torch.uint8).to(torch.int32) + 1) % 256
    assert torch.equal(out.to(torch.int32), expected)
    with pytest.raises(ValueError, match="contiguous"):
        stub.Bulk(types.ping(), send_bulk=[src[::2]])
