"""Entry point of every stage: target dir + heads (any registered kind) -> one validated SpecModel."""

from __future__ import annotations

from pathlib import Path

import torch

from trtspec.checkpoint.heads.draft_vocab import DRAFT_VOCAB_FILE, draft_vocab_path, load_draft_vocab
from trtspec.checkpoint.target import load_hf_causal_lm, load_tokenizer
from trtspec.drafters import registry
from trtspec.dtypes import DtypeError, parse_dtype, resolve_dtype
from trtspec.errors import CheckpointError, UsageError
from trtspec.parallel import Mapping
from trtspec.spec import DrafterSpec, SpecModel, TargetSpec, TreeSpec
from trtspec.tree import DEFAULT_CHOICES, normalize_choices, parse_choices, read_recorded_tree, tree_file

__all__ = ["drafter_inside", "load_drafter", "load_spec_model", "load_tokenizer", "resolve_tree"]


def load_drafter(
    path: str | Path,
    target: TargetSpec,
    heads_format: str | None = None,
    allow_pickle: bool = False,
    draft_vocab: int | None = None,
) -> DrafterSpec:
    """The heads at ``path`` in any format; ``draft_vocab``: None = the heads' own draft vocabulary if
    they carry one, 0 = the full vocabulary, N = its N most frequent tokens."""
    path = Path(path)
    if heads_format is not None:
        registry.get(heads_format)  # a clear error for an unknown name, before touching files
    if not path.exists():  # no such files: maybe an address that names a model-free kind
        addressed = registry.from_address(str(path), target)
        if addressed is not None:
            return _model_free(addressed, heads_format, draft_vocab)
        raise CheckpointError("heads not found", path)
    kind = registry.get(heads_format or registry.detect(path))
    found = registry.detect_or_none(path) if heads_format is not None else kind.name
    if found not in (None, kind.name):
        raise CheckpointError(f"--heads-format {heads_format} but the files hold {found} heads", path)
    drafter = kind.load(path, target, allow_pickle)
    if kind.model_free:
        return _model_free(drafter, heads_format, draft_vocab)
    if kind.own_draft_vocab:
        if draft_vocab or (draft_vocab is None and draft_vocab_path(drafter.path).is_file()):
            raise CheckpointError(
                f"{kind.name} heads carry their own draft vocabulary; remove {DRAFT_VOCAB_FILE}",
                drafter.path,
                "or pass --draft-vocab 0",
            )
        return drafter
    drafter.draft_vocab = load_draft_vocab(drafter.path, target.arch.vocab_size, draft_vocab)
    return drafter


def drafter_inside(target: Path) -> Path | None:
    """The target directory itself when its files hold a drafter (registry kinds with ``inside_target``)."""
    found = registry.detect_or_none(target)
    return target if found is not None and registry.get(found).inside_target else None


def _model_free(drafter: DrafterSpec, heads_format: str | None, draft_vocab: int | None) -> DrafterSpec:
    """A model-free drafter proposes the text's own tokens: a draft vocabulary means nothing to it."""
    if heads_format not in (None, drafter.kind):
        raise UsageError(f"--heads-format {heads_format} but --heads {drafter.path} selects {drafter.kind}")
    if draft_vocab:
        raise UsageError(f"--draft-vocab {draft_vocab}: {drafter.kind} drafts from the text and has no vocabulary")
    return drafter


def resolve_tree(tree, drafter: DrafterSpec | None) -> TreeSpec:
    """Tree choices from the user, else a tuned tree recorded beside the heads (``TREE_FILE``), else the
    heads' own tree (their format's field), else a default that fits the drafter."""
    if drafter is None:
        return TreeSpec(())
    limit = registry.get(drafter.kind).max_tree_depth(drafter)  # a static tree deeper than the heads cannot be filled
    if tree is None:
        tuned = read_recorded_tree(drafter.path) if Path(drafter.path).exists() else None
        if tuned is not None:
            spec = TreeSpec(tuned)
            if limit is not None and spec.depth > limit:
                raise CheckpointError(
                    f"recorded tree is deeper than the {limit} {drafter.kind} drafts",
                    tree_file(drafter.path),
                    "delete it, or re-run tune-tree --write-heads for these heads",
                )
            return spec
        recorded = drafter.config.get("tree_choices")
        if recorded:
            return TreeSpec(normalize_choices(recorded))
        return TreeSpec(tuple(c for c in DEFAULT_CHOICES if limit is None or len(c) <= limit))
    spec = TreeSpec(parse_choices(tree) if isinstance(tree, str) else normalize_choices(tree))
    if limit is not None and spec.depth > limit:
        raise UsageError(
            f"tree depth {spec.depth} exceeds the {limit} {drafter.kind} heads; use a tree of depth <= {limit}"
        )
    return spec


def load_spec_model(
    target: str | Path,
    heads: str | Path | None = None,
    heads_format: str | None = None,
    tree=None,
    dtype: str | torch.dtype | None = None,
    tp_size: int = 1,
    pp_size: int = 1,
    allow_pickle: bool = False,
    draft_vocab: int | None = None,
    also_draft: str | Path | None = None,
) -> SpecModel:
    """Load + validate everything once; the result is what every later stage takes. Without ``heads``, a
    target that carries its own drafter (a kind with ``inside_target``, e.g. MTP layers) drafts with it.
    ``also_draft``: a model-free drafter (address or settings directory) run beside the ``heads``."""
    tgt = load_hf_causal_lm(target, allow_pickle=allow_pickle)
    if heads is None and heads_format is None:
        heads = drafter_inside(tgt.path)
    drafter = load_drafter(heads, tgt, heads_format, allow_pickle, draft_vocab) if heads is not None else None
    also = _also_drafter(also_draft, drafter, tgt) if also_draft is not None else None
    if isinstance(dtype, str):
        try:
            dtype = resolve_dtype(dtype).dtype if dtype == "auto" else parse_dtype(dtype)
        except DtypeError as exc:
            raise UsageError(str(exc)) from None
    if dtype is None:
        if drafter is not None and drafter.dtype != tgt.dtype:
            raise CheckpointError(
                f"dtype mismatch: heads are {drafter.dtype}, target is {tgt.dtype}",
                drafter.path,
                "pass --dtype to run both in one dtype",
            )
        dtype = tgt.dtype
    if tp_size < 1 or pp_size < 1:
        raise UsageError("--tp-size and --pp-size must be >= 1")
    return SpecModel(tgt, drafter, resolve_tree(tree, drafter), dtype, Mapping(tp_size, pp_size), also=also)


def _also_drafter(also_draft: str | Path, drafter: DrafterSpec | None, target: TargetSpec) -> DrafterSpec:
    """The model-free drafter that runs beside the heads (a model drafter beside heads is refused)."""
    free = ", ".join(registry.model_free())
    if drafter is None:
        raise UsageError(f"--also-draft {also_draft} needs --heads (alone, pass it as --heads {also_draft})")
    if registry.get(drafter.kind).model_free:
        raise UsageError(f"--heads {drafter.path} is model-free already; --also-draft goes beside model heads")
    also = load_drafter(also_draft, target)
    if not registry.get(also.kind).model_free:
        raise UsageError(f"--also-draft {also_draft} holds {also.kind} heads; it takes a model-free drafter ({free})")
    return also
