"""dflash: z-lab's DFlash layout, as vLLM's ``method: "dflash"`` (qwen3_dflash.DFlashQwen3ForCausalLM),
SGLang's ``DFLASH`` and TensorRT-LLM's ``DFlashDecodingConfig`` load it.

``config.json``: a Qwen3 config of the draft layers, ``architectures ["DFlashDraftModel"]``,
``block_size`` and ``num_target_layers`` at the top, ``dflash_config {mask_token_id, target_layer_ids}``
(ids are "output of layer i"; vLLM captures i + 1) and ``layer_types`` all ``full_attention``, which
vLLM reads as a non-causal block. ``model.safetensors``: ``layers.{i}.*``, ``norm``, ``fc``,
``hidden_norm``; no ``embed_tokens`` or ``lm_head``, the target's are shared. trtspec's own DFlash
heads are already this layout; writing it from the loaded spec normalizes a checkpoint that came in a
variant (``block_size`` inside ``dflash_config``, Qwen3.5 style) into the one every loader reads.
"""

from __future__ import annotations

from pathlib import Path

from trtspec.drafters.block_layout import draft_config
from trtspec.export.base import Exporter, ExportOptions, drafter_tensors, dtype_name, write_checkpoint
from trtspec.spec import SpecModel

NAME = "dflash"
ARCHITECTURE = "DFlashDraftModel"


def write(spec: SpecModel, out: Path, opts: ExportOptions) -> None:
    d = spec.drafter
    assert d.arch is not None
    tensors = drafter_tensors(spec, opts.dtype)
    c = d.config
    config = draft_config(
        d.arch,
        spec.target,
        int(c["block_size"]),
        int(c["mask_token_id"]),
        [int(i) for i in c["target_layer_ids"]],
        [ARCHITECTURE],
        "dflash_config",
        auto_map={"AutoModel": "dflash.DFlashDraftModel"},
        torch_dtype=dtype_name(tensors),
    )
    for key in ("trtspec_target", "trtspec_training"):  # where it was trained, kept for trtspec's checks
        if key in c:
            config[key] = c[key]
    write_checkpoint(out, tensors, config, "model.safetensors")


EXPORTER = Exporter(
    name=NAME,
    summary="z-lab DFlash layout (Qwen3 draft layers + fc/hidden_norm, dflash_config)",
    loaders='vLLM speculative_config {"method": "dflash"}, SGLang DFLASH, TensorRT-LLM DFlash, z-lab dflash, trtspec',
    write=write,
)
