"""Offline text of three kinds, so drafts are trained (and checked) on more than one chat corpus.

A drafter trained on one small chat set accepts little on prose or code, and a user's traffic is all of
these. Every source here installs offline with the project, and its license allows the use:

* ``chat``: chitchat-dataset 0.9.0 (PyPI, MIT): real conversations, rendered with the target's chat template.
  One item per conversation (a prefix of 1-4 turns ending with a user turn).
* ``chat-turns``: every user turn of the conversations ``chat`` trains on, each with the exchange before it
  or none (chosen at random): about 20x ``chat``'s items, for drafters that memorise one reply per
  conversation. Conversations with an evaluation item are left out, so ``chat-eval`` stays unseen.
* ``prose``: the Python documentation's topic texts that ship in the standard library (``pydoc_data.topics``,
  PSF License 2.0): English explanatory prose, continued raw (no chat template).
* ``code``: the Python standard library's own ``.py`` sources (PSF License 2.0), continued raw.

Each source is cut into items deterministically and split once: the last ``EVAL_SHARE`` of its items are
for evaluation only (``<source>-eval``), never trained on. ``mix`` draws from the training parts with
per-source weights. Data specs: ``chat|prose|code|mix|chat-turns[:N]``, ``<source>-eval[:N]``, and
``mix:N:chat=0.5,prose=0.25,code=0.25`` for other weights.
"""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path

from trtspec.errors import UsageError

SOURCES = ("chat", "prose", "code")
DEFAULT_WEIGHTS = {"chat": 0.5, "prose": 0.25, "code": 0.25}
EVAL_SHARE = 0.1
CHUNK_CHARS = 1200  # a raw-continuation prompt: long enough to set the context, short enough to prefill fast


def _prose_items() -> list[str]:
    from pydoc_data.topics import topics

    items = []
    for key in sorted(topics):
        text = topics[key].strip()
        for i in range(0, len(text), CHUNK_CHARS):
            chunk = text[i : i + CHUNK_CHARS].strip()
            if len(chunk) > 200:
                items.append(chunk)
    return items


def _code_items() -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    items = []
    for f in sorted(root.glob("*.py")):  # top-level modules: a fixed, version-stable-enough set
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for i in range(0, min(len(text), 4 * CHUNK_CHARS), CHUNK_CHARS):
            chunk = text[i : i + CHUNK_CHARS]
            if len(chunk.strip()) > 200:
                items.append(chunk)
    return items


def _split(items: list, evaluation: bool) -> list:
    cut = len(items) - max(1, int(len(items) * EVAL_SHARE))
    return items[cut:] if evaluation else items[:cut]


def _first_eval_conversation(items: list) -> int:
    """The index of the first conversation whose ``chat`` item is in the evaluation part (``items``: one
    per conversation, in order; duplicates keep their first conversation, as ``source_samples`` does)."""
    first: dict = {}
    for i, item in enumerate(items):
        first.setdefault(item, i)
    kept = sorted(first.values())
    return kept[len(kept) - max(1, int(len(kept) * EVAL_SHARE))]


def chat_turn_samples(seed: int = 0) -> list:
    """Every user turn of the training conversations as an item (see the module docstring), shuffled with
    ``seed``. Why: ``chat`` uses one cut per conversation, and a block drafter trained for long on those
    replies memorises them; the conversations have ~34 turns each."""
    from trtspec.train.data import Sample, chitchat_conversations, chitchat_samples

    conversations = chitchat_conversations()
    held = set(_split(list(dict.fromkeys(chitchat_samples(None, 0))), True))
    stop = _first_eval_conversation(chitchat_samples(None, 0))
    rng = random.Random(seed)
    items = []
    for turns in conversations[:stop]:
        for user in range(0, len(turns), 2):
            start = user - 2 * rng.randrange(2) if user >= 2 else user
            msgs = tuple(("user" if i % 2 == 0 else "assistant", turns[i]) for i in range(start, user + 1))
            items.append(Sample(messages=msgs))
    items = [s for s in dict.fromkeys(items) if s not in held]
    rng.shuffle(items)
    return items


def source_samples(name: str, evaluation: bool = False, seed: int = 0):
    """Every item of one source's training (or evaluation) part, shuffled with ``seed``."""
    from trtspec.train.data import Sample, chitchat_samples

    if name == "chat":
        items = chitchat_samples(None, 0)
    elif name == "prose":
        items = [Sample(text=t, raw=True) for t in _prose_items()]
    elif name == "code":
        items = [Sample(text=t, raw=True) for t in _code_items()]
    else:
        raise UsageError(f"unknown data source {name!r}; choose one of {', '.join(SOURCES)} or mix")
    items = list(dict.fromkeys(items))  # duplicates (chitchat has many "Hello!"s) would leak across the split
    part = _split(items, evaluation)
    random.Random(seed).shuffle(part)
    return part


def parse_weights(text: str) -> dict[str, float]:
    weights = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        if key not in SOURCES:
            raise UsageError(f"unknown mix source {key!r}; choose from {', '.join(SOURCES)}")
        try:
            weights[key] = float(value)
        except ValueError:
            raise UsageError(f"mix weight for {key} must be a number, got {value!r}") from None
    if sum(weights.values()) <= 0:
        raise UsageError("mix weights must add up to more than 0")
    return weights


def mix_samples(total: int | None, weights: dict[str, float] | None = None, seed: int = 0) -> list:
    """``total`` training items drawn from the sources in proportion to ``weights`` (default: as many as the
    smallest weighted source allows), interleaved so any prefix keeps the proportions."""
    weights = weights or DEFAULT_WEIGHTS
    norm = sum(weights.values())
    pools = {k: source_samples(k, False, seed) for k, w in weights.items() if w > 0}
    if total is None:
        total = int(min(len(p) / (weights[k] / norm) for k, p in pools.items()))
    counts = {k: min(len(p), round(total * weights[k] / norm)) for k, p in pools.items()}
    picked = {k: pools[k][: counts[k]] for k in pools}
    out, cursor = [], {k: 0 for k in picked}
    while any(cursor[k] < len(picked[k]) for k in picked):  # round-robin by weight
        for k in picked:
            take = max(1, round(weights[k] / min(weights[j] for j in picked)))
            out.extend(picked[k][cursor[k] : cursor[k] + take])
            cursor[k] += take
    return out


def corpus_samples(spec: str, seed: int = 0) -> list | None:
    """Samples for a built-in corpus spec, or None when ``spec`` names no built-in corpus."""
    name, _, rest = spec.partition(":")
    evaluation = name.endswith("-eval")
    base = name.removesuffix("-eval")
    if base not in (*SOURCES, "mix", "chat-turns"):
        return None
    count_text, _, weight_text = rest.partition(":")
    if count_text and not count_text.isdigit():
        raise UsageError(f"bad data source {spec!r}; use {base}[:N]")
    count = int(count_text) if count_text else None
    if base == "chat-turns":
        if evaluation:
            raise UsageError("chat-turns has no evaluation part of its own; evaluate on chat-eval")
        got = chat_turn_samples(seed)
    elif base == "mix":
        if evaluation:
            parts = [source_samples(k, True, seed) for k in SOURCES]
            got = [s for group in zip(*parts) for s in group]
        else:
            got = mix_samples(count, parse_weights(weight_text) if weight_text else None, seed)
    else:
        got = source_samples(base, evaluation, seed)
    return got[:count] if count else got
