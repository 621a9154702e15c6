"""A small, explicit Llama-family forward pass with a KV cache that can hold draft trees.

Why our own and not transformers': speculative decoding needs three things HF's generic cache does
not give cleanly: per-sequence cache lengths in a batch, a tree attention mask over the new tokens,
and committing only the accepted tree nodes (KV rewind). The math is checked against transformers'
LlamaForCausalLM in the tests, so this stays the oracle the kernels and engines are compared with.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trtspec.spec import LlamaArch


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Functional RMSNorm with fp32 accumulation (the formula the CUDA kernel must match)."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rope_inv_freq(arch: LlamaArch) -> torch.Tensor:
    d = arch.head_dim
    inv = 1.0 / (arch.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    rs = arch.rope_scaling or {}
    rtype = rs.get("rope_type", rs.get("type", "default"))
    if rtype == "linear":
        inv = inv / float(rs["factor"])
    elif rtype == "llama3":
        factor = float(rs["factor"])
        low, high = float(rs.get("low_freq_factor", 1.0)), float(rs.get("high_freq_factor", 4.0))
        old = float(rs.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        inv = torch.where(medium, smoothed, scaled)
    return inv.float()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class KVCache:
    """Per-layer K/V of shape [B, capacity, n_kv, head_dim] and a committed length per sequence.

    ``forward`` writes the new tokens at ``lengths[b] + i`` without advancing ``lengths``; the caller
    then ``commit``s the tokens it keeps (all of them after a prefill, the accepted path after a tree).
    """

    def __init__(
        self,
        num_layers: int,
        batch: int,
        n_kv: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ):
        self.k = [torch.zeros(batch, capacity, n_kv, head_dim, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros_like(t) for t in self.k]
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)

    @property
    def capacity(self) -> int:
        return self.k[0].shape[1]

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]

    def ensure(self, needed: int) -> None:
        """Grow (doubling) so that ``needed`` slots exist."""
        if needed <= self.capacity:
            return
        cap = max(needed, 2 * self.capacity)
        for i in range(len(self.k)):
            for store in (self.k, self.v):
                old = store[i]
                new = old.new_zeros(old.shape[0], cap, *old.shape[2:])
                new[:, : old.shape[1]] = old
                store[i] = new

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor, S: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Write a forward's new K/V [B, T, n_kv, d] after each sequence's committed prefix (not committed
        yet) and return the layer's first ``S`` keys and values as [B, n_kv, S, d] for attention."""
        B, T = k.shape[:2]
        pos = self.lengths[:, None] + torch.arange(T, device=k.device)[None, :]
        bidx = torch.arange(B, device=k.device)[:, None]
        self.k[layer][bidx, pos] = k.to(self.k[layer].dtype)
        self.v[layer][bidx, pos] = v.to(self.v[layer].dtype)
        return self.k[layer][:, :S].transpose(1, 2), self.v[layer][:, :S].transpose(1, 2)

    def commit(self, keep: list[torch.Tensor]) -> None:
        """Keep, per sequence b, the new-token offsets ``keep[b]`` (ascending), compacted after the
        committed prefix; everything else written by the last forward is dropped (KV rewind)."""
        for b, idx in enumerate(keep):
            n = int(idx.numel())
            if n == 0:
                continue
            start = int(self.lengths[b])
            if not torch.equal(idx, torch.arange(n, device=idx.device)):
                src = start + idx
                for store in (self.k, self.v):
                    for t in store:
                        t[b, start : start + n] = t[b, src]
            self.lengths[b] += n


def attention_mask(lengths: torch.Tensor, new_mask: torch.Tensor) -> torch.Tensor:
    """[B, 1, T, S] bool: query i of sequence b sees the committed prefix and the new tokens that
    ``new_mask[b, i]`` allows (causal for a chain, ancestors-only for a tree). S = max(lengths) + T."""
    B = lengths.shape[0]
    T = new_mask.shape[-1]
    S = int(lengths.max()) + T
    j = torch.arange(S, device=lengths.device)
    L = lengths[:, None]
    prefix = (j[None, :] < L)[:, None, :].expand(B, T, S)
    rel = j[None, :] - L  # [B, S]
    in_new = (rel >= 0) & (rel < T)
    nm = new_mask.expand(B, T, T)
    gathered = torch.gather(nm, 2, rel.clamp(0, T - 1)[:, None, :].expand(B, T, S))
    return (prefix | (gathered & in_new[:, None, :]))[:, None]


