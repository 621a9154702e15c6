"""medusa: FasterDecoding/Medusa keys with a config vLLM's ``method: "medusa"`` also reads.

Tensors (``medusa_lm_head.safetensors``): ``{h}.{l}.linear.weight|bias`` and ``{h}.{Lm}.weight``, the
FasterDecoding names TensorRT-LLM's Medusa loader and TGI read and vLLM remaps itself. ``config.json``:
FasterDecoding's ``medusa_num_heads`` / ``medusa_num_layers`` / ``base_model_name_or_path`` plus what
vLLM's MedusaConfig needs: ``model_type: medusa``, ``hidden_size``, ``vocab_size`` and
``medusa_fc_bias: true`` (without it vLLM builds the ResBlocks bias-free and drops the biases silently).
Heads that reuse the target's lm_head (Medusa "version 2") get a copy of it per head: vLLM's per-head
layout has no other way to say "the base lm_head".
"""

from __future__ import annotations

from pathlib import Path

from trtspec.export.base import Exporter, ExportOptions, drafter_tensors, dtype_name, write_checkpoint
from trtspec.spec import SpecModel

NAME = "medusa"


def write(spec: SpecModel, out: Path, opts: ExportOptions) -> None:
    d, a = spec.drafter, spec.target.arch
    state = drafter_tensors(spec, opts.dtype)
    K, Lm = int(d.config["num_heads"]), int(d.config.get("num_layers", 1))
    dtype = state["heads.0.res.0.weight"].dtype
    shared = None if d.config.get("own_lm_head") else spec.target.tensors.load(spec.target.lm_head_name).to(dtype)
    tensors = {}
    for h in range(K):
        for layer in range(Lm):
            for p in ("weight", "bias"):
                tensors[f"{h}.{layer}.linear.{p}"] = state[f"heads.{h}.res.{layer}.{p}"]
        own = state.get(f"heads.{h}.lm_head.weight")
        tensors[f"{h}.{Lm}.weight"] = own if own is not None else shared.clone()  # one copy per head
    config = {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "medusa_num_heads": K,
        "medusa_num_layers": Lm,
        "medusa_fc_bias": True,
        "hidden_size": a.hidden_size,
        "vocab_size": a.vocab_size,
        "base_model_name_or_path": str(spec.target.config.get("_name_or_path") or spec.target.path),
        "torch_dtype": dtype_name(tensors),
    }
    write_checkpoint(out, tensors, config, "medusa_lm_head.safetensors")


EXPORTER = Exporter(
    name=NAME,
    summary="FasterDecoding Medusa keys + a config vLLM reads (medusa_fc_bias, per-head lm_heads)",
    loaders='vLLM {"method": "medusa"}, FasterDecoding/Medusa, TGI, TensorRT-LLM Medusa, trtspec',
    write=write,
)
