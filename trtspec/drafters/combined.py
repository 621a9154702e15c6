"""A model drafter with a model-free one beside it: per step and sequence, draft from whichever is
expected to get more tokens accepted.

Why: heads trained on chat accept little on code or on text that repeats itself, where a prompt-lookup
or suffix match is long and nearly always right; a match is rare on fresh prose, where the heads do
better. Both fill the same static tree. The choice per sequence compares measured expectations:

    model-free when  free_ratio * matched_depth >= model_gain   (and it matched anything)

``model_gain``: moving average of the model's accepted tokens per step; ``free_ratio``: moving average
of accepted / drafted depth for model-free proposals. Both are measured here from what the target
committed, per sequence: in a batch, or in-flight beside other requests, a sequence drafts what it
would alone. ``use_model`` is the loop's switch (runtime.adaptive.SourceChoice): off, the model drafter
neither proposes nor observes (its observations wait and are fed in one call when it is switched on).
"""

from __future__ import annotations

import torch

from trtspec.drafters.base import Drafter
from trtspec.tree import TreeBuffers


def prefer_model_free(matched_depth: int, free_ratio: float, model_gain: float) -> bool:
    """Draft this sequence from the model-free proposal: it matched, and its expected accepted tokens
    (per-depth acceptance times depth) are at least the model's (a tie goes to the cheaper drafter)."""
    return matched_depth > 0 and free_ratio * matched_depth >= model_gain


def accepted_along(tree: TreeBuffers, tokens: list[int], drafted: list[bool], committed: list[int]) -> tuple[int, int]:
    """How many of ``committed``'s first tokens follow a drafted root-to-node path of the proposal, and
    the proposal's drafted depth. A rejected child's token is never the bonus (greedy: it would have been
    accepted; sampling: its probability was zeroed), so the walk stops exactly at the accepted path."""
    depths = tree.depths.tolist()
    depth = max((depths[n] for n in range(tree.size) if drafted[n]), default=0)
    cur, i = 0, 0
    while i < len(committed):
        nxt = next((c for c in tree.child_lists[cur] if drafted[c] and tokens[c] == committed[i]), None)
        if nxt is None:
            break
        cur, i = nxt, i + 1
    return i, depth


def _join(chunks: list[tuple]) -> tuple:
    """Several observations of one sequence as one (the model drafter catches up in one call)."""
    if len(chunks) == 1:
        return chunks[0]
    return tuple(None if chunks[0][i] is None else torch.cat([c[i] for c in chunks]) for i in range(4))


def _slots(rows: list[int] | None, batch: int) -> list[int]:
    """The slots a call's B sequences live in (``rows``, or 0..B-1 in the oracle loop)."""
    return list(range(batch)) if rows is None else list(rows)


def _ema(old: float, new: float, alpha: float) -> float:
    return (1 - alpha) * old + alpha * new


