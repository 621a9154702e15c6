"""The public block-drafter layout (z-lab DFlash, and DeepSpec's DSpark on top of it), shared by the kinds
that use it.

``config.json``: a Qwen3 config of the draft (``num_hidden_layers`` = draft layers, ``hidden_size`` = the
target's) plus ``architectures``, ``block_size``, ``num_target_layers`` and the block fields
``mask_token_id`` and ``target_layer_ids`` inside a section (``dflash_config``; DSpark also ``dspark_config``)
or at the top level. ``model.safetensors``: ``layers.{i}.*`` (q/k norms included), ``norm``, ``fc``
[H, n*H_t], ``hidden_norm``; no embedding or lm_head: the target's are used.

``target_layer_ids`` count layer *outputs* (id i = the output of layer i, -1 = the embeddings); trtspec's
target captures layer *inputs*, so the context layers are ids + 1 (id L-1 = the last layer's output).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from trtspec.checkpoint.heads.common import expect_shape, open_weights, single_dtype
from trtspec.checkpoint.target import arch_from_config, read_json
from trtspec.errors import CheckpointError
from trtspec.fsutil import atomic_directory
from trtspec.models.block_draft import BlockDraftModel
from trtspec.models.heads import layer_arch
from trtspec.spec import DrafterSpec, LlamaArch, TargetSpec

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
#: draft layers and target context layers of a freshly trained block drafter (z-lab's spacing rule)
DRAFT_LAYERS = 2
CONTEXT_LAYERS = 3


def default_layer_ids(num_target_layers: int, count: int) -> list[int]:
    """z-lab's rule: one id -> the middle layer; more -> spread evenly over 1 .. L-3 (duplicates dropped:
    a tiny target has fewer distinct layers than ids)."""
    L = num_target_layers
    if count == 1 or L < 5:
        return [L // 2]
    span = (L - 3) - 1
    ids = [int(round(1 + i * span / (count - 1))) for i in range(count)]
    return list(dict.fromkeys(ids))


def mask_token(target: TargetSpec) -> tuple[int, str | None]:
    """The mask (block filler) id for a target: the highest-id special token its chat template and its
    bos/eos/pad/unk never use (SmolLM2: 16 ``<empty_output>``). Why an existing token: the drafter uses
    the target's frozen embedding, and a vocabulary with no spare row (SmolLM2 uses all 49152) has no
    unused id to give it; z-lab's Qwen3 drafts use the first id past the tokenizer (151669), which such a
    vocabulary lacks. Without tokenizer files: the last id."""
    fallback = (target.arch.vocab_size - 1, None)
    directory = target.tokenizer_path
    if directory is None or not (Path(directory) / "tokenizer.json").is_file():
        return fallback
    try:
        added = json.loads((Path(directory) / "tokenizer.json").read_text()).get("added_tokens") or []
        tcfg_path = Path(directory) / "tokenizer_config.json"
        tcfg = json.loads(tcfg_path.read_text()) if tcfg_path.is_file() else {}
    except (OSError, json.JSONDecodeError):
        return fallback
    template = str(tcfg.get("chat_template") or "")
    jinja = Path(directory) / "chat_template.jinja"
    if jinja.is_file():
        template += jinja.read_text()
    reserved = {str(tcfg.get(k)) for k in ("bos_token", "eos_token", "pad_token", "unk_token") if tcfg.get(k)}
    reserved |= {str(v) for k, v in target.config.items() if k.endswith("_token") and isinstance(v, str)}
    ids = {target.config.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")}
    free = [
        (int(t["id"]), str(t["content"]))
        for t in added
        if t.get("special")
        and int(t["id"]) < target.arch.vocab_size
        and int(t["id"]) not in ids
        and t["content"] not in reserved
        and t["content"] not in template
    ]
    return max(free) if free else fallback


def section_value(cfg: dict[str, Any], key: str, sections: tuple[str, ...], default: Any = None) -> Any:
    """A block field from the first config section that has it, else the top level (``prefix_key`` too)."""
    for sec in sections:
        sub = cfg.get(sec)
        if isinstance(sub, dict) and sub.get(key) is not None:
            return sub[key]
        prefixed = f"{sec.removesuffix('_config')}_{key}"
        if cfg.get(prefixed) is not None:
            return cfg[prefixed]
    return cfg.get(key, default)


@dataclass(frozen=True)
class BlockConfig:
    arch: LlamaArch  # the draft's decoder layers
    raw: dict[str, Any]
    block_size: int
    layer_ids: tuple[int, ...]  # target_layer_ids (layer outputs)
    mask_token_id: int

    @property
    def aux_layers(self) -> tuple[int, ...]:
        """trtspec capture indices (layer inputs) of the context layers."""
        return tuple(i + 1 for i in self.layer_ids)


def read_block_config(path: Path, target: TargetSpec, sections: tuple[str, ...]) -> BlockConfig:
    """The draft's architecture and block fields, validated against the target."""
    cfg_path = path / "config.json" if path.is_dir() else path.parent / "config.json"
    cfg = read_json(cfg_path)
    model_type = cfg.get("model_type", "qwen3")
    arch = arch_from_config({**cfg, "vocab_size": cfg.get("vocab_size", target.arch.vocab_size)}, cfg_path)
    if model_type != "qwen3":  # the public layout always carries q/k norms
        arch = LlamaArch(**{**arch.__dict__, "qk_norm": True})
    L, H = target.arch.num_hidden_layers, target.arch.hidden_size
    if arch.hidden_size != H:
        raise CheckpointError(
            f"draft hidden size {arch.hidden_size} != target hidden size {H}",
            cfg_path,
            "a block drafter shares the target's embedding and lm_head; use one trained for this target",
        )
    block = section_value(cfg, "block_size", sections)
    ids = section_value(cfg, "target_layer_ids", sections)
    mask = section_value(cfg, "mask_token_id", sections)
    missing = [n for n, v in (("block_size", block), ("target_layer_ids", ids), ("mask_token_id", mask)) if v is None]
    if missing:
        raise CheckpointError(
            f"config lacks {', '.join(missing)}", cfg_path, f"set them at the top level or under {sections[0]}"
        )
    if int(block) < 2:
        raise CheckpointError(f"block_size {block} < 2 drafts nothing", cfg_path, "use a block of 2 or more")
    n_target = cfg.get("num_target_layers")
    if n_target is not None and int(n_target) != L:
        raise CheckpointError(
            f"num_target_layers {n_target} != the target's {L} layers", cfg_path, "use a draft trained for this target"
        )
    bad = [i for i in ids if not -1 <= int(i) <= L - 1]
    if bad:
        raise CheckpointError(f"target_layer_ids {bad} outside -1..{L - 1}", cfg_path, "fix target_layer_ids")
    if not 0 <= int(mask) < target.arch.vocab_size:
        raise CheckpointError(
            f"mask_token_id {mask} outside the target's vocabulary ({target.arch.vocab_size})",
            cfg_path,
            "pick a mask token the target's embedding has",
        )
    return BlockConfig(arch, cfg, int(block), tuple(int(i) for i in ids), int(mask))


