"""Choose a draft vocabulary from the self-distillation cache: the tokens the target itself writes.

The drafter's job is to guess the target's next tokens, so the counts that matter are the target's own
greedy choices where it writes the reply (not the prompt's tokens). The N most frequent of them form the
vocabulary (see ``checkpoint/heads/draft_vocab`` for why and how it is used); the coverage printed is the
share of the target's choices on the data that the drafter can still propose.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from trtspec.errors import UsageError
from trtspec.train.cache import HiddenCache


@dataclass(frozen=True)
class DraftVocab:
    ids: torch.Tensor  # int64 [N], most frequent first
    coverage: float  # fraction of the target's choices (generated positions) inside ``ids``
    distinct: int  # distinct tokens the target chose on the data
    cumulative: np.ndarray  # cumulative[n - 1] = coverage of the first n ids

    def coverage_of(self, n: int) -> float:
        """Coverage of the vocabulary's first ``n`` entries (what ``--draft-vocab n`` keeps)."""
        return float(self.cumulative[min(n, len(self.cumulative)) - 1])


def target_choice_counts(cache: HiddenCache, vocab_size: int) -> np.ndarray:
    """How often the target chose each token where it wrote the text (positions q >= prompt_length - 1,
    or the assistant turns of a masked teacher-mode cache: ``HiddenCache.trained``)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for i in range(len(cache.sequences)):
        am = np.asarray(cache.sequence(i)["argmax"], dtype=np.int64)[cache.trained(i)]
        counts += np.bincount(am[(am >= 0) & (am < vocab_size)], minlength=vocab_size)
    return counts


def frequent_tokens(cache: HiddenCache, vocab_size: int, size: int) -> DraftVocab:
    """The ``size`` tokens the target chose most often (ties by id); never tokens it did not choose."""
    if size < 1:
        raise UsageError(f"--draft-vocab must be >= 1, got {size}")
    counts = target_choice_counts(cache, vocab_size)
    total = int(counts.sum())
    if total == 0:
        raise UsageError(f"{cache.dir}: the cache holds no target-written positions to count")
    order = np.lexsort((np.arange(vocab_size), -counts))  # by count descending, then id
    distinct = int((counts > 0).sum())
    ids = order[: min(size, distinct)]
    cumulative = np.cumsum(counts[ids]) / total
    return DraftVocab(torch.from_numpy(ids.astype(np.int64)), float(cumulative[-1]), distinct, cumulative)


def token_ranking(cache: HiddenCache, vocab_size: int) -> np.ndarray:
    """Every token id, the ones the target writes most often first (``target_choice_counts``); ties, and
    tokens it never writes in a reply, by how often it chooses them anywhere in the cache (prompts
    included), then by id. A drafter with its own vocabulary keeps a prefix of this order."""
    written = target_choice_counts(cache, vocab_size)
    anywhere = np.zeros(vocab_size, dtype=np.int64)
    for sh in cache.shards:
        am = np.asarray(sh.argmax, dtype=np.int64)
        anywhere += np.bincount(am[(am >= 0) & (am < vocab_size)], minlength=vocab_size)
    return np.lexsort((np.arange(vocab_size), -anywhere, -written)).astype(np.int64)
