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