def layer_shapes(arch: LlamaArch, n_ctx: int, target_hidden: int) -> dict[str, tuple[int, ...]]:
    H, I, d = arch.hidden_size, arch.intermediate_size, arch.head_dim
    q, kv = arch.num_attention_heads * d, arch.num_key_value_heads * d
    out: dict[str, tuple[int, ...]] = {
        "norm.weight": (H,),
        "fc.weight": (H, n_ctx * target_hidden),
        "hidden_norm.weight": (H,),
    }
    for i in range(arch.num_hidden_layers):
        p = f"layers.{i}."
        out.update(
            {
                p + "input_layernorm.weight": (H,),
                p + "post_attention_layernorm.weight": (H,),
                p + "self_attn.q_proj.weight": (q, H),
                p + "self_attn.k_proj.weight": (kv, H),
                p + "self_attn.v_proj.weight": (kv, H),
                p + "self_attn.o_proj.weight": (H, q),
                p + "self_attn.q_norm.weight": (d,),
                p + "self_attn.k_norm.weight": (d,),
                p + "mlp.gate_proj.weight": (I, H),
                p + "mlp.up_proj.weight": (I, H),
                p + "mlp.down_proj.weight": (H, I),
            }
        )
    return out


def load_block(
    path: Path,
    target: TargetSpec,
    kind: str,
    allow_pickle: bool,
    sections: tuple[str, ...],
    extra_shapes: dict[str, tuple[int, ...]] | None = None,
    optional: tuple[str, ...] = (),
    config: dict[str, Any] | None = None,
) -> DrafterSpec:
    """Read and validate a block drafter; the tensors keep their public names (they are canonical).
    ``extra_shapes`` are a kind's own tensors (required), ``optional`` names it may carry."""
    bc = read_block_config(path, target, sections)
    store = open_weights(path, WEIGHT_FILES, allow_pickle)
    shapes = {**layer_shapes(bc.arch, len(bc.layer_ids), target.arch.hidden_size), **(extra_shapes or {})}
    for name, shape in shapes.items():
        expect_shape(store, name, shape, path, f"this {kind} drafter")
    keep = set(shapes) | {n for n in optional if n in store}
    store = store.renamed({n: n for n in store if n in keep})
    spec_config = {
        "block_size": bc.block_size,
        "mask_token_id": bc.mask_token_id,
        "target_layer_ids": list(bc.layer_ids),
        "hidden_size": bc.arch.hidden_size,
        "vocab_size": target.arch.vocab_size,
        "num_layers": bc.arch.num_hidden_layers,
        "rms_norm_eps": bc.arch.rms_norm_eps,
        # the natural tree of a block drafter: the chain of its B-1 draft tokens
        "tree_choices": [[0] * d for d in range(1, bc.block_size)],
        **(config or {}),
    }
    for key in ("trtspec_target", "trtspec_training"):
        if key in bc.raw:
            spec_config[key] = bc.raw[key]
    return DrafterSpec(kind, path, store, spec_config, arch=bc.arch, dtype=single_dtype(store, path))


