"""A separate small draft model: any HF Llama-family directory sharing the target's vocabulary."""

from __future__ import annotations

from pathlib import Path

from trtspec.checkpoint.errors import CheckpointError
from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.spec import DrafterSpec, TargetSpec


def load_draft_model(path: Path, target: TargetSpec, allow_pickle: bool = False) -> DrafterSpec:
    draft = load_hf_causal_lm(path, allow_pickle=allow_pickle, role="draft model")
    if draft.arch.vocab_size != target.arch.vocab_size:
        raise CheckpointError(f"vocab size mismatch: draft model has {draft.arch.vocab_size}, target has "
                              f"{target.arch.vocab_size}", path / "config.json",
                              "a draft model must share the target's tokenizer")
    config = {"num_heads": 1, "hidden_size": draft.arch.hidden_size, "vocab_size": draft.arch.vocab_size,
              "num_layers": draft.arch.num_hidden_layers, "fingerprint": draft.fingerprint}
    return DrafterSpec("draft-model", path, draft.tensors, config, arch=draft.arch, dtype=draft.dtype,
                       tokenizer_path=draft.tokenizer_path)