# Steps up to this many new tokens (decode steps and draft trees) use exact_attention in batch-invariant
# mode; longer ones (prefills) keep fused SDPA: plain and speculative decoding run the very same prefill, so
# it needs no invariance, and float64 scores of a long prompt would cost memory quadratic in its length.
EXACT_ATTENTION_MAX_TOKENS = 128


def exact_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Attention with float64 scores, softmax and sums: q [B, Hq, T, d], k/v [B, Hkv, S, d] (GQA: the r =
    Hq/Hkv query heads of a group ride as r*T rows of one matmul), mask [B, 1, T, S] bool. Why: fused SDPA
    kernels block the key axis by the query count, so a query's result changes in its last bits with T (a
    tree) and with S (the masked extra keys); in bfloat16 those bits round differently and greedy
    speculative output drifts from plain decoding. In float64 the order of the sums cannot reach a
    bfloat16 (or float32) rounding, so every row comes out the same for T = 1 and T = N."""
    B, Hq, T, d = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    r = Hq // Hkv
    bias = _additive_mask(mask, r)  # [B, r*T, S]
    if B > 1:
        bias = bias[:, None].expand(B, Hkv, r * T, S).reshape(B * Hkv, r * T, S)
    scores = torch.baddbmm(
        bias,
        q.reshape(B * Hkv, r * T, d).double(),
        k.double().reshape(B * Hkv, S, d).transpose(1, 2),
        alpha=1.0 / math.sqrt(d),
    )
    out = torch.bmm(torch.softmax(scores, dim=-1), v.double().reshape(B * Hkv, S, d))
    return out.view(B, Hq, T, d).to(q.dtype)


_last_mask: tuple = (None, 0, None)  # (mask, r, bias): every layer of one forward gets the same mask object


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, gqa: bool) -> torch.Tensor:
    """PyTorch's fused SDPA (q [B, Hq, T, d], k/v [B, Hkv, S, d], bool mask), in float32 on CPU for
    half-precision inputs. Why: its CPU kernels are several times slower in bfloat16 than in float32 while
    the upcast is O(S) per call (SmolLM2 shapes, one thread of an AVX512-BF16 EPYC: 64 decode rows x 400
    keys 49 -> 15 ms per layer; 1 x 600-token prefill 19 -> 12 ms); the cache builder decodes 64 rows at
    once in bfloat16. Float32 scores are also the more exact ones."""
    if q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16):
        out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=gqa)
        return out.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


def _additive_mask(mask: torch.Tensor, r: int) -> torch.Tensor:
    """[B, 1, T, S] bool -> [B, r*T, S] float64 with 0 / -inf, built once per forward (not per layer).
    The memo is one tuple, read and replaced whole, so concurrent forwards never mix their masks."""
    global _last_mask
    last_mask, last_r, last_bias = _last_mask
    if last_mask is mask and last_r == r:
        return last_bias
    bias = torch.zeros(mask.shape[0], r * mask.shape[2], mask.shape[3], dtype=torch.float64)
    bias.masked_fill_(~mask[:, 0].repeat(1, r, 1), float("-inf"))
    _last_mask = (mask, r, bias)
    return bias


class Attention(nn.Module):
    def __init__(self, arch: LlamaArch, in_dim: int | None = None):
        super().__init__()
        H, d = arch.hidden_size, arch.head_dim
        in_dim = in_dim or H
        self.n_heads, self.n_kv, self.head_dim = arch.num_attention_heads, arch.num_key_value_heads, d
        self.q_proj = nn.Linear(in_dim, self.n_heads * d, bias=arch.attention_bias)
        self.k_proj = nn.Linear(in_dim, self.n_kv * d, bias=arch.attention_bias)
        self.v_proj = nn.Linear(in_dim, self.n_kv * d, bias=arch.attention_bias)
        self.o_proj = nn.Linear(self.n_heads * d, H, bias=False)
        self.qkv: nn.Module | None = None  # fused q/k/v projection, installed by models.packed for inference
        self.batch_invariant = False  # exact_attention instead of SDPA (set by models.packed)
        if arch.qk_norm:
            self.q_norm = RMSNorm(d, arch.rms_norm_eps)
            self.k_norm = RMSNorm(d, arch.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache, layer: int, mask: torch.Tensor
    ) -> torch.Tensor:
        B, T, _ = x.shape
        if self.qkv is not None:
            q, k, v = self.qkv(x).split(self.qkv.split_sizes, dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.reshape(B, T, self.n_heads, self.head_dim)
        k = k.reshape(B, T, self.n_kv, self.head_dim)
        v = v.reshape(B, T, self.n_kv, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        c, s = cos[:, :, None, :], sin[:, :, None, :]
        q = q * c + rotate_half(q) * s
        k = k * c + rotate_half(k) * s
        keys, vals = cache.store(layer, k, v, mask.shape[-1])
        if self.batch_invariant and T <= EXACT_ATTENTION_MAX_TOKENS:
            out = exact_attention(q.transpose(1, 2), keys, vals, mask)
        else:
            out = fused_attention(q.transpose(1, 2), keys, vals, mask, self.n_heads != self.n_kv)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, arch: LlamaArch):
        super().__init__()
        H, I = arch.hidden_size, arch.intermediate_size
        self.gate_proj = nn.Linear(H, I, bias=arch.mlp_bias)
        self.up_proj = nn.Linear(H, I, bias=arch.mlp_bias)
        self.down_proj = nn.Linear(I, H, bias=arch.mlp_bias)
        self.gate_up: nn.Module | None = None  # fused gate/up projection, installed by models.packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is not None:
            gate, up = self.gate_up(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm Llama block. EAGLE-1 drops input_layernorm; EAGLE-3 feeds a 2H attention input."""

    def __init__(self, arch: LlamaArch, has_input_norm: bool = True, attn_in_dim: int | None = None):
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps) if has_input_norm else None
        self.self_attn = Attention(arch, attn_in_dim)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.mlp = MLP(arch)

    def forward(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache,
        layer: int,
        mask: torch.Tensor,
        attn_input: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if attn_input is None:
            attn_input = self.input_layernorm(h) if self.input_layernorm is not None else h
        a = h + self.self_attn(attn_input, cos, sin, cache, layer, mask)
        return a + self.mlp(self.post_attention_layernorm(a))


class Rotary(nn.Module):
    def __init__(self, arch: LlamaArch):
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(arch), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


class LlamaModel(nn.Module):
    """Embedding, decoder layers, final norm, lm_head. Parameter names match HF (``model.`` dropped
    for the body, ``lm_head`` kept), so a HF state_dict loads with one prefix strip."""

    def __init__(self, arch: LlamaArch):
        super().__init__()
        self.arch = arch
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(arch) for _ in range(arch.num_hidden_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)
        self.rotary = Rotary(arch)

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        p = self.lm_head.weight
        return KVCache(
            len(self.layers), batch, self.arch.num_key_value_heads, self.arch.head_dim, capacity, p.dtype, p.device
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        new_mask: torch.Tensor,
        aux_layers: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Run T new tokens per sequence. Returns the final (post-norm) hidden states [B, T, H] and the
        residual stream entering each layer in ``aux_layers`` (EAGLE-3's low/mid/high features; index L =
        the last layer's output, for drafters that read layer outputs)."""
        cache.ensure(int(cache.lengths.max()) + input_ids.shape[1])
        h = self.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, h.dtype)
        mask = attention_mask(cache.lengths, new_mask)
        captured: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            if i in aux_layers:
                captured[i] = h
            h = layer(h, cos, sin, cache, i, mask)
        if len(self.layers) in aux_layers:  # "entering layer L": the last layer's output, before the norm
            captured[len(self.layers)] = h
        return self.norm(h), [captured[i] for i in aux_layers]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()


def load_state(module: nn.Module, tensors, mapping: dict[str, str], dtype: torch.dtype) -> None:
    """Fill ``module``'s parameters from a TensorStore: ``mapping`` maps parameter name -> store name.
    Tensors are read one at a time. Missing names raise KeyError (callers validated shapes already)."""
    state = {}
    for pname, sname in mapping.items():
        state[pname] = tensors.load(sname).to(dtype)
    missing, unexpected = module.load_state_dict(state, strict=False, assign=True)
    real_missing = [m for m in missing if not m.endswith("inv_freq")]
    if real_missing or unexpected:
        raise KeyError(f"state mismatch: missing {real_missing[:5]}, unexpected {unexpected[:5]}")


def build_llama(arch: LlamaArch, tensors, dtype: torch.dtype = torch.float32) -> LlamaModel:
    """A LlamaModel holding the weights of an HF checkpoint (TensorStore with HF names)."""
    with torch.device("meta"):
        model = LlamaModel(arch)
    mapping = {}
    for name, _ in model.named_parameters():
        if name == "lm_head.weight":
            mapping[name] = "lm_head.weight" if "lm_head.weight" in tensors else "model.embed_tokens.weight"
        else:
            mapping[name] = "model." + name
    load_state(model, tensors, mapping, dtype)
    model.rotary = Rotary(arch)
    return model.eval()


def causal_mask(T: int, device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()[None]
