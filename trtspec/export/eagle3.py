"""eagle3: the Llama-draft EAGLE-3 layout vLLM (llama_eagle3.py), SGLang (LlamaForCausalLMEagle3) and the
TensorRT-LLM PyTorch backend (Eagle3ForCausalLM) all load.

``config.json``: ``model_type: llama``, ``architectures: ["LlamaForCausalLMEagle3"]``, one layer, the
target's ``vocab_size``, ``draft_vocab_size``, ``target_hidden_size``, ``tie_word_embeddings: false``,
``norm_before_residual: false`` (the only form TensorRT-LLM implements, and trtspec's) and the capture
layers in vLLM indexing both at top level and in ``eagle_config``. Tensors: ``midlayer.*`` (SGLang reads
no other prefix), ``fc``, ``norm``, ``lm_head``, ``d2t``/``t2d`` when V_d != V. TensorRT-LLM counts
capture layers from the layer output: its ``eagle3_layers_to_capture`` is ``{a - 1}`` (see
``trtllm_layers_to_capture``), which its serve YAML must carry when the layers are not the default.
"""

from __future__ import annotations

from pathlib import Path

from trtspec.export.base import Exporter, ExportOptions, dtype_name, write_checkpoint
from trtspec.export.eagle3_tensors import aux_layer_ids, eagle3_tensors
from trtspec.export.llama_draft import llama_layer_config
from trtspec.spec import SpecModel

NAME = "eagle3"


def trtllm_layers_to_capture(aux_ids: list[int]) -> list[int]:
    """vLLM's capture ids (input of layer a) as TensorRT-LLM's ``eagle3_layers_to_capture`` (output of a-1)."""
    return sorted(a - 1 for a in aux_ids)


def eagle3_fields(spec: SpecModel) -> dict:
    """The EAGLE-3 keys both EAGLE-3 configs carry next to the layer's own."""
    d = spec.drafter
    return {
        "draft_vocab_size": int(d.config["draft_vocab_size"]),
        "target_hidden_size": int(d.config["target_hidden_size"]),
        "norm_before_residual": False,
        "eagle_aux_hidden_state_layer_ids": aux_layer_ids(spec),
    }


def write(spec: SpecModel, out: Path, opts: ExportOptions) -> None:
    tensors = eagle3_tensors(spec, opts, "midlayer.")
    fields = eagle3_fields(spec)
    config = llama_layer_config(spec.drafter.arch, spec.target.arch.vocab_size)
    config.update(
        architectures=["LlamaForCausalLMEagle3"],
        torch_dtype=dtype_name(tensors),
        eagle_config={
            "eagle_aux_hidden_state_layer_ids": fields["eagle_aux_hidden_state_layer_ids"],
            "use_aux_hidden_state": True,
        },
        **fields,
    )
    write_checkpoint(out, tensors, config, "model.safetensors")


EXPORTER = Exporter(
    name=NAME,
    summary="Llama-draft EAGLE-3 layout (midlayer.*, d2t, draft_vocab_size, capture layers)",
    loaders='vLLM {"method": "eagle3"}, SGLang --speculative-algorithm EAGLE3, TensorRT-LLM PyTorch '
    "backend decoding_type Eagle3, trtspec",
    write=write,
)
