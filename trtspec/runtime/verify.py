"""Tree verification: which draft tokens the target accepts, and the bonus token after them.

This is the exact specification the CUDA TreeVerify kernel reproduces. Per sequence:

Greedy: walk from the root; at node ``cur`` accept the child whose token equals argmax(target at cur)
(children are distinct tokens, so at most one matches); stop when none matches or at a leaf. The bonus
token is argmax at the last accepted node. This is the longest root-to-leaf path whose every token is
the target's argmax at its parent; ``best_path`` is the first path (in ``TreeBuffers.paths`` order)
containing the last accepted node.

Sampling (lossless, drafts are deterministic top-k candidates, i.e. q = one-hot): at ``cur`` with target
distribution p, try children in rank order: accept child c (token t) when ``u(c, 0) < p[t] / sum(p)``;
otherwise set p[t] = 0 and try the next one. If all children are rejected (or cur is a leaf), the bonus
is drawn from the (residual) p by inverse CDF with ``u(cur, 1)``. Each step of this walk is exactly
speculative sampling with a point-mass proposal, so the committed tokens are distributed as the target's.
Uniforms come from ``counter_uniform``: a counter-based generator (splitmix64) the kernel implements too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from trtspec.tree import TreeBuffers


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def counter_uniform(seed: int, batch: int, node: int, slot: int) -> float:
    """U[0,1) from (seed, batch row, node, slot); 24-bit mantissa so fp32 code gets the same value.

    h = splitmix64(splitmix64(seed mod 2^64) XOR (batch * 2^20 + node * 4 + slot)); u = (h >> 40) / 2^24.
    """
    counter = np.array([(batch << 20) + (node << 2) + slot], dtype=np.uint64)
    s = _splitmix64(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
    h = _splitmix64(s ^ counter)
    return float(int(h[0] >> np.uint64(40))) / float(1 << 24)


@dataclass
class VerifyResult:
    """Per sequence: accepted draft count, the committed tokens (accepted + bonus), the node indices
    whose KV to keep (root + accepted), the best path index, and the bonus token."""

    accepted_len: list[int]
    tokens: list[list[int]]
    keep_nodes: list[list[int]]
    best_path: list[int]
    bonus: list[int]

    def add(self, tree: TreeBuffers, tokens: list[int], accepted: list[int], bonus: int) -> None:
        """Record one sequence's walk: ``accepted`` node indices (root excluded) and its bonus token."""
        last = accepted[-1] if accepted else 0
        self.accepted_len.append(len(accepted))
        self.tokens.append([tokens[c] for c in accepted] + [bonus])
        self.keep_nodes.append([0] + accepted)
        self.best_path.append(_best_path(tree, last, len(accepted)))
        self.bonus.append(bonus)


def _best_path(tree: TreeBuffers, last: int, depth: int) -> int:
    hits = torch.nonzero(tree.paths[:, depth] == last).flatten()
    return int(hits[0])


def verify_greedy(tree: TreeBuffers, draft_tokens: torch.Tensor, target_argmax: torch.Tensor) -> VerifyResult:
    """draft_tokens [B, N+1] (index 0 = root token), target_argmax [B, N+1]: the target's argmax after
    each node."""
    kids = tree.child_lists
    tok = draft_tokens.tolist()
    arg = target_argmax.tolist()
    res = VerifyResult([], [], [], [], [])
    for b in range(len(tok)):
        cur, acc = 0, []
        while True:
            nxt = next((c for c in kids[cur] if tok[b][c] == arg[b][cur]), None)
            if nxt is None:
                break
            acc.append(nxt)
            cur = nxt
        bonus = arg[b][cur]
        res.add(tree, tok[b], acc, bonus)
    return res


def sample_from(p: torch.Tensor, u: float) -> int:
    """Inverse-CDF draw from an unnormalised non-negative vector (float64 cumsum)."""
    c = torch.cumsum(p.double(), 0)
    idx = int(torch.searchsorted(c, torch.tensor([u * float(c[-1])], dtype=torch.float64), right=True)[0])
    return min(idx, p.numel() - 1)


def verify_sampling(
    tree: TreeBuffers, draft_tokens: torch.Tensor, target_probs: torch.Tensor, seed: int
) -> VerifyResult:
    """target_probs [B, N+1, V]: the target's (temperature/top-k/top-p processed) distribution after
    each node. Lossless rejection sampling as described in the module docstring."""
    kids = tree.child_lists
    tok = draft_tokens.tolist()
    res = VerifyResult([], [], [], [], [])
    for b in range(len(tok)):
        cur, acc = 0, []
        while True:
            p = target_probs[b, cur].double().clone()
            accepted = None
            for c in kids[cur]:
                t = tok[b][c]
                total = float(p.sum())
                if total > 0 and counter_uniform(seed, b, c, 0) < float(p[t]) / total:
                    accepted = c
                    break
                p[t] = 0.0
            if accepted is None:
                break
            acc.append(accepted)
            cur = accepted
        bonus = sample_from(p, counter_uniform(seed, b, cur, 1))
        res.add(tree, tok[b], acc, bonus)
    return res


def process_logits(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Logits [..., V] -> probabilities after temperature, top-k and top-p (nucleus) filtering.

    The same function gives plain sampling's distribution, so speculative and plain sampling target
    exactly the same distribution."""
    x = logits.float() / max(temperature, 1e-6)
    if top_k and top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if top_p < 1.0:
        sp, si = torch.sort(probs, dim=-1, descending=True)
        cum = sp.cumsum(-1)
        drop = (cum - sp) >= top_p  # keep the smallest prefix whose mass reaches top_p
        sp = sp.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, si, sp)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs
