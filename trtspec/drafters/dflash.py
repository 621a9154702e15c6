"""dflash: z-lab's DFlash block drafter: B-1 draft tokens from one forward, conditioned on target layers.

Layout (z-lab/dflash ``DFlashDraftModel``): ``config.json`` with ``architectures ["DFlashDraftModel"]``,
``block_size``, ``num_target_layers``, ``dflash_config {mask_token_id, target_layer_ids}`` + the draft's
Qwen3 config; ``model.safetensors`` with ``layers.{i}.*``, ``norm``, ``fc``, ``hidden_norm`` (the
canonical names; see trtspec/drafters/block_layout.py and trtspec/models/block_draft.py). The target's
embedding and lm_head are shared. Trained by train-heads (``--num-heads`` = draft tokens per block).
"""

from __future__ import annotations

from pathlib import Path

import torch

from trtspec.drafters.base import DirFacts, DrafterKind, EngineRoute, PyTorchRoute, TrainingRecipe
from trtspec.drafters.block_layout import (
    DRAFT_LAYERS,
    block_config,
    load_block,
    module_for,
    new_backbone,
    save_block,
    train_aux_layers,
)
from trtspec.drafters.block_proposer import build_block_drafter
from trtspec.drafters.weights import demo_init, module_state
from trtspec.models.block_draft import BlockDraftModel
from trtspec.spec import DrafterSpec, TargetSpec

NAME = "dflash"
SECTIONS = ("dflash_config",)
ARCHITECTURE = "DFlashDraftModel"
DEMO_BLOCK = 4


def detect(facts: DirFacts) -> bool:
    return ARCHITECTURE in (facts.config.get("architectures") or []) or "dflash_config" in facts.config


def load(path: Path, target: TargetSpec, allow_pickle: bool = False) -> DrafterSpec:
    return load_block(path, target, NAME, allow_pickle, SECTIONS)


def build(spec: DrafterSpec, target, dtype: torch.dtype):
    return build_block_drafter(spec, target, dtype, module_for(spec, target.arch.hidden_size))


def new_module(
    target: TargetSpec, num_heads: int = DEMO_BLOCK - 1, rmsnorm: bool = True, num_layers: int | None = None
) -> BlockDraftModel:
    """A fresh drafter whose block drafts ``num_heads`` tokens (block size num_heads + 1), ``num_layers``
    decoder layers deep (None: the backbone's default)."""
    return new_backbone(target, num_heads + 1, num_layers=num_layers)


def save(
    module: BlockDraftModel,
    target: TargetSpec,
    out: str | Path,
    info: dict | None = None,
    rmsnorm: bool = True,
    dtype: torch.dtype | None = None,
) -> Path:
    cfg = block_config(
        module, target, [ARCHITECTURE], "dflash_config", auto_map={"AutoModel": "dflash.DFlashDraftModel"}
    )
    if info is not None:
        cfg["trtspec_training"] = info
    return save_block(Path(out), module_state(module, dtype or target.dtype), cfg)


def make_demo(target: TargetSpec, out: Path) -> Path:
    """A random drafter with a block of DEMO_BLOCK (float32, like the tiny targets)."""
    return save(demo_init(new_module(target, DEMO_BLOCK - 1), 5), target, out, dtype=torch.float32)


KIND = DrafterKind(
    name=NAME,
    summary="DFlash: a block of B-1 draft tokens in one forward, conditioned on target layers (z-lab layout)",
    detect=detect,
    load=load,
    build=build,
    make_demo=make_demo,
    engine=EngineRoute(
        refusal=(
            "DFlash block drafters have no TensorRT engine mode: TensorRT-LLM 1.2's trtllm-build offers "
            "--speculative_decoding_mode {draft_tokens_external, lookahead_decoding, medusa, explicit_draft_tokens, "
            "eagle} and none of them runs a non-causal block drafter on the target's layer states. Serve DFlash "
            "with TensorRT-LLM's PyTorch backend (a DFlash speculative config), vLLM (method dflash), or "
            "trtspec's reference runtime (trtspec serve)"
        )
    ),
    pytorch=PyTorchRoute(decoding_type="DFlash", draft_format="dflash"),
    training=TrainingRecipe(
        "block", new_module, save, uses_num_heads=True, draft_layers=DRAFT_LAYERS, aux_layers=train_aux_layers
    ),
    formats=("dflash",),
    export_formats=("dflash",),
    max_tree_depth=lambda spec: int(spec.config["block_size"]) - 1,
)
