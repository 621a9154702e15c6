"""Real tiny checkpoints of every head kind, written to disk and read back through trtspec's loaders.

Shared by the convert/build tests (imported, not collected: no test functions here).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from trtspec.demo.tiny import make_tiny_llama
from trtspec.demo.tokenizer import write_char_tokenizer
from trtspec.drafters.trtspec_heads import save_trtspec_heads as save_mtp
from trtspec.load import load_spec_model
from trtspec.spec import DrafterSpec, SpecModel

#: Odd vocab (101) so that lm_head / embedding padding to a multiple of tp is exercised; 2 KV heads so
#: that tp=4 exercises KV-head replication.
TARGET = dict(
    vocab_size=101,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
)
KINDS = ("none", "medusa", "medusa-own-lm-head", "mtp-linear", "mtp-single", "eagle", "draft-model")


def _rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g) * 0.2


def make_target(root: Path, **overrides) -> Path:
    d = make_tiny_llama(root / "target", **{**TARGET, **overrides})
    write_char_tokenizer(d, overrides.get("vocab_size", TARGET["vocab_size"]))  # the Triton repository needs one
    return d


def make_medusa(root: Path, K: int = 3, own_lm_head: bool = False) -> Path:
    H, V = TARGET["hidden_size"], TARGET["vocab_size"]
    d = root / ("medusa_own" if own_lm_head else "medusa")
    d.mkdir(parents=True, exist_ok=True)
    t = {}
    for h in range(K):
        t[f"{h}.0.linear.weight"] = _rand(H, H, seed=h)
        t[f"{h}.0.linear.bias"] = _rand(H, seed=h + 10)
        if own_lm_head:
            t[f"{h}.1.weight"] = _rand(V, H, seed=h + 20)
    save_file(t, str(d / "medusa_lm_head.safetensors"))
    (d / "config.json").write_text(json.dumps({"medusa_num_heads": K, "medusa_num_layers": 1}))
    return d


def make_mtp(root: Path, target_spec, kind: str, K: int = 3) -> Path:
    H = TARGET["hidden_size"]
    t: dict[str, torch.Tensor] = {}
    if kind == "mtp-linear":
        for k in range(K):
            t[f"heads.{k}.norm.weight"] = 1 + _rand(H, seed=k)
            t[f"heads.{k}.res.0.weight"] = _rand(H, H, seed=k + 1)
            t[f"heads.{k}.res.0.bias"] = _rand(H, seed=k + 2)
        return save_mtp(
            root / kind, kind, t, target_spec, num_heads=K, num_layers=1, has_rmsnorm=True, rms_norm_eps=1e-6
        )
    I, nh, nkv, hd = 80, 4, 2, 16
    t = {
        "eh_proj.weight": _rand(H, 2 * H),
        "enorm.weight": 1 + _rand(H, seed=1),
        "hnorm.weight": 1 + _rand(H, seed=2),
        "norm.weight": 1 + _rand(H, seed=3),
        "layer.input_layernorm.weight": 1 + _rand(H, seed=4),
        "layer.post_attention_layernorm.weight": 1 + _rand(H, seed=5),
        "layer.self_attn.q_proj.weight": _rand(nh * hd, H, seed=6),
        "layer.self_attn.k_proj.weight": _rand(nkv * hd, H, seed=7),
        "layer.self_attn.v_proj.weight": _rand(nkv * hd, H, seed=8),
        "layer.self_attn.o_proj.weight": _rand(H, nh * hd, seed=9),
        "layer.mlp.gate_proj.weight": _rand(I, H, seed=10),
        "layer.mlp.up_proj.weight": _rand(I, H, seed=11),
        "layer.mlp.down_proj.weight": _rand(H, I, seed=12),
    }
    return save_mtp(
        root / kind,
        kind,
        t,
        target_spec,
        num_heads=1,
        num_layers=1,
        has_rmsnorm=True,
        rms_norm_eps=1e-6,
        intermediate_size=I,
        num_attention_heads=nh,
        num_key_value_heads=nkv,
        head_dim=hd,
    )


def make_eagle(root: Path, bias: bool = False) -> Path:
    H, V, I = TARGET["hidden_size"], TARGET["vocab_size"], 80
    d = root / "eagle"
    d.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": H,
        "intermediate_size": I,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": V,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 512,
        "hidden_act": "silu",
        "bias": bias,
    }
    (d / "config.json").write_text(json.dumps(cfg))
    hd = H // 4
    t = {
        "fc.weight": _rand(H, 2 * H),
        "layers.0.self_attn.q_proj.weight": _rand(4 * hd, H, seed=1),
        "layers.0.self_attn.k_proj.weight": _rand(2 * hd, H, seed=2),
        "layers.0.self_attn.v_proj.weight": _rand(2 * hd, H, seed=3),
        "layers.0.self_attn.o_proj.weight": _rand(H, 4 * hd, seed=4),
        "layers.0.mlp.gate_proj.weight": _rand(I, H, seed=5),
        "layers.0.mlp.up_proj.weight": _rand(I, H, seed=6),
        "layers.0.mlp.down_proj.weight": _rand(H, I, seed=7),
        "layers.0.post_attention_layernorm.weight": 1 + _rand(H, seed=8),
    }
    if bias:
        t["fc.bias"] = _rand(H, seed=9)
    save_file(t, str(d / "model.safetensors"))
    return d


def make_draft_model(root: Path) -> Path:
    return make_tiny_llama(
        root / "draft",
        seed=1,
        **{
            **TARGET,
            "num_hidden_layers": 2,
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
        },
    )


def make_spec(root: Path, kind: str, tree=None) -> SpecModel:
    """A SpecModel for ``kind`` (see KINDS) through the real loaders."""
    target = root / "target"
    if not (target / "config.json").exists():
        make_target(root)
    if kind == "none":
        return load_spec_model(target)
    if kind in ("medusa", "medusa-own-lm-head"):
        heads = make_medusa(root, own_lm_head=kind.endswith("lm-head"))
        return load_spec_model(target, heads, "medusa", tree=tree)
    if kind in ("mtp-linear", "mtp-single"):
        base = load_spec_model(target).target
        return load_spec_model(target, make_mtp(root, base, kind), kind, tree=tree or "chain:3")
    if kind == "eagle":
        return load_spec_model(target, make_eagle(root), "eagle", tree=tree)
    if kind == "draft-model":
        return load_spec_model(target, make_draft_model(root), "draft-model", tree=tree or "chain:4")
    raise ValueError(kind)


def eagle3_spec(root: Path) -> SpecModel:
    """An EAGLE-3 drafter (hand-made canonical tensors: only its refusal is tested)."""
    base = make_spec(root, "none")
    from trtspec.checkpoint.tensors import TensorStore

    d = DrafterSpec(
        "eagle3",
        root / "eagle3",
        TensorStore.from_tensors({"fc.weight": torch.zeros(64, 192)}),
        {"num_heads": 1, "draft_vocab_size": 97},
    )
    return SpecModel(base.target, d, base.tree, base.dtype)
