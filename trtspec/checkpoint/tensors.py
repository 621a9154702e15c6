"""Lazy, memory-mapped access to tensors spread over one or many safetensors files.

Why lazy: a 70B checkpoint does not fit in RAM; every stage (reference runtime, converter, trainer)
asks for one tensor at a time and the OS pages it in from the memory map.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from trtspec.errors import CheckpointError

_ST_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
_ST_ITEMSIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives and what it is, known from the header alone (no data read)."""

    file: Path
    key: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int


def read_safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """Parse and check a safetensors header: catches truncated and corrupt files before any mmap."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise CheckpointError(
                    "file is truncated (no safetensors header)", path, "re-download or re-export the file"
                )
            (hlen,) = struct.unpack("<Q", raw)
            if hlen <= 0 or 8 + hlen > size or hlen > 100_000_000:
                raise CheckpointError(
                    "corrupt safetensors header length",
                    path,
                    "the file is truncated or not safetensors; re-download it",
                )
            header = json.loads(f.read(hlen))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        if isinstance(exc, OSError) and not path.exists():
            raise CheckpointError("file not found", path) from None
        raise CheckpointError(
            f"unreadable safetensors header ({exc.__class__.__name__})",
            path,
            "the file is corrupt; re-download or re-export it",
        ) from None
    if not isinstance(header, dict):
        raise CheckpointError("corrupt safetensors header", path, "re-download the file")
    data_len = size - 8 - hlen
    out: dict[str, TensorInfo] = {}
    for key, meta in header.items():
        if key == "__metadata__":
            continue
        try:
            dt = meta["dtype"]
            shape = tuple(int(s) for s in meta["shape"])
            start, end = (int(x) for x in meta["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"corrupt header entry for tensor {key!r}", path, "re-download the file") from None
        if dt not in _ST_DTYPES:
            raise CheckpointError(f"tensor {key!r} has unsupported dtype {dt}", path)
        n = 1
        for s in shape:
            n *= s
        if end - start != n * _ST_ITEMSIZE[dt] or end > data_len or start < 0:
            raise CheckpointError(
                f"tensor {key!r} lies outside the file (truncated download?)", path, "re-download or re-export the file"
            )
        out[key] = TensorInfo(path, key, shape, _ST_DTYPES[dt], end - start)
    return out


class TensorStore(Mapping[str, TensorInfo]):
    """A name -> tensor view over safetensors files; tensors are loaded one at a time on demand.

    ``names`` may differ from the keys stored in the files (``rename`` maps our canonical name to the
    file's key), so loaders can present one naming per drafter kind whatever the published layout.
    Extra in-memory tensors (e.g. converted from a pickle) can be attached with ``extra``.
    """

    def __init__(self, infos: dict[str, TensorInfo], extra: dict[str, torch.Tensor] | None = None):
        self._infos = dict(infos)
        self._extra = dict(extra or {})
        self._handles: dict[Path, object] = {}

    @classmethod
    def from_files(cls, files: list[Path]) -> TensorStore:
        infos: dict[str, TensorInfo] = {}
        for f in files:
            for key, info in read_safetensors_header(f).items():
                if key in infos:
                    raise CheckpointError(
                        f"tensor {key!r} appears in two shards ({infos[key].file.name})",
                        f,
                        "fix model.safetensors.index.json or remove the duplicate",
                    )
                infos[key] = info
        return cls(infos)

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> TensorStore:
        return cls({}, tensors)

    # Mapping protocol --------------------------------------------------------------------------
    def __getitem__(self, name: str) -> TensorInfo:
        if name in self._extra:
            t = self._extra[name]
            return TensorInfo(Path("<memory>"), name, tuple(t.shape), t.dtype, t.numel() * t.element_size())
        return self._infos[name]

    def __iter__(self) -> Iterator[str]:
        yield from self._infos
        yield from (k for k in self._extra if k not in self._infos)

    def __len__(self) -> int:
        return len(set(self._infos) | set(self._extra))

    def __contains__(self, name: object) -> bool:
        return name in self._infos or name in self._extra

    # Data ----------------------------------------------------------------------------------------
    def shape(self, name: str) -> tuple[int, ...]:
        return self[name].shape

    def get(self, name: str, default=None):  # type: ignore[override]
        """Mapping.get returns the TensorInfo (not data); use ``load`` for the tensor."""
        return self[name] if name in self else default

    def load(self, name: str) -> torch.Tensor:
        """Read one tensor (memory-mapped, then copied out) in its stored dtype."""
        if name in self._extra:
            return self._extra[name]
        try:
            info = self._infos[name]
        except KeyError:
            raise CheckpointError(f"missing tensor {name!r}") from None
        handle = self._handles.get(info.file)
        if handle is None:
            handle = safe_open(str(info.file), framework="pt")
            self._handles[info.file] = handle
        return handle.get_tensor(info.key)  # type: ignore[attr-defined]

    def load_rows(self, name: str, n: int) -> torch.Tensor:
        """The first ``n`` rows of a tensor without reading the rest (fingerprints, previews)."""
        if name in self._extra:
            return self._extra[name][:n]
        info = self._infos[name]
        handle = self._handles.get(info.file)
        if handle is None:
            handle = safe_open(str(info.file), framework="pt")
            self._handles[info.file] = handle
        return handle.get_slice(info.key)[:n]  # type: ignore[attr-defined]

    def renamed(self, mapping: dict[str, str]) -> TensorStore:
        """A view whose names are ``mapping`` keys, each pointing at the stored tensor ``mapping[k]``."""
        infos = {new: self._infos[old] for new, old in mapping.items() if old in self._infos}
        extra = {new: self._extra[old] for new, old in mapping.items() if old in self._extra}
        return TensorStore(infos, extra)

    def total_bytes(self) -> int:
        return sum(self[n].nbytes for n in self)

    def files(self) -> list[Path]:
        return sorted({i.file for i in self._infos.values()})
