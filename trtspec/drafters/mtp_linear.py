"""mtp-linear: trtspec's linear MTP heads, Medusa-shaped with a per-head RMSNorm before each ResBlock.

Format: trtspec heads (``trtspec_heads.json`` + ``heads.safetensors``); ``has_rmsnorm`` false gives
plain Medusa semantics. Engines: TensorRT-LLM's Medusa layout plus the stacked norm weights that
trtspec's RmsNormHeads plugin applies before each head.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from trtspec.drafters.base import DrafterKind, EngineRoute, PyTorchRoute, TrainingRecipe
from trtspec.drafters.proposers import build_heads_drafter
from trtspec.drafters.trtspec_heads import NO_GENERIC_MTP, declared_kind, load_trtspec_heads, save_trtspec_heads
from trtspec.drafters.weights import demo_init, module_state
from trtspec.models.heads import LinearHeads
from trtspec.spec import DrafterSpec, TargetSpec

NAME = "mtp-linear"
DEMO_HEADS = 4


def shapes(meta: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor the metadata implies, with its shape."""
    H, K, L = int(meta["hidden_size"]), int(meta["num_heads"]), int(meta.get("num_layers", 1))
    out: dict[str, tuple[int, ...]] = {}
    for k in range(K):
        if bool(meta.get("has_rmsnorm", True)):
            out[f"heads.{k}.norm.weight"] = (H,)
        for layer in range(L):
            out[f"heads.{k}.res.{layer}.weight"] = (H, H)
            out[f"heads.{k}.res.{layer}.bias"] = (H,)
    return out


def load(path: Path, target: TargetSpec, allow_pickle: bool = False) -> DrafterSpec:
    return load_trtspec_heads(path, target, NAME, allow_pickle, shapes)


def new_module(target: TargetSpec, num_heads: int = 3, rmsnorm: bool = True) -> nn.Module:
    a = target.arch
    return LinearHeads(num_heads, a.hidden_size, a.vocab_size, has_norm=rmsnorm, eps=a.rms_norm_eps)


def save(
    module: LinearHeads,
    target: TargetSpec,
    out: str | Path,
    info: dict | None = None,
    rmsnorm: bool = True,
    dtype: torch.dtype | None = None,
) -> Path:
    extra = {"training": info} if info is not None else {}
    return save_trtspec_heads(
        Path(out),
        NAME,
        module_state(module, dtype or target.dtype),
        target,
        num_heads=len(module.heads),
        num_layers=len(module.heads[0].res),
        has_rmsnorm=rmsnorm,
        rms_norm_eps=target.arch.rms_norm_eps,
        **extra,
    )


def make_demo(target: TargetSpec, out: Path) -> Path:
    a = target.arch
    module = demo_init(LinearHeads(DEMO_HEADS, a.hidden_size, a.vocab_size, has_norm=True, eps=a.rms_norm_eps), 4)
    return save(module, target, out, dtype=torch.float32)


KIND = DrafterKind(
    name=NAME,
    summary="linear MTP heads: RMSNorm -> ResBlock -> shared lm_head per head (Medusa-shaped)",
    detect=lambda facts: declared_kind(facts.trtspec_meta) == NAME,
    load=load,
    build=lambda spec, target, dtype: build_heads_drafter(
        spec, target, dtype, has_norm=bool(spec.config.get("has_rmsnorm", True))
    ),
    make_demo=make_demo,
    engine=EngineRoute(layout="MedusaForCausalLM+RmsNormHeads", mode="medusa", triton_decoding_mode="medusa"),
    training=TrainingRecipe("heads", new_module, save, uses_rmsnorm_switch=True, uses_num_heads=True),
    pytorch=PyTorchRoute(refusal=NO_GENERIC_MTP),
    formats=("trtspec-heads",),
    export_formats=("onnx",),
    max_tree_depth=lambda spec: spec.num_heads,
)
