"""The block drafter backbone: a few decoder layers that fill a whole block of draft tokens in one forward.

Why a module of its own: a block drafter conditions on the target differently from every other head.
The target's hidden states at chosen layers (concatenated, ``fc``, ``hidden_norm``) form a *context*: one
vector per committed position, projected by each draft layer's own ``k_proj``/``v_proj`` (+ ``k_norm``,
rotary) into that layer's keys and values, with no input norm. The block is ``[anchor, mask x (B-1)]``
(anchor = the last committed token, not yet seen by the target), embedded with the target's embedding;
its queries see the whole context and every block position (no causal mask inside the block), so one
forward yields B-1 draft tokens through the target's lm_head. Parameter names are the public layout's
(``layers.{i}.self_attn.q_norm.weight``, ``fc.weight``, ``hidden_norm.weight``, ``norm.weight``), so a
checkpoint loads with no renaming. The same module runs in the runtime (context keys cached across
steps) and in the trainer (many anchors per sequence under one block-sparse mask).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trtspec.models.llama import MLP, RMSNorm, Rotary, fused_attention, rotate_half
from trtspec.spec import LlamaArch


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, heads, d], cos/sin [B, T, d]."""
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    return x * c + rotate_half(x) * s


class BlockAttention(nn.Module):
    """Attention whose keys are the context's (cached, computed by ``kv`` from the context vectors) and
    the block's own. q/k norms are per head (Qwen3), applied before rotary."""

    def __init__(self, arch: LlamaArch):
        super().__init__()
        H, d = arch.hidden_size, arch.head_dim
        self.n_heads, self.n_kv, self.head_dim = arch.num_attention_heads, arch.num_key_value_heads, d
        self.q_proj = nn.Linear(H, self.n_heads * d, bias=arch.attention_bias)
        self.k_proj = nn.Linear(H, self.n_kv * d, bias=arch.attention_bias)
        self.v_proj = nn.Linear(H, self.n_kv * d, bias=arch.attention_bias)
        self.o_proj = nn.Linear(self.n_heads * d, H, bias=arch.attention_bias)
        self.q_norm = RMSNorm(d, arch.rms_norm_eps) if arch.qk_norm else None
        self.k_norm = RMSNorm(d, arch.rms_norm_eps) if arch.qk_norm else None

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (normed, rotated) and values [B, T, n_kv, d] of ``x``."""
        B, T, _ = x.shape
        k = self.k_proj(x).reshape(B, T, self.n_kv, self.head_dim)
        if self.k_norm is not None:
            k = self.k_norm(k)
        return _rope(k, cos, sin), self.v_proj(x).reshape(B, T, self.n_kv, self.head_dim)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        prefix: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """x [B, M, H] (normed block input); prefix (k, v) [B, S, n_kv, d]; mask [B, 1, M, S + M] bool."""
        B, M, _ = x.shape
        q = self.q_proj(x).reshape(B, M, self.n_heads, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
        q = _rope(q, cos, sin)
        k, v = self.kv(x, cos, sin)
        keys = torch.cat([prefix[0].to(k.dtype), k], 1).transpose(1, 2)
        vals = torch.cat([prefix[1].to(v.dtype), v], 1).transpose(1, 2)
        out = fused_attention(q.transpose(1, 2), keys, vals, mask, self.n_heads != self.n_kv)
        return self.o_proj(out.transpose(1, 2).reshape(B, M, -1))


class BlockLayer(nn.Module):
    def __init__(self, arch: LlamaArch):
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.self_attn = BlockAttention(arch)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.mlp = MLP(arch)

    def forward(self, h, cos, sin, prefix, mask) -> torch.Tensor:
        a = h + self.self_attn(self.input_layernorm(h), cos, sin, prefix, mask)
        return a + self.mlp(self.post_attention_layernorm(a))


class BlockDraftModel(nn.Module):
    """``layers.*``, ``norm``, ``fc`` [H, n*H_t], ``hidden_norm`` (see the module doc). ``block_size``,
    ``mask_token_id`` and ``aux_layers`` (the target layers whose *input* residual stream is the context,
    in trtspec's capture convention) travel with the module, not in its state.

    ``draft_offset`` says which block outputs draft: 0 = block position j predicts the token *at* p+j
    (j = 1 .. B-1: B-1 drafts, the anchor's output unused); 1 = position j predicts the token at p+j+1
    (j = 0 .. B-1: B drafts, next-token style). Either way draft i (0-based) is the token at p+i+1."""

    draft_offset = 0

    def __init__(
        self, arch: LlamaArch, target_hidden: int, aux_layers: tuple[int, ...], block_size: int, mask_token_id: int
    ):
        super().__init__()
        self.arch = arch
        self.aux_layers, self.block_size, self.mask_token_id = tuple(aux_layers), int(block_size), int(mask_token_id)
        H = arch.hidden_size
        self.layers = nn.ModuleList(BlockLayer(arch) for _ in range(arch.num_hidden_layers))
        self.norm = RMSNorm(H, arch.rms_norm_eps)
        self.fc = nn.Linear(len(self.aux_layers) * target_hidden, H, bias=False)
        self.hidden_norm = RMSNorm(H, arch.rms_norm_eps)
        self.rotary = Rotary(arch)

    @property
    def num_drafts(self) -> int:
        return self.block_size - 1 + self.draft_offset

    def draft_states(self, h: torch.Tensor) -> torch.Tensor:
        """The block outputs [..., B, H] that draft, in draft order [..., num_drafts, H]."""
        return h[..., 1 - self.draft_offset :, :]

    def context_kv(self, aux: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the context's keys and values [B, T, n_kv, d] from the target's concatenated
        aux states [B, T, n*H_t] at ``positions`` [B, T]."""
        ctx = self.hidden_norm(self.fc(aux))
        cos, sin = self.rotary(positions, ctx.dtype)
        return [layer.self_attn.kv(ctx, cos, sin) for layer in self.layers]

    def blocks(
        self,
        emb: torch.Tensor,
        positions: torch.Tensor,
        prefix: list[tuple[torch.Tensor, torch.Tensor]],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """The final-normed hidden states [B, M, H] of block tokens ``emb`` [B, M, H] at ``positions``;
        ``prefix`` per layer (k, v) [B, S, ...]; ``mask`` [B, 1, M, S + M] (what each query may see)."""
        h = emb
        cos, sin = self.rotary(positions, h.dtype)
        for layer, kv in zip(self.layers, prefix):
            h = layer(h, cos, sin, kv, mask)
        return self.norm(h)


class MarkovHead(nn.Module):
    """A low-rank bigram logit bias ``markov_w2(markov_w1[prev])``: added to the logits of draft i with
    prev = the token before it (the anchor for draft 0), so a block drafted in one forward still depends
    on its own earlier tokens (applied sequentially when drafting)."""

    def __init__(self, vocab: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = nn.Linear(rank, vocab, bias=False)

    def prev_embeddings(self, prev: torch.Tensor) -> torch.Tensor:
        return self.markov_w1(prev)

    def forward(self, prev: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The bias over the whole vocabulary, or over its ``rows`` only (a training loss over a draft
        vocabulary: the full [N, V] bias would be most of a step's work and memory, then sliced away)."""
        if rows is None:
            return self.markov_w2(self.markov_w1(prev))
        return F.linear(self.markov_w1(prev), self.markov_w2.weight[rows])


class ConfidenceHead(nn.Module):
    """``proj``: one logit per draft, sigmoid = the chance the target accepts it given its prefix was."""

    def __init__(self, in_dim: int):
        super().__init__()
        self.proj = nn.Linear(in_dim, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features).squeeze(-1).float()


class MarkovBlockDraftModel(BlockDraftModel):
    """The block backbone with next-token drafts (``draft_offset`` 1), a Markov head (``markov_head.*``;
    rank 0 = none) and a confidence head (``confidence_head.proj``, input = draft state, plus the Markov
    embedding of prev when ``confidence_with_markov``)."""

    draft_offset = 1

    def __init__(
        self,
        arch: LlamaArch,
        target_hidden: int,
        aux_layers: tuple[int, ...],
        block_size: int,
        mask_token_id: int,
        vocab_size: int,
        markov_rank: int,
        confidence: bool = True,
        confidence_with_markov: bool = True,
    ):
        super().__init__(arch, target_hidden, aux_layers, block_size, mask_token_id)
        self.markov_head = MarkovHead(vocab_size, markov_rank) if markov_rank > 0 else None
        self.confidence_with_markov = bool(confidence and confidence_with_markov and markov_rank > 0)
        width = arch.hidden_size + (markov_rank if self.confidence_with_markov else 0)
        self.confidence_head = ConfidenceHead(width) if confidence else None

    def confidence(self, states: torch.Tensor, prev: torch.Tensor) -> torch.Tensor | None:
        """Per-draft acceptance logits [...] from draft states [..., H] and their prev tokens [...]."""
        if self.confidence_head is None:
            return None
        if self.confidence_with_markov:
            emb = self.markov_head.prev_embeddings(prev).to(states.dtype)
            states = torch.cat([states, emb], -1)
        return self.confidence_head(states)


class ContextCache:
    """The context keys/values of every committed position, per draft layer: [B, capacity, n_kv, d]."""

    def __init__(self, layers: int, batch: int, n_kv: int, head_dim: int, capacity: int, dtype: torch.dtype):
        self.k = [torch.zeros(batch, capacity, n_kv, head_dim, dtype=dtype) for _ in range(layers)]
        self.v = [torch.zeros_like(t) for t in self.k]
        self.lengths = torch.zeros(batch, dtype=torch.long)

    def append(
        self, kv: list[tuple[torch.Tensor, torch.Tensor]], counts: torch.Tensor, rows: list[int] | None = None
    ) -> None:
        """Append the first ``counts[b]`` rows of each layer's (k, v) [B, T, ...] after sequence b's prefix.
        ``rows``: the slots the B sequences live in (in-flight batching); None = rows 0..B-1."""
        slots = torch.arange(counts.shape[0]) if rows is None else torch.as_tensor(rows, dtype=torch.long)
        need = int((self.lengths[slots] + counts).max())
        if need > self.k[0].shape[1]:
            grow = max(need, 2 * self.k[0].shape[1])
            for store in (self.k, self.v):
                for i, t in enumerate(store):
                    new = t.new_zeros(t.shape[0], grow, *t.shape[2:])
                    new[:, : t.shape[1]] = t
                    store[i] = new
        for b, (slot, n) in enumerate(zip(slots.tolist(), counts.tolist())):
            start = int(self.lengths[slot])
            for i, (k, v) in enumerate(kv):
                self.k[i][slot, start : start + n] = k[b, :n].to(self.k[i].dtype)
                self.v[i][slot, start : start + n] = v[b, :n].to(self.v[i].dtype)
        self.lengths[slots] += counts

    def forget(self, rows: list[int]) -> None:
        """Slots ``rows`` start new sequences: their context restarts empty (old keys are masked out)."""
        self.lengths[torch.as_tensor(rows, dtype=torch.long)] = 0

    def prefix(self, rows: list[int] | None = None) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        """Per layer (k, v) up to the longest sequence, and the validity [B, S] of each key; for the slots
        ``rows`` only when given (gathered), all rows otherwise."""
        if rows is None:
            S = int(self.lengths.max())
            valid = torch.arange(S)[None, :] < self.lengths[:, None]
            return [(k[:, :S], v[:, :S]) for k, v in zip(self.k, self.v)], valid
        slots = torch.as_tensor(rows, dtype=torch.long)
        lengths = self.lengths[slots]
        S = int(lengths.max())
        valid = torch.arange(S)[None, :] < lengths[:, None]
        return [(k[slots, :S], v[slots, :S]) for k, v in zip(self.k, self.v)], valid
