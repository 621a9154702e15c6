"""SpecModel: the one in-memory description of a speculative-decoding deployment.

Every stage (reference runtime, trainer, converter, engine build, Triton emitter) is a function of a
SpecModel plus its own options; none of them re-parses checkpoint files. Tensors stay on disk behind a
lazy TensorStore until a stage asks for one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trtspec.checkpoint.tensors import TensorStore
from trtspec.parallel import Mapping
from trtspec.tree import TreeSpec

__all__ = ["DrafterSpec", "LlamaArch", "Mapping", "SpecModel", "TargetSpec", "TreeSpec"]


@dataclass(frozen=True)
class LlamaArch:
    """The decoder architecture fields every Llama-family model shares (Llama, Mistral, Qwen2, Qwen3).

    Used for the target, a separate draft model, and the single decoder layer inside EAGLE/MTP heads.
    """

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: q/k/v have biases
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: per-head RMSNorm on q and k
    hidden_act: str = "silu"
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def to_hf_dict(self) -> dict[str, Any]:
        """A Hugging Face style config dict (what convert/ and the EAGLE eagle_net_config need)."""
        return {
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "mlp_bias": self.mlp_bias,
            "hidden_act": self.hidden_act,
        }


@dataclass
class TargetSpec:
    """The target (verifier) model. Tensor names are the Hugging Face ones (``model.layers.0...``)."""

    path: Path
    arch: LlamaArch
    tensors: TensorStore
    dtype: torch.dtype
    tokenizer_path: Path | None
    config: dict[str, Any] = field(default_factory=dict)  # the raw config.json
    fingerprint: str = ""

    @property
    def lm_head_name(self) -> str:
        """``lm_head.weight``, or the embedding when the checkpoint ties them."""
        return "lm_head.weight" if "lm_head.weight" in self.tensors else "model.embed_tokens.weight"


@dataclass
class DrafterSpec:
    """The drafter: its kind, its own config, and its tensors under canonical names.

    Canonical tensor names per kind (the loaders in checkpoint/ map published layouts onto these):
      medusa / mtp-linear: ``heads.{k}.res.{l}.weight|bias``, optional ``heads.{k}.norm.weight``
          (mtp-linear with RMSNorm), optional ``heads.{k}.lm_head.weight`` (else the target's lm_head).
      mtp-single: ``enorm.weight``, ``hnorm.weight`` (when has_rmsnorm), ``eh_proj.weight`` [H, 2H],
          ``layer.*`` (one Llama decoder layer, HF sub-names), ``norm.weight`` (when has_rmsnorm).
      eagle: ``fc.weight`` [H, 2H], optional ``fc.bias``, ``layer.*`` without ``layer.input_layernorm``.
      eagle3: ``fc.weight`` [H, 3H_t], ``layer.hidden_norm.weight``, ``layer.input_layernorm.weight``,
          ``layer.post_attention_layernorm.weight``, ``layer.self_attn.*`` (q/k/v take 2H),
          ``layer.mlp.*``, ``norm.weight``, ``lm_head.weight`` [V_d, H], optional ``d2t`` [V_d].
      draft-model: the draft model's own Hugging Face names (``model.layers.0...``).
    ``config`` holds the kind's fields: num_heads, num_layers, has_rmsnorm, rms_norm_eps, draft_vocab_size,
    aux_layers (eagle3), ...; ``arch`` is the decoder architecture of the drafter's layer(s) if any.
    """

    kind: str  # a registered kind's name (trtspec.drafters.registry)
    path: Path
    tensors: TensorStore
    config: dict[str, Any]
    arch: LlamaArch | None = None
    dtype: torch.dtype = torch.float32
    tokenizer_path: Path | None = None
    draft_vocab: torch.Tensor | None = None  # target ids the drafter may propose (None = all); see heads/draft_vocab

    @property
    def num_heads(self) -> int:
        return int(self.config.get("num_heads", 1))


@dataclass
class SpecModel:
    """Target + drafter + tree + dtype + parallel mapping: what every stage takes."""

    target: TargetSpec
    drafter: DrafterSpec | None
    tree: TreeSpec
    dtype: torch.dtype
    parallel: Mapping = field(default_factory=Mapping)
    #: a model-free drafter run beside ``drafter`` (runtime: per step the better proposal is drafted)
    also: DrafterSpec | None = None

    def describe(self) -> str:
        a = self.target.arch
        d = self.drafter.kind if self.drafter else "none"
        if self.drafter is not None and self.drafter.draft_vocab is not None:
            d += f" (draft vocab {self.drafter.draft_vocab.numel()})"
        if self.also is not None:
            d += f" + {self.also.kind}"
        return (
            f"target {a.model_type} {a.num_hidden_layers}L h{a.hidden_size} v{a.vocab_size} "
            f"({self.target.path}), drafter {d}, tree {self.tree.num_nodes} nodes depth {self.tree.depth}, "
            f"dtype {str(self.dtype).removeprefix('torch.')}, tp{self.parallel.tp_size} pp{self.parallel.pp_size}"
        )
