"""A KV cache seen through some of its rows: how in-flight batching runs one step over the live slots.

A serving runtime keeps one ``KVCache`` with a row (slot) per request that may be in flight. Requests
join and leave between steps, so the rows a step runs over are any subset of the slots, in any order.
``KVRows`` gives the model exactly the interface a ``KVCache`` gives it (``lengths``, ``ensure``,
``store``, ``commit``) for those rows: new K/V are written straight into the slots, committed lengths go
back to the slots, and a finished request's slot is reused by the next one without copying anyone's
prefix. When the rows are the first ``n`` slots in order (the common case: slots are handed out lowest
first) the keys are read as a view; otherwise they are gathered for the step.
"""

from __future__ import annotations

import torch

from trtspec.models.llama import KVCache


class KVRows:
    """Rows ``rows`` (slot indices, distinct) of ``base``, as one batch of ``len(rows)`` sequences."""

    def __init__(self, base: KVCache, rows: torch.Tensor | list[int]):
        self.base = base
        self.rows = torch.as_tensor(rows, dtype=torch.long, device=base.lengths.device)
        n = int(self.rows.numel())
        #: rows 0..n-1 in order: slices (views) instead of gathers
        self.prefix = bool(torch.equal(self.rows, torch.arange(n, device=self.rows.device)))
        #: a snapshot: the model reads lengths many times per forward, and only ``commit`` changes them
        self.lengths = base.lengths[self.rows].clone()

    @property
    def batch(self) -> int:
        return int(self.rows.numel())

    @property
    def capacity(self) -> int:
        return self.base.capacity

    def ensure(self, needed: int) -> None:
        self.base.ensure(needed)

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor, S: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``KVCache.store`` for these rows: write into their slots, read back their first ``S`` positions."""
        T = k.shape[1]
        pos = self.lengths[:, None] + torch.arange(T, device=k.device)[None, :]
        slot = self.rows[:, None]
        K, V = self.base.k[layer], self.base.v[layer]
        K[slot, pos] = k.to(K.dtype)
        V[slot, pos] = v.to(V.dtype)
        if self.prefix:
            n = self.batch
            return K[:n, :S].transpose(1, 2), V[:n, :S].transpose(1, 2)
        return K[self.rows, :S].transpose(1, 2), V[self.rows, :S].transpose(1, 2)

    def commit(self, keep: list[torch.Tensor]) -> None:
        """``KVCache.commit`` for these rows (``keep[i]`` belongs to ``rows[i]``)."""
        for i, idx in enumerate(keep):
            n = int(idx.numel())
            if n == 0:
                continue
            slot, start = int(self.rows[i]), int(self.lengths[i])
            if not torch.equal(idx, torch.arange(n, device=idx.device)):
                src = start + idx
                for store in (self.base.k, self.base.v):
                    for t in store:
                        t[slot, start : start + n] = t[slot, src]
            self.lengths[i] += n
        self.base.lengths[self.rows] = self.lengths


def free_rows(base: KVCache, rows: list[int]) -> None:
    """Forget what ``rows`` held: their next sequence starts at position 0 (the old K/V are masked out)."""
    base.lengths[torch.as_tensor(rows, dtype=torch.long)] = 0
