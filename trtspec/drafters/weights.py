"""Initialisation and state helpers every kind module shares (so no kind carries its own copy)."""

from __future__ import annotations

import torch
from torch import nn


def is_norm(name: str) -> bool:
    return name.endswith("norm.weight") or "layernorm" in name


def train_init(module: nn.Module, seed: int, identity: bool) -> nn.Module:
    """The trainer's start point: norms 1; with ``identity`` (Medusa-scheme heads) every other weight 0,
    so each untrained head proposes the target's own next token; otherwise biases 0 and weights
    N(0, 0.02), as Llama layers are initialised."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if is_norm(name):
                p.fill_(1.0)
            elif identity or name.endswith(".bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return module


def demo_init(module: nn.Module, seed: int, scale: float = 0.02) -> nn.Module:
    """Random weights for the embedded demo's untrained heads: norms 1, everything else N(0, scale)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if is_norm(name):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    return module


def module_state(module: nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The module's tensors under their canonical names (rotary buffers dropped), contiguous, on the CPU."""
    out = {}
    for k, v in module.state_dict().items():
        if "inv_freq" in k:
            continue
        v = v.detach()
        out[k] = (v.to(dtype) if dtype is not None and v.is_floating_point() else v).contiguous().cpu()
    return out
