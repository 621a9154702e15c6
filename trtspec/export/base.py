"""What an export format is: one frozen record per format, filled by the format's module."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trtspec.spec import SpecModel


@dataclass(frozen=True)
class ExportOptions:
    """Choices that are the user's, not the files': where the heads and target came from (a format may
    record them, ONNX re-reads them), the tree, the dtype to write (None = the heads' own; ONNX: float32)
    and how many tokens a chain drafter proposes per step (written where a format records it)."""

    heads: Path
    target: Path
    tree: Any = None
    dtype: torch.dtype | None = None
    num_speculative_tokens: int = 3


@dataclass(frozen=True)
class Exporter:
    """One export format.

    ``write(spec, out, options)`` writes into ``out``: a fresh temporary directory, or for
    ``single_file`` formats a file path inside one; ``export_draft`` moves the result into place only
    when ``write`` returns, so a failed export leaves nothing behind. ``loaders`` names who reads it.
    """

    name: str
    summary: str
    loaders: str
    write: Callable[[SpecModel, Path, ExportOptions], None]
    single_file: bool = False


def drafter_tensors(spec: SpecModel, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """Every drafter tensor under its canonical name, floating ones cast to ``dtype`` (None = as stored)."""
    store = spec.drafter.tensors
    out = {}
    for name in store:
        t = store.load(name)
        out[name] = (t.to(dtype) if dtype is not None and t.is_floating_point() else t).contiguous()
    return out


def dtype_name(tensors: dict[str, torch.Tensor]) -> str:
    """The HF ``torch_dtype`` of a checkpoint: its floating tensors' dtype."""
    floats = {t.dtype for t in tensors.values() if t.is_floating_point()}
    return str(floats.pop() if len(floats) == 1 else torch.float32).removeprefix("torch.")


def write_checkpoint(out: Path, tensors: dict[str, torch.Tensor], config: dict, weights: str) -> None:
    """``weights`` (safetensors) + ``config.json`` into ``out`` (a temporary directory)."""
    import json

    from safetensors.torch import save_file

    save_file(tensors, str(out / weights), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
