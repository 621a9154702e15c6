"""Tree tuning: measure where the drafter's candidates hit, then pick the static tree that maximises the
expected acceptance length for a node budget.

Measurement (trtspec.train.ranks): for every calibration position q and depth d = 1..D, the rank r_d of
the token the target actually chose among the drafter's candidates at that depth, with the true tokens
on the path so far (exactly the situation of a tree node whose ancestors were all accepted). A node with path (r_1..r_d) is
accepted iff the position's ranks start with that path, so

    P(node) = fraction of positions whose rank vector starts with (r_1..r_d)       (empirical joint)
    E[acceptance length] = 1 + sum over tree nodes of P(node)

(the accepted nodes are exactly one root-to-node chain). Because P(child) <= P(parent), the N most
probable paths are prefix-closed, so taking them greedily is optimal for that estimate -- Medusa's sparse
tree construction, but on the joint statistics rather than a product of per-head accuracies (which
misses that a head's hits correlate with its parent's). ``marginal_path_probs`` gives the product model
for synthetic statistics.

That is the expectation at one position, the objective the tree is built for. The length reported is
``ranks.simulated_length``: decoding walked over the calibration text, steps skipping what they accept,
which the per-position mean overstates wherever acceptance varies along the text (an 8-node tree on
SmolLM2 chat once promised 1.83 by the mean and decoded 1.50).
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter

import numpy as np


def path_probs_from_ranks(ranks: np.ndarray, topk: int) -> dict[tuple[int, ...], float]:
    """``ranks`` [n, D] (rank of the true token per depth; >= topk or < 0 = miss) -> P(path) for every
    observed path prefix."""
    n = len(ranks)
    counts: Counter = Counter()
    for row in ranks:
        path: tuple[int, ...] = ()
        for r in row:
            if r < 0 or r >= topk:
                break
            path = path + (int(r),)
            counts[path] += 1
    return {p: c / max(n, 1) for p, c in counts.items()}


def marginal_path_probs(p: list[list[float]], max_paths: int = 100000) -> dict[tuple[int, ...], float]:
    """Product model: p[d][r] = P(rank r at depth d+1 | ancestors accepted). Enumerates paths best first."""
    out: dict[tuple[int, ...], float] = {}
    heap: list[tuple[float, tuple[int, ...]]] = [(-pr, (r,)) for r, pr in enumerate(p[0]) if pr > 0] if p else []
    heapq.heapify(heap)
    while heap and len(out) < max_paths:
        neg, path = heapq.heappop(heap)
        out[path] = -neg
        d = len(path)
        if d < len(p):
            for r, pr in enumerate(p[d]):
                if pr > 0:
                    heapq.heappush(heap, (neg * pr, path + (r,)))
    return out


def build_tree(probs: dict[tuple[int, ...], float], nodes: int) -> tuple[tuple[int, ...], ...]:
    """The ``nodes`` most probable paths (ties: shorter, then lower ranks first), prefix-closed."""
    ranked = sorted(probs.items(), key=lambda kv: (-kv[1], len(kv[0]), kv[0]))
    chosen: set[tuple[int, ...]] = set()
    for path, _ in ranked:
        if len(chosen) >= nodes:
            break
        if all(path[:i] in chosen for i in range(1, len(path))):
            chosen.add(path)
    return tuple(sorted(chosen, key=lambda c: (len(c), c)))


def expected_length(probs: dict[tuple[int, ...], float], choices) -> float:
    return 1.0 + sum(probs.get(tuple(c), 0.0) for c in choices)


def brute_force_best(probs: dict[tuple[int, ...], float], nodes: int, max_rank: int, max_depth: int):
    """Exhaustive optimum over every prefix-closed tree with ``nodes`` nodes (tests, tiny budgets only)."""
    universe = [p for d in range(1, max_depth + 1) for p in itertools.product(range(max_rank), repeat=d)]
    best, best_val = (), -1.0
    for combo in itertools.combinations(universe, nodes):
        s = set(combo)
        if all(c[:i] in s for c in combo for i in range(1, len(c))):
            v = expected_length(probs, combo)
            if v > best_val + 1e-12:
                best, best_val = combo, v
    return tuple(sorted(best, key=lambda c: (len(c), c))), best_val


def per_depth_topk(ranks: np.ndarray, topk: int) -> list[list[float]]:
    """P(rank r at depth d | ancestors hit) -- the per-depth top-k acceptance table that is printed."""
    out = []
    alive = np.ones(len(ranks), dtype=bool)
    for d in range(ranks.shape[1]):
        r = ranks[:, d]
        n = max(int(alive.sum()), 1)
        out.append([float(((r == k) & alive).sum() / n) for k in range(topk)])
        alive &= (r >= 0) & (r < topk)
    return out
