"""config.json builders for TensorRT-LLM 1.2 checkpoints, and the fields its loaders read.

``PretrainedConfig.from_json_file`` -> ``MODEL_MAP[config['architecture']].config_class(**config)``;
the keyword-only arguments without defaults must be present, and every other field we rely on is
written explicitly so a changed default cannot change the engine. Sources (NVIDIA/TensorRT-LLM):
- ``tensorrt_llm/models/modeling_utils.py::PretrainedConfig.__init__`` (architecture, dtype, hidden_size,
  num_hidden_layers, num_attention_heads required; vocab_size, hidden_act, logits_dtype, norm_epsilon,
  position_embedding_type, max_position_embeddings, num_key_value_heads, intermediate_size, mapping,
  quantization, use_parallel_embedding, embedding_sharding_dim, head_size, qk_layernorm read);
- ``tensorrt_llm/models/llama/config.py::LLaMAConfig`` (mlp_bias, attn_bias, rotary_base, rotary_scaling,
  residual_mlp; tie_word_embeddings as a passthrough kwarg);
- ``tensorrt_llm/models/medusa/config.py::MedusaConfig`` (num_medusa_heads, num_medusa_layers,
  max_draft_len);
- ``tensorrt_llm/models/eagle/config.py::EagleConfig`` (num_eagle_layers, max_non_leaves_per_layer,
  max_draft_len <= 256, eagle_net_config = a LLaMAConfig dict read with ``LLaMAConfig.from_dict``).
"""

from __future__ import annotations

from typing import Any

import torch

from trtspec.convert.names import Mapping
from trtspec.dtypes import DTYPE_NAMES  # noqa: F401 (the one dtype table; re-exported)
from trtspec.spec import LlamaArch

#: architecture -> {field: allowed python types}. What TensorRT-LLM 1.2 reads for that architecture.
PRETRAINED_FIELDS: dict[str, tuple[type, ...]] = {
    "architecture": (str,),
    "dtype": (str,),
    "hidden_size": (int,),
    "num_hidden_layers": (int,),
    "num_attention_heads": (int,),
    "vocab_size": (int,),
    "hidden_act": (str,),
    "logits_dtype": (str,),
    "norm_epsilon": (float,),
    "position_embedding_type": (str,),
    "max_position_embeddings": (int,),
    "num_key_value_heads": (int,),
    "intermediate_size": (int,),
    "mapping": (dict,),
    "quantization": (dict,),
    "use_parallel_embedding": (bool,),
    "embedding_sharding_dim": (int,),
    "head_size": (int,),
    "qk_layernorm": (bool,),
}
LLAMA_FIELDS: dict[str, tuple[type, ...]] = {
    **PRETRAINED_FIELDS,
    "mlp_bias": (bool,),
    "attn_bias": (bool,),
    "rotary_base": (float,),
    "rotary_scaling": (dict, type(None)),
    "residual_mlp": (bool,),
    "tie_word_embeddings": (bool,),
}
MEDUSA_FIELDS = {**LLAMA_FIELDS, "num_medusa_heads": (int,), "num_medusa_layers": (int,), "max_draft_len": (int,)}
EAGLE_FIELDS = {
    **LLAMA_FIELDS,
    "num_eagle_layers": (int,),
    "max_non_leaves_per_layer": (int,),
    "max_draft_len": (int,),
    "eagle_net_config": (dict,),
}
REQUIRED_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "LlamaForCausalLM": LLAMA_FIELDS,
    "MistralForCausalLM": LLAMA_FIELDS,
    "MedusaForCausalLM": MEDUSA_FIELDS,
    "EagleForCausalLM": EAGLE_FIELDS,
}
MAPPING_FIELDS = {"world_size": (int,), "tp_size": (int,), "pp_size": (int,)}
QUANT_FIELDS = {"quant_algo": (type(None), str), "kv_cache_quant_algo": (type(None), str)}
#: EagleConfig asserts this (examples/eagle/convert_checkpoint.py: "max_draft_len > 256 is not supported").
EAGLE_MAX_DRAFT_LEN = 256

