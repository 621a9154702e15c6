"""``export_draft``: heads of any kind -> one export format, written atomically.

The kind decides which formats exist for it (``DrafterKind.export_formats``); asking for another is one
error that lists the ones there are, raised before anything is written.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch

from trtspec.drafters import registry as kinds
from trtspec.dtypes import DtypeError, parse_dtype
from trtspec.errors import UsageError
from trtspec.export import registry
from trtspec.export.base import ExportOptions
from trtspec.fsutil import atomic_directory
from trtspec.load import load_spec_model


def check_format(kind_name: str, fmt: str) -> None:
    """One clear error when ``fmt`` is not among the formats the kind declares."""
    registry.get(fmt)
    kind = kinds.get(kind_name)
    if fmt not in kind.export_formats:
        have = ", ".join(kind.export_formats) or "none yet"
        raise UsageError(f"{kind.name} heads cannot be exported as {fmt}; formats for {kind.name}: {have}")


def export_draft(
    heads: str | Path,
    target: str | Path,
    fmt: str,
    out: str | Path,
    *,
    heads_format: str | None = None,
    tree=None,
    dtype: str | torch.dtype | None = None,
    overwrite: bool = False,
    allow_pickle: bool = False,
) -> Path:
    """Write the drafter at ``heads`` (for the target at ``target``) as ``fmt`` to ``out``; returns ``out``.

    ``out`` is a directory for the checkpoint formats and a file for ONNX. ``tree`` sets the draft depth a
    format records (vLLM/speculators ``num_speculative_tokens``); ``dtype`` None keeps the heads' dtype.
    """
    heads, target, out = Path(heads), Path(target), Path(out)
    exporter = registry.get(fmt)
    kind = heads_format or kinds.detect(heads)
    check_format(kind, fmt)
    if out.resolve() == heads.resolve():
        raise UsageError(f"--out {out} is the heads directory itself; write the export somewhere else")
    try:
        torch_dtype = parse_dtype(dtype) if isinstance(dtype, str) else dtype
    except DtypeError as exc:
        raise UsageError(str(exc)) from None
    spec = load_spec_model(
        target, heads, heads_format=heads_format, tree=tree, allow_pickle=allow_pickle, draft_vocab=0
    )
    opts = ExportOptions(heads, target, tree, torch_dtype, max(spec.tree.depth, 1))
    if not exporter.single_file:
        with atomic_directory(out, overwrite=overwrite) as tmp:
            exporter.write(spec, tmp, opts)
        return out
    if out.exists() and not overwrite:
        raise UsageError(f"{out} already exists; pass --overwrite or choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        exporter.write(spec, tmp / out.name, opts)
        for f in sorted(tmp.iterdir()):  # the file and any sidecar (ONNX external data)
            f.replace(out.parent / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
