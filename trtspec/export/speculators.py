"""speculators: the vllm-project/speculators EAGLE-3 format (``speculators_model_type: eagle3``).

vLLM reads it with no ``method`` at all: its speculators config reader takes the method and
``num_speculative_tokens`` from ``speculators_config`` and builds the draft layer from
``transformer_layer_config`` (a Llama config; vLLM maps ``llama`` to Eagle3LlamaForCausalLM). Tensors
as the Llama-draft layout but with the layer under ``layers.0.``, plus ``embed_tokens.weight`` (a copy of
the target's: speculators saves it) and ``t2d``. ``norm_before_residual`` is written as false: vLLM's
reader defaults it to true when absent, which is not how these heads compute. speculators' ``to_dict``
drops the HF ``model_type``, so TensorRT-LLM and SGLang cannot read this format: use ``eagle3`` for them.
"""

from __future__ import annotations

from pathlib import Path

from trtspec.export.base import Exporter, ExportOptions, dtype_name, write_checkpoint
from trtspec.export.eagle3 import NAME as EAGLE3_METHOD
from trtspec.export.eagle3 import eagle3_fields
from trtspec.export.eagle3_tensors import eagle3_tensors
from trtspec.export.llama_draft import llama_layer_config
from trtspec.spec import SpecModel

NAME = "speculators"
SPECULATORS_VERSION = "0.9.0"  # the schema written: speculators 0.9.0's SpeculatorModelConfig
#: vLLM takes its ``method`` straight from ``speculators_model_type``: the two words are one
MODEL_TYPE = EAGLE3_METHOD


def write(spec: SpecModel, out: Path, opts: ExportOptions) -> None:
    tensors = eagle3_tensors(spec, opts, "layers.0.")
    if "embed_tokens.weight" not in tensors:
        emb = spec.target.tensors.load("model.embed_tokens.weight")
        tensors["embed_tokens.weight"] = emb.to(opts.dtype or tensors["fc.weight"].dtype).contiguous()
    layer = llama_layer_config(spec.drafter.arch, spec.target.arch.vocab_size)
    layer.update(architectures=["LlamaForCausalLM"], torch_dtype=dtype_name(tensors))
    target_cfg = spec.target.config
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": MODEL_TYPE,
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": {
            "algorithm": MODEL_TYPE,
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": opts.num_speculative_tokens,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {
                "name_or_path": str(target_cfg.get("_name_or_path") or spec.target.path),
                "architectures": list(target_cfg.get("architectures") or ["LlamaForCausalLM"]),
            },
        },
        "transformer_layer_config": layer,
        **eagle3_fields(spec),
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "embed_requires_grad": False,
        "torch_dtype": dtype_name(tensors),
    }
    write_checkpoint(out, tensors, config, "model.safetensors")


EXPORTER = Exporter(
    name=NAME,
    summary="speculators EAGLE-3 format (speculators_config, transformer_layer_config, layers.0.*)",
    loaders="vLLM (method read from the config), speculators tooling, trtspec",
    write=write,
)
