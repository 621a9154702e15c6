"""Read one tensor from a safetensors file with ``pread`` into a fresh buffer (no memory map).

Why not the memory-mapped ``safe_open``: every page a mapping touches stays resident in this process
(file-backed, counted in its RSS) for as long as the file stays open, so converting a 70B checkpoint
through mmaps shows an RSS close to the model size. Reading each tensor into its own buffer and
dropping it after it is written keeps the process at about one tensor (plus its shards).
"""

from __future__ import annotations

import json
import os
import struct
from functools import lru_cache
from pathlib import Path

import torch

from trtspec.checkpoint.tensors import TensorInfo, TensorStore


@lru_cache(maxsize=256)
def _offsets(path: str, mtime_ns: int) -> tuple[int, dict[str, tuple[int, int]]]:
    with open(path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen))
    return 8 + hlen, {k: tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__"}


def read_tensor(info: TensorInfo) -> torch.Tensor:
    """The tensor ``info`` describes, read with os.pread (the header was validated by TensorStore)."""
    path = str(info.file)
    base, offsets = _offsets(path, os.stat(path).st_mtime_ns)
    start, end = offsets[info.key]
    buf = torch.empty(end - start, dtype=torch.uint8)
    view = memoryview(buf.numpy())
    fd = os.open(path, os.O_RDONLY)
    try:
        done = 0
        while done < end - start:  # pread may return short reads for large requests
            n = os.preadv(fd, [view[done:]], base + start + done)
            if n <= 0:
                raise OSError(f"{path}: unexpected end of file reading {info.key}")
            done += n
        if hasattr(os, "posix_fadvise"):  # we will not read these bytes again: let the page cache go
            os.posix_fadvise(fd, base + start, end - start, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if info.dtype == torch.uint8:
        return buf.reshape(info.shape)
    if not info.shape:
        return buf.view(info.dtype).reshape(())
    return buf.view(info.dtype).reshape(info.shape)


def load(store: TensorStore, name: str) -> torch.Tensor:
    """pread for file-backed tensors; in-memory ones (converted pickles) as they are."""
    info = store[name]
    if info.file == Path("<memory>") or not Path(info.file).is_file():
        return store.load(name)
    return read_tensor(info)
