"""The embedded demo: a tiny Llama target with a tokenizer, and heads of every kind in their published
formats (FasterDecoding Medusa, SafeAILab EAGLE-1/2 and EAGLE-3, trtspec MTP, a truncated draft model).

Everything is written as real files and then read back through the same loaders a user's checkpoint
goes through, so the demo exercises the whole load -> runtime path with nothing downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from trtspec.checkpoint.heads.eagle import eagle_config
from trtspec.checkpoint.heads.mtp import save_mtp
from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.checkpoint.truncate import write_truncated_draft
from trtspec.demo.tiny import make_tiny_llama
from trtspec.demo.tokenizer import write_char_tokenizer
from trtspec.models.heads import Eagle3Head, EagleHead, LinearHeads, MtpSingleHead, layer_arch
from trtspec.spec import TargetSpec

DEMO_VOCAB = 128
DEMO_HEADS = 4


def _init(module: torch.nn.Module, seed: int, scale: float = 0.02) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name or "hidden_norm" in name:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    return module


def write_medusa(target: TargetSpec, out: Path, num_heads: int = DEMO_HEADS, seed: int = 1) -> Path:
    """FasterDecoding layout: medusa_lm_head.safetensors with {h}.0.linear.* and {h}.1.weight."""
    heads = _init(LinearHeads(num_heads, target.arch.hidden_size, target.arch.vocab_size, own_lm_head=True), seed)
    lm = target.tensors.load(target.lm_head_name).float()
    state = {}
    for h, head in enumerate(heads.heads):
        state[f"{h}.0.linear.weight"] = head.res[0].weight.detach().clone()
        state[f"{h}.0.linear.bias"] = head.res[0].bias.detach().clone()
        state[f"{h}.1.weight"] = lm.clone()
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "medusa_lm_head.safetensors"))
    (out / "config.json").write_text(json.dumps({"medusa_num_heads": num_heads, "medusa_num_layers": 1,
                                                 "base_model_name_or_path": str(target.path)}, indent=2))
    return out


def write_eagle(target: TargetSpec, out: Path, seed: int = 2) -> Path:
    """SafeAILab EAGLE-1/2 layout: config.json + model.safetensors with fc.* and layers.0.*."""
    head = _init(EagleHead(layer_arch(target.arch), fc_bias=True), seed)
    state = {("layers.0." + k[len("layer."):] if k.startswith("layer.") else k): v.detach().clone()
             for k, v in head.state_dict().items() if "inv_freq" not in k}
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(eagle_config(target, bias=True), indent=2))
    return out


def write_eagle3(target: TargetSpec, out: Path, draft_vocab: int = 64, seed: int = 3) -> Path:
    """EAGLE-3 layout: midlayer.*, fc over 3 target features, own norm + draft lm_head, d2t/t2d maps."""
    head = _init(Eagle3Head(layer_arch(target.arch), target.arch.hidden_size, draft_vocab), seed)
    used = torch.arange(target.arch.vocab_size)[:draft_vocab]  # the demo's "most frequent" tokens
    state = {("midlayer." + k[len("layer."):] if k.startswith("layer.") else k): v.detach().clone()
             for k, v in head.state_dict().items() if "inv_freq" not in k}
    state["d2t"] = used - torch.arange(draft_vocab)
    t2d = torch.zeros(target.arch.vocab_size, dtype=torch.bool)
    t2d[used] = True
    state["t2d"] = t2d
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(eagle_config(
        target, architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=draft_vocab), indent=2))
    return out


def write_mtp(target: TargetSpec, out: Path, kind: str, has_rmsnorm: bool = True, num_heads: int = DEMO_HEADS,
              seed: int = 4) -> Path:
    a = target.arch
    if kind == "mtp-linear":
        module = _init(LinearHeads(num_heads, a.hidden_size, a.vocab_size, has_norm=has_rmsnorm,
                                   eps=a.rms_norm_eps), seed)
        meta = {"num_heads": num_heads, "num_layers": 1}
    else:
        module = _init(MtpSingleHead(layer_arch(a), has_rmsnorm=has_rmsnorm), seed)
        meta = {"num_heads": 1, "num_layers": 1, "intermediate_size": a.intermediate_size,
                "num_attention_heads": a.num_attention_heads, "num_key_value_heads": a.num_key_value_heads,
                "head_dim": a.head_dim}
    tensors = {k: v for k, v in module.state_dict().items() if "inv_freq" not in k}
    return save_mtp(out, kind, tensors, target, has_rmsnorm=has_rmsnorm, rms_norm_eps=a.rms_norm_eps, **meta)


def build_demo(out: str | Path, seed: int = 0) -> dict[str, Path]:
    """Write the demo target and heads of every kind under ``out``; returns {kind: heads path},
    plus "target"."""
    out = Path(out)
    target_dir = make_tiny_llama(out / "target", seed=seed, vocab_size=DEMO_VOCAB, num_hidden_layers=4)
    write_char_tokenizer(target_dir, DEMO_VOCAB)
    target = load_hf_causal_lm(target_dir)
    heads = out / "heads"
    paths = {
        "target": target_dir,
        "medusa": write_medusa(target, heads / "medusa"),
        "eagle": write_eagle(target, heads / "eagle"),
        "eagle3": write_eagle3(target, heads / "eagle3"),
        "mtp-linear": write_mtp(target, heads / "mtp-linear", "mtp-linear"),
        "mtp-single": write_mtp(target, heads / "mtp-single", "mtp-single"),
        "draft-model": write_truncated_draft(target, 2, heads / "draft-model"),
    }
    return paths