class CombinedDrafter:
    """The Drafter protocol over a model drafter and a model-free one (see the module docstring).

    Everything it measures is per sequence (slot): a sequence's choice depends on its own text alone, so
    it drafts what it would draft in a batch of one, and a slot that takes a new request starts over."""

    def __init__(self, model: Drafter, free: Drafter, alpha: float = 0.3, prior_gain: float = 1.0):
        self.model, self.free, self.alpha = model, free, alpha
        self.aux_layers, self.max_depth = model.aux_layers, model.max_depth
        self.prior_gain = prior_gain
        self.use_model = True
        #: (sequence, step) pairs drafted from each source, for reports and tests
        self.chosen = {"model": 0, "model-free": 0}
        self.reset(0, 0)

    def reset(self, batch: int, capacity: int) -> None:
        if batch:
            self.model.reset(batch, capacity)
            self.free.reset(batch, capacity)
        self.batch = batch
        #: per slot: moving averages of the model's accepted tokens and of model-free accepted / drafted depth
        self.gains = [self.prior_gain] * batch
        self.ratios = [0.5] * batch
        #: per slot: per-sequence observations (hidden, aux, tokens_in, tokens_next) the model has not seen
        self._pending: dict[int, list[tuple]] = {}
        self._drafted: torch.Tensor | None = None
        #: per slot: (tree, tokens, drafted, source) of its last proposal, scored by its next observation
        self._last: dict[int, tuple] = {}

    def forget(self, rows: list[int]) -> None:
        """Slots ``rows`` start new sequences: both drafters forget them, and so do the measures."""
        self.model.forget(rows)
        self.free.forget(rows)
        for r in rows:
            self.gains[r], self.ratios[r] = self.prior_gain, 0.5
            self._pending.pop(r, None)
            self._last.pop(r, None)

    @property
    def model_gain(self) -> float:
        """The model's accepted tokens per step, averaged over the slots (for reports)."""
        return sum(self.gains) / len(self.gains) if self.gains else self.prior_gain

    @property
    def free_ratio(self) -> float:
        """Model-free accepted / drafted depth, averaged over the slots (for reports)."""
        return sum(self.ratios) / len(self.ratios) if self.ratios else 0.5

    def observe(self, hidden, aux, tokens_in, tokens_next, rows: list[int] | None = None) -> None:
        slots = _slots(rows, len(tokens_next))
        self._score(slots, tokens_next)
        self.free.observe(hidden, aux, tokens_in, tokens_next, rows=rows)
        for b, s in enumerate(slots):
            seq = (hidden[b], None if aux is None else aux[b], tokens_in[b], tokens_next[b])
            self._pending.setdefault(s, []).append(seq)
        if self.use_model:
            self._catch_up(slots)

    def _catch_up(self, slots: list[int]) -> None:
        """Feed the model what it missed for ``slots`` (while it was off), in one call."""
        behind = [s for s in slots if self._pending.get(s)]
        if not behind:
            return
        seqs = [_join(self._pending.pop(s)) for s in behind]
        parts = [None if seqs[0][i] is None else [q[i] for q in seqs] for i in range(4)]
        self.model.observe(*parts, rows=None if behind == list(range(self.batch)) else behind)

    def _score(self, slots: list[int], tokens_next: list[torch.Tensor]) -> None:
        """Update each slot's moving average from what its last proposal got accepted."""
        for s, nxt in zip(slots, tokens_next):
            last = self._last.pop(s, None)
            if last is None or last[3] is None:
                continue
            tree, tokens, drafted, source = last
            acc, depth = accepted_along(tree, tokens, drafted, nxt.tolist())
            if source == "model-free":
                self.ratios[s] = _ema(self.ratios[s], acc / depth, self.alpha)
            else:
                self.gains[s] = _ema(self.gains[s], acc, self.alpha)

    @torch.no_grad()
    def propose(self, tree: TreeBuffers, root: torch.Tensor, rows: list[int] | None = None) -> torch.Tensor:
        slots = _slots(rows, root.shape[0])
        tokens = self.free.propose(tree, root, rows=rows)
        drafted = self.free.drafted()
        if drafted is None:
            drafted = torch.ones_like(tokens, dtype=torch.bool)
        depth = (tree.depths[None, :] * drafted).max(1).values.tolist()
        if self.use_model:
            self._catch_up(slots)
            model_tokens = self.model.propose(tree, root, rows=rows)
            free_rows = [prefer_model_free(d, self.ratios[s], self.gains[s]) for d, s in zip(depth, slots)]
            pick = torch.tensor(free_rows)[:, None]
            tokens = torch.where(pick, tokens, model_tokens)
            drafted = torch.where(pick, drafted, torch.ones_like(drafted))
            sources = ["model-free" if f else "model" for f in free_rows]
        else:
            sources = ["model-free" if d > 0 else None for d in depth]
        for s in sources:
            if s is not None:
                self.chosen[s] += 1
        rows_tokens, rows_drafted = tokens.tolist(), drafted.tolist()
        for b, s in enumerate(slots):
            self._last[s] = (tree, rows_tokens[b], rows_drafted[b], sources[b])
        self._drafted = drafted
        return tokens

    def drafted(self) -> torch.Tensor | None:
        return self._drafted

    def pack(self, target_projection) -> None:
        self.model.pack(target_projection)
        self.free.pack(target_projection)

    def tune_small_rows(self, target_projection, dtype, device) -> None:
        self.model.tune_small_rows(target_projection, dtype, device)
        self.free.tune_small_rows(target_projection, dtype, device)
