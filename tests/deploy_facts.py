"""Facts about the PyTorch backend, Triton llmapi and vLLM formats, read from the recorded
``../shared/docs/DEPLOY_FORMATS.md`` (sources cited there), never from a list of our own."""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEFAULT = REPO.parent / "shared" / "docs" / "DEPLOY_FORMATS.md"
TYPES = ("STRING", "BOOL", "INT32", "INT64", "UINT64", "FP32")


@lru_cache(maxsize=1)
def text() -> str:
    p = Path(os.environ.get("TRTSPEC_DEPLOY_FORMATS") or DEFAULT)
    if not p.is_file():
        pytest.skip(f"deploy-format facts not found at {p} (set TRTSPEC_DEPLOY_FORMATS)")
    return p.read_text()


def section(number: int) -> str:
    """The text of '## N. ...' up to the next '## '."""
    m = re.search(rf"^## {number}\..*?(?=^## |\Z)", text(), re.S | re.M)
    assert m, f"DEPLOY_FORMATS.md has no section {number}"
    return m.group(0)


def between(body: str, start: str, end: str | None) -> str:
    i = body.index(start)
    j = body.index(end, i) if end else len(body)
    return body[i:j]


def llm_args_fields(block: str) -> set[str]:
    """Field names recorded as `name: Type=default` in a part of §1."""
    return set(re.findall(r"`([a-z][a-z0-9_]*): ", block))


def decoding_types() -> dict[str, str]:
    """Config class -> its decoding_type literal, as recorded in §1."""
    pairs = re.findall(r'`(\w+DecodingConfig)` \((?:literal )?`(?:decoding_type: )?"(\w+)"`\)', section(1))
    return dict(pairs)


def pytorch_fields(config_class: str) -> set[str]:
    """Fields a speculative config of ``config_class`` may carry: the shared base fields + the class's own."""
    s1 = section(1)
    base = llm_args_fields(between(s1, "**`DecodingBaseConfig` fields", "**`EagleDecodingConfig`"))
    own: dict[str, str] = {
        "Eagle3DecodingConfig": between(s1, "**`EagleDecodingConfig`", "**`MTPDecodingConfig`"),
        "EagleDecodingConfig": between(s1, "**`EagleDecodingConfig`", "**`MTPDecodingConfig`"),
        "MTPDecodingConfig": between(s1, "**`MTPDecodingConfig`", "**The other configs"),
    }
    block = own.get(config_class)
    if block is None:  # the one-paragraph configs of "The other configs"
        m = re.search(rf"\*\*`{config_class}`.*?(?=\n- \*\*|\n\*\*|\Z)", s1, re.S)
        block = m.group(0) if m else ""
    return base | llm_args_fields(block) | {"decoding_type"}


def _tensors(block: str, default_dims: tuple[int, ...] | None) -> dict[str, tuple[str, tuple[int, ...]]]:
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for line in block.splitlines():
        pending: list[str] = []
        last: list[str] = []
        for m in re.finditer(r"`(\w+)`|\b(" + "|".join(TYPES) + r")\b|\[(-?1)\]", line):
            name, typ, dim = m.groups()
            if name:
                pending.append(name)
            elif typ:
                for n in pending:
                    out[n] = (typ, default_dims or ())
                last, pending = pending, []
            elif dim and last:
                for n in last:
                    out[n] = (out[n][0], (int(dim),))
    return out


def llmapi_inputs() -> tuple[dict[str, tuple[str, tuple[int, ...]]], set[str]]:
    """Triton llmapi inputs {name: (type, dims)} and the required ones (§2)."""
    block = between(section(2), "**Inputs.**", "**Outputs.**")
    required = {n for line in block.splitlines() if "Required" in line for n in re.findall(r"`(\w+)`", line)}
    return _tensors(block, (1,)), required


def llmapi_outputs() -> dict[str, tuple[str, tuple[int, ...]]]:
    return _tensors(between(section(2), "**Outputs.**", "**`model.yaml`**"), None)


def llmapi_model_yaml_keys() -> set[str]:
    """Top-level model.yaml keys recorded in §2 (the rest are LLM-args keys, e.g. speculative_config)."""
    block = between(section(2), "**`model.yaml`**", "**How the speculative config")
    return set(re.findall(r"`(\w+): ", block)) | set(re.findall(r"`(\w+)`", block))
