"""What the model-free kinds share: an n-gram index over token ids, a drafter that fills a static tree
from matched continuations, and the files and addresses that select such a kind.

A model-free drafter has no weights: it finds where the last tokens of a sequence occurred before (in
the prompt, in what was generated, or in a corpus) and proposes what followed there. The static tree is
filled like a trie of those continuations: a node's children are the distinct next tokens of the
continuations that agree with the node's path, ranked by weight (how many continuations, or how recent).
Nodes no continuation reaches, or that the kind does not trust, are reported by ``drafted()`` so the
loop verifies only what some sequence drafted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trtspec.checkpoint.tensors import TensorStore
from trtspec.drafters.base import DirFacts
from trtspec.drafters.trtspec_heads import META_FILE, declared_kind
from trtspec.errors import CheckpointError, UsageError
from trtspec.fsutil import atomic_directory
from trtspec.spec import DrafterSpec, TargetSpec
from trtspec.tree import TreeBuffers

#: separates documents in a corpus's token stream: a continuation never runs into the next document
SEPARATOR = -1
CORPUS_TENSOR = "corpus_ids"
CORPUS_FILE = "corpus.jsonl"

#: (continuation tokens, weight) candidates for one sequence
Candidates = list[tuple[list[int], float]]


class TokenIndex:
    """Every n-gram (n = 1..max_n) of a growing token stream -> the positions right after its occurrences.

    Why a table and not a suffix tree: with patterns capped at ``max_n`` tokens the table answers the
    same question (where did this suffix occur, and what followed) with a dict lookup per length, and an
    append costs ``max_n`` inserts. Positions are kept in increasing order (the most recent is last)."""

    def __init__(self, max_n: int):
        self.max_n = max_n
        self.tokens: list[int] = []
        self.table: dict[tuple[int, ...], list[int]] = {}

    def extend(self, tokens: list[int]) -> None:
        for t in tokens:
            self.tokens.append(t)
            end = len(self.tokens)
            for n in range(1, min(self.max_n, end) + 1):
                key = tuple(self.tokens[end - n : end])
                if SEPARATOR not in key:
                    self.table.setdefault(key, []).append(end)

    def longest_match(self, context: list[int], min_n: int, max_n: int) -> tuple[int, list[int]]:
        """The longest n in [min_n, max_n] whose last-n-tokens pattern of ``context`` occurred with at
        least one following token, and those occurrences' positions (right after the pattern).
        (0, []) when nothing matches. The context's own last occurrence (at its end) never counts."""
        limit = len(self.tokens)
        for n in range(min(max_n, self.max_n, len(context)), min_n - 1, -1):
            hits = self.table.get(tuple(context[len(context) - n :]))
            if not hits:
                continue
            found = [p for p in hits if p < limit and self.tokens[p] != SEPARATOR]
            if found:
                return n, found
        return 0, []

    def continuation(self, position: int, length: int) -> list[int]:
        """Up to ``length`` tokens from ``position``, stopping at a document separator."""
        out = self.tokens[position : position + length]
        return out[: out.index(SEPARATOR)] if SEPARATOR in out else out


def fill_tree(
    tree: TreeBuffers, root: int, cands: Candidates, max_depth: int, min_prob: float = 0.0
) -> tuple[list[int], list[bool]]:
    """Tokens and trust per node of ``tree`` from one sequence's candidates (see the module docstring).

    A node is drafted when some candidate reaches it, its depth is <= ``max_depth``, and its path
    probability (the product, along the path, of each node's share of its parent's continuing weight)
    is >= ``min_prob``. Undrafted nodes get the root token (never verified unless another row drafts)."""
    parents, depths, ranks = tree.parents.tolist(), tree.depths.tolist(), tree.ranks.tolist()
    tokens, drafted = [root] * tree.size, [False] * tree.size
    drafted[0] = True
    members: list[list[int]] = [list(range(len(cands)))] + [[] for _ in range(tree.size - 1)]
    prob = [1.0] * tree.size
    ranked: dict[int, list[tuple[int, float, list[int], float]]] = {}
    for n in range(1, tree.size):
        p, d = parents[n], depths[n]
        if not drafted[p] or d > max_depth:
            continue
        if p not in ranked:
            groups: dict[int, tuple[float, list[int]]] = {}
            for i in members[p]:
                seq, w = cands[i]
                if len(seq) >= d:
                    total, idx = groups.get(seq[d - 1], (0.0, []))
                    groups[seq[d - 1]] = (total + w, idx + [i])
            mass = sum(w for w, _ in groups.values())
            order = sorted(groups.items(), key=lambda kv: -kv[1][0])  # stable: ties keep first appearance
            ranked[p] = [(tok, w, idx, w / mass) for tok, (w, idx) in order]
        if ranks[n] >= len(ranked[p]):
            continue
        tok, _, idx, share = ranked[p][ranks[n]]
        if prob[p] * share < min_prob:
            continue
        tokens[n], drafted[n], members[n], prob[n] = tok, True, idx, prob[p] * share
    return tokens, drafted


