"""Greedy acceptance on hand-worked trees; rejection sampling preserves the target distribution."""

import numpy as np
import torch

from trtspec.runtime.verify import counter_uniform, process_logits, verify_greedy, verify_sampling
from trtspec.tree import build_tree

TREE = build_tree([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])  # nodes as in test_tree


def test_greedy_hand_worked():
    # node tokens:   root=9, [0]=10, [1]=11, [0,0]=12, [0,1]=13, [1,0]=14, [0,0,0]=15
    drafts = torch.tensor([[9, 10, 11, 12, 13, 14, 15]] * 4)
    argmax = torch.tensor(
        [
            [10, 13, 0, 0, 0, 0, 0],  # accept [0] then [0,1] (a leaf) -> bonus = argmax at node 4
            [11, 0, 14, 0, 0, 7, 0],  # accept [1], [1,0] -> bonus 7
            [5, 0, 0, 0, 0, 0, 0],  # reject everything -> bonus 5
            [10, 12, 0, 15, 0, 0, 3],  # accept the whole deepest path -> bonus 3
        ]
    )
    r = verify_greedy(TREE, drafts, argmax)
    assert r.accepted_len == [2, 2, 0, 3]
    assert r.tokens == [[10, 13, 0], [11, 14, 7], [5], [10, 12, 15, 3]]
    assert r.keep_nodes == [[0, 1, 4], [0, 2, 5], [0], [0, 1, 3, 6]]
    assert r.best_path == [0, 1, 0, 2]
    assert r.bonus == [0, 7, 5, 3]


def test_counter_uniform_is_uniform_and_deterministic():
    xs = np.array([counter_uniform(11, 2, n, 0) for n in range(4000)])
    assert abs(xs.mean() - 0.5) < 0.02 and abs(xs.var() - 1 / 12) < 0.01
    assert counter_uniform(1, 2, 3, 1) == counter_uniform(1, 2, 3, 1)
    assert counter_uniform(1, 2, 3, 1) != counter_uniform(2, 2, 3, 1)


def _chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson chi-square goodness of fit; survival of chi2(k) = regularised upper incomplete gamma."""
    keep = probs > 0
    expected = probs[keep] * counts.sum()
    stat = float(((counts[keep] - expected) ** 2 / expected).sum())
    k = int(keep.sum()) - 1
    return float(
        torch.special.gammaincc(
            torch.tensor(k / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0, dtype=torch.float64)
        )
    )


def test_rejection_sampling_is_lossless():
    """Committed tokens must follow the target: first token ~ p(root), second ~ p(node) given the first.

    20,000 draws on a 6-token vocab; the chi-square test must not reject at p = 0.001 (fixed seeds, so the
    test is deterministic). The drafts are deliberately off (they propose unlikely tokens first)."""
    V, n = 6, 20_000
    g = torch.Generator().manual_seed(0)
    tree = build_tree([[0], [1], [0, 0]])
    probs = torch.softmax(torch.randn(1, 4, V, generator=g) * 1.5, -1)
    drafts = torch.tensor([[0, 3, 1, 2]])  # root=0, [0]=3, [1]=1, [0,0]=2
    first, second_after_3 = np.zeros(V), np.zeros(V)
    for seed in range(n):
        r = verify_sampling(tree, drafts, probs, seed)
        t = r.tokens[0]
        first[t[0]] += 1
        if t[0] == 3 and len(t) > 1:
            second_after_3[t[1]] += 1
    assert _chi2_pvalue(first, probs[0, 0].numpy()) > 1e-3
    assert _chi2_pvalue(second_after_3, probs[0, 1].numpy()) > 1e-3
    # the test has power: the same counts are far from a wrong distribution
    assert _chi2_pvalue(first, np.roll(probs[0, 0].numpy(), 1)) < 1e-6


def test_process_logits_top_k_top_p():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    p = process_logits(logits, 1.0, top_k=2)
    assert p[0, 2:].sum() == 0 and torch.isclose(p.sum(), torch.tensor(1.0))
    full = process_logits(logits, 1.0)
    p = process_logits(logits, 1.0, top_p=float(full[0, 0]) + 1e-4)
    assert p[0, 2:].sum() == 0 and p[0, 1] > 0
    assert torch.allclose(process_logits(logits, 0.5), torch.softmax(logits / 0.5, -1))


def test_greedy_limit_of_sampling():
    """At a near-zero temperature the sampler accepts exactly what greedy accepts."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, TREE.size, 16, generator=g) * 3
    drafts = torch.randint(0, 16, (3, TREE.size), generator=g)
    drafts[:, 1] = logits[:, 0].argmax(-1)  # make the first child right
    gr = verify_greedy(TREE, drafts, logits.argmax(-1))
    sr = verify_sampling(TREE, drafts, process_logits(logits, 1e-4), seed=5)
    assert gr.tokens == sr.tokens and gr.keep_nodes == sr.keep_nodes
