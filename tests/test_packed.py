"""Pre-packed bfloat16 CPU inference (models.packed): the same math as the plain bfloat16 modules, and
speculative greedy still equals plain greedy when both run packed."""

import pytest
import torch

from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.load import load_spec_model
from trtspec.models.llama import MLP, Attention, build_llama, causal_mask
from trtspec.models.packed import PackedLinear, pack_module, packing_supported
from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator

pytestmark = pytest.mark.skipif(
    not packing_supported(), reason="this CPU or torch build has no oneDNN bfloat16 linear kernels"
)

KINDS = ["draft-model", "medusa", "mtp-linear", "mtp-single", "eagle", "eagle3"]
PROMPTS = [[1, 40, 50, 60, 70], [1, 7], [5, 6, 7, 8, 9, 10, 11, 12], [3]]


def test_packed_linear_matches_fused_reference():
    torch.manual_seed(0)
    parts = [torch.nn.Linear(32, n, bias=b).to(torch.bfloat16) for n, b in ((24, True), (8, False), (8, True))]
    fused = PackedLinear(parts)
    x = torch.randn(2, 5, 32).to(torch.bfloat16)
    out = fused(x)
    assert out.shape == (2, 5, 40) and fused.split_sizes == [24, 8, 8]
    ref = torch.cat([p(x) for p in parts], -1)
    assert torch.allclose(out.float(), ref.float(), atol=2e-2, rtol=2e-2), (out.float() - ref.float()).abs().max()


def test_packed_linear_rows_do_not_depend_on_the_batch():
    """Why packed speculative decoding stays token-identical to plain: a row's result is the same bits
    whether it is computed alone (plain decoding, T=1) or with a tree's other rows (T=N)."""
    torch.manual_seed(0)
    for n, k in ((96, 64), (64, 160), (1000, 64)):
        packed = PackedLinear([torch.nn.Linear(k, n, bias=False).to(torch.bfloat16)])
        x = torch.randn(17, k).to(torch.bfloat16)
        for m in (2, 9, 17):
            rows = torch.cat([packed(x[i : i + 1]) for i in range(m)])
            assert torch.equal(packed(x[:m]), rows), (n, k, m)


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("prefix", [5, 37, 120])
def test_packed_target_is_batch_invariant(smollm2, prefix, threads):
    """The root token's hidden state is the same bits in a plain step (T=1) and in a tree step (T=N),
    after any prefix length: no kernel lets the other tree rows or the masked extra keys leak into it.
    SmolLM2's real sizes: with fused SDPA instead of exact_attention this fails at the first layer."""
    from trtspec.tree import build_tree

    target = load_hf_causal_lm(smollm2)
    model = build_llama(target.arch, target.tensors, torch.bfloat16)
    pack_module(model)
    tree = build_tree([[0], [1], [0, 0], [0, 1], [0, 0, 0]])
    g = torch.Generator().manual_seed(prefix)
    ids = torch.randint(0, 20000, (1, prefix), generator=g)  # common tokens: the high ids hide the drift
    nodes = torch.randint(0, 20000, (1, tree.size), generator=g)
    outs = []
    with torch.no_grad():
        for tokens, mask, offsets in (
            (nodes[:, :1], causal_mask(1), torch.zeros(1, dtype=torch.long)),
            (nodes, tree.mask[None], tree.depths),
        ):
            cache = model.new_cache(1, 400)
            model(ids, torch.arange(prefix)[None], cache, causal_mask(prefix))
            cache.commit([torch.arange(prefix)])
            h, _ = model(tokens, cache.lengths[:, None] + offsets[None], cache, mask)
            outs.append(h[:, 0])
    assert torch.equal(outs[0], outs[1])


