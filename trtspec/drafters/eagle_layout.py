"""The one-layer Llama draft layout SafeAILab/EAGLE publishes, shared by the EAGLE-1/2 and EAGLE-3 kinds.

A ``config.json`` (a one-layer Llama config with the target's widths) next to ``model.safetensors`` (or
``pytorch_model.bin``); the decoder layer's tensors sit under a prefix (``layers.0.`` for EAGLE-1/2,
``midlayer.`` for EAGLE-3) that maps to the canonical ``layer.`` of trtspec's head modules.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from trtspec.checkpoint.target import arch_from_config, read_json
from trtspec.errors import CheckpointError
from trtspec.fsutil import atomic_directory
from trtspec.spec import LlamaArch, TargetSpec

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def read_arch(path: Path, target: TargetSpec, section: str | None = None) -> tuple[LlamaArch, dict]:
    """The drafter layer's architecture from the heads' config.json (one layer, Llama); ``section`` names a
    nested dict that holds the layer's config instead of the top level (speculators'
    ``transformer_layer_config``). Returns the whole config too."""
    cfg_path = path / "config.json" if path.is_dir() else path.parent / "config.json"
    cfg = read_json(cfg_path)
    layer = cfg.get(section) if section else cfg
    if not isinstance(layer, dict):
        raise CheckpointError(f"config.json has no {section} dict", cfg_path)
    layer = {"model_type": "llama", "vocab_size": target.arch.vocab_size, **layer}
    if section is None:
        cfg = layer
    arch = arch_from_config({**layer, "model_type": "llama"}, cfg_path)
    return LlamaArch(**{**arch.__dict__, "num_hidden_layers": 1, "rope_theta": arch.rope_theta}), cfg


def layer_shapes(arch: LlamaArch, in_dim: int) -> dict[str, tuple[int, ...]]:
    """Decoder-layer tensors (input norm excepted) for an attention input of width ``in_dim``."""
    H, I, d = arch.hidden_size, arch.intermediate_size, arch.head_dim
    q, kv = arch.num_attention_heads * d, arch.num_key_value_heads * d
    return {
        "self_attn.q_proj.weight": (q, in_dim),
        "self_attn.k_proj.weight": (kv, in_dim),
        "self_attn.v_proj.weight": (kv, in_dim),
        "self_attn.o_proj.weight": (H, q),
        "mlp.gate_proj.weight": (I, H),
        "mlp.up_proj.weight": (I, H),
        "mlp.down_proj.weight": (H, I),
        "post_attention_layernorm.weight": (H,),
    }


def eagle_config(target: TargetSpec, **extra) -> dict:
    """The config.json SafeAILab EAGLE heads ship: a one-layer Llama config with the target's widths
    (``extra`` adds e.g. bias, draft_vocab_size, architectures)."""
    a = target.arch
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": a.hidden_size,
        "intermediate_size": a.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": a.num_attention_heads,
        "num_key_value_heads": a.num_key_value_heads,
        "vocab_size": a.vocab_size,
        "rms_norm_eps": a.rms_norm_eps,
        "rope_theta": a.rope_theta,
        "max_position_embeddings": a.max_position_embeddings,
        "hidden_act": "silu",
    }
    cfg.update(extra)
    return cfg


def save_layout(out: Path, state: dict[str, torch.Tensor], layer_prefix: str, config: dict) -> Path:
    """Write canonical tensors (``layer.*`` renamed to ``layer_prefix``) + config.json, atomically."""
    renamed = {(layer_prefix + k[len("layer.") :] if k.startswith("layer.") else k): v for k, v in state.items()}
    with atomic_directory(Path(out), overwrite=True) as tmp:
        save_file(renamed, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return Path(out)
