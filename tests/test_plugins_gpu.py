"""The kernels against the PyTorch reference: on a GPU (marked gpu; skipped, with the reason, without
one) and, with smaller sizes, in the host-emulation build on the CPU (plugins/emu: the same kernel
sources, threads run as fibers), so the kernels' logic is checked on every CI run even without a GPU.

RMSNorm: within reference.RMSNORM_TOLERANCE per dtype. Tree verify: exactly equal to
trtspec/runtime/verify.py (greedy and sampling), across trees from one node to 256, batch up to 256 and
vocab up to 256k on the GPU, including all-rejected and all-accepted rows.
"""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass

import pytest
import torch

from trtspec.kernels import bindings, build, reference
from trtspec.models.llama import rms_norm
from trtspec.tree import DEFAULT_CHOICES, build_tree, normalize_choices, parse_choices

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
BACKENDS = [
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(
                not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
            ),
        ],
    ),
    pytest.param(
        "emu",
        marks=pytest.mark.skipif(
            shutil.which(os.environ.get("CXX", "g++")) is None, reason="the host emulation build needs g++"
        ),
    ),
]


@dataclass
class Backend:
    name: str
    lib: bindings.KernelLibrary
    device: str

    @property
    def full(self) -> bool:
        """Full-size cases only on the GPU; the emulation runs every code path on smaller sizes."""
        return self.name == "cuda"


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request, tmp_path_factory) -> Backend:
    """cuda: $TRTSPEC_KERNELS_LIB if given, else a fresh build for this GPU; emu: the host build."""
    out = tmp_path_factory.mktemp(f"plugins-{request.param}")
    if request.param == "emu":
        return Backend("emu", bindings.load_library(build.build_host_emulation(out)), "cpu")
    if os.environ.get("TRTSPEC_KERNELS_LIB"):
        return Backend("cuda", bindings.load_library(), "cuda")
    major, minor = torch.cuda.get_device_capability()
    res = build.build_plugins(out, archs=[f"{major}{minor}"], with_trt=False)
    return Backend("cuda", bindings.load_library(res.kernels_lib), "cuda")


# ------------------------------------------------------------------------------------------ RMSNorm

