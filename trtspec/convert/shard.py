"""Tensor-parallel split rules, exactly as TensorRT-LLM 1.2 lays weights out per rank.

Sources (NVIDIA/TensorRT-LLM): ``tensorrt_llm/models/llama/convert.py`` (load_weights_from_hf_model:
q/k/v split per rank then concatenated, o_proj and down_proj split on dim 1, gate/up split on dim 0,
lm_head padded to a multiple of tp then split on dim 0), ``tensorrt_llm/models/convert_utils.py``
(``dup_kv_weight``: when num_kv_heads < tp every KV head is repeated tp/num_kv times so each rank gets
one), ``tensorrt_llm/layers/embedding.py`` (vocab-parallel embedding: ceil(V/tp) rows per rank when
embedding_sharding_dim=0, H/tp columns when 1), ``tensorrt_llm/_utils.py`` (pad_vocab_size).

Every rule can also ``merge`` the per-rank pieces back into the source tensors: the round-trip tests
use that, and the semantic test (a TP-aware forward over the rank files) checks the layout itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from trtspec.checkpoint.tensors import TensorStore
from trtspec.errors import UsageError


def pad_vocab_size(vocab_size: int, tp_size: int) -> int:
    """TensorRT-LLM's ``pad_vocab_size``: the next multiple of tp_size."""
    return int(math.ceil(vocab_size / tp_size) * tp_size)


# Sources ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """A tensor read lazily from a TensorStore (one at a time, when its job runs)."""

    store: TensorStore
    name: str

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.store.shape(self.name))

    @property
    def nbytes(self) -> int:
        return self.store[self.name].nbytes

    def load(self) -> torch.Tensor:
        from trtspec.convert.reader import load

        return load(self.store, self.name)

    def describe(self) -> str:
        return self.name


@dataclass(frozen=True)
class Zeros:
    """A tensor the engine needs but the source lacks (e.g. EAGLE fc.bias when the head has no bias)."""

    shape: tuple[int, ...]

    nbytes = 0

    def load(self) -> torch.Tensor:
        return torch.zeros(self.shape, dtype=torch.float32)

    def describe(self) -> str:
        return f"zeros{list(self.shape)}"


# Rules -----------------------------------------------------------------------------------------


