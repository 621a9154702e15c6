"""Kernel tests aimed at specific bugs, each of which the older tests let through (issue 18): eps dropped or
moved outside the sqrt, a head stride ignored, the last instead of the first matching sibling, NaN order
in argmax, softmax without the max shift, the multi-tile path of vocabularies over 524288, and a sampling
seed with no step term. They run on the GPU (marked gpu) and in the host emulation of the same sources.
"""

from __future__ import annotations

import pytest
import test_plugins_gpu as gpu
import torch

from trtspec.kernels import bindings, reference
from trtspec.tree import build_tree

backend = gpu.backend  # the same fixture: CUDA (marked gpu) and the host emulation
DTYPES = gpu.DTYPES
_assert_same, _draft, _greedy_ids, _on, _tree = gpu._assert_same, gpu._draft, gpu._greedy_ids, gpu._on, gpu._tree

# ------------------------------------------------------------------------------------------ RMSNorm


# (T, H) per launch shape: warp per token, block per token, scalar (H not a multiple of the vector).
PATH_SHAPES = [(3, 64), (3, 4096), (3, 100)]


@pytest.mark.parametrize("tokens,hidden", PATH_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_rmsnorm_eps_matters_at_small_magnitudes(backend, dtype, tokens, hidden):
    """mean(x^2) ~ 1e-8 next to eps = 1e-6: dropping eps, or adding it outside the sqrt, is far off."""
    gen = torch.Generator().manual_seed(hidden)
    x = (torch.randn(tokens, hidden, generator=gen) * 1e-4).to(dtype)
    w = (torch.rand(2, hidden, generator=gen) + 0.5).to(dtype)
    eps = 1e-6
    want = reference.rmsnorm_heads_reference(x, w, eps)
    no_eps = reference.rmsnorm_heads_reference(x, w, 0.0)
    assert (want.float() - no_eps.float()).abs().max() > 0.5  # the case can tell eps from no eps
    got = bindings.rmsnorm_heads(*_on(backend, x, w), eps, lib=backend.lib)
    atol, rtol = reference.RMSNORM_TOLERANCE[dtype]
    torch.testing.assert_close(got.cpu(), want, atol=atol, rtol=rtol)


@pytest.mark.parametrize("tokens,hidden", PATH_SHAPES)
@pytest.mark.parametrize("pad", [8, 3])
def test_rmsnorm_honours_every_stride(backend, tokens, hidden, pad):
    """Weights, hidden states and outputs sliced out of wider buffers: head k must read row k of the
    weights at k * w_head_stride (not k * H), and write at its own head/token strides."""
    gen = torch.Generator().manual_seed(tokens + hidden + pad)
    dtype = torch.float16
    k = 3
    xbuf = torch.randn(tokens, hidden + pad, generator=gen).to(dtype)
    wbuf = (torch.rand(k, hidden + pad, generator=gen) + 0.5).to(dtype)
    obuf = torch.full((k, tokens, hidden + pad), 7.0, dtype=dtype)
    xbuf, wbuf, obuf = _on(backend, xbuf, wbuf, obuf)
    x, w, out = xbuf[:, :hidden], wbuf[:, :hidden], obuf[:, :, :hidden]
    bindings.rmsnorm_heads_strided(x, w, out, 1e-6, lib=backend.lib)
    want = reference.rmsnorm_heads_reference(x.cpu().contiguous(), w.cpu().contiguous(), 1e-6)
    atol, rtol = reference.RMSNORM_TOLERANCE[dtype]
    torch.testing.assert_close(out.cpu(), want, atol=atol, rtol=rtol)
    assert (obuf[:, :, hidden:].cpu() == 7.0).all(), "wrote into the padding"


# ------------------------------------------------------------------------------------------ greedy


def _shared_token_case(vocab: int = 50):
    """root -> 1, 2 (same token 7); 1 -> 3 (8); 2 -> 4 (9) -> 5 (10). The argmax at the root is 7, at
    nodes 1 and 2 it is 9, at node 4 it is 10. The first matching child (node 1) stops after one step;
    taking the last one (node 2) or the longest run would accept three."""
    tree = build_tree([[0], [1], [0, 0], [1, 0], [1, 0, 0]])
    assert tree.paths.tolist() == [[0, 1, 3, -1], [0, 2, 4, 5]]
    draft = torch.tensor([[1, 7, 7, 8, 9, 10]], dtype=torch.int32)
    ids = torch.tensor([[7, 9, 9, 0, 10, 11]], dtype=torch.int32)
    return tree, draft, ids


def test_reference_batched_greedy_takes_the_first_matching_sibling():
    tree, draft, ids = _shared_token_case()
    got = reference.tree_verify_greedy_batched(tree.paths.int(), draft, ids)
    assert got.as_lists() == {
        "accepted_len": [1],
        "tokens": [[7, 9, -1, -1]],
        "best_path": [0],
        "keep_nodes": [[0, 1, -1, -1]],
    }
    _assert_same(got, reference.tree_verify_reference(tree, draft, ids))


@pytest.mark.parametrize("target_kind", ["ids", "logits"])
def test_greedy_takes_the_first_of_siblings_sharing_a_token(backend, target_kind):
    tree, draft, ids = _shared_token_case()
    target = ids if target_kind == "ids" else torch.nn.functional.one_hot(ids.long(), 50).float()
    got = bindings.tree_verify(*_on(backend, tree.paths.int(), draft, target), target_kind=target_kind, lib=backend.lib)
    assert got.accepted_len.tolist() == [1] and got.keep_nodes.tolist() == [[0, 1, -1, -1]]
    _assert_same(got, reference.tree_verify_reference(tree, draft, target, target_kind=target_kind))


@pytest.mark.parametrize("kind", ["default", "random64"])
def test_greedy_with_many_shared_sibling_tokens_matches_verify_py(backend, kind):
    tree = _tree(kind)
    batch = 64 if backend.full else 8
    gen = torch.Generator().manual_seed(len(kind))
    draft = torch.randint(0, 3, (batch, tree.size), generator=gen)  # 3 tokens: siblings often share
    ids = torch.randint(0, 3, (batch, tree.size), generator=gen)
    got = bindings.tree_verify(*_on(backend, tree.paths.int(), draft.int(), ids.int()), lib=backend.lib)
    want = reference.tree_verify_reference(tree, draft, ids)
    _assert_same(got, want)
    _assert_same(reference.tree_verify_greedy_batched(tree.paths.int(), draft.int(), ids.int()), want)
    assert want.accepted_len.float().mean() > 1  # the walks do go deep


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_greedy_logits_nan_rows_follow_torch_argmax(backend, dtype):
    """torch.argmax: the first NaN beats every number. Row 0: a NaN at a child's token makes the walk
    accept it; row 1: NaNs after a huge finite max still win; row 2: the first of two NaNs."""
    tree = _tree("default")
    vocab = 1000
    gen = torch.Generator().manual_seed(3)
    draft = _draft(tree, 3, vocab, gen)
    logits = torch.randn(3, tree.size, vocab, generator=gen)
    child = tree.children(0)[1]
    logits[0, 0, int(draft[0, child])] = float("nan")
    logits[1, :, 5] = 1e4
    logits[1, :, 900] = float("nan")
    logits[2, 0, 17] = float("nan")
    logits[2, 0, 3] = float("nan")
    logits = logits.to(dtype)
    got = bindings.tree_verify(
        *_on(backend, tree.paths.int(), draft.int(), logits), target_kind="logits", lib=backend.lib
    )
    want = reference.tree_verify_reference(tree, draft, logits, target_kind="logits")
    _assert_same(got, want)
    assert got.keep_nodes[0, 1] == child and got.tokens[1, 0] == 900 and got.tokens[2, 0] == 3


# ------------------------------------------------------------------------------------------ sampling


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_sampling_large_logits_need_the_max_shift(backend, dtype):
    """Logits around +-1000 (temperature 0.5): exp without subtracting the row max overflows to inf or
    underflows to 0 everywhere."""
    tree = _tree("one" if not backend.full else "default")
    batch, vocab = 6, 300
    gen = torch.Generator().manual_seed(11)
    draft = _draft(tree, batch, vocab, gen)
    logits = torch.randn(batch, tree.size, vocab, generator=gen) * 4
    ids = _greedy_ids(tree, draft, vocab, gen, accept=0.7)
    logits.scatter_add_(-1, ids[..., None], torch.full(ids.shape + (1,), 3.0))
    logits[: batch // 2] += 1000.0
    logits[batch // 2 :] -= 1000.0
    logits = logits.to(dtype)
    for seed in (1, 2, 3):
        got = bindings.tree_verify(
            *_on(backend, tree.paths.int(), draft.int(), logits),
            mode="sampling",
            target_kind="logits",
            temperature=0.5,
            seed=seed,
            lib=backend.lib,
        )
        want = reference.tree_verify_reference(tree, draft, logits, "sampling", "logits", 0.5, seed=seed)
        _assert_same(got, want)


@pytest.mark.parametrize("target_kind", ["probs", "logits"])
def test_sampling_vocab_over_524k_takes_the_multi_tile_path(backend, target_kind):
    """V > 256 * 2048 makes each tile span several 256-element steps (tile_mult 2): the tile sums, the
    re-summed tiles of rejected tokens and the inverse-CDF draw must all index the same elements."""
    vocab = 600_000
    tree = _tree("one") if not backend.full else _tree("random64")
    batch = 2 if not backend.full else 4
    gen = torch.Generator().manual_seed(600)
    draft = _draft(tree, batch, vocab, gen)
    if target_kind == "probs":
        probs = torch.zeros(batch, tree.size, vocab)
        high = torch.randint(524_288, vocab, (batch, tree.size, 64), generator=gen)
        probs.scatter_(-1, high, torch.rand(high.shape, generator=gen))  # mass past the first tile step
        probs[:, :, 300] = 0.2
        probs.scatter_(-1, draft[:, :, None].expand(-1, -1, 1), 0.3)  # draft tokens get some mass
        target = probs
    else:
        target = (torch.randn(batch, tree.size, vocab, generator=gen) * 2).half()
    for seed in (5, 6):
        got = bindings.tree_verify(
            *_on(backend, tree.paths.int(), draft.int(), target),
            mode="sampling",
            target_kind=target_kind,
            temperature=0.8 if target_kind == "logits" else None,
            seed=seed,
            lib=backend.lib,
        )
        want = reference.tree_verify_reference(
            tree, draft, target, "sampling", target_kind, 0.8 if target_kind == "logits" else None, seed=seed
        )
        _assert_same(got, want)


def test_greedy_logits_vocab_over_524k(backend):
    if not backend.full:
        pytest.skip("runs on the GPU only")
    tree = _tree("random64")
    vocab = 600_000
    gen = torch.Generator().manual_seed(7)
    draft = _draft(tree, 4, vocab, gen)
    ids = _greedy_ids(tree, draft, vocab, gen, accept=0.8)
    logits = torch.randn(4, tree.size, vocab, generator=gen)
    logits.scatter_(-1, ids[..., None], 9.0)
    logits = logits.half()
    got = bindings.tree_verify(
        *_on(backend, tree.paths.int(), draft.int(), logits), target_kind="logits", lib=backend.lib
    )
    _assert_same(got, reference.tree_verify_reference(tree, draft, logits, target_kind="logits"))


def test_sampling_step_counter_gives_fresh_draws_that_match_the_reference(backend):
    """One seed with a step counter: every step matches verify.py with step_key(seed, step), the draws
    change from step to step, and seed tensor [seed, step] is the same as seed=int, step=int."""
    tree = _tree("one")
    batch, vocab = 4, 16
    gen = torch.Generator().manual_seed(21)
    draft = _draft(tree, batch, vocab, gen)
    probs = torch.rand(batch, tree.size, vocab, generator=gen)
    outs = []
    steps = range(12) if not backend.full else range(64)
    for step in steps:
        got = bindings.tree_verify(
            *_on(backend, tree.paths.int(), draft.int(), probs),
            mode="sampling",
            target_kind="probs",
            seed=1234,
            step=step,
            lib=backend.lib,
        )
        _assert_same(
            got, reference.tree_verify_reference(tree, draft, probs, "sampling", "probs", seed=1234, step=step)
        )
        outs.append(got.tokens.cpu())
    assert len({tuple(t.flatten().tolist()) for t in outs}) > len(outs) // 2, "draws repeat across steps"
    seed_tensor = torch.tensor([1234, 5], dtype=torch.int64, device=backend.device)
    again = bindings.tree_verify(
        *_on(backend, tree.paths.int(), draft.int(), probs),
        mode="sampling",
        target_kind="probs",
        seed=seed_tensor,
        lib=backend.lib,
    )
    assert torch.equal(again.tokens.cpu(), outs[5])


# ------------------------------------------------------------------------------------------ clusters


@pytest.mark.parametrize("cluster", ["1", "2", "8"])
@pytest.mark.parametrize("vocab", [1, 13, 4099, 128256, 600_000])
def test_clustered_verify_matches_the_reference(backend, monkeypatch, cluster, vocab):
    """sm_90+: each sequence's rows split over a cluster of CTAs (TRTSPEC_VERIFY_CLUSTER forces the size;
    slices may be empty for tiny vocabularies); every mode must still equal verify.py."""
    if not backend.full:
        pytest.skip("thread block clusters need the GPU")
    monkeypatch.setenv("TRTSPEC_VERIFY_CLUSTER", cluster)
    tree = _tree("random64")
    batch = 3 if vocab > 200_000 else 16
    gen = torch.Generator().manual_seed(vocab)
    draft = _draft(tree, batch, vocab, gen)
    ids = _greedy_ids(tree, draft, vocab, gen, accept=0.8)
    logits = torch.randn(batch, tree.size, vocab, generator=gen) * 2
    logits.scatter_add_(-1, ids[..., None], torch.full(ids.shape + (1,), 7.0))
    logits = logits.half()
    paths, d, t = _on(backend, tree.paths.int(), draft.int(), logits)
    got = bindings.tree_verify(paths, d, t, target_kind="logits", lib=backend.lib)
    _assert_same(got, reference.tree_verify_reference(tree, draft, logits, target_kind="logits"))
    for seed in (3, 4):
        got = bindings.tree_verify(
            paths, d, t, mode="sampling", target_kind="logits", temperature=0.9, seed=seed, step=seed, lib=backend.lib
        )
        _assert_same(
            got, reference.tree_verify_reference(tree, draft, logits, "sampling", "logits", 0.9, seed=seed, step=seed)
        )
    probs = torch.softmax(logits.float(), -1)
    got = bindings.tree_verify(
        *_on(backend, tree.paths.int(), draft.int(), probs),
        mode="sampling",
        target_kind="probs",
        seed=8,
        lib=backend.lib,
    )
    _assert_same(got, reference.tree_verify_reference(tree, draft, probs, "sampling", "probs", seed=8))
