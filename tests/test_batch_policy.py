"""The batch-aware speculation table (runtime.batch_policy): TensorRT-LLM's draft_len_schedule semantics."""

from __future__ import annotations

import pytest

from trtspec.errors import UsageError
from trtspec.runtime.batch_policy import (
    BatchAwareSpeculation,
    cut_tree,
    default_schedule,
    parse_schedule,
    schedule_depth,
)
from trtspec.tree import build_tree

TREE = build_tree([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)])


def test_schedule_depth_follows_the_smallest_threshold_at_or_above_the_batch():
    table = {1: 3, 4: 2, 8: 1}
    assert [schedule_depth(b, table, 3) for b in (1, 2, 4, 5, 8, 9, 32)] == [3, 2, 2, 1, 1, 0, 0]
    assert schedule_depth(64, {}, 3) == 3  # no table: always the full depth
    assert schedule_depth(3, {2: 3}, 3) == 0  # max_concurrency=2


def test_parse_schedule_accepts_text_and_refuses_bad_tables():
    assert parse_schedule("1:3,8:1", 3) == {1: 3, 8: 1}
    assert parse_schedule('{"16": 1, "1": 3}', 3) == {1: 3, 16: 1}
    assert parse_schedule("", 3) == {}
    with pytest.raises(UsageError, match="smallest batch size must map to the full depth 3"):
        parse_schedule("1:2,8:1", 3)
    with pytest.raises(UsageError, match="depths 0..3"):
        parse_schedule("1:3,8:5", 3)
    with pytest.raises(UsageError, match="not a table"):
        parse_schedule("fast please", 3)


def test_default_schedule_is_valid_and_ends_speculation_at_large_batches():
    table = default_schedule(TREE.max_depth)
    assert parse_schedule(table, TREE.max_depth) == table
    assert schedule_depth(1, table, 3) == 3 and schedule_depth(64, table, 3) == 0
    assert default_schedule(0) == {}


def test_batch_aware_policy_cuts_the_tree():
    p = BatchAwareSpeculation(TREE, {1: 3, 4: 1})
    assert p.choose(1).num_nodes == TREE.num_nodes
    assert p.choose(3).choices == cut_tree(TREE, 1).choices == ((0,), (1,))
    assert p.choose(5).num_nodes == 0
    assert p.table() == {1: 3, 4: 1}
    plain = BatchAwareSpeculation(build_tree(()), {1: 3, 4: 1})  # speculation off, the table still set
    assert plain.choose(1).num_nodes == 0 and plain.choose(8).num_nodes == 0


def test_adaptive_buckets_measure_separately():
    """With measurement on, a bucket where drafts are never accepted falls back to plain steps; another
    bucket keeps speculating."""
    p = BatchAwareSpeculation(TREE, {}, adaptive=True)
    for _ in range(40):  # batch 8: trees cost more than they bring
        t = p.choose(8)
        p.record([0] * 8, 0.010 + 0.004 * t.num_nodes)
    assert p.choose(8).num_nodes == 0
    for _ in range(40):  # batch 1: everything accepted, a tree costs about a token
        t = p.choose(1)
        p.record([t.max_depth], 0.010 + 0.0001 * t.num_nodes)
    assert p.choose(1).num_nodes > 0


def test_buckets_share_acceptance_so_a_new_bucket_does_not_explore():
    p = BatchAwareSpeculation(TREE, {}, adaptive=True)
    for _ in range(30):  # batch 1 learns that nothing is accepted
        t = p.choose(1)
        p.record([0], 0.010 + 0.004 * t.num_nodes)
    spec_steps = 0
    for _ in range(12):  # a new bucket: no exploration, and it probes as rarely as bucket 1 learnt to
        t = p.choose(16)
        spec_steps += t.num_nodes > 0
        p.record([0] * 16, 0.040 + 0.02 * t.num_nodes)
    assert spec_steps == 0
    fresh = BatchAwareSpeculation(TREE, {}, adaptive=True)  # without the shared estimates it explores
    explored = 0
    for _ in range(12):
        t = fresh.choose(16)
        explored += t.num_nodes > 0
        fresh.record([0] * 16, 0.040 + 0.02 * t.num_nodes)
    assert explored >= 2


def test_the_requests_in_flight_decide_not_the_history():
    """Per-request acceptance: a batch whose requests accept nothing decodes plainly even though the
    server's history says trees pay; the history itself is left as it was."""
    p = BatchAwareSpeculation(TREE, {}, adaptive=True)
    for _ in range(40):  # history: everything accepted, a tree costs about a token
        t = p.choose(1)
        p.record([t.max_depth], 0.010 + 0.0001 * t.num_nodes)
    assert p.choose(1).num_nodes > 0
    history = list(p._accept)
    assert [p.choose(1, [0.0, 0.0, 0.0]).num_nodes for _ in range(4)] == [0, 0, 0, 0]
    assert p._accept == history
    assert p.choose(1, [None, None, None]).num_nodes > 0  # nobody measured anything: the history decides
