"""The recorded TensorRT-LLM 1.2.1 facts the conformance tests check against (never a list of our own).

The file lives beside the checkout (``../shared/facts/trtllm_1.2.json`` from the repository root) because CI
clones the repository next to ``shared/``; ``TRTSPEC_TRTLLM_FACTS`` points elsewhere when needed.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEFAULT = REPO.parent / "shared" / "facts" / "trtllm_1.2.json"


def facts_path() -> Path:
    return Path(os.environ.get("TRTSPEC_TRTLLM_FACTS") or DEFAULT)


@lru_cache(maxsize=1)
def _load(path: str) -> dict:
    return json.loads(Path(path).read_text())


def facts() -> dict:
    """The facts as a dict; skips (with the path) when the file is not there rather than inventing them."""
    p = facts_path()
    if not p.is_file():
        pytest.skip(f"TensorRT-LLM 1.2.1 facts not found at {p} (set TRTSPEC_TRTLLM_FACTS)")
    return _load(str(p))
