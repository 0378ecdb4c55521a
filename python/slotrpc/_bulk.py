"""Buffers for bulk payloads and FlatBuffers messages as bytes."""

import flatbuffers


def as_buffer(obj):
    """A buffer-protocol object for `obj`: itself, or a CPU torch tensor's
    numpy() view (the same memory).  A tensor on a device is refused: the
    binding does not copy device memory to the host behind the caller's
    back (docs/python.md, "Tensors on a GPU")."""
    if hasattr(obj, "__dlpack__") and hasattr(obj, "device") and not isinstance(obj, memoryview):
        device = getattr(obj.device, "type", str(obj.device))
        if device != "cpu":
            raise ValueError(
                f"a tensor on device {obj.device!s} cannot be a bulk buffer from Python: "
                "TCP and shared memory move host memory only, and the Python binding does not "
                "register dma-buf device memory; copy it to the host (t.cpu()) explicitly")
        if hasattr(obj, "is_contiguous") and not obj.is_contiguous():
            raise ValueError("a bulk tensor must be contiguous (t.contiguous())")
        if hasattr(obj, "numpy"):
            return obj.detach().numpy()
    return obj


def bulk_list(items):
    if items is None:
        return None
    out = []
    for item in items:
        if isinstance(item, tuple):
            out.append(item)
        else:
            out.append(as_buffer(item))
    return out


def message_bytes(msg, what="a request"):
    """A request or reply as a finished FlatBuffer: bytes-like, a finished
    flatbuffers.Builder, or a callable that builds into the Builder it is
    given (returning the root's offset, or finishing the builder itself)."""
    if isinstance(msg, (bytes, bytearray, memoryview)):
        return msg
    if isinstance(msg, flatbuffers.Builder):
        if not msg.finished:
            raise ValueError(f"{what}: the flatbuffers.Builder is not finished (call Finish(root))")
        return msg.Output()
    if callable(msg):
        builder = flatbuffers.Builder(256)
        root = msg(builder)
        if not builder.finished:
            if root is None:
                raise ValueError(f"{what}: the build callback neither finished the builder nor "
                                 "returned the root's offset")
            builder.Finish(root)
        return builder.Output()
    if msg is None:
        raise TypeError(f"{what} is None: return bytes, a finished flatbuffers.Builder or a "
                        "build callback")
    return msg  # any other buffer; the core checks it
