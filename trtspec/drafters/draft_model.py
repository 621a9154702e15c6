"""draft-model: a separate small causal LM sharing the target's vocabulary, drafting autoregressively.

Any Hugging Face Llama-family directory (config.json + safetensors, sharded or not) whose vocabulary is
the target's. Engines: a second TensorRT-LLM engine, the target built with ``draft_tokens_external``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.checkpoint.truncate import write_truncated_draft
from trtspec.drafters.base import DirFacts, DrafterKind, EngineRoute, PyTorchRoute
from trtspec.drafters.proposers import RecurrentDrafter, restrict_rows
from trtspec.errors import CheckpointError
from trtspec.models.llama import build_llama
from trtspec.spec import DrafterSpec, TargetSpec

NAME = "draft-model"


def detect(facts: DirFacts) -> bool:
    return (
        any(k.startswith("model.layers.") for k in facts.tensor_names) or "model.safetensors.index.json" in facts.files
    )


def load(path: Path, target: TargetSpec, allow_pickle: bool = False) -> DrafterSpec:
    draft = load_hf_causal_lm(path, allow_pickle=allow_pickle, role="draft model")
    if draft.arch.vocab_size != target.arch.vocab_size:
        raise CheckpointError(
            f"vocab size mismatch: draft model has {draft.arch.vocab_size}, target has {target.arch.vocab_size}",
            path / "config.json",
            "a draft model must share the target's tokenizer",
        )
    config = {
        "num_heads": 1,
        "hidden_size": draft.arch.hidden_size,
        "vocab_size": draft.arch.vocab_size,
        "num_layers": draft.arch.num_hidden_layers,
        "fingerprint": draft.fingerprint,
    }
    return DrafterSpec(
        NAME, path, draft.tensors, config, arch=draft.arch, dtype=draft.dtype, tokenizer_path=draft.tokenizer_path
    )


def build(spec: DrafterSpec, target, dtype: torch.dtype) -> RecurrentDrafter:
    model = build_llama(spec.arch, spec.tensors, dtype)
    if spec.draft_vocab is not None:  # a new Parameter: a tied embedding keeps the full vocabulary
        model.lm_head.weight = nn.Parameter(
            restrict_rows(model.lm_head.weight.detach(), spec.draft_vocab), requires_grad=False
        )
    return RecurrentDrafter(model, None, None, draft_vocab=spec.draft_vocab)


KIND = DrafterKind(
    name=NAME,
    summary="a separate small causal LM with the target's vocabulary",
    detect=detect,
    load=load,
    build=build,
    make_demo=lambda target, out: write_truncated_draft(target, 2, out),
    engine=EngineRoute(layout="draft_tokens_external", mode="draft_tokens_external", draft_len="depth"),
    # the PyTorch backend's DraftTargetDecodingConfig: decoding_type literal "Draft_Target" (llm_args.py)
    pytorch=PyTorchRoute(decoding_type="Draft_Target", draft_format="hf"),
    formats=("hf",),
)