# (T, H): warp-per-token (H/vec <= 256), block-per-token (<= 4096 vectors), scalar (other H, huge H).
RMS_SHAPES = [
    (1, 8),
    (1, 4096),
    (3, 100),
    (2, 6),
    (33, 256),
    (33, 2048),
    (5, 8192),
    (4, 16384),
    (2, 40000),
    (300, 1024),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("tokens,hidden", RMS_SHAPES)
def test_rmsnorm_heads_matches_reference(backend, dtype, tokens, hidden):
    if not backend.full:
        tokens = min(tokens, 5)  # the emulation runs one block at a time: keep every path, fewer tokens
    gen = torch.Generator().manual_seed(tokens * 7919 + hidden)
    x = (torch.randn(tokens, hidden, generator=gen) * 3).to(dtype).to(backend.device)
    atol, rtol = reference.RMSNORM_TOLERANCE[dtype]
    for heads in (1, 3) if backend.full else (3,):
        w = (torch.rand(heads, hidden, generator=gen) + 0.5).to(dtype).to(backend.device)
        for layout in ("head-major", "token-major"):
            got = bindings.rmsnorm_heads(x, w, 1e-6, layout=layout, lib=backend.lib)
            want = reference.rmsnorm_heads_reference(x, w, 1e-6, layout=layout)
            assert got.shape == want.shape and got.dtype == dtype
            torch.testing.assert_close(got, want, atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_rmsnorm_heads_unaligned_and_batched_inputs(backend, dtype):
    """A hidden state that is not 16-byte aligned takes the scalar path; leading dims are flattened."""
    buf = torch.randn(1 + 4 * 512).to(dtype).to(backend.device)
    x = buf[1:].view(4, 512)
    assert x.data_ptr() % 16 != 0
    w = (torch.rand(2, 512) + 0.5).to(dtype).to(backend.device)
    atol, rtol = reference.RMSNORM_TOLERANCE[dtype]
    torch.testing.assert_close(
        bindings.rmsnorm_heads(x, w, 1e-5, lib=backend.lib),
        reference.rmsnorm_heads_reference(x, w, 1e-5),
        atol=atol,
        rtol=rtol,
    )
    x3 = torch.randn(2, 3, 64).to(dtype).to(backend.device)
    got = bindings.rmsnorm_heads(x3, w[:, :64].contiguous(), 1e-5, layout="token-major", lib=backend.lib)
    assert got.shape == (2, 3, 2, 64)
    torch.testing.assert_close(got[:, :, 1], rms_norm(x3, w[1, :64], 1e-5), atol=atol, rtol=rtol)


@pytest.mark.parametrize("tokens,hidden", [(300, 64), (40, 4096), (40, 100), (7, 4096)])
def test_rmsnorm_heads_with_and_without_head_groups(backend, tokens, hidden):
    """Enough tokens to fill the (emulated or real) GPU: all K heads in one block; few: heads split over
    grid y. Both launch shapes of every path must give the same numbers."""
    gen = torch.Generator().manual_seed(tokens + hidden)
    x = torch.randn(tokens, hidden, generator=gen).half().to(backend.device)
    w = (torch.rand(5, hidden, generator=gen) + 0.5).half().to(backend.device)
    atol, rtol = reference.RMSNORM_TOLERANCE[torch.float16]
    for layout in ("head-major", "token-major"):
        got = bindings.rmsnorm_heads(x, w, 1e-6, layout=layout, lib=backend.lib)
        torch.testing.assert_close(
            got.cpu(), reference.rmsnorm_heads_reference(x.cpu(), w.cpu(), 1e-6, layout), atol=atol, rtol=rtol
        )


def test_rmsnorm_heads_fp32_is_nearly_exact(backend):
    x = torch.randn(64 if backend.full else 4, 4096, device=backend.device)
    w = torch.randn(4, 4096, device=backend.device)
    got = bindings.rmsnorm_heads(x, w, 1e-6, lib=backend.lib)
    want = reference.rmsnorm_heads_reference(x.double(), w.double(), 1e-6).float()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------ tree verify


def _tree(kind: str):
    if kind == "root":
        return build_tree([])
    if kind == "one":
        return build_tree([[0]])
    if kind == "default":
        return build_tree(DEFAULT_CHOICES)
    if kind == "chain16":
        return build_tree(parse_choices("chain:16"))
    if kind == "wide255":
        return build_tree([[r] for r in range(255)])
    rng = random.Random(kind)
    n = int(kind.removeprefix("random"))
    choices = [(0,), (1,), (2,)]
    while len(choices) < n - 1:
        parent = rng.choice(choices)
        kids = sum(1 for c in choices if len(c) == len(parent) + 1 and c[:-1] == parent)
        if kids < 4:
            choices.append(parent + (kids,))
    return build_tree(normalize_choices(choices))


TREES = ["root", "one", "default", "chain16", "wide255", "random64", "random256"]


def _draft(tree, batch: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """Sibling tokens distinct, as top-k drafts are."""
    draft = torch.randint(0, vocab, (batch, tree.size), generator=gen)
    for n in range(1, tree.size):
        draft[:, n] = (draft[:, int(tree.parents[n])] * 31 + int(tree.ranks[n]) * 17 + 5) % vocab
    return draft


def _greedy_ids(tree, draft: torch.Tensor, vocab: int, gen: torch.Generator, accept: float) -> torch.Tensor:
    """Target argmax that follows one of the children with probability ``accept`` at every node."""
    rng = random.Random(int(torch.randint(0, 2**31, (1,), generator=gen)))
    ids = torch.randint(0, vocab, draft.shape, generator=gen)
    kids = [tree.children(n) for n in range(tree.size)]
    for b in range(draft.shape[0]):
        for n in range(tree.size):
            if kids[n] and rng.random() < accept:
                ids[b, n] = draft[b, rng.choice(kids[n])]
    return ids


def _deepest_path(tree) -> list[int]:
    return [int(n) for n in tree.paths[int(torch.argmax((tree.paths >= 0).sum(-1)))] if n >= 0]


def _assert_same(got: bindings.TreeVerifyOutput, want: bindings.TreeVerifyOutput):
    for name in ("accepted_len", "tokens", "best_path", "keep_nodes"):
        g, w = getattr(got, name).cpu(), getattr(want, name)
        bad = (g != w).reshape(len(g), -1).any(-1).nonzero().flatten().tolist()
        assert not bad, f"{name} differs in rows {bad[:8]}: got {g[bad[0]].tolist()}, want {w[bad[0]].tolist()}"


def _on(backend: Backend, *tensors: torch.Tensor):
    return [t.to(backend.device) for t in tensors]


@pytest.mark.parametrize("kind", TREES)
@pytest.mark.parametrize("batch", [1, 37, 256])
def test_tree_verify_greedy_ids_exact(backend, kind, batch):
    if batch == 256 and not backend.full:
        pytest.skip("batch 256 runs on the GPU only")
    tree = _tree(kind)
    gen = torch.Generator().manual_seed(batch)
    vocab = 1000
    draft = _draft(tree, batch, vocab, gen)
    ids = _greedy_ids(tree, draft, vocab, gen, accept=0.8)
    ids[0] = -7  # row 0: everything rejected (no token is -7)
    if batch > 1:  # row 1: everything accepted down the deepest path
        nodes = _deepest_path(tree)
        for parent, child in zip(nodes, nodes[1:]):
            ids[1, parent] = draft[1, child]
    paths, d, t = _on(backend, tree.paths.int(), draft.int(), ids.int())
    got = bindings.tree_verify(paths, d, t, lib=backend.lib)
    want = reference.tree_verify_reference(tree, draft, ids)
    _assert_same(got, want)
    assert got.accepted_len[0] == 0
    if batch > 1:
        assert got.accepted_len[1] == tree.max_depth
    _assert_same(reference.tree_verify_greedy_batched(paths, d, t), want)  # the torch version, same device


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("vocab", [1, 1003, 32000, 256000])
def test_tree_verify_greedy_logits_exact(backend, dtype, vocab):
    if vocab > 32000 and not backend.full:
        pytest.skip("vocab 256k runs on the GPU only")
    tree = _tree("default")
    batch = 8 if vocab < 10000 else 2
    gen = torch.Generator().manual_seed(vocab)
    draft = _draft(tree, batch, vocab, gen)
    ids = _greedy_ids(tree, draft, vocab, gen, accept=0.7)
    logits = torch.randn(batch, tree.size, vocab, generator=gen)
    logits.scatter_(-1, ids[..., None], 8.0)  # the argmax
    logits = logits.to(dtype)
    if vocab > 1:
        logits[0, 0, :] = 1.0  # a row of ties: argmax is index 0 in torch and in the kernel
    got = bindings.tree_verify(
        *_on(backend, tree.paths.int(), draft.int(), logits), target_kind="logits", lib=backend.lib
    )
    _assert_same(got, reference.tree_verify_reference(tree, draft, logits, target_kind="logits"))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("vocab", [7, 4099, 128000])
@pytest.mark.parametrize("kind", ["one", "default", "random64"])
def test_tree_verify_sampling_logits_exact(backend, dtype, vocab, kind):
    if not backend.full and (vocab > 4099 or kind == "default"):
        pytest.skip("runs on the GPU only")
    tree = _tree(kind)
    batch = (64 if vocab <= 4099 else 4) if backend.full else 6
    gen = torch.Generator().manual_seed(vocab + len(kind))
    draft = _draft(tree, batch, vocab, gen)
    logits = torch.randn(batch, tree.size, vocab, generator=gen) * 2
    ids = _greedy_ids(tree, draft, vocab, gen, accept=0.6)
    logits.scatter_add_(-1, ids[..., None], torch.full(ids.shape + (1,), 6.0))  # often accepted
    logits = logits.to(dtype)
    temps = torch.rand(batch, generator=gen) * 1.5 + 0.3
    for seed in (0, 12345, -3) if backend.full else (12345, -3):
        got = bindings.tree_verify(
            *_on(backend, tree.paths.int(), draft.int(), logits),
            mode="sampling",
            target_kind="logits",
            temperature=temps.to(backend.device),
            seed=seed,
            lib=backend.lib,
        )
        want = reference.tree_verify_reference(tree, draft, logits, "sampling", "logits", temps, seed=seed)
        _assert_same(got, want)


@pytest.mark.parametrize("kind", ["root", "one", "chain16", "wide255", "random256"])
def test_tree_verify_sampling_probs_exact(backend, kind):
    tree = _tree(kind)
    batch, vocab = (32, 300) if backend.full else (4, 300)
    gen = torch.Generator().manual_seed(len(kind))
    draft = _draft(tree, batch, vocab, gen)
    probs = torch.rand(batch, tree.size, vocab, generator=gen) ** 4
    probs[probs < 0.2] = 0.0  # sparse rows: the residual often empties
    probs[0] = 0.0
    probs[0, :, 3] = 1.0  # row 0: a point mass; every child that is not token 3 is rejected
    got = bindings.tree_verify(
        *_on(backend, tree.paths.int(), draft.int(), probs),
        mode="sampling",
        target_kind="probs",
        seed=7,
        lib=backend.lib,
    )
    _assert_same(got, reference.tree_verify_reference(tree, draft, probs, "sampling", "probs", seed=7))


def test_tree_verify_sampling_all_accepted_and_all_rejected(backend):
    tree = _tree("default")
    batch, vocab = 3, 64
    gen = torch.Generator().manual_seed(0)
    draft = _draft(tree, batch, vocab, gen)
    probs = torch.full((batch, tree.size, vocab), 1e-3)
    deepest = _deepest_path(tree)
    for parent, child in zip(deepest, deepest[1:]):
        probs[0, parent] = 0.0
        probs[0, parent, draft[0, child]] = 1.0  # row 0: all mass on the draft token: accepted
    for n in range(tree.size):
        kids = tree.children(n)
        if kids:
            probs[1, n, draft[1, kids]] = 0.0  # row 1: no draft token has mass: all rejected
    got = bindings.tree_verify(
        *_on(backend, tree.paths.int(), draft.int(), probs),
        mode="sampling",
        target_kind="probs",
        seed=1,
        lib=backend.lib,
    )
    _assert_same(got, reference.tree_verify_reference(tree, draft, probs, "sampling", "probs", seed=1))
    assert got.accepted_len[0] == tree.max_depth and got.accepted_len[1] == 0


def test_tree_verify_large_vocab_sampling(backend):
    if not backend.full:
        pytest.skip("vocab 256k runs on the GPU only")
    tree = _tree("random64")
    batch, vocab = 2, 256000
    gen = torch.Generator().manual_seed(5)
    draft = _draft(tree, batch, vocab, gen)
    logits = (torch.randn(batch, tree.size, vocab, generator=gen) * 3).half()
    got = bindings.tree_verify(
        *_on(backend, tree.paths.int(), draft.int(), logits),
        mode="sampling",
        target_kind="logits",
        temperature=0.7,
        seed=99,
        lib=backend.lib,
    )
    want = reference.tree_verify_reference(tree, draft, logits, "sampling", "logits", 0.7, seed=99)
    _assert_same(got, want)


def test_tree_verify_sampling_duplicate_sibling_tokens(backend):
    """Siblings with the same token (not produced by top-k drafts, but legal input): once rejected, the
    token's mass is zero, so its later siblings are rejected too, exactly as verify.py does."""
    tree = build_tree([[0], [1], [2], [0, 0], [1, 0]])
    batch, vocab = 16, 8
    gen = torch.Generator().manual_seed(2)
    draft = torch.randint(0, vocab, (batch, tree.size), generator=gen)
    draft[:, 1:4] = 5  # the three depth-1 siblings share token 5
    probs = torch.rand(batch, tree.size, vocab, generator=gen)
    for seed in range(4):
        got = bindings.tree_verify(
            *_on(backend, tree.paths.int(), draft.int(), probs),
            mode="sampling",
            target_kind="probs",
            seed=seed,
            lib=backend.lib,
        )
        _assert_same(got, reference.tree_verify_reference(tree, draft, probs, "sampling", "probs", seed=seed))