class MatchDrafter:
    """The Drafter protocol for model-free kinds: per-sequence histories and indexes, tree filling.

    Subclasses say what to propose for one sequence: ``candidates(b, depth)`` returns the candidates, the
    deepest depth the kind trusts for them, and the minimum path probability of a drafted node."""

    aux_layers: tuple[int, ...] = ()
    max_depth: int | None = None

    def __init__(self, max_n: int):
        self.max_n = max_n
        self.index: list[TokenIndex] = []
        self._drafted: torch.Tensor | None = None

    def reset(self, batch: int, capacity: int) -> None:
        self.index = [TokenIndex(self.max_n) for _ in range(batch)]
        self._drafted = None

    def forget(self, rows: list[int]) -> None:
        """Slots ``rows`` start new sequences (in-flight batching): their histories restart empty, so a
        request never matches the text of the one that held its slot before."""
        for r in rows:
            self.index[r] = TokenIndex(self.max_n)

    def observe(self, hidden, aux, tokens_in, tokens_next, rows: list[int] | None = None) -> None:
        """Extend each history with what was committed (the history always ends with the next root).
        ``rows``: the slots these sequences live in; None = rows 0..B-1."""
        for b, nxt in enumerate(tokens_next):
            idx = self.index[b if rows is None else rows[b]]
            if not idx.tokens:
                idx.extend([int(tokens_in[b][0])])
            idx.extend([int(t) for t in nxt.tolist()])

    def candidates(self, b: int, depth: int) -> tuple[Candidates, int, float]:
        """Candidates for the sequence in slot ``b`` (see the class docstring)."""
        raise NotImplementedError

    def propose(self, tree: TreeBuffers, root: torch.Tensor, rows: list[int] | None = None) -> torch.Tensor:
        """[B, tree.size] tokens for the sequences in slots ``rows`` (None = rows 0..B-1); ``drafted()``
        then holds their trust, in the same order."""
        slots = range(root.shape[0]) if rows is None else rows
        tokens, trust = [], []
        for b, slot in enumerate(slots):
            cands, depth, min_prob = self.candidates(slot, tree.max_depth)
            toks, ok = fill_tree(tree, int(root[b]), cands, depth, min_prob)
            tokens.append(toks)
            trust.append(ok)
        self._drafted = torch.tensor(trust, dtype=torch.bool)
        return torch.tensor(tokens, dtype=torch.long)

    def drafted(self) -> torch.Tensor | None:
        return self._drafted

    def pack(self, target_projection) -> None:
        """Nothing to pack: no weights."""

    def tune_small_rows(self, target_projection, dtype, device) -> None:
        """No matmuls."""


# -- selecting a model-free kind: an address, or a settings directory ------------------------------------


def address_argument(text: str, name: str) -> tuple[bool, str | None]:
    """Does ``text`` name the kind ``name`` ("name" or "name:argument"), and with which argument."""
    head, sep, arg = text.partition(":")
    if head != name:
        return False, None
    if sep and not arg:
        raise UsageError(f"--heads {text}: nothing after ':'; use {name} or {name}:ARGUMENT")
    return True, arg or None


def detect_settings(name: str) -> Callable[[DirFacts], bool]:
    """A settings directory (``trtspec_heads.json`` declaring the kind, no weights) holds this kind."""
    return lambda facts: declared_kind(facts.trtspec_meta) == name


@dataclass(frozen=True)
class Settings:
    """A model-free kind's knobs: their defaults, and how to check a user's value."""

    defaults: dict[str, Any]

    def merged(self, given: dict[str, Any], where: Path | str) -> dict[str, Any]:
        unknown = set(given) - set(self.defaults)
        if unknown:
            raise CheckpointError(
                f"unknown settings {sorted(unknown)}", where, f"known: {', '.join(sorted(self.defaults))}"
            )
        out = dict(self.defaults)
        for k, v in given.items():
            want = type(self.defaults[k])
            if want is float and isinstance(v, int):
                v = float(v)
            if not isinstance(v, want) or isinstance(v, bool) is not (want is bool):
                raise CheckpointError(f"setting {k!r} must be {want.__name__}, got {v!r}", where)
            out[k] = v
        return out


