"""Which module each head kind trains, how it is initialised, and how it is written to disk.

The modules are the runtime's own (trtspec.models.heads), so their parameter names are the canonical
tensor names. Output formats are the ones the loaders read: trtspec-heads for the MTP kinds,
FasterDecoding/Medusa for medusa, SafeAILab/EAGLE-1/2 for eagle; each records the target fingerprint.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from trtspec.checkpoint.errors import UsageError
from trtspec.checkpoint.heads.eagle import eagle_config
from trtspec.checkpoint.heads.mtp import save_mtp
from trtspec.fsutil import atomic_directory
from trtspec.models.heads import EagleHead, LinearHeads, MtpSingleHead, layer_arch
from trtspec.spec import TargetSpec

TRAIN_KINDS = ("mtp-linear", "mtp-single", "medusa", "eagle")
LINEAR_KINDS = ("mtp-linear", "medusa")


def make_module(kind: str, target: TargetSpec, num_heads: int = 3, rmsnorm: bool = True, seed: int = 0) -> nn.Module:
    """A freshly initialised head module. Linear heads start as the identity (ResBlock weights 0), so
    before training every head proposes the target's own next token; recurrent heads get a small
    normal init (std 0.02, norms 1), as Llama layers do."""
    a = target.arch
    if kind == "mtp-linear":
        module = LinearHeads(num_heads, a.hidden_size, a.vocab_size, has_norm=rmsnorm, eps=a.rms_norm_eps)
    elif kind == "medusa":
        module = LinearHeads(num_heads, a.hidden_size, a.vocab_size)
    elif kind == "mtp-single":
        module = MtpSingleHead(layer_arch(a), has_rmsnorm=rmsnorm)
    elif kind == "eagle":
        module = EagleHead(layer_arch(a), fc_bias=True)
    else:
        raise UsageError(f"train-heads cannot train {kind!r}; choose one of {', '.join(TRAIN_KINDS)}")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.fill_(1.0)
            elif kind in LINEAR_KINDS or name.endswith(".bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return module


def horizon(kind: str, num_heads: int, unroll: int) -> int:
    """How many tokens past the target's own next token the kind is trained to predict."""
    return num_heads if kind in LINEAR_KINDS else unroll


def _state(module: nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: v.detach().to(dtype).contiguous().cpu() for k, v in module.state_dict().items() if "inv_freq" not in k}


def save_heads(kind: str, module: nn.Module, target: TargetSpec, out: str | Path, info: dict | None = None,
               rmsnorm: bool = True) -> Path:
    """Write trained heads in ``kind``'s published format, in the target's dtype."""
    out = Path(out)
    a, dtype = target.arch, target.dtype
    info = info or {}
    fp = {"fingerprint": target.fingerprint, "model_type": a.model_type, "path": str(target.path)}
    if kind == "mtp-linear":
        return save_mtp(out, kind, _state(module, dtype), target, num_heads=len(module.heads), num_layers=1,
                        has_rmsnorm=rmsnorm, rms_norm_eps=a.rms_norm_eps, training=info)
    if kind == "mtp-single":
        arch = module.arch
        return save_mtp(out, kind, _state(module, dtype), target, num_heads=1, num_layers=1, has_rmsnorm=rmsnorm,
                        rms_norm_eps=a.rms_norm_eps, intermediate_size=arch.intermediate_size,
                        num_attention_heads=arch.num_attention_heads, num_key_value_heads=arch.num_key_value_heads,
                        head_dim=arch.head_dim, training=info)
    if kind not in ("medusa", "eagle"):
        raise UsageError(f"cannot save {kind!r} heads")
    with atomic_directory(out, overwrite=True) as tmp:
        if kind == "medusa":
            # FasterDecoding layout without per-head lm_heads (Medusa "version 2": the base lm_head is reused).
            state = {}
            for h, head in enumerate(module.heads):
                state[f"{h}.0.linear.weight"] = head.res[0].weight.detach().to(dtype).contiguous()
                state[f"{h}.0.linear.bias"] = head.res[0].bias.detach().to(dtype).contiguous()
            save_file(state, str(tmp / "medusa_lm_head.safetensors"))
            cfg = {"medusa_num_heads": len(module.heads), "medusa_num_layers": 1, "version": "2",
                   "base_model_name_or_path": str(target.path), "hidden_size": a.hidden_size,
                   "vocab_size": a.vocab_size, "trtspec_target": fp, "trtspec_training": info}
        else:
            state = {("layers.0." + k[len("layer."):] if k.startswith("layer.") else k): v
                     for k, v in _state(module, dtype).items()}
            save_file(state, str(tmp / "model.safetensors"))
            cfg = eagle_config(target, bias=True, torch_dtype=str(dtype).removeprefix("torch."),
                               trtspec_target=fp, trtspec_training=info)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out
