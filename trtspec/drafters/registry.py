"""The registry: every drafter kind trtspec knows, in detection order, and the questions asked of them.

Adding a kind = one module under ``trtspec/drafters/`` that defines ``KIND`` + one line in ``_MODULES``.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from trtspec.checkpoint.heads.draft_vocab import DRAFT_VOCAB_FILE
from trtspec.checkpoint.tensors import read_safetensors_header
from trtspec.drafters.base import DirFacts, DrafterKind
from trtspec.drafters.trtspec_heads import META_FILE
from trtspec.errors import CheckpointError, UsageError
from trtspec.spec import DrafterSpec, TargetSpec

#: Kind modules in detection order (files that could match two kinds go to the earlier one).
_MODULES = (
    "trtspec.drafters.mtp_linear",
    "trtspec.drafters.mtp_single",
    "trtspec.drafters.medusa",
    "trtspec.drafters.eagle3",
    "trtspec.drafters.dspark",
    "trtspec.drafters.dflash",
    "trtspec.drafters.eagle",
    "trtspec.drafters.native_mtp",  # before draft-model: both are HF directories with model.layers.*
    "trtspec.drafters.draft_model",
    "trtspec.drafters.ngram",
    "trtspec.drafters.suffix",
)

KINDS: dict[str, DrafterKind] = {}
for _name in _MODULES:
    _kind: DrafterKind = importlib.import_module(_name).KIND
    KINDS[_kind.name] = _kind


def names() -> tuple[str, ...]:
    return tuple(KINDS)


def trainable() -> tuple[str, ...]:
    return tuple(n for n, k in KINDS.items() if k.training is not None)


def model_free() -> tuple[str, ...]:
    """Kinds selected by an address (``--heads NAME[:ARG]``) rather than files."""
    return tuple(n for n, k in KINDS.items() if k.model_free)


def from_address(text: str, target: TargetSpec) -> DrafterSpec | None:
    """The model-free drafter an address names (``ngram``, ``suffix:corpus.txt``, ...), or None."""
    for kind in KINDS.values():
        if kind.address is not None:
            spec = kind.address(text, target)
            if spec is not None:
                return spec
    return None


def get(name: str) -> DrafterKind:
    """The record of a kind, or a usage error that lists the kinds there are."""
    if name not in KINDS:
        raise UsageError(f"unknown drafter kind {name!r}; choose one of {', '.join(KINDS)}")
    return KINDS[name]


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"not valid JSON ({exc})", path) from None
    return data if isinstance(data, dict) else None


def dir_facts(path: Path) -> DirFacts:
    """Read what detection needs once: the two metadata files and the first weight file's tensor names."""
    if not path.exists():
        raise CheckpointError("heads not found", path)
    directory = path if path.is_dir() else path.parent
    weights = (
        [path]
        if path.is_file() and path.suffix == ".safetensors"
        else sorted(f for f in directory.glob("*.safetensors") if f.name != DRAFT_VOCAB_FILE)
    )
    names_in_file = tuple(read_safetensors_header(weights[0])) if weights else ()
    return DirFacts(
        path=path,
        directory=directory,
        trtspec_meta=_read_json(directory / META_FILE),
        config=_read_json(directory / "config.json") or {},
        tensor_names=names_in_file,
        files=tuple(sorted(f.name for f in directory.iterdir())),
    )


def detect(path: str | Path) -> str:
    """Name the kind of a heads path from its files, or raise naming what was found."""
    path = Path(path)
    facts = dir_facts(path)
    for kind in KINDS.values():
        if kind.detect(facts):
            return kind.name
    if facts.trtspec_meta is not None:
        raise CheckpointError(
            f"unknown heads kind {facts.trtspec_meta.get('kind')!r}",
            facts.directory / META_FILE,
            f"expected one of {', '.join(KINDS)}",
        )
    raise CheckpointError("unknown heads format", path, f"pass --heads-format with one of {', '.join(KINDS)}")


def detect_or_none(path: str | Path) -> str | None:
    """The detected kind, or None when the files match no kind (a user's --heads-format then decides)."""
    try:
        return detect(path)
    except CheckpointError:
        return None
