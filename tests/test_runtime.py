"""The reference runtime: our Llama matches transformers; speculative greedy == plain greedy for every
drafter kind, chain and tree, batch 1 and 4; KV bookkeeping proven by a perfect self-drafter."""

import pytest
import torch

from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.demo.tiny import make_tiny_llama
from trtspec.load import load_spec_model
from trtspec.models.llama import build_llama, causal_mask
from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator

KINDS = ["draft-model", "medusa", "mtp-linear", "mtp-single", "eagle", "eagle3"]
PROMPTS = [[1, 40, 50, 60, 70], [1, 7], [5, 6, 7, 8, 9, 10, 11, 12], [3]]


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
def test_llama_forward_matches_transformers(tmp_path, model_type):
    import transformers

    d = make_tiny_llama(
        tmp_path / model_type, model_type=model_type, max_shard_size="40KB", tie_word_embeddings=model_type == "qwen2"
    )
    target = load_hf_causal_lm(d)
    model = build_llama(target.arch, target.tensors)
    hf = transformers.AutoModelForCausalLM.from_pretrained(d).eval()
    ids = torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids).logits
        cache = model.new_cache(2, 4)  # too small on purpose: forward grows it
        pos = torch.arange(10)[None].expand(2, -1)
        h1, _ = model(ids[:, :6], pos[:, :6], cache, causal_mask(6))
        cache.commit([torch.arange(6)] * 2)
        h2, _ = model(ids[:, 6:], pos[:, 6:], cache, causal_mask(4))
    out = torch.cat([model.logits(h1), model.logits(h2)], 1)
    assert torch.allclose(out, ref, atol=1e-4), (out - ref).abs().max()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tree", ["chain:3", None])
@pytest.mark.parametrize("batch", [1, 4])
def test_speculative_greedy_equals_plain(demo_paths, kind, tree, batch):
    spec = load_spec_model(demo_paths["target"], demo_paths[kind], tree=tree)
    gen = SpeculativeGenerator(spec)
    prompts = PROMPTS[:batch]
    plain = gen.generate(prompts, GenerationConfig(max_new_tokens=24, speculative=False))
    res = gen.generate(prompts, GenerationConfig(max_new_tokens=24))
    assert res.tokens == plain.tokens
    assert all(len(t) == 24 for t in res.tokens)
    m = res.metrics
    assert m.target_steps <= plain.metrics.target_steps
    assert 1.0 <= m.mean_acceptance_length <= spec.tree.depth + 1
    assert sum(m.acceptance_histogram) == m.sequence_steps


@pytest.mark.parametrize("tree,expected", [("chain:3", 4.0), ("[[0],[1],[0,0],[0,0,0],[0,0,0,0]]", 5.0)])
def test_self_drafting_accepts_everything(demo_paths, tree, expected):
    """The target as its own draft model must get every draft accepted: proves positions, masks, KV
    commit/rewind and the drafter's cache sync, for batch 2 with different prompt lengths."""
    spec = load_spec_model(demo_paths["target"], demo_paths["target"], heads_format="draft-model", tree=tree)
    gen = SpeculativeGenerator(spec)
    res = gen.generate(PROMPTS[:2], GenerationConfig(max_new_tokens=1 + 4 * int(expected)))
    assert res.metrics.mean_acceptance_length == expected
    assert res.metrics.per_position_acceptance == [1.0] * (int(expected) - 1)
    plain = gen.generate(PROMPTS[:2], GenerationConfig(max_new_tokens=1 + 4 * int(expected), speculative=False))
    assert res.tokens == plain.tokens


def test_eos_stops_each_sequence(demo_paths):
    spec = load_spec_model(demo_paths["target"], demo_paths["medusa"])
    gen = SpeculativeGenerator(spec)
    plain = gen.generate(PROMPTS, GenerationConfig(max_new_tokens=30, speculative=False)).tokens
    eos = plain[0][5]
    res = gen.generate(PROMPTS, GenerationConfig(max_new_tokens=30, eos_token_id=eos)).tokens
    for p, r in zip(plain, res):
        cut = p.index(eos) + 1 if eos in p else len(p)
        assert r == p[:cut]