HF_ARCH_NAMES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}


def rotary_scaling(arch: LlamaArch) -> dict[str, Any] | None:
    """HF rope_scaling, with both ``type`` and ``rope_type`` keys (1.2's Attention reads either)."""
    rs = arch.rope_scaling
    if not rs:
        return None
    rtype = rs.get("rope_type", rs.get("type", "default"))
    if rtype == "default":
        return None
    out = {k: v for k, v in rs.items() if v is not None}
    out["type"] = rtype
    out["rope_type"] = rtype
    return out


def llama_config(
    arch: LlamaArch,
    dtype: torch.dtype,
    mapping: Mapping,
    architecture: str,
    use_parallel_embedding: bool = False,
    embedding_sharding_dim: int = 0,
) -> dict[str, Any]:
    """A LLaMAConfig dict for ``arch`` (target, draft model, or an EAGLE drafter's one layer)."""
    return {
        "architecture": architecture,
        "dtype": DTYPE_NAMES[dtype],
        "logits_dtype": "float32",
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size,
        "num_hidden_layers": arch.num_hidden_layers,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_key_value_heads,
        "head_size": arch.head_dim,
        "intermediate_size": arch.intermediate_size,
        "hidden_act": arch.hidden_act,
        "norm_epsilon": float(arch.rms_norm_eps),
        "position_embedding_type": "rope_gpt_neox",
        "max_position_embeddings": arch.max_position_embeddings,
        "rotary_base": float(arch.rope_theta),
        "rotary_scaling": rotary_scaling(arch),
        "mapping": mapping.to_config(),
        "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
        "use_parallel_embedding": bool(use_parallel_embedding),
        "embedding_sharding_dim": int(embedding_sharding_dim),
        "qk_layernorm": False,
        "attn_bias": bool(arch.attention_bias),
        "mlp_bias": bool(arch.mlp_bias),
        "residual_mlp": False,
        "tie_word_embeddings": bool(arch.tie_word_embeddings),
    }


def check_config(cfg: dict[str, Any]) -> list[str]:
    """Problems with a config.json dict against what 1.2 reads (empty list = fine)."""
    problems: list[str] = []
    arch = cfg.get("architecture")
    fields = REQUIRED_FIELDS.get(arch)
    if fields is None:
        return [f"architecture {arch!r} is not one trtspec writes ({', '.join(REQUIRED_FIELDS)})"]

    def check(d: dict[str, Any], spec: dict[str, tuple[type, ...]], where: str) -> None:
        for key, types in spec.items():
            if key not in d:
                problems.append(f"{where}{key} missing")
            elif not isinstance(d[key], types) or (isinstance(d[key], bool) and bool not in types):
                problems.append(
                    f"{where}{key} is {type(d[key]).__name__}, expected {'/'.join(t.__name__ for t in types)}"
                )

    check(cfg, fields, "")
    if isinstance(cfg.get("mapping"), dict):
        check(cfg["mapping"], MAPPING_FIELDS, "mapping.")
        m = cfg["mapping"]
        if all(isinstance(m.get(k), int) for k in MAPPING_FIELDS) and m["world_size"] != m["tp_size"] * m["pp_size"]:
            problems.append("mapping.world_size != tp_size * pp_size")
    if isinstance(cfg.get("quantization"), dict):
        check(cfg["quantization"], QUANT_FIELDS, "quantization.")
    if arch == "EagleForCausalLM" and isinstance(cfg.get("eagle_net_config"), dict):
        check(cfg["eagle_net_config"], LLAMA_FIELDS, "eagle_net_config.")
        if isinstance(cfg.get("max_draft_len"), int) and cfg["max_draft_len"] > EAGLE_MAX_DRAFT_LEN:
            problems.append(f"max_draft_len {cfg['max_draft_len']} > {EAGLE_MAX_DRAFT_LEN}")
    return problems
