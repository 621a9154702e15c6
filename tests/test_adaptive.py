"""Adaptive speculation: the tree shrinks or speculation stops when it does not pay, and resumes when it does."""

from __future__ import annotations

import pytest

from trtspec.demo.tiny import make_tiny_llama
from trtspec.load import load_spec_model
from trtspec.runtime.adaptive import AdaptiveSpeculation
from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator
from trtspec.tree import DEFAULT_CHOICES, build_tree


def drive(
    policy: AdaptiveSpeculation, steps: int, accepted_at_depth, plain_s: float = 1.0, node_s: float = 0.05
) -> list[int]:
    """Run the policy against a synthetic machine: a step costs plain_s + node_s per tree node, and a
    step with a depth-D tree accepts min(D, accepted_at_depth(step)) drafts. Returns the depth per step."""
    depths = []
    for step in range(steps):
        tree = policy.choose()
        depth = tree.max_depth
        depths.append(depth)
        policy.record([min(depth, accepted_at_depth(step))], plain_s + node_s * tree.num_nodes)
    return depths


def test_useless_drafter_stops_speculating():
    policy = AdaptiveSpeculation(build_tree(DEFAULT_CHOICES))
    depths = drive(policy, 400, lambda step: 0)
    spec_steps = sum(1 for d in depths if d)
    assert spec_steps <= 12, spec_steps  # exploration + probes at doubling intervals
    assert all(d == 0 for d in depths[-50:-1] if d == 0)  # and the tail is plain decoding


def test_good_drafter_keeps_speculating_and_shrinks_to_what_pays():
    policy = AdaptiveSpeculation(build_tree(DEFAULT_CHOICES))
    depths = drive(policy, 200, lambda step: 2)  # always exactly 2 accepted: depth 3+ nodes are wasted
    tail = depths[20:]
    assert sum(1 for d in tail if d) >= 0.95 * len(tail)
    assert max(set(tail), key=tail.count) == 2  # the depth that pays best, not the full tree


def test_speculation_resumes_when_the_text_turns_predictable():
    policy = AdaptiveSpeculation(build_tree(DEFAULT_CHOICES))
    depths = drive(policy, 300, lambda step: 0 if step < 150 else 6)
    assert sum(1 for d in depths[100:150] if d) <= 3
    resumed = next(i for i in range(150, 300) if depths[i] > 0)
    assert resumed - 150 <= policy.max_probe_every + 1
    assert sum(1 for d in depths[resumed + 5 :] if d) >= 0.9 * len(depths[resumed + 5 :])


def test_costs_decide_not_constants():
    """The same acceptance speculates on a machine where nodes are cheap and not where they are dear."""
    cheap = drive(AdaptiveSpeculation(build_tree(DEFAULT_CHOICES)), 100, lambda s: 1, node_s=0.01)
    dear = drive(AdaptiveSpeculation(build_tree(DEFAULT_CHOICES)), 100, lambda s: 1, node_s=0.5)
    assert sum(1 for d in cheap[20:] if d) > 70
    assert sum(1 for d in dear[20:] if d) < 15


def test_model_free_steps_without_a_match_do_not_count_as_rejections():
    """A model-free drafter that matches every other step, and is always right when it matches: a step
    without a match is trimmed to a plain step (verified depth 0). Speculation pays (the matched steps
    commit 5 tokens at the price of ~1), so the policy must keep speculating at full depth; counting the
    unmatched steps as depth-1 rejections would halve the measured acceptance and make depth look wasteful."""
    chain = build_tree(tuple((0,) * d for d in range(1, 5)))
    policy = AdaptiveSpeculation(chain)
    depths = []
    for step in range(200):
        tree = policy.choose()
        depths.append(tree.max_depth)
        if tree.max_depth and step % 2:  # no match: the loop verified nothing, a plain step's cost
            policy.record([0], 1.0, trimmed=True, verified_depth=0)
        else:
            policy.record([tree.max_depth], 1.0 + 0.02 * tree.num_nodes)
    assert policy.acceptance()[0] > 0.9
    tail = depths[40:]
    assert sum(1 for d in tail if d == 4) >= 0.9 * len(tail)


