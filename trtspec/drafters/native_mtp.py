"""native-mtp: the MTP module a target checkpoint carries itself (DeepSeek-V3 / GLM-4.5 layout).

Such a target's ``config.json`` has ``num_nextn_predict_layers`` and its weights hold, under
``model.layers.{num_hidden_layers}.``, ``enorm``, ``hnorm``, ``eh_proj`` [H, 2H], a full decoder layer and
``shared_head.{norm, head}`` (the head and ``embed_tokens`` share the main model's parameters). The module
is the one mtp-single trains: eh_proj(cat[enorm(emb(token)), hnorm(h)]) -> layer -> norm -> lm_head,
applied autoregressively, so it drafts any depth. Nothing separate to load: the heads path is the target
directory, and a target that carries the module drafts with it when no --heads is given. Engines: the same
EAGLE layout with MTP norms as mtp-single.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from trtspec.checkpoint.heads.common import expect_shape, single_dtype
from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.drafters.base import DirFacts, DrafterKind, EngineRoute, PyTorchRoute
from trtspec.drafters.eagle_layout import layer_shapes
from trtspec.drafters.proposers import build_pair_drafter
from trtspec.drafters.weights import demo_init, module_state
from trtspec.errors import CheckpointError
from trtspec.fsutil import atomic_directory
from trtspec.models.heads import MtpSingleHead, layer_arch
from trtspec.spec import DrafterSpec, TargetSpec

NAME = "native-mtp"
CONFIG_KEY = "num_nextn_predict_layers"
#: canonical (MtpSingleHead) name -> name under model.layers.{L}.
OWN = {"eh_proj.weight": "eh_proj.weight", "enorm.weight": "enorm.weight", "hnorm.weight": "hnorm.weight"}
OWN["norm.weight"] = "shared_head.norm.weight"
SHARED = {"shared_head.head.weight": "lm_head.weight", "embed_tokens.weight": "model.embed_tokens.weight"}


def detect(facts: DirFacts) -> bool:
    return int(facts.config.get(CONFIG_KEY) or 0) > 0


def _layer_names(arch) -> dict[str, tuple[int, ...]]:
    """The decoder layer's tensors (canonical ``layer.*`` names) with their shapes."""
    parts = {"input_layernorm.weight": (arch.hidden_size,), **layer_shapes(arch, arch.hidden_size)}
    return {f"layer.{k}": v for k, v in parts.items()}


def load(path: Path, target: TargetSpec, allow_pickle: bool = False) -> DrafterSpec:
    directory = path if path.is_dir() else path.parent
    carrier = load_hf_causal_lm(directory, allow_pickle, role="target with MTP layers")
    n = int(json.loads((directory / "config.json").read_text()).get(CONFIG_KEY) or 0)
    if n != 1:
        raise CheckpointError(
            f"{CONFIG_KEY} is {n}; trtspec drafts with one MTP module applied autoregressively",
            directory / "config.json",
            "use a checkpoint with num_nextn_predict_layers: 1 (DeepSeek-V3, GLM-4.5)",
        )
    if carrier.fingerprint != target.fingerprint:
        raise CheckpointError(
            "the MTP layers belong to another target (architecture or embeddings differ)",
            directory,
            "pass the same directory as --target and --heads, or omit --heads",
        )
    L, H, V = target.arch.num_hidden_layers, target.arch.hidden_size, target.arch.vocab_size
    prefix = f"model.layers.{L}."
    store, where = carrier.tensors, directory
    shapes = {"eh_proj.weight": (H, 2 * H), "enorm.weight": (H,), "hnorm.weight": (H,), "norm.weight": (H,)}
    shapes.update(_layer_names(target.arch))
    mapping = {c: prefix + (OWN.get(c) or c.removeprefix("layer.")) for c in shapes}
    for canonical, shape in shapes.items():
        if mapping[canonical] not in store:
            raise CheckpointError(
                f"{CONFIG_KEY} is set but {mapping[canonical]!r} is missing",
                where,
                "the MTP layer was stripped from this checkpoint (DeepSeek's convert.py skips it); use the original",
            )
        expect_shape(store, mapping[canonical], shape, where, "the MTP module")
    for own, main in SHARED.items():  # documented as shared: check, never silently use another head
        if prefix + own in store:
            expect_shape(store, prefix + own, (V, H), where, "the MTP shared head")
            main = main if main in store else "model.embed_tokens.weight"
            if not store.load_rows(prefix + own, 4).equal(store.load_rows(main, 4)):
                raise CheckpointError(f"{prefix + own} differs from {main}; trtspec shares the main model's", where)
    renamed = store.renamed(mapping)
    config = {"num_heads": 1, "num_layers": 1, "has_rmsnorm": True, "hidden_size": H, "vocab_size": V}
    config.update(
        intermediate_size=target.arch.intermediate_size,
        num_attention_heads=target.arch.num_attention_heads,
        num_key_value_heads=target.arch.num_key_value_heads,
        head_dim=target.arch.head_dim,
        rms_norm_eps=target.arch.rms_norm_eps,
    )
    return DrafterSpec(
        NAME, directory, renamed, config, arch=layer_arch(target.arch), dtype=single_dtype(renamed, where)
    )


