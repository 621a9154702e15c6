"""SafeAILab/EAGLE heads: EAGLE-1/2 (config.json + pytorch_model.bin|model.safetensors) and EAGLE-3.

EAGLE-1/2 keys: ``fc.weight`` [H, 2H], optional ``fc.bias``, ``layers.0.*`` (no input_layernorm), optional
``embed_tokens.weight`` (a frozen copy of the target's; ignored). EAGLE-3 keys: ``fc.weight`` [H, 3H_t],
``midlayer.*`` (hidden_norm, input_layernorm, 2H-input attention), ``norm.weight``, ``lm_head.weight``
[V_d, H], ``d2t`` [V_d], ``t2d`` [V] (training only). Both map onto DrafterSpec canonical names.
"""

from __future__ import annotations

from pathlib import Path

from trtspec.checkpoint.errors import CheckpointError
from trtspec.checkpoint.heads.common import check_hidden, check_vocab, expect_shape, open_weights, single_dtype
from trtspec.checkpoint.target import arch_from_config, read_json
from trtspec.spec import DrafterSpec, LlamaArch, TargetSpec

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
LAYER_PARTS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
               "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
               "post_attention_layernorm.weight")


def _arch(path: Path, target: TargetSpec) -> tuple[LlamaArch, dict]:
    cfg_path = path / "config.json" if path.is_dir() else path.parent / "config.json"
    cfg = read_json(cfg_path)
    cfg.setdefault("model_type", "llama")
    cfg.setdefault("vocab_size", target.arch.vocab_size)
    arch = arch_from_config({**cfg, "model_type": "llama"}, cfg_path)
    return LlamaArch(**{**arch.__dict__, "num_hidden_layers": 1, "rope_theta": arch.rope_theta}), cfg


def _layer_shapes(arch: LlamaArch, in_dim: int) -> dict[str, tuple[int, ...]]:
    H, I, d = arch.hidden_size, arch.intermediate_size, arch.head_dim
    q, kv = arch.num_attention_heads * d, arch.num_key_value_heads * d
    return {"self_attn.q_proj.weight": (q, in_dim), "self_attn.k_proj.weight": (kv, in_dim),
            "self_attn.v_proj.weight": (kv, in_dim), "self_attn.o_proj.weight": (H, q),
            "mlp.gate_proj.weight": (I, H), "mlp.up_proj.weight": (I, H), "mlp.down_proj.weight": (H, I),
            "post_attention_layernorm.weight": (H,)}


def load_eagle(path: Path, target: TargetSpec, allow_pickle: bool = False) -> DrafterSpec:
    arch, cfg = _arch(path, target)
    store = open_weights(path, WEIGHT_FILES, allow_pickle)
    H = arch.hidden_size
    check_hidden(H, target, path)
    check_vocab(arch.vocab_size, target, path)
    expect_shape(store, "fc.weight", (H, 2 * H), path, "EAGLE fc (cat[embedding, hidden])")
    mapping = {"fc.weight": "fc.weight"}
    has_bias = "fc.bias" in store
    if has_bias:
        expect_shape(store, "fc.bias", (H,), path, "EAGLE fc bias")
        mapping["fc.bias"] = "fc.bias"
    for part, shape in _layer_shapes(arch, H).items():
        expect_shape(store, f"layers.0.{part}", shape, path, "the EAGLE decoder layer")
        mapping[f"layer.{part}"] = f"layers.0.{part}"
    config = {"num_heads": 1, "fc_bias": has_bias, "hidden_size": H, "vocab_size": arch.vocab_size,
              "rms_norm_eps": arch.rms_norm_eps}
    return DrafterSpec("eagle", path, store.renamed(mapping), config, arch=arch,
                       dtype=single_dtype(store.renamed(mapping), path))


def eagle3_aux_layers(cfg: dict, num_target_layers: int) -> tuple[int, int, int]:
    """Target layers whose *input* residual stream feeds fc: (2, L//2, L-3) unless the config says."""
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") \
        or cfg.get("eagle_aux_hidden_state_layer_ids")
    L = num_target_layers
    if ids:
        if len(ids) != 3:
            raise CheckpointError(f"eagle_aux_hidden_state_layer_ids must list 3 layers, got {ids}")
        return tuple(int(i) for i in ids)  # type: ignore[return-value]
    return (2, L // 2, L - 3)


def load_eagle3(path: Path, target: TargetSpec, allow_pickle: bool = False) -> DrafterSpec:
    arch, cfg = _arch(path, target)
    store = open_weights(path, WEIGHT_FILES, allow_pickle)
    H, Ht = arch.hidden_size, target.arch.hidden_size
    if "lm_head.weight" not in store:
        raise CheckpointError("EAGLE-3 heads have no lm_head.weight", path, "export the draft lm_head with the heads")
    Vd = int(cfg.get("draft_vocab_size") or store.shape("lm_head.weight")[0])
    expect_shape(store, "fc.weight", (H, 3 * Ht), path, "EAGLE-3 fc (low, mid, high target features)")
    expect_shape(store, "lm_head.weight", (Vd, H), path, "EAGLE-3 draft lm_head")
    if H != Ht and "embed_tokens.weight" not in store:
        raise CheckpointError(f"draft hidden {H} != target hidden {Ht} and no embed_tokens.weight", path,
                              "export the draft embedding with the heads")
    mapping = {"fc.weight": "fc.weight", "lm_head.weight": "lm_head.weight", "norm.weight": "norm.weight"}
    expect_shape(store, "norm.weight", (H,), path, "EAGLE-3 final norm")
    for part, shape in {**_layer_shapes(arch, 2 * H), "hidden_norm.weight": (H,),
                        "input_layernorm.weight": (H,)}.items():
        expect_shape(store, f"midlayer.{part}", shape, path, "the EAGLE-3 midlayer")
        mapping[f"layer.{part}"] = f"midlayer.{part}"
    if Vd != target.arch.vocab_size:
        if "d2t" not in store:
            raise CheckpointError(f"draft vocab {Vd} != target vocab {target.arch.vocab_size} and no d2t map", path,
                                  "export d2t with the heads")
        expect_shape(store, "d2t", (Vd,), path, "the draft-to-target vocab map")
        mapping["d2t"] = "d2t"
    if "embed_tokens.weight" in store:
        mapping["embed_tokens.weight"] = "embed_tokens.weight"
    config = {"num_heads": 1, "hidden_size": H, "target_hidden_size": Ht, "draft_vocab_size": Vd,
              "vocab_size": target.arch.vocab_size, "aux_layers": list(eagle3_aux_layers(cfg, target.arch.num_hidden_layers)),
              "rms_norm_eps": arch.rms_norm_eps}
    renamed = store.renamed(mapping)
    return DrafterSpec("eagle3", path, renamed, config, arch=arch, dtype=single_dtype(renamed, path))


def eagle_config(target: TargetSpec, **extra) -> dict:
    """The config.json SafeAILab EAGLE heads ship: a one-layer Llama config with the target's widths
    (written by the trainer and the demo; ``extra`` adds e.g. bias, draft_vocab_size, architectures)."""
    a = target.arch
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": a.hidden_size,
           "intermediate_size": a.intermediate_size, "num_hidden_layers": 1,
           "num_attention_heads": a.num_attention_heads, "num_key_value_heads": a.num_key_value_heads,
           "vocab_size": a.vocab_size, "rms_norm_eps": a.rms_norm_eps, "rope_theta": a.rope_theta,
           "max_position_embeddings": a.max_position_embeddings, "hidden_act": "silu"}
    cfg.update(extra)
    return cfg
