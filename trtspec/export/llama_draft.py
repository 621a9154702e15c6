"""The one-layer Llama config both EAGLE layouts carry (the HF keys vLLM/SGLang/TRT-LLM build the layer from)."""

from __future__ import annotations

from trtspec.spec import LlamaArch


def llama_layer_config(arch: LlamaArch, vocab_size: int) -> dict:
    """A ``model_type: llama`` config for one draft decoder layer of ``arch``'s widths (AutoConfig reads it)."""
    cfg = arch.to_hf_dict()
    cfg.update(model_type="llama", num_hidden_layers=1, vocab_size=vocab_size, tie_word_embeddings=False)
    return {k: v for k, v in cfg.items() if v is not None}
