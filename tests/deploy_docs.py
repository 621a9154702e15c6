"""The shared deploy-format docs as data: the names the export tests check written keys against.

``../shared/docs/{DEPLOY_FORMATS,HEAD_FORMATS}.md`` beside the checkout (CI lays shared/ there). A test
asks for one section and gets the backticked names in it, with brace alternatives expanded
(``{q,k,v}_proj``) and placeholders (``{h}``, ``{i}``) and ``*`` turned into patterns.
"""

from __future__ import annotations

import itertools
import re
from functools import lru_cache
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1].parent / "shared" / "docs"


@lru_cache(maxsize=4)
def _text(name: str) -> str:
    p = DOCS / name
    if not p.is_file():
        pytest.skip(f"shared deploy docs not found at {p}")
    return p.read_text()


def section(doc: str, heading: str) -> str:
    """The text under the first markdown heading (any level) that starts with ``heading``, up to the
    next heading of the same or a higher level."""
    lines = _text(doc).splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(#+)\s+(.*)$", line)
        if m and m.group(2).startswith(heading):
            level = len(m.group(1))
            body = []
            for nxt in lines[i + 1 :]:
                n = re.match(r"^(#+)\s", nxt)
                if n and len(n.group(1)) <= level:
                    break
                body.append(nxt)
            return "\n".join(body)
    raise AssertionError(f"{doc} has no section {heading!r}")


def spans(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def _expand(token: str) -> list[str]:
    parts = re.split(r"(\{[^}]*\})", token)
    choices = []
    for p in parts:
        if p.startswith("{") and p.endswith("}"):
            inner = p[1:-1]
            choices.append(inner.split(",") if "," in inner else ["<N>"])
        else:
            choices.append([p])
    return ["".join(c) for c in itertools.product(*choices)]


def name_patterns(text: str) -> list[re.Pattern]:
    """Tensor-name patterns from a doc section: each span's first word, expanded."""
    out = []
    for s in spans(text):
        word = s.split()[0].strip("\"',:;") if s.split() else ""
        if "." not in word:
            continue
        for alt in _expand(word):
            rx = re.escape(alt).replace("<N>", r"\d+").replace(r"\*", ".*")
            out.append(re.compile(rf"(^|.*\.){rx}$"))
    return out


def documented_names(text: str) -> set[str]:
    """Every identifier-like word inside backticks (config keys, values)."""
    words = set()
    for s in spans(text):
        for alt in _expand(s):
            words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", alt))
    return words


def doc(name: str) -> str:
    return _text(name)


# TensorRT-LLM PyTorch backend and Triton llmapi facts (DEPLOY_FORMATS.md §1 and §2) ----------------------
TYPES = ("STRING", "BOOL", "INT32", "INT64", "UINT64", "FP32")


def deploy_section(number: int) -> str:
    """DEPLOY_FORMATS.md's section "N. ..."."""
    return section("DEPLOY_FORMATS.md", f"{number}.")


def between(body: str, start: str, end: str | None) -> str:
    i = body.index(start)
    j = body.index(end, i) if end else len(body)
    return body[i:j]


def llm_args_fields(block: str) -> set[str]:
    """Field names recorded as `name: Type=default` in a part of §1."""
    return set(re.findall(r"`([a-z][a-z0-9_]*): ", block))


def decoding_types() -> dict[str, str]:
    """Config class -> its decoding_type literal, as recorded in §1."""
    pairs = re.findall(r'`(\w+DecodingConfig)` \((?:literal )?`(?:decoding_type: )?"(\w+)"`[^)]*\)', deploy_section(1))
    return dict(pairs)


def pytorch_fields(config_class: str) -> set[str]:
    """Fields a speculative config of ``config_class`` may carry: the shared base fields + the class's own."""
    s1 = deploy_section(1)
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
    block = between(deploy_section(2), "**Inputs.**", "**Outputs.**")
    required = {n for line in block.splitlines() if "Required" in line for n in re.findall(r"`(\w+)`", line)}
    return _tensors(block, (1,)), required


def llmapi_outputs() -> dict[str, tuple[str, tuple[int, ...]]]:
    return _tensors(between(deploy_section(2), "**Outputs.**", "**`model.yaml`**"), None)


def llmapi_model_yaml_keys() -> set[str]:
    """Top-level model.yaml keys recorded in §2 (the rest are LLM-args keys, e.g. speculative_config)."""
    block = between(deploy_section(2), "**`model.yaml`**", "**How the speculative config")
    return set(re.findall(r"`(\w+): ", block)) | set(re.findall(r"`(\w+)`", block))
