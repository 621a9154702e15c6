"""The ``trtspec::`` torch operators (runtime/ops.py): opcheck on CPU, the specification's numbers, and
the reference runtime verifying through them with unchanged output."""

from __future__ import annotations

import pytest
import torch

import trtspec.kernels.torch_ops  # noqa: F401  (registers the CUDA implementations; safe without a GPU)
from trtspec.load import load_spec_model
from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator
from trtspec.runtime.verify import verify_greedy
from trtspec.tree import DEFAULT_CHOICES, build_tree


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["head-major", "token-major"])
@pytest.mark.parametrize("shape", [(5, 64), (2, 3, 48)])
def test_rmsnorm_heads_opcheck_and_formula(dtype, layout, shape):
    g = torch.Generator().manual_seed(0)
    hidden = (torch.randn(shape, generator=g) * 1e-3).to(dtype)  # small: eps matters, inside the sqrt
    weights = torch.randn(3, shape[-1], generator=g).to(dtype)
    eps = 1e-5
    torch.library.opcheck(torch.ops.trtspec.rmsnorm_heads, (hidden, weights, eps, layout))
    out = torch.ops.trtspec.rmsnorm_heads(hidden, weights, eps, layout)
    x = hidden.double()
    want = torch.stack([w.double() * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) for w in weights])
    if layout == "token-major":
        want = want.movedim(0, -2)
    assert out.dtype == dtype and out.shape == want.shape
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(out.double(), want, atol=tol * want.abs().max().item(), rtol=tol)


def test_rmsnorm_heads_rejects_an_unknown_layout():
    with pytest.raises(ValueError, match="layout"):
        torch.ops.trtspec.rmsnorm_heads(torch.ones(2, 4), torch.ones(1, 4), 1e-6, "diagonal")


@pytest.mark.parametrize("target_kind", ["ids", "logits"])
def test_tree_verify_opcheck_and_verify_py(target_kind):
    """Random drafts over 3 tokens on the default tree: siblings often share a token (first child wins)."""
    tree = build_tree(DEFAULT_CHOICES)
    g = torch.Generator().manual_seed(3)
    draft = torch.randint(0, 3, (16, tree.size), generator=g)
    ids = torch.randint(0, 3, (16, tree.size), generator=g)
    target = ids if target_kind == "ids" else torch.nn.functional.one_hot(ids, 5).float()
    torch.library.opcheck(torch.ops.trtspec.tree_verify, (tree.paths, draft, target))
    acc, toks, best, keep = torch.ops.trtspec.tree_verify(tree.paths, draft, target)
    want = verify_greedy(tree, draft, ids)
    assert acc.tolist() == want.accepted_len and best.tolist() == want.best_path
    for b, n in enumerate(want.accepted_len):
        assert toks[b, : n + 1].tolist() == want.tokens[b] and (toks[b, n + 1 :] == -1).all()
        assert keep[b, : n + 1].tolist() == want.keep_nodes[b]
    assert acc.float().mean() > 1  # the walks do go deep


def test_reference_runtime_through_the_operator_is_token_identical(demo_paths):
    spec = load_spec_model(demo_paths["target"], demo_paths["medusa"])
    gen = SpeculativeGenerator(spec, dtype=torch.float32)
    prompts = [[1, 2, 3, 4], [7, 8, 9]]
    plain = gen.generate(prompts, GenerationConfig(max_new_tokens=12))
    through = gen.generate(prompts, GenerationConfig(max_new_tokens=12, kernel_ops=True))
    assert through.tokens == plain.tokens
    assert through.metrics.acceptance_histogram == plain.metrics.acceptance_histogram


@pytest.mark.gpu
def test_cuda_operators_are_the_kernels_and_match_the_cpu_ones():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    tree = build_tree(DEFAULT_CHOICES)
    g = torch.Generator().manual_seed(4)
    draft = torch.randint(0, 3, (8, tree.size), generator=g)
    logits = torch.randn(8, tree.size, 3, generator=g)
    cpu = torch.ops.trtspec.tree_verify(tree.paths, draft, logits)
    gpu = torch.ops.trtspec.tree_verify(tree.paths.cuda(), draft.cuda(), logits.cuda().half())
    for a, b in zip(cpu, gpu):
        assert b.is_cuda and a.tolist() == b.cpu().tolist()
    hidden, weights = torch.randn(64, 256, generator=g), torch.randn(3, 256, generator=g)
    want = torch.ops.trtspec.rmsnorm_heads(hidden, weights, 1e-6)
    got = torch.ops.trtspec.rmsnorm_heads(hidden.cuda(), weights.cuda(), 1e-6)
    torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-5)
