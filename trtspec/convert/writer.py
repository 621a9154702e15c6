"""Streaming safetensors writing: one tensor in memory at a time, all-or-nothing output directories.

Why not ``safetensors.torch.save_file``: it needs every tensor of a file in memory at once, which for a
70B rank file is tens of GB. The safetensors layout is simple (8-byte little-endian header length, a JSON
header with dtype/shape/data_offsets per tensor, then the raw bytes), and everything in the header is
known from shapes and dtypes alone. So we write the header first and append tensors one by one, in
header order, checking each against what the header promised.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch

from trtspec.fsutil import atomic_directory  # noqa: F401  (re-exported)

#: torch dtype -> (safetensors dtype string, bytes per element)
ST_DTYPE = {
    torch.float64: ("F64", 8),
    torch.float32: ("F32", 4),
    torch.float16: ("F16", 2),
    torch.bfloat16: ("BF16", 2),
    torch.int64: ("I64", 8),
    torch.int32: ("I32", 4),
    torch.int16: ("I16", 2),
    torch.int8: ("I8", 1),
    torch.uint8: ("U8", 1),
    torch.bool: ("BOOL", 1),
    torch.float8_e4m3fn: ("F8_E4M3", 1),
    torch.float8_e5m2: ("F8_E5M2", 1),
}


@dataclass(frozen=True)
class PlannedTensor:
    """One entry of a file's header, decided before any data is read."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * ST_DTYPE[self.dtype][1]


class StreamingSafetensorsWriter:
    """Writes one safetensors file whose header is fixed up front; tensors are appended in order.

    ``write(name, tensor)`` must be called for every planned tensor, in the planned order; ``close``
    refuses a file that did not get all of them (a half-written file must never look complete).
    """

    ALIGN = 8  # header padded with spaces so the data section starts 8-byte aligned (as safetensors does)

    def __init__(self, path: Path, planned: list[PlannedTensor], metadata: dict[str, str] | None = None):
        self.path = Path(path)
        self.planned = list(planned)
        names = [p.name for p in self.planned]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"duplicate tensor names in plan for {self.path.name}: {dup[:3]}")
        header: dict[str, object] = {}
        if metadata:
            header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
        offset = 0
        for p in self.planned:
            header[p.name] = {
                "dtype": ST_DTYPE[p.dtype][0],
                "shape": list(p.shape),
                "data_offsets": [offset, offset + p.nbytes],
            }
            offset += p.nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * ((-(8 + len(raw))) % self.ALIGN)
        self._header = raw
        self.data_bytes = offset
        self._next = 0
        self._fh: BinaryIO | None = open(self.path, "wb")
        self._fh.write(struct.pack("<Q", len(raw)))
        self._fh.write(raw)

    @property
    def total_bytes(self) -> int:
        return 8 + len(self._header) + self.data_bytes

    def write(self, name: str, tensor: torch.Tensor) -> int:
        """Append the next planned tensor; returns the bytes written."""
        if self._fh is None:
            raise RuntimeError(f"{self.path}: writer is closed")
        if self._next >= len(self.planned):
            raise RuntimeError(f"{self.path}: more tensors than planned (got {name!r})")
        p = self.planned[self._next]
        if name != p.name or tuple(tensor.shape) != p.shape or tensor.dtype != p.dtype:
            raise RuntimeError(
                f"{self.path}: expected {p.name} {list(p.shape)} {p.dtype}, "
                f"got {name} {list(tensor.shape)} {tensor.dtype}"
            )
        t = tensor.detach().contiguous()
        if t.device.type != "cpu":
            t = t.cpu()
        # A uint8 view of the same storage: the bytes as they lie in memory (little-endian on every
        # platform torch supports), no second copy for the already-contiguous common case.
        if t.numel():
            self._fh.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
        self._next += 1
        return p.nbytes

    def close(self) -> None:
        if self._fh is None:
            return
        self._fh.close()
        self._fh = None
        if self._next != len(self.planned):
            missing = self.planned[self._next].name
            raise RuntimeError(
                f"{self.path}: closed after {self._next}/{len(self.planned)} tensors (next was {missing!r})"
            )

    def abort(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
