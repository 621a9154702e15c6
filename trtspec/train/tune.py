"""Tree tuning: measure where the drafter's candidates hit, then pick the static tree that maximises the
expected acceptance length for a node budget.

Measurement: for every calibration position q and depth d = 1..D, the rank r_d of the token the target
actually chose among the drafter's candidates at that depth, with the true tokens on the path so far
(exactly the situation of a tree node whose ancestors were all accepted). A node with path (r_1..r_d) is
accepted iff the position's ranks start with that path, so

    P(node) = fraction of positions whose rank vector starts with (r_1..r_d)       (empirical joint)
    E[acceptance length] = 1 + sum over tree nodes of P(node)

(the accepted nodes are exactly one root-to-node chain). Because P(child) <= P(parent), the N most
probable paths are prefix-closed, so taking them greedily is optimal for that estimate -- Medusa's sparse
tree construction, but on the joint statistics rather than a product of per-head accuracies (which
misses that a head's hits correlate with its parent's). ``marginal_path_probs`` gives the product model
for synthetic statistics.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter

import numpy as np
import torch

from trtspec.errors import UsageError
from trtspec.train.cache import HiddenCache
from trtspec.train.unroll import unrolled


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


# Measuring ranks with the runtime's own drafter modules ------------------------------------------------


def _rank(z: torch.Tensor, lm_head: torch.Tensor, labels: torch.Tensor, chunk: int = 512) -> torch.Tensor:
    """Rank of ``labels`` in logits z @ lm_head.T (0 = argmax); -1 where the label is missing."""
    out = torch.full(labels.shape, -1, dtype=torch.long)
    for s in range(0, z.shape[0], chunk):
        lg = (z[s : s + chunk].to(lm_head.dtype) @ lm_head.T).float()
        lab = labels[s : s + chunk]
        ok = lab >= 0
        tl = lg.gather(1, lab.clamp_min(0)[:, None])
        r = (lg > tl).sum(1)
        out[s : s + chunk] = torch.where(ok, r, torch.full_like(r, -1))
    return out


@torch.no_grad()
def check_measurable(drafter) -> None:
    """Refuse, before any work, a drafter whose per-depth ranks this module cannot compute."""
    from trtspec.drafters.proposers import HeadsDrafter, RecurrentDrafter

    if not isinstance(drafter, HeadsDrafter | RecurrentDrafter) or drafter.aux_layers:
        raise UsageError(
            "tune-tree measures heads that read the target's last hidden state over the full or a draft "
            "vocabulary; this drafter reads other target layers or drafts blocks: "
            "pass a tree with --tree (e.g. chain:4) and measure it with generate --compare"
        )


def measure_ranks(drafter, cache: HiddenCache, depth: int, max_positions: int = 20000) -> np.ndarray:
    """[n, depth] true-token ranks per calibration position for a runtime Drafter (HeadsDrafter or a
    pair RecurrentDrafter) on a cache of the target's own text (positions of the target's replies only)."""
    from trtspec.checkpoint.heads.draft_vocab import to_draft_index
    from trtspec.drafters.proposers import HeadsDrafter

    check_measurable(drafter)

    rows = []
    total = 0
    dv = getattr(drafter, "draft_vocab", None)
    inv = None if dv is None else to_draft_index(dv, int(cache.meta["vocab_size"]))

    def in_draft_vocab(labels: torch.Tensor) -> torch.Tensor:
        """Labels as draft-vocabulary indices (the logits' columns); a token outside it is a miss (-1)."""
        if inv is None:
            return labels
        return torch.where(labels >= 0, inv[labels.clamp_min(0)], torch.full_like(labels, -1))

    for i in range(len(cache.sequences)):
        seq = cache.sequence(i)
        n = len(seq["tokens"])
        if n < 2:
            continue
        h = torch.from_numpy(np.asarray(seq["hidden"], dtype=np.float32))
        am = torch.from_numpy(np.asarray(seq["argmax"], dtype=np.int64))
        toks = torch.from_numpy(np.asarray(seq["tokens"], dtype=np.int64))
        q = torch.arange(n - 1)
        ranks = torch.full((n - 1, depth), -1, dtype=torch.long)
        if isinstance(drafter, HeadsDrafter):
            lm = drafter.lm_head
            dtype = lm.dtype
            for k, head in enumerate(drafter.heads.heads[:depth]):
                t = q + k + 1
                ok = t < n
                lab = torch.where(ok, am[t.clamp_max(n - 1)], torch.full_like(t, -1))
                hq = h[: n - 1].to(dtype)
                z = head.norm(hq) if head.norm is not None else hq
                for block in head.res:
                    z = block(z)
                w = head.lm_head.weight if head.lm_head is not None else lm
                ranks[:, k] = _rank(z, w, in_draft_vocab(lab))
        else:
            module = drafter.module
            dtype = next(module.parameters()).dtype
            eye = torch.eye(h.shape[1], dtype=dtype)
            tokens, labels = [], []
            for s in range(depth):
                t = q + s + 1
                ok = t < n
                tokens.append(torch.where(ok, toks[t.clamp_max(n - 1)], torch.zeros_like(t))[None])
                labels.append(torch.where(ok, am[t.clamp_max(n - 1)], torch.full_like(t, -1)))
            res = unrolled(
                module,
                drafter.embed.weight,
                eye,
                h[None, : n - 1].to(dtype),
                tokens,
                torch.zeros(1, dtype=torch.long),
                torch.ones(1, n - 1, dtype=torch.bool),
            )
            for s, (_, z) in enumerate(res):
                ranks[:, s] = _rank(z[0], drafter.lm_head, in_draft_vocab(labels[s]))
        first = max(cache.prompt_lengths[i] - 1, 0)  # only where the target wrote the text, as when serving
        rows.append(ranks.numpy()[first:])
        total += n - 1 - first
        if total >= max_positions:
            break
    return np.concatenate(rows)[:max_positions]


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
