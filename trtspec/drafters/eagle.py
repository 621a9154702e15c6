"""eagle: SafeAILab EAGLE-1/2 heads, fc(cat[emb, h]) -> one decoder layer without input norm -> lm_head.

Layout: ``config.json`` (one-layer Llama) + ``model.safetensors|pytorch_model.bin`` with ``fc.weight``
[H, 2H], optional ``fc.bias``, ``layers.0.*`` and optionally ``embed_tokens.weight`` (a frozen copy of
the target's; ignored). Canonical names: ``fc.*``, ``layer.*``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from trtspec.checkpoint.heads.common import check_hidden, check_vocab, expect_shape, open_weights, single_dtype
from trtspec.drafters.base import DirFacts, DrafterKind, EngineRoute, PyTorchRoute, TrainingRecipe
from trtspec.drafters.eagle_layout import WEIGHT_FILES, eagle_config, layer_shapes, read_arch, save_layout
from trtspec.drafters.proposers import build_pair_drafter
from trtspec.drafters.weights import demo_init, module_state
from trtspec.models.heads import EagleHead, layer_arch
from trtspec.spec import DrafterSpec, TargetSpec

NAME = "eagle"


def detect(facts: DirFacts) -> bool:
    if "fc.weight" in facts.tensor_names:
        return True  # EAGLE-3 is asked first, so fc + midlayer never lands here
    pickled_one_layer = "pytorch_model.bin" in facts.files and facts.config.get("num_hidden_layers") == 1
    return not facts.tensor_names and pickled_one_layer


def load(path: Path, target: TargetSpec, allow_pickle: bool = False) -> DrafterSpec:
    arch, _ = read_arch(path, target)
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
    for part, shape in layer_shapes(arch, H).items():
        expect_shape(store, f"layers.0.{part}", shape, path, "the EAGLE decoder layer")
        mapping[f"layer.{part}"] = f"layers.0.{part}"
    config = {
        "num_heads": 1,
        "fc_bias": has_bias,
        "hidden_size": H,
        "vocab_size": arch.vocab_size,
        "rms_norm_eps": arch.rms_norm_eps,
    }
    renamed = store.renamed(mapping)
    return DrafterSpec(NAME, path, renamed, config, arch=arch, dtype=single_dtype(renamed, path))


def new_module(target: TargetSpec, num_heads: int = 1, rmsnorm: bool = True) -> nn.Module:
    """Trained heads have no fc bias (SafeAILab's EAGLE-LLaMA3 heads ship ``"bias": false``): vLLM's
    EAGLE-1 drafter (llama_eagle.py) builds fc without one and would drop a trained bias silently."""
    return EagleHead(layer_arch(target.arch), fc_bias=False)


def save(
    module: EagleHead,
    target: TargetSpec,
    out: str | Path,
    info: dict | None = None,
    rmsnorm: bool = True,
    dtype: torch.dtype | None = None,
) -> Path:
    dtype = dtype or target.dtype
    a = target.arch
    extra = {
        "torch_dtype": str(dtype).removeprefix("torch."),
        "trtspec_target": {"fingerprint": target.fingerprint, "model_type": a.model_type, "path": str(target.path)},
    }
    if info is not None:
        extra["trtspec_training"] = info
    bias = module.fc.bias is not None
    return save_layout(Path(out), module_state(module, dtype), "layers.0.", eagle_config(target, bias=bias, **extra))


def build(spec: DrafterSpec, target, dtype: torch.dtype):
    return build_pair_drafter(spec, target, dtype, EagleHead(spec.arch, fc_bias=bool(spec.config.get("fc_bias", True))))


KIND = DrafterKind(
    name=NAME,
    summary="SafeAILab EAGLE-1/2: fc(cat[embedding, hidden]) -> one decoder layer, autoregressive",
    detect=detect,
    load=load,
    build=build,
    make_demo=lambda target, out: save(
        demo_init(EagleHead(layer_arch(target.arch), fc_bias=False), 2), target, out, dtype=torch.float32
    ),
    engine=EngineRoute(layout="EagleForCausalLM", mode="eagle", triton_decoding_mode="eagle"),
    training=TrainingRecipe("recurrent", new_module, save, feature_regression=True),
    pytorch=PyTorchRoute(
        refusal=(
            "TensorRT-LLM's PyTorch backend runs an Eagle speculative config as Eagle3, and EAGLE-1/2 checkpoints "
            "are incompatible with its EAGLE-3 draft model; deploy EAGLE-1/2 heads as an engine (--backend engine, "
            "TensorRT-LLM 1.2.1 'eagle' mode) or train eagle3 heads"
        )
    ),
    formats=("eagle",),
    export_formats=("eagle",),
)
