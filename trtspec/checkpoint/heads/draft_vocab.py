"""A draft vocabulary: the target tokens a drafter may propose, stored beside any heads.

Why: on a small target (and on every CPU) the drafter's cost is dominated by its vocabulary projection:
SmolLM2's lm_head is 49152 x 576, a fifth of the whole model's weights, paid once per tree depth.
Restricting the drafter's lm_head to the tokens the target actually writes (FR-Spec's frequency-ranked
draft vocabulary) cuts that cost by V / V_d while costing little acceptance, and stays lossless: the
target still verifies over its full vocabulary, a draft token outside the subset just cannot be proposed.

File: ``draft_vocab.safetensors`` in the heads directory, one int64 tensor ``draft_vocab`` [V_d] of
target token ids, most frequent first (so its first N entries are the best N-token vocabulary). Any head
format may carry it (the published layouts stay untouched); EAGLE-3 heads already have their own d2t.
TensorRT-LLM engines ignore it and draft over the full vocabulary (a superset: still lossless).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from trtspec.errors import CheckpointError, UsageError

DRAFT_VOCAB_FILE = "draft_vocab.safetensors"
TENSOR = "draft_vocab"


def draft_vocab_path(heads: Path) -> Path:
    return (heads if heads.is_dir() else heads.parent) / DRAFT_VOCAB_FILE


def load_draft_vocab(heads: Path, vocab_size: int, size: int | None = None) -> torch.Tensor | None:
    """The validated draft vocabulary of ``heads`` (None when it has none or ``size == 0``).

    ``size``: None = the whole file, N = its N most frequent tokens (an error if the file is missing)."""
    f = draft_vocab_path(Path(heads))
    if size == 0:
        return None
    if not f.is_file():
        if size is not None:
            raise UsageError(
                f"{f.parent}: --draft-vocab {size} but the heads have no {DRAFT_VOCAB_FILE} "
                "(train-heads --draft-vocab N writes one)"
            )
        return None
    try:
        tensors = load_file(str(f))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(
            f"not a readable safetensors file ({str(exc)[:100]})",
            f,
            "delete it or rewrite it with train-heads --draft-vocab",
        ) from None
    ids = tensors.get(TENSOR)
    if ids is None or ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64) or ids.numel() == 0:
        raise CheckpointError(
            f"needs one non-empty 1-D integer tensor {TENSOR!r}", f, "rewrite it with train-heads --draft-vocab"
        )
    ids = ids.long()
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise CheckpointError(
            f"token ids outside the target vocabulary [0, {vocab_size})", f, "it was written for another tokenizer"
        )
    if ids.unique().numel() != ids.numel():
        raise CheckpointError("repeated token ids", f, "rewrite it with train-heads --draft-vocab")
    if size is not None:
        if size < 0:
            raise UsageError(f"--draft-vocab must be >= 0, got {size}")
        ids = ids[:size]
    return ids.contiguous()


def save_draft_vocab(heads: Path, ids: torch.Tensor) -> Path:
    """Write ``ids`` (most frequent first) beside the heads, atomically (temp file + rename)."""
    f = draft_vocab_path(Path(heads))
    tmp = f.with_name(f.name + ".tmp")
    save_file({TENSOR: ids.to(torch.int64).contiguous()}, str(tmp))
    tmp.replace(f)
    return f


def to_draft_index(draft_vocab: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Inverse map [V]: target id -> index in the draft vocabulary, -1 where the token is not in it."""
    inv = torch.full((vocab_size,), -1, dtype=torch.long)
    inv[draft_vocab] = torch.arange(draft_vocab.numel())
    return inv
