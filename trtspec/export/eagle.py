"""eagle: SafeAILab EAGLE-1/2 layout as vLLM's ``method: "eagle"`` loads it (llama_eagle.py).

``config.json``: a one-layer Llama config, ``architectures: ["LlamaForCausalLM"]`` (vLLM prefixes it to
EagleLlamaForCausalLM) and ``bias: false``; ``model.safetensors``: ``fc.weight`` [H, 2H] and
``layers.0.*`` (no input_layernorm, no final norm, no lm_head: the target's embedding and lm_head are
shared). vLLM builds fc without a bias and drops a checkpoint's ``fc.bias`` silently, so heads with a
non-zero bias are refused here rather than exported into a drafter that proposes something else.
"""

from __future__ import annotations

from pathlib import Path

from trtspec.errors import CheckpointError
from trtspec.export.base import Exporter, ExportOptions, drafter_tensors, dtype_name, write_checkpoint
from trtspec.export.llama_draft import llama_layer_config
from trtspec.spec import SpecModel

NAME = "eagle"


def write(spec: SpecModel, out: Path, opts: ExportOptions) -> None:
    d = spec.drafter
    state = drafter_tensors(spec, opts.dtype)
    bias = state.pop("fc.bias", None)
    if bias is not None and bool(bias.float().abs().max() > 0):
        raise CheckpointError(
            "these EAGLE heads have a non-zero fc.bias, which vLLM's EAGLE drafter has no place for "
            "(it builds fc without a bias and would drop it)",
            d.path,
            "retrain with trtspec train-heads, which writes bias-free EAGLE heads",
        )
    tensors = {("layers.0." + k[len("layer.") :] if k.startswith("layer.") else k): v for k, v in state.items()}
    config = llama_layer_config(d.arch, spec.target.arch.vocab_size)
    config.update(architectures=["LlamaForCausalLM"], bias=False, torch_dtype=dtype_name(tensors))
    write_checkpoint(out, tensors, config, "model.safetensors")


EXPORTER = Exporter(
    name=NAME,
    summary="SafeAILab EAGLE-1/2 layout (fc + layers.0.*, bias-free fc)",
    loaders='vLLM speculative_config {"method": "eagle"}, SafeAILab EAGLE, trtspec',
    write=write,
)
