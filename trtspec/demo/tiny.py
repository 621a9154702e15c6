"""Tiny random Llama-family checkpoints, written as real HF directories (config + safetensors).

Used by the embedded demo and the tests: nothing is downloaded, and the files go through exactly the
loaders a user's checkpoint does.
"""

from __future__ import annotations

from pathlib import Path

import torch

TINY_DEFAULTS = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
)


def make_tiny_llama(
    out: str | Path,
    seed: int = 0,
    model_type: str = "llama",
    dtype: torch.dtype = torch.float32,
    max_shard_size: str | None = None,
    **overrides,
) -> Path:
    """Write a randomly initialised HF causal LM (llama, mistral, qwen2 or qwen3) to ``out``.

    Weights get a larger init than HF's default so that logits are well separated and greedy decoding
    is not a sequence of near-ties (which would make token-identity tests meaningless).
    """
    import transformers

    transformers.utils.logging.disable_progress_bar()
    cfg_cls = {
        "llama": transformers.LlamaConfig,
        "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
    }[model_type]
    kwargs = dict(TINY_DEFAULTS)
    kwargs.update(overrides)
    if model_type == "qwen3":
        kwargs.setdefault("head_dim", kwargs["hidden_size"] // kwargs["num_attention_heads"])
    cfg = cfg_cls(**kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif p.dim() >= 2:
                p.normal_(0.0, 0.6 / p.shape[-1] ** 0.5 * 2.0)
            else:
                p.normal_(0.0, 0.02)
    model = model.to(dtype)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, safe_serialization=True, **kw)
    return out
