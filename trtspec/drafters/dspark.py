"""dspark: DeepSpec's DSpark: the DFlash block backbone + a Markov head + a confidence head.

Layout (deepseek-ai/DeepSpec ``Qwen3DSparkModel``): ``config.json`` with ``architectures
["Qwen3DSparkModel"]``, ``block_size``, ``num_target_layers``, ``target_layer_ids``, ``mask_token_id``,
``markov_rank``, ``markov_head_type`` ("vanilla"), ``enable_confidence_head``,
``confidence_head_with_markov`` (top level, or under ``dspark_config`` / ``dflash_config``) + the draft's
Qwen3 config; ``model.safetensors`` with the block backbone's tensors, ``markov_head.markov_w1.weight``
[V, r], ``markov_head.markov_w2.weight`` [V, r], ``confidence_head.proj.{weight,bias}`` [1, H(+r)], and
the frozen copies ``embed_tokens.weight`` / ``lm_head.weight`` of the target's (written for DeepSpec,
not read: the target's own are used). Drafts are next-token style: block position j drafts the token at anchor + j + 1, so a
block of B drafts B tokens; each draft's logits get the Markov bias of the token before it.

Confidence-scheduled verification: the confidence head's per-draft acceptance probabilities multiply
into a survival curve per request; the loop verifies the tree only as deep as the deepest request whose
top-1 chain still survives with probability >= ``MIN_SURVIVAL`` (config ``trtspec_min_survival``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from trtspec.checkpoint.target import read_json
from trtspec.drafters.base import DirFacts, DrafterKind, EngineRoute, PyTorchRoute, TrainingRecipe
from trtspec.drafters.block_layout import (
    DRAFT_LAYERS,
    block_config,
    load_block,
    module_for,
    new_backbone,
    save_block,
    section_value,
    train_aux_layers,
)
from trtspec.drafters.block_proposer import build_block_drafter
from trtspec.drafters.weights import demo_init, module_state
from trtspec.errors import CheckpointError
from trtspec.models.block_draft import MarkovBlockDraftModel
from trtspec.spec import DrafterSpec, TargetSpec

NAME = "dspark"
SECTIONS = ("dspark_config", "dflash_config")
ARCHITECTURE = "Qwen3DSparkModel"
DEMO_BLOCK = 3
MARKOV_RANK = 32  # trained drafts (DeepSpec's recipe uses 256 for 8B targets)
MIN_SURVIVAL = 0.1


def detect(facts: DirFacts) -> bool:
    archs = " ".join(facts.config.get("architectures") or [])
    return "DSpark" in archs or "dspark_config" in facts.config or "markov_rank" in facts.config


def _fields(path: Path) -> dict:
    cfg = read_json(path / "config.json" if path.is_dir() else path.parent / "config.json")
    kind = section_value(cfg, "markov_head_type", SECTIONS, "vanilla")
    if int(section_value(cfg, "markov_rank", SECTIONS, 0) or 0) > 0 and kind != "vanilla":
        raise CheckpointError(
            f"markov_head_type {kind!r} is not supported (only 'vanilla')",
            path,
            "use a draft with the vanilla Markov head",
        )
    return {
        "markov_rank": int(section_value(cfg, "markov_rank", SECTIONS, 0) or 0),
        "confidence": bool(section_value(cfg, "enable_confidence_head", SECTIONS, False)),
        "confidence_with_markov": bool(section_value(cfg, "confidence_head_with_markov", SECTIONS, False)),
        "min_survival": float(cfg.get("trtspec_min_survival", MIN_SURVIVAL)),
    }


def load(path: Path, target: TargetSpec, allow_pickle: bool = False) -> DrafterSpec:
    f = _fields(path)
    V, H, r = target.arch.vocab_size, target.arch.hidden_size, f["markov_rank"]
    extra: dict[str, tuple[int, ...]] = {}
    if r > 0:
        extra.update({"markov_head.markov_w1.weight": (V, r), "markov_head.markov_w2.weight": (V, r)})
    if f["confidence"]:
        width = H + (r if f["confidence_with_markov"] and r > 0 else 0)
        extra.update({"confidence_head.proj.weight": (1, width), "confidence_head.proj.bias": (1,)})
    spec = load_block(path, target, NAME, allow_pickle, SECTIONS, extra, config=f)
    spec.config["tree_choices"] = [[0] * d for d in range(1, spec.config["block_size"] + 1)]
    return spec


def _module(spec: DrafterSpec, target_hidden: int) -> MarkovBlockDraftModel:
    base = module_for(spec, target_hidden)
    c = spec.config
    return MarkovBlockDraftModel(
        base.arch,
        target_hidden,
        base.aux_layers,
        base.block_size,
        base.mask_token_id,
        int(c["vocab_size"]),
        int(c["markov_rank"]),
        bool(c["confidence"]),
        bool(c["confidence_with_markov"]),
    )


def build(spec: DrafterSpec, target, dtype: torch.dtype):
    module = _module(spec, target.arch.hidden_size)
    min_survival = float(spec.config["min_survival"]) if spec.config["confidence"] else None
    return build_block_drafter(spec, target, dtype, module, min_survival=min_survival)


def new_module(
    target: TargetSpec, num_heads: int = DEMO_BLOCK, rmsnorm: bool = True, num_layers: int | None = None
) -> MarkovBlockDraftModel:
    """A fresh drafter drafting ``num_heads`` tokens per block (block size = num_heads: next-token drafts),
    ``num_layers`` decoder layers deep (None: the backbone's default)."""
    return new_backbone(
        target,
        num_heads,
        MarkovBlockDraftModel,
        num_layers=num_layers,
        vocab_size=target.arch.vocab_size,
        markov_rank=min(MARKOV_RANK, target.arch.hidden_size),
    )


def save(
    module: MarkovBlockDraftModel,
    target: TargetSpec,
    out: str | Path,
    info: dict | None = None,
    rmsnorm: bool = True,
    dtype: torch.dtype | None = None,
) -> Path:
    dtype = dtype or target.dtype
    rank = module.markov_head.markov_w1.weight.shape[1] if module.markov_head is not None else 0
    cfg = block_config(
        module,
        target,
        [ARCHITECTURE],
        "dspark_config",
        markov_rank=rank,
        markov_head_type="vanilla",
        enable_confidence_head=module.confidence_head is not None,
        confidence_head_with_markov=module.confidence_with_markov,
        num_anchors=16,  # a training field DeepSpec's model requires in its config (trtspec's anchors per window)
    )
    cfg.update(cfg["dspark_config"])  # DeepSpec reads the fields at the top level
    if info is not None:
        cfg["trtspec_training"] = info
    state = module_state(module, dtype)
    # DeepSpec's module holds frozen copies of the target's embedding and lm_head
    state["embed_tokens.weight"] = target.tensors.load("model.embed_tokens.weight").to(dtype).contiguous()
    state["lm_head.weight"] = target.tensors.load(target.lm_head_name).to(dtype).clone()  # tied: own storage
    return save_block(Path(out), state, cfg)


def make_demo(target: TargetSpec, out: Path) -> Path:
    module = demo_init(new_module(target, DEMO_BLOCK), 6)
    return save(module, target, out, dtype=torch.float32)


KIND = DrafterKind(
    name=NAME,
    summary="DSpark: DFlash backbone + Markov head + confidence-scheduled verification (DeepSpec layout)",
    detect=detect,
    load=load,
    build=build,
    make_demo=make_demo,
    engine=EngineRoute(
        refusal=(
            "DSpark drafters have no TensorRT engine mode: TensorRT-LLM 1.2's trtllm-build offers "
            "--speculative_decoding_mode {draft_tokens_external, lookahead_decoding, medusa, explicit_draft_tokens, "
            "eagle} and none of them runs a block drafter with a Markov head. Serve DSpark with TensorRT-LLM's "
            "PyTorch backend (a DSpark speculative config: the Markov head runs, the confidence head is not "
            "wired in), vLLM (method dspark), or trtspec's reference runtime (trtspec serve)"
        )
    ),
    pytorch=PyTorchRoute(decoding_type="DSpark", draft_format="dspark"),
    training=TrainingRecipe(
        "block", new_module, save, uses_num_heads=True, draft_layers=DRAFT_LAYERS, aux_layers=train_aux_layers
    ),
    formats=("dspark",),
    max_tree_depth=lambda spec: int(spec.config["block_size"]),
)
