"""A model drafter with a model-free one beside it: per step and sequence, draft from whichever is
expected to get more tokens accepted.

Why: heads trained on chat accept little on code or on text that repeats itself, where a prompt-lookup
or suffix match is long and nearly always right; a match is rare on fresh prose, where the heads do
better. Both fill the same static tree. The choice per sequence compares measured expectations:

    model-free when  free_ratio * matched_depth >= model_gain   (and it matched anything)

``model_gain``: moving average of the model's accepted tokens per step; ``free_ratio``: moving average
of accepted / drafted depth for model-free proposals. Both are measured here from what the target
committed. ``use_model`` is the loop's switch (runtime.adaptive.SourceChoice): off, the model drafter
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
    """Several observations as one, per sequence (the model drafter catches up in one call)."""
    if len(chunks) == 1:
        return chunks[0]
    B = len(chunks[0][3])

    def cat(i: int):
        return None if chunks[0][i] is None else [torch.cat([c[i][b] for c in chunks]) for b in range(B)]

    return cat(0), cat(1), cat(2), cat(3)


class CombinedDrafter:
    """The Drafter protocol over a model drafter and a model-free one (see the module docstring)."""

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
        self.model_gain, self.free_ratio = self.prior_gain, 0.5
        self._pending: list[tuple] = []
        self._drafted: torch.Tensor | None = None
        self._last: tuple | None = None  # (tree, tokens, drafted, from model-free) of the last proposal

    def observe(self, hidden, aux, tokens_in, tokens_next) -> None:
        self._score(tokens_next)
        self.free.observe(hidden, aux, tokens_in, tokens_next)
        self._pending.append((hidden, aux, tokens_in, tokens_next))
        if self.use_model:
            self._catch_up()

    def _catch_up(self) -> None:
        if self._pending:
            chunks, self._pending = self._pending, []
            self.model.observe(*_join(chunks))

    def _score(self, tokens_next: list[torch.Tensor]) -> None:
        """Update the two moving averages from what the last proposal got accepted."""
        if self._last is None:
            return
        tree, tokens, drafted, sources = self._last
        self._last = None
        gains, ratios = [], []
        for b, nxt in enumerate(tokens_next):
            if sources[b] is None:
                continue
            acc, depth = accepted_along(tree, tokens[b], drafted[b], nxt.tolist())
            if sources[b] == "model-free":
                ratios.append(acc / depth)
            else:
                gains.append(acc)
        a = self.alpha
        if gains:
            self.model_gain = (1 - a) * self.model_gain + a * sum(gains) / len(gains)
        if ratios:
            self.free_ratio = (1 - a) * self.free_ratio + a * sum(ratios) / len(ratios)

    @torch.no_grad()
    def propose(self, tree: TreeBuffers, root: torch.Tensor) -> torch.Tensor:
        tokens = self.free.propose(tree, root)
        drafted = self.free.drafted()
        if drafted is None:
            drafted = torch.ones_like(tokens, dtype=torch.bool)
        depth = (tree.depths[None, :] * drafted).max(1).values.tolist()
        if self.use_model:
            self._catch_up()
            model_tokens = self.model.propose(tree, root)
            free_rows = [prefer_model_free(d, self.free_ratio, self.model_gain) for d in depth]
            pick = torch.tensor(free_rows)[:, None]
            tokens = torch.where(pick, tokens, model_tokens)
            drafted = torch.where(pick, drafted, torch.ones_like(drafted))
            sources = ["model-free" if f else "model" for f in free_rows]
        else:
            sources = ["model-free" if d > 0 else None for d in depth]
        for s in sources:
            if s is not None:
                self.chosen[s] += 1
        self._last = (tree, tokens.tolist(), drafted.tolist(), sources)
        self._drafted = drafted
        return tokens

    def drafted(self) -> torch.Tensor | None:
        return self._drafted

    def pack(self, target_projection) -> None:
        self.model.pack(target_projection)
        self.free.pack(target_projection)
