"""The sampling seed/step contract on the reference path (CPU, fast): over many verification steps with
one seed and a step counter, the committed tokens are distributed as the target's (lossless); with one
seed and no step term they are not (every step draws the same uniforms)."""

from __future__ import annotations

import math

import torch

from trtspec.kernels import reference
from trtspec.runtime.verify import verify_sampling
from trtspec.tree import build_tree

P_ROOT = torch.tensor([0.05, 0.30, 0.10, 0.25, 0.20, 0.10])
P_CHILD = torch.tensor([0.40, 0.10, 0.10, 0.10, 0.20, 0.10])


def _first_tokens(keys: list[int]) -> torch.Tensor:
    """First committed token of each step (root with children of tokens 1 and 3), one step per key."""
    tree = build_tree([[0], [1]])
    draft = torch.tensor([[0, 1, 3]])
    probs = torch.stack([P_ROOT, P_CHILD, P_CHILD])[None]
    return torch.tensor([verify_sampling(tree, draft, probs, k).tokens[0][0] for k in keys])


def _chi_square(counts: torch.Tensor, p: torch.Tensor) -> float:
    expected = p * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_step_key_is_the_seed_at_step_zero_and_distinct_after():
    assert reference.step_key(42) == 42 == reference.step_key(42, 0)
    keys = {reference.step_key(42, s) for s in range(10_000)}
    assert len(keys) == 10_000
    assert reference.step_key(-1, 1) == (reference.STEP_GAMMA - 1) % 2**64


def test_many_steps_under_one_seed_are_lossless():
    steps = 3000
    first = _first_tokens([reference.step_key(7, s) for s in range(steps)])
    counts = torch.bincount(first, minlength=6).float()
    # chi-square with 5 degrees of freedom: 20.5 is the 0.999 quantile
    assert _chi_square(counts, P_ROOT) < 20.5, counts.tolist()
    assert math.isclose(float(counts[1]) / steps, 0.30, abs_tol=0.035)


def test_one_seed_without_a_step_term_repeats_itself():
    first = _first_tokens([7] * 200)
    assert first.unique().numel() == 1  # the same token every step: not the target's distribution
