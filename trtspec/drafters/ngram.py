"""ngram: prompt lookup. No weights: propose what followed the most recent earlier occurrence of the
sequence's last n tokens (n from ``max_ngram`` down to ``min_ngram``) in its prompt and generated text.

Selected by ``--heads ngram`` or ``--heads ngram:N`` (N = max_ngram), or a settings directory
(``trtspec_heads.json`` with kind "ngram" and optional "settings"). The default tree is a chain of
``draft_len``; a tree's siblings are older occurrences' different continuations, most recent first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.drafters.base import DrafterKind, EngineRoute, PyTorchRoute
from trtspec.drafters.matching import (
    ENGINE_REFUSAL,
    Candidates,
    MatchDrafter,
    Settings,
    address_argument,
    detect_settings,
    model_free_spec,
    read_settings_dir,
    write_settings_dir,
)
from trtspec.errors import UsageError
from trtspec.spec import DrafterSpec, TargetSpec

NAME = "ngram"
SETTINGS = Settings({"max_ngram": 3, "min_ngram": 1, "draft_len": 6, "occurrences": 8})


def _spec(path: Path, target: TargetSpec, settings: dict[str, Any], where: Path | str) -> DrafterSpec:
    if not 1 <= settings["min_ngram"] <= settings["max_ngram"] or settings["draft_len"] < 1:
        raise UsageError(f"{where}: need 1 <= min_ngram <= max_ngram and draft_len >= 1, got {settings}")
    config = dict(settings, tree_choices=[[0] * d for d in range(1, settings["draft_len"] + 1)])
    return model_free_spec(NAME, path, target, config)


def address(text: str, target: TargetSpec) -> DrafterSpec | None:
    named, arg = address_argument(text, NAME)
    if not named:
        return None
    settings = dict(SETTINGS.defaults)
    if arg is not None:
        if not arg.isdigit() or int(arg) < 1:
            raise UsageError(f"--heads {text}: expected {NAME}:N with N the longest n-gram to match (e.g. {NAME}:3)")
        settings["max_ngram"] = int(arg)
        settings["min_ngram"] = min(settings["min_ngram"], int(arg))
    return _spec(Path(text), target, settings, f"--heads {text}")


def load(path: Path, target: TargetSpec, allow_pickle: bool = False) -> DrafterSpec:
    directory, settings = read_settings_dir(path, NAME, SETTINGS)
    return _spec(directory, target, settings, directory)


class NgramDrafter(MatchDrafter):
    def __init__(self, max_ngram: int, min_ngram: int, occurrences: int):
        super().__init__(max_ngram)
        self.min_ngram, self.occurrences = min_ngram, occurrences

    def candidates(self, b: int, depth: int) -> tuple[Candidates, int, float]:
        idx = self.index[b]
        _, hits = idx.longest_match(idx.tokens, self.min_ngram, self.max_n)
        cands: Candidates = []
        for i, p in enumerate(reversed(hits[-self.occurrences :])):
            cands.append((idx.continuation(p, depth), 0.5**i))  # the most recent outweighs all older ones
        return cands, depth, 0.0


def build(spec: DrafterSpec, target, dtype) -> NgramDrafter:
    c = spec.config
    return NgramDrafter(int(c["max_ngram"]), int(c["min_ngram"]), int(c["occurrences"]))


def serving_configs(spec: DrafterSpec, draft_len: int) -> dict[str, dict[str, Any]]:
    """TensorRT-LLM PyTorch backend ``NGramDecodingConfig`` and vLLM ``method: ngram`` (prompt lookup).
    Both match the oldest/first occurrence by default where this kind takes the most recent one."""
    c = spec.config
    return {
        "trtllm-pytorch": {
            "decoding_type": "NGram",
            "max_draft_len": draft_len,
            "max_matching_ngram_size": int(c["max_ngram"]),
        },
        "vllm": {
            "method": "ngram",
            "num_speculative_tokens": draft_len,
            "prompt_lookup_max": int(c["max_ngram"]),
            "prompt_lookup_min": int(c["min_ngram"]),
        },
    }


KIND = DrafterKind(
    name=NAME,
    summary="prompt lookup: the continuation of the last n-gram's most recent earlier occurrence (no weights)",
    detect=detect_settings(NAME),
    load=load,
    build=build,
    make_demo=lambda target, out, *_: write_settings_dir(out, NAME, {"max_ngram": 2}),
    engine=EngineRoute(refusal=ENGINE_REFUSAL),
    pytorch=PyTorchRoute(decoding_type="NGram"),  # no draft directory; the fields come from serving_configs
    formats=("trtspec-settings",),
    address=address,
    serving_configs=serving_configs,
)
