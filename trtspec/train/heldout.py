"""Held-out acceptance of freshly trained heads, without decoding: train-heads ``--eval-data``.

Why: the training loss says little about serving. What a chain of drafts gets accepted follows from the
drafter's top-1 hit rate per depth with the true tokens before it, on text the target writes and the
drafter never saw; trtspec.train.ranks measures exactly that through the runtime's own drafter, and
``simulated_length`` walks it as decoding would (SmolLM2 with EAGLE-3 heads, 40 held-out chat prompts,
chain of 3: 1.39 tokens/step walked, 1.40 decoded). Measured on the training cache as well, the gap
between the two shows a drafter that memorised its data: the remedy is more data, not more steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trtspec.train.cache import HiddenCache, build_cache
from trtspec.train.ranks import drafter_aux, ranks_by_sequence, simulated_length
from trtspec.train.tune import per_depth_topk

#: calibration-style positions measured on the training cache for the comparison
TRAIN_POSITIONS = 4000


@dataclass
class Acceptance:
    """Top-1 hit rate per depth given every earlier depth hit (what a chain's node sees), over ``positions``,
    and the tokens per target step greedy decoding with a chain of len(conditional) drafts gets on that
    text (``ranks.simulated_length``; the bonus token included)."""

    conditional: list[float]
    positions: int
    chain_length: float

    def describe(self) -> str:
        per = " ".join(f"{p:.3f}" for p in self.conditional)
        return f"top-1 per depth {per}, chain of {len(self.conditional)}: {self.chain_length:.2f} tokens/step"


def acceptance(sequences: list[np.ndarray]) -> Acceptance:
    """From teacher-forced ranks per sequence [m_i, depth] (``ranks.ranks_by_sequence``)."""
    ranks = np.concatenate(sequences)
    conditional = [row[0] for row in per_depth_topk(ranks, 1)]
    chain = [(0,) * d for d in range(1, ranks.shape[1] + 1)]
    return Acceptance(conditional, len(ranks), simulated_length(sequences, chain))


def evaluate_heads(
    target_dir: Path,
    heads: Path,
    items: list[list[int]],
    cache_dir: Path,
    depth: int,
    gen_tokens: int,
    dtype: str,
    train_cache: HiddenCache | None = None,
) -> tuple[Acceptance, Acceptance | None]:
    """(held-out, training) acceptance of the heads at ``heads``: ``items`` are held-out prompts whose
    replies the target writes into ``cache_dir`` (resumable, like every cache)."""
    from trtspec.dtypes import resolve_dtype
    from trtspec.load import load_spec_model
    from trtspec.runtime.generate import SpeculativeGenerator

    choice = resolve_dtype(dtype)
    spec = load_spec_model(target_dir, heads, tree="chain:1", dtype="float32")
    gen = SpeculativeGenerator(spec, dtype=choice.dtype)
    drafter = gen.drafter
    if drafter.max_depth is not None:
        depth = min(depth, drafter.max_depth)
    build_cache(
        spec.target, items, cache_dir, gen_tokens=gen_tokens, model=gen.target, dtype=choice.name, progress=False
    )
    held = HiddenCache(cache_dir, spec.target.fingerprint)
    heldout = acceptance(ranks_by_sequence(drafter, held, depth, aux=drafter_aux(drafter, held, spec.target)))
    train = None
    if train_cache is not None:
        aux = drafter_aux(drafter, train_cache, spec.target)
        train = acceptance(ranks_by_sequence(drafter, train_cache, depth, TRAIN_POSITIONS, aux))
    return heldout, train
