"""suffix: SuffixDecoding-style drafting from the prompt, the generated text and an optional corpus.

No weights. Per step it finds the longest suffix of the sequence (up to ``max_pattern`` tokens) that
occurred before, in the sequence itself or in the corpus (the longer match wins; a tie goes to the
sequence), and fills the tree with the continuations of up to ``occurrences`` of its most recent
occurrences as a frequency-ranked trie: siblings are alternative continuations ranked by count (each
occurrence counts 1 plus a recency bonus that halves with age: ties go to the newest).
The draft length follows the match: at most ``max_spec_factor * match + max_spec_offset`` tokens, and a
node is drafted only while its path probability (count shares along the path) stays >= ``min_token_prob``,
so a short or ambiguous match drafts little or nothing (the loop then verifies fewer nodes).

Selected by ``--heads suffix`` or ``--heads suffix:CORPUS`` (.txt: documents separated by blank lines;
.jsonl: {"text"} or {"token_ids"} per line; .json: a list of either), or a settings directory
(``trtspec_heads.json`` with kind "suffix", optional "settings", and a corpus file it names).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.drafters.base import DrafterKind, EngineRoute, PyTorchRoute
from trtspec.drafters.matching import (
    CORPUS_FILE,
    CORPUS_TENSOR,
    ENGINE_REFUSAL,
    Candidates,
    MatchDrafter,
    Settings,
    TokenIndex,
    address_argument,
    detect_settings,
    model_free_spec,
    read_corpus,
    read_settings_dir,
    write_settings_dir,
)
from trtspec.errors import UsageError
from trtspec.spec import DrafterSpec, TargetSpec

NAME = "suffix"
SETTINGS = Settings(
    {
        "max_pattern": 12,
        "min_pattern": 1,
        "occurrences": 64,
        "max_spec_factor": 2.0,
        "max_spec_offset": 2,
        "min_token_prob": 0.1,
        "draft_len": 8,
        "corpus": "",
    }
)


def default_tree(depth: int) -> list[list[int]]:
    """A chain of ``depth`` plus the runner-up continuation at the first three depths."""
    chain = [[0] * d for d in range(1, depth + 1)]
    side = [[0] * d + [1] for d in range(min(3, depth))] + ([[1, 0]] if depth >= 2 else [])
    return chain + side


def _spec(path: Path, target: TargetSpec, settings: dict[str, Any], where: Path | str) -> DrafterSpec:
    s = settings
    if not 1 <= s["min_pattern"] <= s["max_pattern"] or s["draft_len"] < 1 or s["occurrences"] < 1:
        raise UsageError(f"{where}: need 1 <= min_pattern <= max_pattern, draft_len >= 1, occurrences >= 1")
    if not 0.0 <= s["min_token_prob"] <= 1.0 or s["max_spec_factor"] < 0:
        raise UsageError(f"{where}: need 0 <= min_token_prob <= 1 and max_spec_factor >= 0")
    corpus = None
    if s["corpus"]:
        corpus_path = Path(s["corpus"])
        if not corpus_path.is_absolute() and path.is_dir():
            corpus_path = path / corpus_path
        corpus = read_corpus(corpus_path, target)
    config = dict(s, tree_choices=default_tree(s["draft_len"]))
    return model_free_spec(NAME, path, target, config, corpus)


def address(text: str, target: TargetSpec) -> DrafterSpec | None:
    named, arg = address_argument(text, NAME)
    if not named:
        return None
    return _spec(Path(text), target, dict(SETTINGS.defaults, corpus=arg or ""), f"--heads {text}")


def load(path: Path, target: TargetSpec, allow_pickle: bool = False) -> DrafterSpec:
    directory, settings = read_settings_dir(path, NAME, SETTINGS)
    return _spec(directory, target, settings, directory)


class SuffixDrafter(MatchDrafter):
    def __init__(self, config: dict[str, Any], corpus: TokenIndex | None):
        super().__init__(int(config["max_pattern"]))
        self.min_pattern, self.occurrences = int(config["min_pattern"]), int(config["occurrences"])
        self.factor, self.offset = float(config["max_spec_factor"]), int(config["max_spec_offset"])
        self.min_prob = float(config["min_token_prob"])
        self.corpus = corpus

    def candidates(self, b: int, depth: int) -> tuple[Candidates, int, float]:
        idx = self.index[b]
        source, (n, hits) = idx, idx.longest_match(idx.tokens, self.min_pattern, self.max_n)
        if self.corpus is not None:
            nc, hc = self.corpus.longest_match(idx.tokens, self.min_pattern, self.max_n)
            if nc > n:
                source, n, hits = self.corpus, nc, hc
        if n == 0:
            return [], 0, 1.0
        limit = min(depth, int(self.factor * n) + self.offset)
        # newest first, and each occurrence counts 1 plus a recency bonus that halves with age: text that
        # loops or copies repeats its latest continuation, so recency breaks ties and can outvote one count
        recent = reversed(hits[-self.occurrences :])
        cands = [(source.continuation(p, limit), 1.0 + 0.5**i) for i, p in enumerate(recent)]
        return cands, limit, self.min_prob


def build(spec: DrafterSpec, target, dtype) -> SuffixDrafter:
    corpus = None
    if CORPUS_TENSOR in spec.tensors:
        corpus = TokenIndex(int(spec.config["max_pattern"]))
        corpus.extend(spec.tensors.load(CORPUS_TENSOR).tolist())
    return SuffixDrafter(spec.config, corpus)


def serving_configs(spec: DrafterSpec, draft_len: int) -> dict[str, dict[str, Any]]:
    """TensorRT-LLM PyTorch backend ``SADecodingConfig`` (suffix automaton, longest match) and vLLM
    ``method: suffix`` (arctic-inference). Neither reads a corpus file: theirs grow from served requests."""
    c = spec.config
    return {
        "trtllm-pytorch": {"decoding_type": "SA", "max_draft_len": draft_len, "max_matching_ngram_size": -1},
        "vllm": {
            "method": "suffix",
            "num_speculative_tokens": draft_len,
            "suffix_decoding_max_spec_factor": float(c["max_spec_factor"]),
            "suffix_decoding_min_token_prob": float(c["min_token_prob"]),
        },
    }


def make_demo(target: TargetSpec, out: Path, *_: Any) -> Path:
    """Settings with a tiny token-id corpus (a repeated phrase), so the corpus path is exercised."""
    v = target.arch.vocab_size
    phrase = [(3 + 5 * i) % v for i in range(6)]
    return write_settings_dir(out, NAME, {"corpus": CORPUS_FILE}, [{"token_ids": phrase * 3}])


KIND = DrafterKind(
    name=NAME,
    summary="SuffixDecoding-style: frequency-ranked continuations of the longest matched suffix (no weights)",
    detect=detect_settings(NAME),
    load=load,
    build=build,
    make_demo=make_demo,
    engine=EngineRoute(refusal=ENGINE_REFUSAL),
    pytorch=PyTorchRoute(decoding_type="SA"),  # no draft directory; the fields come from serving_configs
    formats=("trtspec-settings",),
    address=address,
    serving_configs=serving_configs,
)
