"""Teacher-forced multi-step forward of a recurrent drafter (EAGLE / mtp-single), shaped like serving.

At serving time the drafter has committed pairs (h_j, x_{j+1}) for every j <= q; a depth-d draft node
feeds (its parent's output o, its token) at position q + d - 1 and attends to those committed pairs and
to its own ancestors only. Training step s (0-based) reproduces that for every q of a window at once:
query i (position i + s) sees step-0 keys j <= i and, of steps 1..s, only its own column (its
ancestors on the ground-truth path). The module's own forward does the math; only its mask is replaced,
so a trained head is exactly the runtime's head.
"""

from __future__ import annotations

import torch
from torch import nn

from trtspec.models.llama import KVCache


def step_mask(valid: torch.Tensor, step: int) -> torch.Tensor:
    """[B, 1, T, (step+1)*T] bool attention mask of step ``step`` (see module doc)."""
    B, T = valid.shape
    eye = torch.eye(T, dtype=torch.bool, device=valid.device)
    first = torch.ones(T, T, dtype=torch.bool, device=valid.device).tril()[None] & valid[:, None, :]
    first = first | eye  # padded queries attend to themselves: finite, and ignored by the loss
    blocks = [first] + [eye[None].expand(B, T, T)] * step
    return torch.cat(blocks, -1)[:, None]


def unrolled(
    module: nn.Module,
    embed: torch.Tensor,
    lm_head: torch.Tensor,
    feats: torch.Tensor,
    tokens: list[torch.Tensor],
    start: torch.Tensor,
    valid: torch.Tensor,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Run ``len(tokens)`` steps. ``feats`` [B, T, H] target hidden h_q; ``tokens[s]`` [B, T] the token
    fed at step s (x_{q+s+1}); ``start`` [B] the absolute position of column 0. Returns (out, logits)
    per step; ``out`` of step s is the feature of step s + 1."""
    B, T, _ = feats.shape
    arch = module.arch
    p = next(module.parameters())
    cache = KVCache(1, B, arch.num_key_value_heads, arch.head_dim, T, p.dtype, p.device)
    results = []
    f = feats
    base = start[:, None] + torch.arange(T, device=feats.device)[None]
    for s, tok in enumerate(tokens):
        mask = step_mask(valid, s)

        def run_layer(x, positions, c, new_mask, attn_input=None, _mask=mask):
            cos, sin = module.rotary(positions, x.dtype)
            return module.layer(x, cos, sin, c, 0, _mask, attn_input)

        module.run_layer = run_layer  # instance attribute shadows the method for this call only
        if s > 0:  # grow out of place: the previous steps' K/V are saved for backward
            cache.k[0] = torch.cat([cache.k[0], torch.zeros_like(cache.k[0][:, :T])], 1)
            cache.v[0] = torch.cat([cache.v[0], torch.zeros_like(cache.v[0][:, :T])], 1)
        try:
            cache.lengths = torch.full((B,), s * T, dtype=torch.long, device=feats.device)
            emb = nn.functional.embedding(tok, embed)
            out, logits = module(emb, f, base + s, cache, None, lm_head)
        finally:
            del module.run_layer
        results.append((out, logits))
        f = out
    return results
