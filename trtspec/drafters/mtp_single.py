"""mtp-single: one DeepSeek-V3-style MTP module applied autoregressively.

eh_proj(cat[enorm(emb(token)), hnorm(h)]) -> one decoder layer -> norm -> the target's lm_head; the
layer output (pre-norm) is fed back as the next step's h. Format: trtspec heads. Engines: TensorRT-LLM's
EAGLE layout with the norms EAGLE lacks, built with trtspec's model class.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from trtspec.drafters.base import DrafterKind, EngineRoute, PyTorchRoute, TrainingRecipe
from trtspec.drafters.proposers import build_pair_drafter
from trtspec.drafters.trtspec_heads import NO_GENERIC_MTP, declared_kind, load_trtspec_heads, save_trtspec_heads
from trtspec.drafters.weights import demo_init, module_state
from trtspec.models.heads import MtpSingleHead, layer_arch
from trtspec.spec import DrafterSpec, LlamaArch, TargetSpec

NAME = "mtp-single"


def shapes(meta: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    H = int(meta["hidden_size"])
    inter, d = int(meta["intermediate_size"]), int(meta["head_dim"])
    q, kv = int(meta["num_attention_heads"]) * d, int(meta["num_key_value_heads"]) * d
    out = {
        "eh_proj.weight": (H, 2 * H),
        "layer.input_layernorm.weight": (H,),
        "layer.post_attention_layernorm.weight": (H,),
        "layer.self_attn.q_proj.weight": (q, H),
        "layer.self_attn.k_proj.weight": (kv, H),
        "layer.self_attn.v_proj.weight": (kv, H),
        "layer.self_attn.o_proj.weight": (H, q),
        "layer.mlp.gate_proj.weight": (inter, H),
        "layer.mlp.up_proj.weight": (inter, H),
        "layer.mlp.down_proj.weight": (H, inter),
    }
    if bool(meta.get("has_rmsnorm", True)):
        out.update({"enorm.weight": (H,), "hnorm.weight": (H,), "norm.weight": (H,)})
    return out


def arch(meta: dict[str, Any], target: TargetSpec) -> LlamaArch:
    return layer_arch(
        target.arch,
        intermediate_size=int(meta["intermediate_size"]),
        num_attention_heads=int(meta["num_attention_heads"]),
        num_key_value_heads=int(meta["num_key_value_heads"]),
        head_dim=int(meta["head_dim"]),
        rms_norm_eps=float(meta.get("rms_norm_eps", target.arch.rms_norm_eps)),
    )


def load(path: Path, target: TargetSpec, allow_pickle: bool = False) -> DrafterSpec:
    return load_trtspec_heads(path, target, NAME, allow_pickle, shapes, arch)


def new_module(target: TargetSpec, num_heads: int = 1, rmsnorm: bool = True) -> nn.Module:
    return MtpSingleHead(layer_arch(target.arch), has_rmsnorm=rmsnorm)


def save(
    module: MtpSingleHead,
    target: TargetSpec,
    out: str | Path,
    info: dict | None = None,
    rmsnorm: bool = True,
    dtype: torch.dtype | None = None,
) -> Path:
    a = module.arch
    extra = {"training": info} if info is not None else {}
    return save_trtspec_heads(
        Path(out),
        NAME,
        module_state(module, dtype or target.dtype),
        target,
        num_heads=1,
        num_layers=1,
        has_rmsnorm=rmsnorm,
        rms_norm_eps=target.arch.rms_norm_eps,
        intermediate_size=a.intermediate_size,
        num_attention_heads=a.num_attention_heads,
        num_key_value_heads=a.num_key_value_heads,
        head_dim=a.head_dim,
        **extra,
    )


def build(spec: DrafterSpec, target, dtype: torch.dtype):
    module = MtpSingleHead(spec.arch, has_rmsnorm=bool(spec.config.get("has_rmsnorm", True)))
    return build_pair_drafter(spec, target, dtype, module)


KIND = DrafterKind(
    name=NAME,
    summary="one DeepSeek-V3-style MTP module (enorm/hnorm, eh_proj, one layer) drafting autoregressively",
    detect=lambda facts: declared_kind(facts.trtspec_meta) == NAME,
    load=load,
    build=build,
    make_demo=lambda target, out: save(
        demo_init(MtpSingleHead(layer_arch(target.arch)), 4), target, out, dtype=torch.float32
    ),
    engine=EngineRoute(layout="EagleForCausalLM+MtpNorms", mode="eagle", triton_decoding_mode="eagle"),
    training=TrainingRecipe("recurrent", new_module, save, uses_rmsnorm_switch=True),
    pytorch=PyTorchRoute(refusal=NO_GENERIC_MTP),
    formats=("trtspec-heads",),
    export_formats=("deepseek-v3-mtp",),
)