def build(spec: DrafterSpec, target, dtype: torch.dtype):
    return build_pair_drafter(spec, target, dtype, MtpSingleHead(spec.arch, has_rmsnorm=True))


def write_target_with_mtp(
    target: TargetSpec, state: dict[str, torch.Tensor], out: Path, dtype: torch.dtype | None = None
) -> None:
    """The target's files and weights plus ``state`` (canonical MtpSingleHead names) as its MTP layer
    ``model.layers.{L}.*``, with ``num_nextn_predict_layers: 1``, into the fresh directory ``out``.

    ``shared_head.head`` and ``embed_tokens`` are written as copies of the main model's, as DeepSeek-V3
    checkpoints carry them; ``dtype`` None keeps the target's. The caller makes ``out`` atomic."""
    L = target.arch.num_hidden_layers
    tensors = {n: target.tensors.load(n).contiguous() for n in target.tensors}
    for canonical, t in state.items():
        tensors[f"model.layers.{L}." + (OWN.get(canonical) or canonical.removeprefix("layer."))] = t
    head = "lm_head.weight" if "lm_head.weight" in tensors else "model.embed_tokens.weight"
    tensors[f"model.layers.{L}.shared_head.head.weight"] = tensors[head].clone()
    tensors[f"model.layers.{L}.embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    dtype = dtype or target.dtype
    tensors = {n: t.to(dtype) if t.is_floating_point() else t for n, t in tensors.items()}
    src = target.path
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and not f.name.endswith(".index.json"):
            shutil.copy2(f, out / f.name)
    cfg = json.loads((src / "config.json").read_text())
    cfg[CONFIG_KEY] = 1
    for key in ("torch_dtype", "dtype"):  # whichever the target's transformers version wrote
        if key in cfg:
            cfg[key] = str(dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def make_demo(target: TargetSpec, out: Path) -> Path:
    """A copy of the target that carries one random MTP module in the DeepSeek-V3 layout."""
    state = module_state(demo_init(MtpSingleHead(layer_arch(target.arch)), 5), target.dtype)
    with atomic_directory(Path(out), overwrite=True) as tmp:
        write_target_with_mtp(target, state, tmp)
    return Path(out)


KIND = DrafterKind(
    name=NAME,
    summary="the MTP module inside the target checkpoint (DeepSeek-V3 layout), drafting autoregressively",
    detect=detect,
    load=load,
    build=build,
    make_demo=make_demo,
    engine=EngineRoute(layout="EagleForCausalLM+MtpNorms", mode="eagle", triton_decoding_mode="eagle"),
    pytorch=PyTorchRoute(
        refusal=(
            "TensorRT-LLM's PyTorch backend runs a target's MTP layers only for its MTP model types (deepseek_v3, "
            "glm4_moe, qwen3_next, ...), and trtspec's runtime runs Llama-family targets; deploy as an engine "
            "(--backend engine, EAGLE layout with the MTP norms)"
        )
    ),
    formats=("deepseek-v3-mtp",),
    inside_target=True,
)
