"""medusa: FasterDecoding/Medusa heads, K ResBlock heads on the target's last hidden state.

Layout: ``config.json`` (MedusaConfig) + ``medusa_lm_head.safetensors|.pt|.bin``. Published keys
``{h}.{l}.linear.weight|bias`` (ResBlocks) and ``{h}.{Lm}.weight`` (per-head lm_head, absent for version
"2" heads, which reuse the base lm_head). K and Lm are read from the keys: Hub configs are known to
misstate medusa_num_heads. Canonical names: ``heads.{k}.res.{l}.*``, ``heads.{k}.lm_head.weight``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from trtspec.checkpoint.heads.common import check_hidden, check_vocab, expect_shape, open_weights, single_dtype
from trtspec.drafters.base import DirFacts, DrafterKind, EngineRoute, PyTorchRoute, TrainingRecipe
from trtspec.drafters.proposers import build_heads_drafter
from trtspec.drafters.weights import demo_init
from trtspec.errors import CheckpointError
from trtspec.fsutil import atomic_directory
from trtspec.models.heads import LinearHeads
from trtspec.spec import DrafterSpec, TargetSpec

NAME = "medusa"
WEIGHT_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt", "medusa_lm_head.bin")
_KEY = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")
DEMO_HEADS = 4


def detect(facts: DirFacts) -> bool:
    if facts.path.is_file() and facts.path.name.startswith("medusa_lm_head"):
        return True
    return any(n in facts.files for n in WEIGHT_FILES) or any(_KEY.match(k) for k in facts.tensor_names)


def load(path: Path, target: TargetSpec, allow_pickle: bool = False) -> DrafterSpec:
    store = open_weights(path, WEIGHT_FILES, allow_pickle)
    where = path
    heads: dict[int, set[int]] = {}
    lm_layer: dict[int, int] = {}
    for key in store:
        m = _KEY.match(key)
        if not m:
            raise CheckpointError(
                f"unexpected tensor {key!r} in Medusa heads",
                where,
                "expected FasterDecoding/Medusa keys like 0.0.linear.weight",
            )
        h, layer, part = int(m.group(1)), int(m.group(2)), m.group(3)
        if part == "weight":
            lm_layer[h] = layer
        else:
            heads.setdefault(h, set()).add(layer)
    if not heads:
        raise CheckpointError("no Medusa ResBlock tensors found", where)
    K = max(heads) + 1
    Lm = max(max(v) for v in heads.values()) + 1
    if sorted(heads) != list(range(K)):
        raise CheckpointError(f"Medusa heads are not numbered 0..{K - 1}", where)
    H = store.shape("0.0.linear.weight")[0]
    check_hidden(H, target, where)
    own_lm_head = bool(lm_layer)
    mapping = {}
    for h in range(K):
        for layer in range(Lm):
            for p in ("weight", "bias"):
                src = f"{h}.{layer}.linear.{p}"
                expect_shape(store, src, (H, H) if p == "weight" else (H,), where, "a Medusa ResBlock")
                mapping[f"heads.{h}.res.{layer}.{p}"] = src
        if own_lm_head:
            src = f"{h}.{lm_layer.get(h, Lm)}.weight"
            if src not in store:
                raise CheckpointError(f"head {h} has no lm_head ({src})", where)
            check_vocab(store.shape(src)[0], target, where)
            mapping[f"heads.{h}.lm_head.weight"] = src
    cfg_file = (path / "config.json") if path.is_dir() else path.parent / "config.json"
    meta = {}
    if cfg_file.is_file():
        try:
            meta = json.loads(cfg_file.read_text())
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"not valid JSON ({exc})", cfg_file) from None
    config = {
        "num_heads": K,
        "num_layers": Lm,
        "has_rmsnorm": False,
        "own_lm_head": own_lm_head,
        "hidden_size": H,
        "vocab_size": target.arch.vocab_size,
        "base_model_name_or_path": meta.get("base_model_name_or_path"),
    }
    return DrafterSpec(NAME, path, store.renamed(mapping), config, dtype=single_dtype(store, where))


def new_module(target: TargetSpec, num_heads: int = 3, rmsnorm: bool = True) -> nn.Module:
    a = target.arch
    return LinearHeads(num_heads, a.hidden_size, a.vocab_size)


def save(
    module: LinearHeads,
    target: TargetSpec,
    out: str | Path,
    info: dict | None = None,
    rmsnorm: bool = True,
    dtype: torch.dtype | None = None,
) -> Path:
    """FasterDecoding layout; heads without their own lm_head are Medusa "version 2" (reuse the base one)."""
    dtype = dtype or target.dtype
    state: dict[str, torch.Tensor] = {}
    own = all(head.lm_head is not None for head in module.heads)
    for h, head in enumerate(module.heads):
        for layer, block in enumerate(head.res):
            state[f"{h}.{layer}.linear.weight"] = block.weight.detach().to(dtype).contiguous()
            state[f"{h}.{layer}.linear.bias"] = block.bias.detach().to(dtype).contiguous()
        if own:
            state[f"{h}.{len(head.res)}.weight"] = head.lm_head.weight.detach().to(dtype).contiguous()
    a = target.arch
    cfg = {
        "medusa_num_heads": len(module.heads),
        "medusa_num_layers": len(module.heads[0].res),
        "base_model_name_or_path": str(target.path),
        "hidden_size": a.hidden_size,
        "vocab_size": a.vocab_size,
        "trtspec_target": {"fingerprint": target.fingerprint, "model_type": a.model_type, "path": str(target.path)},
    }
    if not own:
        cfg["version"] = "2"
    if info is not None:
        cfg["trtspec_training"] = info
    with atomic_directory(Path(out), overwrite=True) as tmp:
        save_file(state, str(tmp / "medusa_lm_head.safetensors"))
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return Path(out)


def make_demo(target: TargetSpec, out: Path, num_heads: int = DEMO_HEADS) -> Path:
    """Random heads, each with its own copy of the target's lm_head (the original Medusa layout)."""
    heads = demo_init(LinearHeads(num_heads, target.arch.hidden_size, target.arch.vocab_size, own_lm_head=True), 1)
    lm = target.tensors.load(target.lm_head_name).float()
    with torch.no_grad():
        for head in heads.heads:
            head.lm_head.weight.copy_(lm)
    return save(heads, target, out, dtype=torch.float32)


KIND = DrafterKind(
    name=NAME,
    summary="FasterDecoding/Medusa ResBlock heads on the target's last hidden state",
    detect=detect,
    load=load,
    build=lambda spec, target, dtype: build_heads_drafter(spec, target, dtype, has_norm=False),
    make_demo=make_demo,
    engine=EngineRoute(layout="MedusaForCausalLM", mode="medusa", triton_decoding_mode="medusa"),
    training=TrainingRecipe("heads", new_module, save, uses_num_heads=True),
    pytorch=PyTorchRoute(
        refusal=(
            "TensorRT-LLM's PyTorch backend has no Medusa speculative config (MedusaDecodingConfig is for the "
            "TensorRT engine path only); deploy Medusa heads as an engine (--backend engine)"
        )
    ),
    formats=("medusa",),
    export_formats=("onnx", "medusa"),
    max_tree_depth=lambda spec: spec.num_heads,
)
