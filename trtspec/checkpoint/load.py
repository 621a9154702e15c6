"""Entry point of every stage: target dir + heads (any format) -> one validated SpecModel."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from trtspec.checkpoint.errors import CheckpointError, UsageError
from trtspec.checkpoint.heads.draft_model import load_draft_model
from trtspec.checkpoint.heads.draft_vocab import DRAFT_VOCAB_FILE, draft_vocab_path, load_draft_vocab
from trtspec.checkpoint.heads.eagle import load_eagle, load_eagle3
from trtspec.checkpoint.heads.medusa import WEIGHT_FILES as MEDUSA_FILES, load_medusa, looks_like_medusa
from trtspec.checkpoint.heads.mtp import META_FILE, load_mtp
from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.checkpoint.tensors import read_safetensors_header
from trtspec.dtypes import DtypeError, parse_dtype, resolve_dtype
from trtspec.runtime.tree import DEFAULT_CHOICES, normalize_choices, parse_choices
from trtspec.spec import DRAFTER_KINDS, DrafterSpec, ParallelSpec, SpecModel, TargetSpec, TreeSpec

HEAD_FORMATS = DRAFTER_KINDS


def detect_heads_format(path: Path) -> str:
    """Name the format of a heads path from its files, or raise naming what was found."""
    if not path.exists():
        raise CheckpointError("heads not found", path)
    directory = path if path.is_dir() else path.parent
    if (directory / META_FILE).is_file():
        try:
            kind = json.loads((directory / META_FILE).read_text()).get("kind")
        except (json.JSONDecodeError, OSError, AttributeError):
            raise CheckpointError("not valid JSON", directory / META_FILE) from None
        return str(kind)
    if path.is_file() and path.name.startswith("medusa_lm_head") or any((directory / n).exists() for n in MEDUSA_FILES):
        return "medusa"
    cfg = {}
    if (directory / "config.json").is_file():
        try:
            cfg = json.loads((directory / "config.json").read_text())
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"not valid JSON ({exc})", directory / "config.json") from None
    archs = " ".join(cfg.get("architectures") or [])
    if "Eagle3" in archs or "draft_vocab_size" in cfg:
        return "eagle3"
    keys: list[str] = []
    st = [path] if path.is_file() and path.suffix == ".safetensors" else sorted(
        f for f in directory.glob("*.safetensors") if f.name != DRAFT_VOCAB_FILE)
    for f in st[:1]:
        keys = list(read_safetensors_header(f))
    if any(k.startswith("midlayer.") for k in keys):
        return "eagle3"
    if "fc.weight" in keys or (not keys and (directory / "pytorch_model.bin").exists() and cfg.get("num_hidden_layers") == 1):
        return "eagle"
    if looks_like_medusa(keys):
        return "medusa"
    if any(k.startswith("model.layers.") for k in keys) or (directory / "model.safetensors.index.json").exists():
        return "draft-model"
    raise CheckpointError("unknown heads format", path,
                          f"pass --heads-format with one of {', '.join(HEAD_FORMATS)}")


def load_drafter(path: str | Path, target: TargetSpec, heads_format: str | None = None,
                 allow_pickle: bool = False, draft_vocab: int | None = None) -> DrafterSpec:
    """The heads at ``path`` in any format; ``draft_vocab``: None = the heads' own draft vocabulary if
    they carry one, 0 = the full vocabulary, N = its N most frequent tokens."""
    path = Path(path)
    fmt = heads_format or detect_heads_format(path)
    if fmt not in HEAD_FORMATS:
        raise UsageError(f"unknown heads format {fmt!r}; choose one of {', '.join(HEAD_FORMATS)}")
    if not path.exists():
        raise CheckpointError("heads not found", path)
    loaders = {"medusa": load_medusa, "eagle": load_eagle, "eagle3": load_eagle3, "mtp-linear": load_mtp,
               "mtp-single": load_mtp, "draft-model": load_draft_model}
    drafter = loaders[fmt](path, target, allow_pickle=allow_pickle)
    if heads_format and drafter.kind != heads_format:
        raise CheckpointError(f"--heads-format {heads_format} but the files hold {drafter.kind} heads", path)
    if drafter.kind == "eagle3":
        if draft_vocab or (draft_vocab is None and draft_vocab_path(drafter.path).is_file()):
            raise CheckpointError(f"EAGLE-3 heads carry their own draft vocabulary (d2t); remove {DRAFT_VOCAB_FILE}",
                                  drafter.path, "or pass --draft-vocab 0")
        return drafter
    drafter.draft_vocab = load_draft_vocab(drafter.path, target.arch.vocab_size, draft_vocab)
    return drafter


def resolve_tree(tree, drafter: DrafterSpec | None) -> TreeSpec:
    """Tree choices from the user, else the heads' own recorded tree, else a default that fits the drafter."""
    if drafter is None:
        return TreeSpec(())
    if tree is None:
        recorded = drafter.config.get("tree_choices")
        if recorded:
            return TreeSpec(normalize_choices(recorded))
        choices = DEFAULT_CHOICES
        if drafter.kind in ("medusa", "mtp-linear"):  # a static tree deeper than the heads cannot be filled
            choices = tuple(c for c in choices if len(c) <= drafter.num_heads)
        return TreeSpec(choices)
    choices = parse_choices(tree) if isinstance(tree, str) else normalize_choices(tree)
    if drafter.kind in ("medusa", "mtp-linear") and max((len(c) for c in choices), default=0) > drafter.num_heads:
        raise UsageError(f"tree depth {max(len(c) for c in choices)} exceeds the {drafter.num_heads} "
                         f"{drafter.kind} heads; use a tree of depth <= {drafter.num_heads}")
    return TreeSpec(choices)


def load_spec_model(target: str | Path, heads: str | Path | None = None, heads_format: str | None = None,
                    tree=None, dtype: str | torch.dtype | None = None, tp_size: int = 1, pp_size: int = 1,
                    allow_pickle: bool = False, draft_vocab: int | None = None) -> SpecModel:
    """Load + validate everything once; the result is what every later stage takes."""
    tgt = load_hf_causal_lm(target, allow_pickle=allow_pickle)
    drafter = load_drafter(heads, tgt, heads_format, allow_pickle, draft_vocab) if heads is not None else None
    if isinstance(dtype, str):
        try:
            dtype = resolve_dtype(dtype).dtype if dtype == "auto" else parse_dtype(dtype)
        except DtypeError as exc:
            raise UsageError(str(exc)) from None
    if dtype is None:
        if drafter is not None and drafter.dtype != tgt.dtype:
            raise CheckpointError(f"dtype mismatch: heads are {drafter.dtype}, target is {tgt.dtype}", drafter.path,
                                  "pass --dtype to run both in one dtype")
        dtype = tgt.dtype
    if tp_size < 1 or pp_size < 1:
        raise UsageError("--tp-size and --pp-size must be >= 1")
    return SpecModel(tgt, drafter, resolve_tree(tree, drafter), dtype, ParallelSpec(tp_size, pp_size))


def load_tokenizer(target: TargetSpec):
    """The target's tokenizer (transformers AutoTokenizer), or a clear error when the dir has none."""
    if target.tokenizer_path is None:
        raise CheckpointError("no tokenizer files (tokenizer.json / tokenizer.model)", target.path,
                              "copy the tokenizer into the target directory or pass token ids")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(target.tokenizer_path))
    except Exception as exc:  # transformers raises many types for broken tokenizer files
        raise CheckpointError(f"cannot load tokenizer ({exc.__class__.__name__}: {str(exc)[:120]})",
                              target.tokenizer_path) from None