def test_streaming_yields_committed_chunks(demo_paths):
    spec = load_spec_model(demo_paths["target"], demo_paths["draft-model"])
    gen = SpeculativeGenerator(spec)
    chunks = list(gen.stream(PROMPTS[0], GenerationConfig(max_new_tokens=20)))
    steps = sum(s.metrics.target_steps for s in gen.stream_batch([PROMPTS[0]], GenerationConfig(max_new_tokens=20)))
    flat = [t for c in chunks for t in c]
    assert flat == gen.generate([PROMPTS[0]], GenerationConfig(max_new_tokens=20, speculative=False)).tokens[0]
    assert len(chunks) == steps + 1  # prefill token + one chunk per step


def test_sampling_end_to_end_matches_plain_distribution(tmp_path):
    """Speculative sampling through the whole loop: the second token's marginal matches plain sampling's
    exact distribution (computed by enumeration on a 12-token vocab)."""
    d = make_tiny_llama(tmp_path / "t", vocab_size=12, num_hidden_layers=2, seed=3)
    draft = make_tiny_llama(tmp_path / "d", vocab_size=12, num_hidden_layers=1, seed=4)
    spec = load_spec_model(d, draft, tree="[[0],[1],[0,0]]")
    gen = SpeculativeGenerator(spec)
    prompt = [1, 5, 7]
    cfg = GenerationConfig(max_new_tokens=2, temperature=1.0)
    with torch.no_grad():
        m = gen.target

        def dist(ids):
            c = m.new_cache(1, 8)
            h, _ = m(torch.tensor([ids]), torch.arange(len(ids))[None], c, causal_mask(len(ids)))
            return torch.softmax(m.logits(h[0, -1]), -1)

        p1 = dist(prompt)
        exact2 = sum(p1[a] * dist(prompt + [a]) for a in range(12))
    n = 1500
    counts = torch.zeros(12)
    for s in range(n):
        toks = gen.generate([prompt], GenerationConfig(**{**cfg.__dict__, "seed": s})).tokens[0]
        counts[toks[1]] += 1
    tv = 0.5 * (counts / n - exact2).abs().sum()
    assert tv < 0.06, f"total variation {tv:.3f}"


def test_smollm2_real_model(smollm2, tmp_path):
    """The real SmolLM2-135M: our forward matches transformers, and a truncated-layer draft model gives
    token-identical greedy output."""
    import transformers

    from trtspec.checkpoint.truncate import write_truncated_draft

    target = load_hf_causal_lm(smollm2)
    draft = write_truncated_draft(target, 6, tmp_path / "draft")
    spec = load_spec_model(smollm2, draft, tree="chain:3")
    gen = SpeculativeGenerator(spec)
    tok = transformers.AutoTokenizer.from_pretrained(smollm2)
    ids = tok("The capital of France is")["input_ids"]
    with torch.no_grad():
        ref = transformers.AutoModelForCausalLM.from_pretrained(smollm2)(torch.tensor([ids])).logits[0, -1]
        c = gen.target.new_cache(1, 16)
        h, _ = gen.target(torch.tensor([ids]), torch.arange(len(ids))[None], c, causal_mask(len(ids)))
    assert torch.allclose(gen.target.logits(h[0, -1]), ref, atol=1e-3)
    plain = gen.generate([ids], GenerationConfig(max_new_tokens=24, speculative=False))
    res = gen.generate([ids], GenerationConfig(max_new_tokens=24))
    assert res.tokens == plain.tokens
    assert "Paris" in tok.decode(res.tokens[0])
    assert res.metrics.target_steps < plain.metrics.target_steps