class Rule:
    """How one logical tensor (from one or more sources) becomes tp_size per-rank tensors."""

    def shapes(self, src: list[tuple[int, ...]], tp: int) -> list[tuple[int, ...]]:
        raise NotImplementedError

    def split(self, src: list[torch.Tensor], tp: int) -> list[torch.Tensor]:
        raise NotImplementedError

    def merge(self, parts: list[torch.Tensor], src_shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
        """Inverse of ``split``: the source tensors again (exactly)."""
        raise NotImplementedError


class Replicate(Rule):
    """Norm weights, biases of row-parallel layers: every rank holds the full tensor."""

    def shapes(self, src, tp):
        return [tuple(src[0])] * tp

    def split(self, src, tp):
        return [src[0]] * tp

    def merge(self, parts, src_shapes):
        for p in parts[1:]:
            if not torch.equal(p, parts[0]):
                raise ValueError("replicated tensor differs between ranks")
        return [parts[0]]


@dataclass
class Split(Rule):
    """Split on ``dim``; with ``pad`` the dim is zero-padded to a multiple of tp first (vocab rows).

    dim 0 = ColumnLinear output features (gate, up, lm_head, Medusa/EAGLE fc), dim 1 = RowLinear input
    features (attention.dense, mlp.proj).
    """

    dim: int
    pad: bool = False

    def _padded(self, n: int, tp: int) -> int:
        if self.pad:
            return pad_vocab_size(n, tp)
        if n % tp:
            raise UsageError(
                f"dimension {n} is not divisible by tp_size {tp}",
            )
        return n

    def shapes(self, src, tp):
        s = list(src[0])
        s[self.dim] = self._padded(s[self.dim], tp) // tp
        return [tuple(s)] * tp

    def split(self, src, tp):
        t = src[0]
        n = t.shape[self.dim]
        padded = self._padded(n, tp)
        if padded != n:
            pad_shape = list(t.shape)
            pad_shape[self.dim] = padded - n
            t = torch.cat([t, torch.zeros(pad_shape, dtype=t.dtype)], dim=self.dim)
        if tp == 1:
            return [t]
        return [c.contiguous() for c in torch.chunk(t, tp, dim=self.dim)]

    def merge(self, parts, src_shapes):
        full = torch.cat(parts, dim=self.dim)
        return [full.narrow(self.dim, 0, src_shapes[0][self.dim])]


@dataclass
class QKV(Rule):
    """Fused qkv: sources [q, k, v] (weights [n*d, in] or biases [n*d]); rank r gets cat(q_r, k_r, v_r).

    When num_kv_heads < tp (and tp % num_kv_heads == 0) the KV heads are duplicated first, as
    TensorRT-LLM's dup_kv_weight does, so each rank holds exactly one KV head.
    """

    num_heads: int
    num_kv_heads: int
    head_dim: int

    def check(self, tp: int) -> int:
        """Validate the head counts for tp; returns the KV replication factor."""
        if self.num_heads % tp:
            raise UsageError(f"num_attention_heads {self.num_heads} is not divisible by tp_size {tp}")
        if self.num_kv_heads >= tp:
            if self.num_kv_heads % tp:
                raise UsageError(f"num_key_value_heads {self.num_kv_heads} is not divisible by tp_size {tp}")
            return 1
        if tp % self.num_kv_heads:
            raise UsageError(
                f"tp_size {tp} is not a multiple of num_key_value_heads {self.num_kv_heads} "
                "(KV heads can only be replicated a whole number of times)"
            )
        return tp // self.num_kv_heads

    def _dup(self, t: torch.Tensor, reps: int) -> torch.Tensor:
        if reps == 1:
            return t
        heads = t.reshape(self.num_kv_heads, self.head_dim, *t.shape[1:])
        return heads.repeat_interleave(reps, dim=0).reshape(self.num_kv_heads * reps * self.head_dim, *t.shape[1:])

    def shapes(self, src, tp):
        reps = self.check(tp)
        q, k = src[0], src[1]
        rows = q[0] // tp + 2 * (k[0] * reps // tp)
        return [(rows, *q[1:])] * tp

    def split(self, src, tp):
        reps = self.check(tp)
        q, k, v = src
        k, v = self._dup(k, reps), self._dup(v, reps)
        qs, ks, vs = (torch.chunk(x, tp, dim=0) for x in (q, k, v))
        return [torch.cat([qs[r], ks[r], vs[r]], dim=0).contiguous() for r in range(tp)]

    def merge(self, parts, src_shapes):
        tp = len(parts)
        reps = self.check(tp)
        nq = src_shapes[0][0] // tp
        nk = src_shapes[1][0] * reps // tp
        qs, ks, vs = zip(*(torch.split(p, [nq, nk, nk], dim=0) for p in parts))
        q, k, v = torch.cat(qs), torch.cat(ks), torch.cat(vs)
        if reps > 1:
            k = k.reshape(self.num_kv_heads, reps, self.head_dim, *k.shape[1:])[:, 0]
            v = v.reshape(self.num_kv_heads, reps, self.head_dim, *v.shape[1:])[:, 0]
            k, v = k.reshape(src_shapes[1]), v.reshape(src_shapes[2])
        return [q, k, v]


class Stack(Rule):
    """K same-shaped sources stacked on a new dim 0, replicated (our RmsNormHeads plugin's [K, H])."""

    def shapes(self, src, tp):
        return [(len(src), *src[0])] * tp

    def split(self, src, tp):
        return [torch.stack(src, dim=0)] * tp

    def merge(self, parts, src_shapes):
        Replicate().merge(parts, src_shapes)
        return list(torch.unbind(parts[0], dim=0))


def embedding_rule(use_parallel_embedding: bool, sharding_dim: int) -> Rule:
    """``transformer.vocab_embedding.weight``: replicated unless use_parallel_embedding."""
    if not use_parallel_embedding:
        return Replicate()
    if sharding_dim not in (0, 1):
        raise UsageError(f"embedding_sharding_dim must be 0 or 1, got {sharding_dim}")
    return Split(dim=0, pad=True) if sharding_dim == 0 else Split(dim=1)


LM_HEAD = Split(dim=0, pad=True)
COLUMN = Split(dim=0)
ROW = Split(dim=1)
REPLICATE = Replicate()
STACK = Stack()
