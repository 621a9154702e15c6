"""Tree buffers checked against hand-worked trees."""

import pytest
import torch

from trtspec.errors import UsageError
from trtspec.tree import build_tree, format_choices_trtllm, pack_mask, parse_choices, unpack_mask


def test_hand_worked_tree():
    #        root(0)
    #       /      \
    #   [0](1)    [1](2)
    #   /    \        \
    # [0,0](3) [0,1](4) [1,0](5)
    #   |
    # [0,0,0](6)
    t = build_tree([[1, 0], [0], [0, 0, 0], [1], [0, 1], [0, 0]])
    assert t.choices == ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
    assert t.parents.tolist() == [-1, 0, 0, 1, 1, 2, 3]
    assert t.depths.tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert t.ranks.tolist() == [0, 0, 1, 0, 1, 0, 0]
    # one row per leaf, in node order (leaves 4, 5, 6)
    assert t.paths.tolist() == [[0, 1, 4, -1], [0, 2, 5, -1], [0, 1, 3, 6]]
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0, 0],
            [1, 1, 0, 1, 0, 0, 0],
            [1, 1, 0, 0, 1, 0, 0],
            [1, 0, 1, 0, 0, 1, 0],
            [1, 1, 0, 1, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(t.mask, expected)
    # bit j of row i: row 6 = nodes {0,1,3,6} -> 1 + 2 + 8 + 64
    assert t.packed_mask[:, 0].tolist() == [1, 3, 5, 11, 19, 37, 75]
    assert t.max_rank_at_depth() == [2, 2, 1]


def test_packed_mask_multiword_and_sign_bit():
    # 40 siblings: row 32 must set bit 0 of word 0 and bit 0 of word 1; row 31 sets bit 31 (the sign bit).
    t = build_tree([[i] for i in range(40)])
    assert t.packed_mask.shape == (41, 2)
    assert t.packed_mask[31].tolist() == [1 | -(2**31), 0]
    assert t.packed_mask[32].tolist() == [1, 1]
    assert torch.equal(unpack_mask(t.packed_mask, 41), t.mask)
    m = torch.rand(3, 70, 70) > 0.5
    assert torch.equal(unpack_mask(pack_mask(m), 70), m)


def test_chain_and_parse_formats():
    assert parse_choices("chain:3") == ((0,), (0, 0), (0, 0, 0))
    assert parse_choices("{0}, {0, 0}, {1}") == ((0,), (1,), (0, 0))
    assert parse_choices("[[0],[1],[0,0]]") == ((0,), (1,), (0, 0))
    assert format_choices_trtllm([[0], [0, 0], [1]]) == "{0}, {1}, {0, 0}"
    t = build_tree(parse_choices("chain:4"))
    assert t.paths.tolist() == [[0, 1, 2, 3, 4]]
    assert torch.equal(t.mask, torch.ones(5, 5, dtype=torch.bool).tril())


def test_empty_tree_is_plain_decoding():
    t = build_tree(())
    assert t.size == 1 and t.num_nodes == 0 and t.paths.tolist() == [[0]]


@pytest.mark.parametrize("bad", ["[[0,0]]", "[[0],[0]]", "[[]]", "[[-1]]", "nonsense", "[[0],'x']"])
def test_bad_choices(bad):
    with pytest.raises(UsageError):
        parse_choices(bad)
