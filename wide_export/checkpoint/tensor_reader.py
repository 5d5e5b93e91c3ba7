"""Read one safetensors tensor straight into the export dtype, a few MB at a time.

safe_open(...).get_tensor(k).to(dtype) holds the file's pages (mapped), a copy in
the file's dtype and the cast result at once: three times a 1 GB embedding. Here
the result is allocated once and filled from plain reads through a small buffer,
each chunk cast on the way (the same elementwise conversion as Tensor.to, so the
bytes agree), which keeps a tensor's cost at its own size.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

CHUNK_BYTES = 32 << 20
_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64", "I64": "int64",
           "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


class ShardReader:
    """Header of one safetensors file (parsed once), and tensors read from it on demand."""

    def __init__(self, path: Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            self.header = json.loads(f.read(n))
        self.data_start = 8 + n

    def read(self, key: str, dtype, chunk_bytes: int = CHUNK_BYTES):
        """Tensor `key` of this file as `dtype` (a torch dtype)."""
        import torch

        info = self.header[key]
        src = getattr(torch, _DTYPES[info["dtype"]])
        start, end = info["data_offsets"]
        out = torch.empty(info["shape"], dtype=dtype)
        flat = out.view(-1)
        count, item = flat.numel(), src.itemsize
        if (end - start) != count * item:
            raise ValueError(f"{self.path}: {key} holds {end - start} bytes for {count} {info['dtype']} values")
        step = max(1, chunk_bytes // item)
        buf = torch.empty(min(step, max(count, 1)), dtype=src)
        raw = buf.view(torch.uint8).numpy()
        with open(self.path, "rb", buffering=0) as f:
            f.seek(self.data_start + start)
            for first in range(0, count, step):
                k = min(step, count - first)
                _read_exactly(f, memoryview(raw)[: k * item])
                flat[first:first + k].copy_(buf[:k])
        return out


def _read_exactly(f, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            raise EOFError("the safetensors file ended early")
        got += n