def test_packed_target_matches_plain_bfloat16(demo_paths):
    target = load_hf_causal_lm(demo_paths["target"])
    plain = build_llama(target.arch, target.tensors, torch.bfloat16)
    packed = build_llama(target.arch, target.tensors, torch.bfloat16)
    n = pack_module(packed)
    layers = target.arch.num_hidden_layers
    assert n == 4 * layers + 1  # qkv, o, gate_up, down per layer + lm_head
    assert all(m.qkv is not None for m in packed.modules() if isinstance(m, Attention))
    assert all(m.gate_up is not None for m in packed.modules() if isinstance(m, MLP))
    assert not any(type(m) is torch.nn.Linear for m in packed.modules())
    ids = torch.randint(0, target.arch.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(12)[None].expand(2, -1)
    with torch.no_grad():
        a, _ = plain(ids, pos, plain.new_cache(2, 16), causal_mask(12))
        b, _ = packed(ids, pos, packed.new_cache(2, 16), causal_mask(12))
        la, lb = plain.logits(a), packed.logits(b)
    assert lb.dtype == torch.float32
    assert (la - lb).abs().max() < 0.1 * la.abs().max()
    assert (la.argmax(-1) == lb.argmax(-1)).float().mean() >= 0.9


def test_packing_without_batch_invariance_keeps_the_math_and_skips_float64_attention(demo_paths, monkeypatch):
    """The self-distillation cache packs its target with batch_invariant=False: attention stays on SDPA
    (float64 exact attention re-read every row's whole KV cache per layer and step, and a 64-row cache of
    chat prompts did not finish its first pool in 14 minutes), and the outputs are the same model's."""
    import trtspec.models.llama as llama

    target = load_hf_causal_lm(demo_paths["target"])
    exact = build_llama(target.arch, target.tensors, torch.bfloat16)
    fast = build_llama(target.arch, target.tensors, torch.bfloat16)
    pack_module(exact)
    pack_module(fast, batch_invariant=False)
    assert all(m.batch_invariant for m in exact.modules() if isinstance(m, Attention))
    assert not any(m.batch_invariant for m in fast.modules() if isinstance(m, Attention))
    ids = torch.randint(0, target.arch.vocab_size, (3, 10), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(10)[None].expand(3, -1)
    calls = []
    real = llama.exact_attention
    monkeypatch.setattr(llama, "exact_attention", lambda *args: calls.append(1) or real(*args))
    with torch.no_grad():
        a, _ = exact(ids, pos, exact.new_cache(3, 12), causal_mask(10))
        exact_calls = len(calls)
        b, _ = fast(ids, pos, fast.new_cache(3, 12), causal_mask(10))
        la, lb = exact.logits(a), fast.logits(b)
    assert exact_calls == target.arch.num_hidden_layers and len(calls) == exact_calls
    assert (la - lb).abs().max() < 0.05 * la.abs().max()
    assert (la.argmax(-1) == lb.argmax(-1)).float().mean() >= 0.9


def test_fused_attention_runs_half_precision_in_float32_on_cpu():
    """The cache builder's bfloat16 attention goes through SDPA in float32 (several times faster on CPU):
    the result is the float32 computation rounded once to bfloat16, with the GQA grouping and the mask
    kept, and float32 inputs take SDPA unchanged."""
    import torch.nn.functional as F

    from trtspec.models.llama import fused_attention

    g = torch.Generator().manual_seed(0)
    q = torch.randn(4, 9, 3, 64, generator=g)
    k, v = torch.randn(4, 3, 20, 64, generator=g), torch.randn(4, 3, 20, 64, generator=g)
    mask = torch.rand(4, 1, 3, 20, generator=g) > 0.3
    mask[..., 0] = True
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    out = fused_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask, True)
    assert out.dtype == torch.bfloat16
    expect = F.scaled_dot_product_attention(
        q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(), attn_mask=mask, enable_gqa=True
    )
    assert torch.equal(out, expect.bfloat16())
    assert (out.float() - ref).abs().max() < 0.05
    assert torch.equal(fused_attention(q, k, v, mask, True), ref)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tree", ["chain:3", None])
def test_packed_speculative_greedy_equals_plain(demo_paths, kind, tree):
    spec = load_spec_model(demo_paths["target"], demo_paths[kind], tree=tree)
    gen = SpeculativeGenerator(spec, dtype=torch.bfloat16)
    assert gen.packed
    plain = gen.generate(PROMPTS, GenerationConfig(max_new_tokens=24, speculative=False))
    res = gen.generate(PROMPTS, GenerationConfig(max_new_tokens=24))
    assert res.tokens == plain.tokens
    assert res.metrics.draft_tokens > 0 and res.metrics.target_steps <= plain.metrics.target_steps


def test_float32_is_never_packed(demo_paths):
    gen = SpeculativeGenerator(load_spec_model(demo_paths["target"], demo_paths["mtp-single"]))
    assert not gen.packed
    assert any(type(m) is torch.nn.Linear for m in gen.target.modules())


def test_generate_cli_honours_bfloat16(demo_paths, monkeypatch):
    """``generate --dtype bfloat16`` runs the packed path (the CPU runtime used to fall back to float32)."""
    import json

    from click.testing import CliRunner

    from trtspec.cli import main
    from trtspec.runtime import generate as gen_mod

    made = []
    real_init = gen_mod.SpeculativeGenerator.__init__

    def spy(self, *a, **k):
        real_init(self, *a, **k)
        made.append(self)

    monkeypatch.setattr(gen_mod.SpeculativeGenerator, "__init__", spy)
    r = CliRunner().invoke(
        main,
        [
            "generate",
            "-t",
            str(demo_paths["target"]),
            "-H",
            str(demo_paths["mtp-single"]),
            "-p",
            "hello",
            "-n",
            "12",
            "--dtype",
            "bfloat16",
            "--compare",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    assert made and made[0].dtype == torch.bfloat16 and made[0].packed
    out = json.loads(r.output[r.output.index('{\n  "speculative"') :])
    assert out["identical"] is True


@pytest.mark.parametrize("kind", ["medusa", "mtp-single", "eagle"])
def test_full_vocabulary_drafter_shares_the_targets_packed_lm_head(demo_paths, kind):
    gen = SpeculativeGenerator(load_spec_model(demo_paths["target"], demo_paths[kind]), dtype=torch.bfloat16)
    assert gen.drafter.draft_vocab is None
    assert gen.drafter.projection is gen.target.lm_head