def module_for(spec: DrafterSpec, target_hidden: int) -> BlockDraftModel:
    """An empty backbone shaped like a loaded drafter (the kind fills it with load_module)."""
    cfg = spec.config
    assert spec.arch is not None
    aux = tuple(int(i) + 1 for i in cfg["target_layer_ids"])
    return BlockDraftModel(spec.arch, target_hidden, aux, int(cfg["block_size"]), int(cfg["mask_token_id"]))


def train_aux_layers(target: TargetSpec) -> tuple[int, ...]:
    """The capture indices (layer inputs) a fresh block drafter reads its context from: what the training
    cache records while the target writes its replies, so no second pass over the cache is needed."""
    return tuple(i + 1 for i in default_layer_ids(target.arch.num_hidden_layers, CONTEXT_LAYERS))


def new_backbone(
    target: TargetSpec,
    block_size: int,
    cls: type[BlockDraftModel] = BlockDraftModel,
    num_layers: int | None = None,
    **extra,
):
    """A fresh backbone for ``target``: ``num_layers`` (default DRAFT_LAYERS) Qwen3-style layers of the
    target's widths, context from CONTEXT_LAYERS target layers, the target's mask token. ``extra`` goes
    to ``cls``."""
    layers = num_layers or DRAFT_LAYERS
    arch = layer_arch(target.arch, model_type="qwen3", qk_norm=True, num_hidden_layers=layers)
    return cls(arch, target.arch.hidden_size, train_aux_layers(target), block_size, mask_token(target)[0], **extra)


def block_config(
    module: BlockDraftModel, target: TargetSpec, architectures: list[str], section: str, **extra
) -> dict[str, Any]:
    """The config.json of a trained or demo block drafter (a Qwen3 config + the block fields)."""
    ids = [i - 1 for i in module.aux_layers]
    return draft_config(
        module.arch, target, module.block_size, module.mask_token_id, ids, architectures, section, **extra
    )


def draft_config(
    a: LlamaArch,
    target: TargetSpec,
    block_size: int,
    mask_token_id: int,
    target_layer_ids: list[int],
    architectures: list[str],
    section: str,
    **extra,
) -> dict[str, Any]:
    """The public config.json of a block drafter with architecture ``a``: a Qwen3 config, ``block_size``
    and ``num_target_layers`` at the top, ``{mask_token_id, target_layer_ids}`` under ``section``."""
    mask_id, mask_text = mask_token(target)
    fields: dict[str, Any] = {"mask_token_id": mask_token_id, "target_layer_ids": list(target_layer_ids)}
    cfg: dict[str, Any] = {
        "architectures": architectures,
        "model_type": "qwen3",
        "hidden_size": a.hidden_size,
        "intermediate_size": a.intermediate_size,
        "num_hidden_layers": a.num_hidden_layers,
        "num_attention_heads": a.num_attention_heads,
        "num_key_value_heads": a.num_key_value_heads,
        "head_dim": a.head_dim,
        "vocab_size": target.arch.vocab_size,
        "rms_norm_eps": a.rms_norm_eps,
        "rope_theta": a.rope_theta,
        "rope_scaling": a.rope_scaling,
        "max_position_embeddings": a.max_position_embeddings,
        "hidden_act": "silu",
        "attention_bias": a.attention_bias,
        "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * a.num_hidden_layers,
        "block_size": block_size,
        "num_target_layers": target.arch.num_hidden_layers,
        section: fields,
        "trtspec_target": {"fingerprint": target.fingerprint, "model_type": target.arch.model_type},
    }
    if mask_token_id == mask_id and mask_text is not None:
        cfg["trtspec_target"]["mask_token"] = mask_text  # which existing token stands in for the mask
    cfg.update(extra)
    return cfg


def save_block(out: Path, state: dict[str, torch.Tensor], config: dict[str, Any]) -> Path:
    """Write the public layout atomically: model.safetensors + config.json."""
    with atomic_directory(Path(out), overwrite=True) as tmp:
        save_file(state, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return Path(out)