def test_a_drafter_whose_every_step_is_trimmed_still_speculates():
    """A model-free drafter that always matches 2 tokens of a 4-deep chain, and is always right: every
    speculative step is trimmed, so no option's own time is ever measured. The trimmed steps' times must
    stand in for a node's cost; without them no speculative option has a rate and the policy would
    decode plain for good after its first steps."""
    policy = AdaptiveSpeculation(build_tree(tuple((0,) * d for d in range(1, 5))))
    depths = []
    for _ in range(120):
        tree = policy.choose()
        depths.append(tree.max_depth)
        if tree.max_depth:
            policy.record([2], 1.0 + 0.02 * 2, trimmed=True, verified_depth=min(2, tree.max_depth), verified_nodes=2)
        else:
            policy.record([0], 1.0)
    tail = depths[20:]
    assert sum(1 for d in tail if d) >= 0.9 * len(tail)


@pytest.fixture(scope="module")
def useless(tmp_path_factory):
    """A target and a draft model of the same shape but other random weights: it accepts next to nothing."""
    root = tmp_path_factory.mktemp("useless")
    target = make_tiny_llama(root / "target", vocab_size=128, num_hidden_layers=4, seed=0)
    draft = make_tiny_llama(root / "draft", vocab_size=128, num_hidden_layers=2, seed=9)
    return load_spec_model(target, draft, tree=str([list(c) for c in DEFAULT_CHOICES]))


def test_fallback_engages_in_the_loop_and_output_is_unchanged(useless):
    gen = SpeculativeGenerator(useless)
    prompts = [[5, 9, 17, 3], [60, 61, 62]]
    plain = gen.generate(prompts, GenerationConfig(max_new_tokens=60, speculative=False))
    fixed = gen.generate(prompts, GenerationConfig(max_new_tokens=60))
    adaptive = gen.generate(prompts, GenerationConfig(max_new_tokens=60, adaptive=True))
    assert adaptive.tokens == plain.tokens == fixed.tokens
    assert fixed.metrics.speculative_steps == fixed.metrics.target_steps
    assert adaptive.metrics.speculative_steps <= 12 < adaptive.metrics.target_steps
    assert adaptive.metrics.mean_acceptance_length < 1.2


def test_adaptive_sampling_and_streaming_stay_consistent(useless):
    """Deferred observations: streaming chunks add up to the result, sampling still runs."""
    gen = SpeculativeGenerator(useless)
    cfg = GenerationConfig(max_new_tokens=40, adaptive=True, temperature=1.0, seed=3)
    steps = list(gen.stream_batch([[1, 2, 3]], cfg))
    assert sum(len(s.tokens[0]) for s in steps) == 40


def test_served_runtime_falls_back_per_request(useless):
    """The reference Triton backend with adaptive speculation: text equals plain greedy, and each reply's
    draft-token count is what its steps really verified (fewer than a fixed tree's)."""
    import threading

    from trtspec.triton.reference_backend import GenRequest, ReferenceBackend

    gen = SpeculativeGenerator(useless)
    replies, done = [], threading.Event()

    def emit(reply):
        replies.append(reply)
        if reply.final:
            done.set()

    backend = ReferenceBackend(gen, speculative=True, adaptive=True, max_batch_size=1)
    try:
        backend.submit(GenRequest(prompt=[5, 9, 17, 3], max_new_tokens=48, emit=emit))
        assert done.wait(120)
    finally:
        backend.close()
    final = replies[-1]
    plain = gen.generate([[5, 9, 17, 3]], GenerationConfig(max_new_tokens=48, speculative=False)).tokens[0]
    assert final.tokens == plain
    assert final.draft_tokens < final.target_steps * useless.tree.num_nodes / 2
