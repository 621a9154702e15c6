"""Draft-head modules for every drafter kind, with parameter names = DrafterSpec canonical names.

The same modules serve the reference runtime (inference) and trtspec's trainer, so a trained head is
exactly what gets verified. Shared pieces (the target's embedding and lm_head) are passed in, never
copied into the heads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trtspec.models.llama import DecoderLayer, KVCache, RMSNorm, Rotary, attention_mask
from trtspec.spec import LlamaArch


def project(z: torch.Tensor, lm_head: torch.Tensor | nn.Module) -> torch.Tensor:
    """Vocabulary projection by a shared lm_head: a weight tensor [V, H], or a module holding one (the
    runtime's pre-packed projection, models.packed)."""
    return lm_head(z) if isinstance(lm_head, nn.Module) else F.linear(z, lm_head)


class ResBlock(nn.Linear):
    """Medusa's block: z + SiLU(W z + b). A Linear subclass so its tensors are ``res.{l}.weight|bias``."""

    def __init__(self, hidden: int):
        super().__init__(hidden, hidden)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z + F.silu(super().forward(z))


class LinearHead(nn.Module):
    def __init__(self, hidden: int, vocab: int, num_layers: int, has_norm: bool, eps: float, own_lm_head: bool):
        super().__init__()
        self.norm = RMSNorm(hidden, eps) if has_norm else None
        self.res = nn.ModuleList(ResBlock(hidden) for _ in range(num_layers))
        self.lm_head = nn.Linear(hidden, vocab, bias=False) if own_lm_head else None

    def forward(self, h: torch.Tensor, shared_lm_head: torch.Tensor) -> torch.Tensor:
        z = self.norm(h) if self.norm is not None else h
        for block in self.res:
            z = block(z)
        return project(z, self.lm_head if self.lm_head is not None else shared_lm_head)


class LinearHeads(nn.Module):
    """Medusa and mtp-linear: K heads on the target's final hidden state; head k predicts the token
    k+2 positions ahead (k+1 past the target's own next token). mtp-linear adds a per-head RMSNorm."""

    def __init__(
        self,
        num_heads: int,
        hidden: int,
        vocab: int,
        num_layers: int = 1,
        has_norm: bool = False,
        eps: float = 1e-6,
        own_lm_head: bool = False,
    ):
        super().__init__()
        self.heads = nn.ModuleList(
            LinearHead(hidden, vocab, num_layers, has_norm, eps, own_lm_head) for _ in range(num_heads)
        )

    def forward(self, h: torch.Tensor, shared_lm_head: torch.Tensor) -> torch.Tensor:
        """h [..., H] -> logits [K, ..., V] (float32)."""
        return torch.stack([head(h, shared_lm_head).float() for head in self.heads])


class _RecurrentHead(nn.Module):
    """Shared machinery of the one-layer autoregressive drafters: rotary, its own KV cache.

    ``features`` runs the layer (writing the drafter's KV cache) and returns the output that is fed
    back; ``head_logits`` turns outputs into logits. They are separate so the runtime pays for the
    vocabulary projection only at the positions it expands; ``forward`` does both."""

    arch: LlamaArch

    def forward(
        self,
        emb: torch.Tensor,
        h: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        new_mask: torch.Tensor,
        lm_head: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.features(emb, h, positions, cache, new_mask)
        return out, self.head_logits(out, lm_head)

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        p = next(self.parameters())
        return KVCache(1, batch, self.arch.num_key_value_heads, self.arch.head_dim, capacity, p.dtype, p.device)

    def run_layer(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        new_mask: torch.Tensor,
        attn_input: torch.Tensor | None = None,
    ) -> torch.Tensor:
        cache.ensure(int(cache.lengths.max()) + x.shape[1])
        cos, sin = self.rotary(positions, x.dtype)
        mask = attention_mask(cache.lengths, new_mask)
        return self.layer(x, cos, sin, cache, 0, mask, attn_input)


class MtpSingleHead(_RecurrentHead):
    """DeepSeek-V3 style MTP module: eh_proj(cat[enorm(emb(tok)), hnorm(h)]) -> one decoder layer ->
    norm -> shared lm_head. The layer output (pre-norm) is fed back as the next step's h.
    ``has_rmsnorm=False`` drops enorm/hnorm/norm (the ablation the trainer measures)."""

    def __init__(self, arch: LlamaArch, has_rmsnorm: bool = True):
        super().__init__()
        self.arch = arch
        H, eps = arch.hidden_size, arch.rms_norm_eps
        self.enorm = RMSNorm(H, eps) if has_rmsnorm else None
        self.hnorm = RMSNorm(H, eps) if has_rmsnorm else None
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        self.layer = DecoderLayer(arch)
        self.norm = RMSNorm(H, eps) if has_rmsnorm else None
        self.rotary = Rotary(arch)

    def features(
        self, emb: torch.Tensor, h: torch.Tensor, positions: torch.Tensor, cache: KVCache, new_mask: torch.Tensor
    ) -> torch.Tensor:
        e = self.enorm(emb) if self.enorm is not None else emb
        hh = self.hnorm(h) if self.hnorm is not None else h
        x = self.eh_proj(torch.cat([e, hh], dim=-1))
        return self.run_layer(x, positions, cache, new_mask)

    def head_logits(self, out: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
        z = self.norm(out) if self.norm is not None else out
        return project(z, lm_head).float()


class EagleHead(_RecurrentHead):
    """EAGLE-1/2: fc(cat[emb, h]) -> decoder layer without input norm -> shared lm_head (no final norm)."""

    def __init__(self, arch: LlamaArch, fc_bias: bool = True):
        super().__init__()
        self.arch = arch
        H = arch.hidden_size
        self.fc = nn.Linear(2 * H, H, bias=fc_bias)
        self.layer = DecoderLayer(arch, has_input_norm=False)
        self.rotary = Rotary(arch)

    def features(
        self, emb: torch.Tensor, h: torch.Tensor, positions: torch.Tensor, cache: KVCache, new_mask: torch.Tensor
    ) -> torch.Tensor:
        return self.run_layer(self.fc(torch.cat([emb, h], dim=-1)), positions, cache, new_mask)

    def head_logits(self, out: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
        return project(out, lm_head).float()


class Eagle3Head(_RecurrentHead):
    """EAGLE-3: g = fc(cat[low, mid, high]) (first step only), attention over
    cat[input_layernorm(emb), hidden_norm(g)] (2H) with residual g, own norm + draft-vocab lm_head;
    draft ids map to target ids through d2t."""

    def __init__(self, arch: LlamaArch, target_hidden: int, draft_vocab: int):
        super().__init__()
        self.arch = arch
        H, eps = arch.hidden_size, arch.rms_norm_eps
        self.fc = nn.Linear(3 * target_hidden, H, bias=False)
        self.layer = DecoderLayer(arch, attn_in_dim=2 * H)
        self.layer.hidden_norm = RMSNorm(H, eps)
        self.norm = RMSNorm(H, eps)
        self.lm_head = nn.Linear(H, draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))
        self.rotary = Rotary(arch)

    def features(
        self, emb: torch.Tensor, h: torch.Tensor, positions: torch.Tensor, cache: KVCache, new_mask: torch.Tensor
    ) -> torch.Tensor:
        g = self.fc(h) if h.shape[-1] != self.arch.hidden_size else h
        u = torch.cat([self.layer.input_layernorm(emb), self.layer.hidden_norm(g)], dim=-1)
        return self.run_layer(g, positions, cache, new_mask, attn_input=u)

    def head_logits(self, out: torch.Tensor, lm_head: torch.Tensor | None = None) -> torch.Tensor:
        """Draft-vocab logits (map ids with to_target_ids); the target lm_head is not used."""
        return self.lm_head(self.norm(out)).float()

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]


def layer_arch(base: LlamaArch, **overrides) -> LlamaArch:
    """The architecture of a one-layer drafter derived from the target's (same widths by default)."""
    fields = dict(base.__dict__)
    fields.update(num_hidden_layers=1, tie_word_embeddings=False)
    fields.update(overrides)
    return LlamaArch(**fields)
