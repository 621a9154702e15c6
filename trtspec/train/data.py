"""Training / calibration data: files or the built-in chitchat corpus -> token-id sequences.

Why chat formatting matters: heads learn the target's behaviour on the exact token stream it will see
when serving. A chat model served with its chat template but trained on raw text sees different
contexts (no role markers, no system prompt) and acceptance collapses, so chat data is rendered with
the target tokenizer's own template, ending in the generation prompt the server adds.

Accepted inputs (``--data``, repeatable):
  * ``mix[:N]`` (train-heads' default), ``chat``, ``prose``, ``code``, ``<source>-eval``: the offline
    corpora of trtspec.train.corpora (chat with the template, prose and code continued raw; the eval parts
    are never trained on).
  * ``chitchat`` or ``chitchat:N``: the chitchat-dataset package (N conversations, default all).
  * ``*.jsonl``: one object per line, ``{"text": ...}``, ``{"messages": [{"role", "content"}, ...]}``
    (OpenAI style) or ``{"conversations": [{"from", "value"}, ...]}`` (ShareGPT style).
  * ``*.json``: a list of such objects.
  * ``*.txt`` / other text: documents separated by blank lines.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtspec.errors import CheckpointError, UsageError
from trtspec.train.corpora import corpus_samples

_ROLE_MAP = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "bot": "assistant",
    "system": "system",
}


@dataclass(frozen=True)
class Sample:
    """One training item: plain text, or chat messages (the last one is the turn the target answers)."""

    text: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None  # (role, content)
    raw: bool = False  # continue the text as it is (prose, code): never wrapped in the chat template


def _messages(obj: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(obj, list) or not obj:
        raise CheckpointError(
            f"{where}: 'messages' must be a non-empty list", None, 'use [{"role": "user", "content": "..."}, ...]'
        )
    out = []
    for m in obj:
        if not isinstance(m, dict):
            raise CheckpointError(f"{where}: each message must be an object with role/content")
        role = m.get("role", m.get("from"))
        content = m.get("content", m.get("value"))
        if not isinstance(role, str) or not isinstance(content, str):
            raise CheckpointError(f"{where}: a message lacks a string role/content (or from/value)")
        out.append((_ROLE_MAP.get(role.lower(), role.lower()), content))
    return tuple(out)


def _sample(obj: Any, where: str) -> Sample:
    if isinstance(obj, str):
        return Sample(text=obj)
    if not isinstance(obj, dict):
        raise CheckpointError(
            f"{where}: expected a JSON object, got {type(obj).__name__}",
            None,
            'each line must be {"text": ...} or {"messages": [...]}',
        )
    if isinstance(obj.get("text"), str):
        return Sample(text=obj["text"])
    for key in ("messages", "conversations", "conversation"):
        if key in obj:
            return Sample(messages=_messages(obj[key], where))
    raise CheckpointError(f"{where}: object has none of 'text', 'messages', 'conversations' (keys: {sorted(obj)[:6]})")


def read_jsonl(path: Path) -> list[Sample]:
    out = []
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CheckpointError(
                    f"line {i} is not valid JSON ({exc.msg})", path, "one JSON object per line"
                ) from None
            out.append(_sample(obj, f"{path}:{i}"))
    return out


def read_json_file(path: Path) -> list[Sample]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"not valid JSON ({exc.msg} at line {exc.lineno})", path) from None
    if isinstance(data, dict):
        data = data.get("data", [data])
    if not isinstance(data, list):
        raise CheckpointError("expected a JSON list of samples", path)
    return [_sample(o, f"{path}[{i}]") for i, o in enumerate(data)]


def read_text(path: Path) -> list[Sample]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise CheckpointError("not UTF-8 text", path, "pass .jsonl, .json or UTF-8 .txt files") from None
    docs = [d.strip() for d in text.split("\n\n")]
    return [Sample(text=d) for d in docs if d]


def chitchat_conversations(limit: int | None = None) -> list[list[str]]:
    """The chitchat-dataset conversations as lists of turns (a turn = one speaker's consecutive
    messages joined by newlines), in the package's order."""
    try:
        import chitchat_dataset
    except ImportError:
        raise UsageError(
            "the chitchat corpus needs the chitchat-dataset package: pip install --no-deps chitchat-dataset==0.9.0"
        ) from None
    raw = chitchat_dataset.Dataset()
    convs = []
    for conv in raw.values():
        turns = ["\n".join(u["text"].strip() for u in turn if u.get("text", "").strip()) for turn in conv["messages"]]
        turns = [t for t in turns if t]
        if len(turns) >= 2:
            convs.append(turns)
        if limit is not None and len(convs) >= limit:
            break
    return convs


