"""Helpers every head loader shares: locating weight files, shape checks against the target."""

from __future__ import annotations

from pathlib import Path

import torch

from trtspec.checkpoint.target import PICKLE_SUFFIXES, load_pickle_tensors
from trtspec.checkpoint.tensors import TensorStore
from trtspec.errors import CheckpointError
from trtspec.spec import TargetSpec


def open_weights(path: Path, names: tuple[str, ...], allow_pickle: bool) -> TensorStore:
    """Open the first existing weight file among ``names`` in ``path`` (or ``path`` itself if a file).

    safetensors are memory-mapped; pickles (.bin/.pt) only with allow_pickle, via weights_only=True."""
    candidates = [path] if path.is_file() else [path / n for n in names]
    for f in candidates:
        if not f.is_file():
            continue
        if f.suffix in PICKLE_SUFFIXES:
            if not allow_pickle:
                raise CheckpointError(
                    f"heads are a pickle file ({f.name}); pickles can run code",
                    f,
                    "convert to safetensors, or pass --allow-pickle (loads with weights_only=True)",
                )
            return TensorStore.from_tensors(load_pickle_tensors([f]))
        return TensorStore.from_files([f])
    raise CheckpointError(
        f"no head weights found (looked for {', '.join(names)})",
        path,
        "point --heads at the heads directory or weight file",
    )


def single_dtype(store: TensorStore, where: Path, skip: tuple[str, ...] = ("d2t", "t2d")) -> torch.dtype:
    dtypes = {store[n].dtype for n in store if n not in skip}
    if len(dtypes) != 1:
        raise CheckpointError(f"mixed dtypes in heads: {sorted(map(str, dtypes))}", where, "re-export in one dtype")
    return dtypes.pop()


def expect_shape(store: TensorStore, name: str, shape: tuple[int, ...], where: Path, what: str) -> None:
    if name not in store:
        raise CheckpointError(f"missing tensor {name!r}", where, "the heads file is incomplete or of another format")
    got = store.shape(name)
    if got != shape:
        raise CheckpointError(
            f"{name} has shape {list(got)} but {what} needs {list(shape)}",
            where,
            "these heads were trained for a different target",
        )


def check_hidden(got: int, target: TargetSpec, where: Path) -> None:
    if got != target.arch.hidden_size:
        raise CheckpointError(
            f"hidden size mismatch: heads have {got}, target has {target.arch.hidden_size}",
            where,
            "use heads trained for this target",
        )


def check_vocab(got: int, target: TargetSpec, where: Path) -> None:
    if got != target.arch.vocab_size:
        raise CheckpointError(
            f"vocab size mismatch: heads have {got}, target has {target.arch.vocab_size}",
            where,
            "use heads trained for this target's tokenizer",
        )