def read_settings_dir(path: Path, name: str, settings: Settings) -> tuple[Path, dict[str, Any]]:
    """The settings a directory's ``trtspec_heads.json`` records for the kind (unset ones: defaults)."""
    directory = path if path.is_dir() else path.parent
    meta_path = directory / META_FILE
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read settings ({exc})", meta_path) from None
    if declared_kind(meta) != name:
        raise CheckpointError(f"declares kind {meta.get('kind')!r}, expected {name!r}", meta_path)
    given = meta.get("settings", {})
    if not isinstance(given, dict):
        raise CheckpointError("'settings' must be an object", meta_path)
    return directory, settings.merged(given, meta_path)


def write_settings_dir(
    out: Path, name: str, settings: dict[str, Any], corpus: list[dict[str, Any]] | None = None
) -> Path:
    """A settings directory: ``trtspec_heads.json`` (+ ``corpus.jsonl``, one {"text"} or {"token_ids"}
    per line, when given), written atomically."""
    with atomic_directory(Path(out), overwrite=True) as tmp:
        meta = {"format": "trtspec-heads", "version": 1, "kind": name, "settings": settings}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        if corpus is not None:
            (tmp / CORPUS_FILE).write_text("".join(json.dumps(d) + "\n" for d in corpus))
    return Path(out)


def model_free_spec(
    name: str, path: Path, target: TargetSpec, config: dict[str, Any], corpus: list[list[int]] | None = None
) -> DrafterSpec:
    """A DrafterSpec without weights; a corpus travels as one token-id tensor (documents separated)."""
    tensors: dict[str, torch.Tensor] = {}
    if corpus:
        flat: list[int] = []
        for doc in corpus:
            flat.extend(doc)
            flat.append(SEPARATOR)
        tensors[CORPUS_TENSOR] = torch.tensor(flat, dtype=torch.long)
    return DrafterSpec(name, path, TensorStore.from_tensors(tensors), config, dtype=target.dtype)


def read_corpus(path: Path, target: TargetSpec) -> list[list[int]]:
    """Token ids of a corpus file: ``.txt`` (documents separated by blank lines), ``.jsonl`` (one
    {"text": ...} or {"token_ids": [...]} per line) or ``.json`` (a list of strings or of id lists)."""
    if not path.is_file():
        raise CheckpointError("corpus file not found", path, "pass an existing .txt, .jsonl or .json file")
    try:
        raw = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read corpus ({exc})", path) from None
    try:
        if path.suffix == ".txt":
            items: list[Any] = [d for d in raw.split("\n\n") if d.strip()]
        elif path.suffix == ".jsonl":
            items = [json.loads(line) for line in raw.splitlines() if line.strip()]
            items = [i.get("token_ids", i.get("text")) if isinstance(i, dict) else i for i in items]
        elif path.suffix == ".json":
            items = json.loads(raw)
        else:
            raise CheckpointError("unknown corpus format", path, "use .txt, .jsonl or .json")
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"not valid JSON ({exc})", path) from None
    if not isinstance(items, list):
        raise CheckpointError("expected a list of documents", path)
    tok = None
    docs: list[list[int]] = []
    for item in items:
        if isinstance(item, str):
            if tok is None:
                from trtspec.checkpoint.target import load_tokenizer

                tok = load_tokenizer(target)
            docs.append(list(tok(item, add_special_tokens=False)["input_ids"]))
        elif isinstance(item, list) and all(isinstance(t, int) and 0 <= t < target.arch.vocab_size for t in item):
            docs.append(item)
        else:
            raise CheckpointError(
                f"a document is neither text nor token ids below {target.arch.vocab_size}: {str(item)[:40]!r}",
                path,
            )
    if not any(docs):
        raise CheckpointError("the corpus holds no tokens", path)
    return docs


#: why model-free kinds have no TensorRT-LLM 1.2.1 engine (trtllm-build's --speculative_decoding_mode choices)
ENGINE_REFUSAL = (
    "TensorRT-LLM 1.2.1 engines cannot draft from text: trtllm-build --speculative_decoding_mode accepts "
    "draft_tokens_external, lookahead_decoding, medusa, explicit_draft_tokens and eagle only (its "
    "SpeculativeDecodingMode.NGRAM is not among them, and lookahead decoding is the target's own Jacobi "
    "n-grams, not prompt lookup); serve it with the TensorRT-LLM PyTorch backend (NGram / SA decoding) or "
    "the reference runtime"
)