def chitchat_samples(limit: int | None = None, seed: int = 0, max_turns: int = 4) -> list[Sample]:
    """Chat samples from chitchat: speaker 1 = user, speaker 2 = assistant; each sample is a
    conversation prefix of 1..max_turns turns ending with a user turn (the target writes the reply)."""
    rng = random.Random(seed)
    out = []
    for turns in chitchat_conversations(limit):
        n_user = (min(len(turns), max_turns) + 1) // 2
        end = 2 * rng.randrange(n_user) + 1  # odd number of turns: ends with a user turn
        msgs = tuple(("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(turns[:end]))
        out.append(Sample(messages=msgs))
    return out


def load_samples(sources: list[str] | tuple[str, ...], seed: int = 0) -> list[Sample]:
    """Read every ``--data`` source; raise a clear error for missing, empty or malformed input."""
    if not sources:
        raise UsageError("no --data given; pass a .jsonl/.json/.txt file, 'mix', 'chat', 'prose', 'code' or 'chitchat'")
    samples: list[Sample] = []
    for src in sources:
        src = str(src)
        builtin = corpus_samples(src, seed)
        if builtin is not None:
            got = builtin
        elif src == "chitchat" or src.startswith("chitchat:"):
            n = src.split(":", 1)[1] if ":" in src else ""
            if n and not n.isdigit():
                raise UsageError(f"bad data source {src!r}; use chitchat or chitchat:N")
            got = chitchat_samples(int(n) if n else None, seed)
        else:
            path = Path(src)
            if not path.is_file():
                raise CheckpointError("data file not found", path)
            if path.stat().st_size == 0:
                raise CheckpointError("data file is empty", path, "give it at least one sample")
            suffix = path.suffix.lower()
            got = (
                read_jsonl(path)
                if suffix == ".jsonl"
                else read_json_file(path)
                if suffix == ".json"
                else read_text(path)
            )
            if not got:
                raise CheckpointError("data file holds no samples", path)
        samples.extend(got)
    return samples


def split_holdout(samples: list[Sample], holdout: int) -> tuple[list[Sample], list[Sample]]:
    """Last ``holdout`` samples are held out (the benchmark evaluates on conversations never trained on)."""
    if holdout <= 0:
        return samples, []
    if holdout >= len(samples):
        raise UsageError(f"--holdout {holdout} leaves no training samples (only {len(samples)})")
    return samples[:-holdout], samples[-holdout:]


def _ids(x) -> list[int]:
    if hasattr(x, "keys"):
        x = x["input_ids"]
    return [int(t) for t in x]


def encode_prompt(tokenizer, sample: Sample, chat: bool = True) -> list[int]:
    """The prompt the target continues: chat samples end with the generation prompt."""
    if sample.messages is not None:
        if not getattr(tokenizer, "chat_template", None):
            raise UsageError(
                "chat data needs a tokenizer with a chat template (the target's has none); "
                "use text data or add a chat_template to the tokenizer config"
            )
        msgs = [{"role": r, "content": c} for r, c in sample.messages]
        add_gen = msgs[-1]["role"] != "assistant"
        return _ids(tokenizer.apply_chat_template(msgs, add_generation_prompt=add_gen, tokenize=True))
    text = sample.text or ""
    if chat and not sample.raw and getattr(tokenizer, "chat_template", None):
        return _ids(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
        )
    return _ids(tokenizer(text)["input_ids"])


def encode_text(tokenizer, sample: Sample) -> list[int]:
    """The whole sample as one sequence (teacher-forced distillation on the data's own tokens)."""
    if sample.messages is not None:
        if not getattr(tokenizer, "chat_template", None):
            raise UsageError("chat data needs a tokenizer with a chat template")
        msgs = [{"role": r, "content": c} for r, c in sample.messages]
        return _ids(tokenizer.apply_chat_template(msgs, tokenize=True))
    return _ids(tokenizer(sample.text or "")["input_ids"])


def encode_text_with_mask(tokenizer, sample: Sample) -> tuple[list[int], list[int]]:
    """``encode_text`` plus a 0/1 per token: 1 on the assistant turns of chat data (what the target
    writes when serving, so the only text a drafter is trained to predict), 0 on system and user turns
    and the template's role headers; every token of plain text is 1. Each assistant turn is located by
    rendering the conversation up to it with the tokenizer's own chat template (generation prompt
    included) and up to its end."""
    ids = encode_text(tokenizer, sample)
    if sample.messages is None:
        return ids, [1] * len(ids)
    msgs = [{"role": r, "content": c} for r, c in sample.messages]
    mask = [0] * len(ids)
    for k, m in enumerate(msgs):
        if m["role"] != "assistant" or k == 0:  # an opening assistant turn answers nothing: context only
            continue
        head = _ids(tokenizer.apply_chat_template(msgs[:k], add_generation_prompt=True, tokenize=True))
        upto = _ids(tokenizer.apply_chat_template(msgs[: k + 1], tokenize=True))
        if ids[: len(head)] != head or ids[: len(upto)] != upto:
            raise UsageError(
                "the tokenizer's chat template renders a conversation's start differently from the whole "
                "conversation, so its assistant turns cannot be located; use --distill generate"
            )
        mask[len(head) : len(upto)] = [1] * (len(upto) - len(head))
    return ids, mask


def check_lengths(seqs: list[list[int]], horizon: int, what: str = "data") -> None:
    """Every heads kind needs sequences longer than its horizon (tokens ahead it predicts)."""
    usable = sum(1 for s in seqs if len(s) > horizon + 1)
    if usable == 0:
        longest = max((len(s) for s in seqs), default=0)
        raise UsageError(
            f"{what}: every sequence is too short for the heads' horizon of {horizon} tokens "
            f"(longest has {longest} tokens); use longer texts or fewer heads"
        )


def check_token_ids(items: list[list[int]], vocab_size: int, target_path) -> None:
    """Refuse data whose tokenizer does not belong to the target: an id the target has no embedding for
    would index past its vocabulary (a crash deep in the forward, or silently wrong labels)."""
    top = max((max(it) for it in items if it), default=-1)
    if top >= vocab_size:
        raise CheckpointError(
            f"the tokenizer produced token id {top}, but the target's vocabulary has {vocab_size} tokens: "
            "the tokenizer and the model do not match",
            target_path,
            "use the tokenizer the target was trained with",
        )
