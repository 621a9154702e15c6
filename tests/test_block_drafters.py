"""Block drafters (DFlash layout): the runtime's incremental context equals the trainer's one-shot forward,
layer-output ids map to the right target states, the public config is validated with clear errors, and
bfloat16 (packed) decoding stays token-identical to plain greedy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.demo.tiny import make_tiny_llama
from trtspec.drafters import registry
from trtspec.drafters.block_layout import default_layer_ids, mask_token
from trtspec.errors import CheckpointError, UsageError
from trtspec.load import load_spec_model
from trtspec.models.heads import project
from trtspec.models.llama import build_llama, causal_mask
from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator
from trtspec.train.block import block_mask

KIND = "dflash"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("block")
    tdir = make_tiny_llama(root / "target", seed=2, num_hidden_layers=6)
    target = load_hf_causal_lm(tdir)
    heads = registry.get(KIND).make_demo(target, root / KIND)
    return {"root": root, "target_dir": tdir, "target": target, "heads": heads}


def _with_config(src: Path, dst: Path, edit) -> Path:
    """A copy of a drafter directory whose config.json went through ``edit``."""
    dst.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((src / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    (dst / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes())
    return dst


def test_runtime_context_cache_matches_the_training_forward(tiny):
    """Observing a sequence in two chunks and proposing at anchor p gives the logits the trainer computes
    for the same anchor from the whole sequence under its block-sparse mask (with a later anchor in the
    same forward that must not leak into the first)."""
    spec = load_spec_model(tiny["target_dir"], tiny["heads"])
    gen = SpeculativeGenerator(spec)
    drafter, model = gen.drafter, gen.target
    m = drafter.module
    B = m.block_size
    toks = torch.tensor([[7, 3, 19, 44, 5, 61, 2, 8, 30, 12, 9, 77, 40, 41, 3, 6]])
    T = toks.shape[1]
    with torch.no_grad():
        _, aux = model(toks, torch.arange(T)[None], model.new_cache(1, T), causal_mask(T), drafter.aux_layers)
    feats = torch.cat(aux, -1)
    p, q = 9, 13  # two anchors
    drafter.reset(1, 64)
    drafter.observe(None, [feats[0, :4]], [toks[0, :4]], [toks[0, 1:5]])
    drafter.observe(None, [feats[0, 4:p]], [toks[0, 4:p]], [toks[0, 5 : p + 1]])
    runtime = drafter.block_logits(toks[0, p : p + 1])
    anchor = torch.tensor([[p, q]])
    ids = torch.full((1, 2 * B), m.mask_token_id)
    ids[0, 0], ids[0, B] = toks[0, p], toks[0, q]
    pos = anchor.repeat_interleave(B, 1) + torch.arange(B).repeat(2)[None]
    ctx_pos = torch.arange(T)[None]
    with torch.no_grad():
        prefix = m.context_kv(feats, ctx_pos)
        h = m.blocks(
            model.embed_tokens(ids), pos, prefix, block_mask(anchor, ctx_pos, torch.ones(1, T, dtype=torch.bool), B)
        )
    trained = project(h[:, 1:B], model.lm_head.weight).float()
    assert torch.allclose(runtime, trained, atol=1e-4), (runtime - trained).abs().max()
    assert not torch.allclose(runtime, project(h[:, B + 1 :], model.lm_head.weight).float(), atol=1e-2)


def test_layer_output_ids_read_the_right_target_states(tiny):
    """target_layer_ids count layer outputs: id i is the residual stream entering layer i+1, and the last
    layer's id (L-1) is its output before the final norm."""
    target = tiny["target"]
    L = target.arch.num_hidden_layers
    model = build_llama(target.arch, target.tensors)
    toks = torch.tensor([[4, 9, 1, 33, 7]])
    with torch.no_grad():
        final, aux = model(toks, torch.arange(5)[None], model.new_cache(1, 5), causal_mask(5), (L, 0, 3))
    assert torch.allclose(model.norm(aux[0]), final)
    assert torch.equal(aux[1], model.embed_tokens(toks))
    out = _with_config(
        tiny["heads"], tiny["root"] / "last-layer", lambda c: c["dflash_config"].update(target_layer_ids=[-1, 2, L - 1])
    )
    spec = load_spec_model(tiny["target_dir"], out)
    assert registry.get(KIND).build(spec.drafter, model, torch.float32).aux_layers == (0, 3, L)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c["dflash_config"].pop("mask_token_id"), "lacks mask_token_id"),
        (lambda c: c.update(num_target_layers=99), "num_target_layers 99"),
        (lambda c: c["dflash_config"].update(target_layer_ids=[1, 40]), "outside -1..5"),
        (lambda c: c.update(block_size=1), "block_size 1"),
        (lambda c: c["dflash_config"].update(mask_token_id=10**6), "mask_token_id 1000000"),
    ],
)
def test_bad_configs_name_the_file_and_the_problem(tiny, edit, message):
    out = _with_config(tiny["heads"], tiny["root"] / f"bad-{message.split()[0]}", edit)
    with pytest.raises(CheckpointError, match=message) as err:
        load_spec_model(tiny["target_dir"], out)
    assert "config.json" in str(err.value)


def test_fields_inside_the_section_and_the_default_chain_tree(tiny):
    """Qwen3.5-era configs keep block_size inside dflash_config; the default tree is the B-1 chain and a
    deeper tree is refused."""

    def move(c):
        c["dflash_config"]["block_size"] = c.pop("block_size")

    out = _with_config(tiny["heads"], tiny["root"] / "sectioned", move)
    spec = load_spec_model(tiny["target_dir"], out)
    B = spec.drafter.config["block_size"]
    assert spec.tree.choices == tuple((0,) * d for d in range(1, B))
    with pytest.raises(UsageError, match="exceeds"):
        load_spec_model(tiny["target_dir"], out, tree=f"chain:{B}")


def test_bfloat16_packed_decoding_is_token_identical(tiny):
    spec = load_spec_model(tiny["target_dir"], tiny["heads"], tree="[[0],[1],[0,0],[0,0,0]]")
    gen = SpeculativeGenerator(spec, dtype=torch.bfloat16)
    prompts = [[5, 9, 17, 3], [60, 61, 62, 63, 64, 65, 66]]
    plain = gen.generate(prompts, GenerationConfig(max_new_tokens=16, speculative=False))
    spec_run = gen.generate(prompts, GenerationConfig(max_new_tokens=16))
    assert spec_run.tokens == plain.tokens


def test_layer_ids_follow_the_public_spacing_rule():
    assert default_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # the Qwen3-8B drafts' ids
    assert default_layer_ids(30, 1) == [15]
    assert default_layer_ids(4, 3) == [2]


def test_smollm2_mask_token_is_an_unused_special_token(smollm2):
    """SmolLM2 has no spare vocabulary row: the mask is its highest special token that the chat template
    and bos/eos/pad/unk never use."""
    assert mask_token(load_hf_causal_lm(smollm2)) == (16, "<empty_output>")


@pytest.fixture(scope="module")
def spark(tiny) -> Path:
    return registry.get("dspark").make_demo(tiny["target"], tiny["root"] / "dspark")


def test_markov_bias_follows_each_parent(tiny, spark):
    """Depth-2 nodes under different parents take the top-1 of (block logits + Markov bias of their own
    parent), so the block is semi-autoregressive."""
    spec = load_spec_model(tiny["target_dir"], spark, tree="[[0],[1],[0,0],[1,0]]")
    gen = SpeculativeGenerator(spec)
    d = gen.drafter
    prompt = torch.tensor([5, 9, 17, 3, 44])
    with torch.no_grad():
        _, aux = gen.target(
            prompt[None], torch.arange(5)[None], gen.target.new_cache(1, 5), causal_mask(5), d.aux_layers
        )
        d.reset(1, 32)
        d.observe(None, [torch.cat(aux, -1)[0]], [prompt], [prompt])
        root = torch.tensor([7])
        tokens = d.propose(gen.tree, root)
        logits = d.block_logits(root)
        head = d.module.markov_head
        first = (logits[0, 0] + head(root)[0]).topk(2).indices
        assert tokens[0, 1:3].tolist() == first.tolist()
        for node, parent in ((3, 1), (4, 2)):
            expect = (logits[0, 1] + head(tokens[0, parent : parent + 1])[0]).argmax()
            assert int(tokens[0, node]) == int(expect)


@pytest.mark.parametrize(("min_survival", "depth"), [(0.0, 3), (0.999, 1)])
def test_confidence_schedules_how_deep_to_verify(tiny, spark, min_survival, depth):
    """The loop verifies only as deep as the predicted survival allows (all of the chain at threshold 0,
    one draft when no request's chain is that sure), and the output stays plain greedy's."""
    out = _with_config(
        spark, tiny["root"] / f"spark-{min_survival}", lambda c: c.update(trtspec_min_survival=min_survival)
    )
    spec = load_spec_model(tiny["target_dir"], out)
    assert spec.tree.depth == 3
    gen = SpeculativeGenerator(spec)
    prompts = [[5, 9, 17, 3], [60, 61, 62, 63, 64, 65, 66]]
    plain = gen.generate(prompts, GenerationConfig(max_new_tokens=12, speculative=False))
    run = gen.generate(prompts, GenerationConfig(max_new_tokens=12))
    assert run.tokens == plain.tokens
    assert run.metrics.draft_tokens == run.metrics.sequence_steps * depth


def test_each_request_asks_its_own_depth_and_the_batch_verifies_the_deepest(tiny, spark):
    gen = SpeculativeGenerator(load_spec_model(tiny["target_dir"], spark))
    d = gen.drafter
    d.min_survival = 0.5
    d.survival = torch.tensor([[0.9, 0.6, 0.2], [0.4, 0.1, 0.05]])  # request 0: depth 2, request 1: none
    assert d.verify_depth(gen.tree) == 2
    d.survival = torch.tensor([[0.3, 0.1, 0.0], [0.4, 0.1, 0.05]])
    assert d.verify_depth(gen.tree) == 1  # always at least one draft


def test_training_batches_align_with_serving(tiny, tmp_path):
    """The aux side file holds the target's states at the drafter's layers for every cached position, and
    a block batch puts draft i of anchor p on the target's choice for position p+i+1 (a_{p+i}), with
    x_{p+i} as the token before it and the target's top-k there (led by that choice), the context being
    the positions before p only."""
    import numpy as np

    from trtspec.train.aux_cache import aux_features
    from trtspec.train.block import block_batch
    from trtspec.train.cache import HiddenCache, build_cache
    from trtspec.train.trainer import windows

    target = tiny["target"]
    items = [[5, 9, 17, 3], [60, 61, 62, 63, 64], [2, 40, 2]]
    build_cache(target, items, tmp_path / "cache", gen_tokens=10, topk=3, batch_size=2, progress=False)
    cache = HiddenCache(tmp_path / "cache")
    layers = (1, target.arch.num_hidden_layers)
    aux = aux_features(cache, target, layers, progress=False)
    model = build_llama(target.arch, target.tensors)
    si, a, n = cache.sequences[1]
    toks = torch.from_numpy(np.asarray(cache.sequence(1)["tokens"], dtype=np.int64))[None]
    with torch.no_grad():
        _, ref = model(toks, torch.arange(n)[None], model.new_cache(1, n), causal_mask(n), layers)
    got = torch.from_numpy(np.asarray(aux[si][a : a + n], dtype=np.float32))
    assert torch.allclose(got, torch.cat(ref, -1)[0], atol=2e-2)
    wins = windows(cache, 512)
    batch = block_batch(cache, aux, wins, np.array([1]), 4, 4, 95, seed=0, step=0, want_topk=True)
    seq = cache.sequence(wins[1][0])
    plen = cache.prompt_lengths[wins[1][0]]
    for k, p in enumerate(batch["anchor"][0].tolist()):
        if p < 0:
            continue
        assert p >= plen  # anchors lie in the target's reply
        assert int(batch["tokens"][0, 4 * k]) == int(seq["tokens"][p])
        assert (batch["tokens"][0, 4 * k + 1 : 4 * k + 4] == 95).all()
        for i in range(4):
            lab = int(batch["labels"][0, k, i])
            assert lab == (int(seq["argmax"][p + i]) if p + i < len(seq["tokens"]) else -1)
            if lab >= 0:
                assert int(batch["prev"][0, k, i]) == int(seq["tokens"][p + i])
                assert batch["topk_ids"][0, k, i].tolist() == seq["topk_ids"][p + i].tolist()
                assert int(batch["topk_ids"][0, k, i, 0]) == lab
            else:
                assert (batch["topk_logits"][0, k, i] <= -1e4).all()  # padding carries no weight


def test_cli_trains_a_block_drafter_with_and_without_soft_labels(tmp_path):
    from click.testing import CliRunner

    from trtspec.cli import main
    from trtspec.demo.tokenizer import write_char_tokenizer
    from trtspec.drafters.block_layout import train_aux_layers
    from trtspec.train.cache import HiddenCache

    tdir = make_tiny_llama(tmp_path / "target", seed=0, vocab_size=128, num_hidden_layers=3)
    write_char_tokenizer(tdir, 128)
    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(json.dumps({"messages": [{"role": "user", "content": f"hi {i}"}]}) + "\n" for i in range(8))
    )
    args = ["train-heads", "-t", str(tdir), "-k", KIND, "-d", str(data), "--gen-tokens", "12", "--steps", "3"]
    r = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "h"), "--num-heads", "5", "--batch-tokens", "64"])
    assert r.exit_code == 0, r.output
    spec = load_spec_model(tdir, tmp_path / "h")
    assert spec.drafter.kind == KIND and spec.drafter.config["block_size"] == 6 and spec.tree.depth == 5
    recorded = HiddenCache(tmp_path / "h.cache")  # the context layers came with the replies: no second pass
    assert recorded.aux_layers == train_aux_layers(load_hf_causal_lm(tdir))
    assert not list((tmp_path / "h.cache").glob("aux-*"))
    soft = [*args, "--num-heads", "5", "--batch-tokens", "64", "--topk", "4", "--soft-weight", "0.3"]
    r = CliRunner().invoke(main, [*soft, "-o", str(tmp_path / "s"), "--cache", str(tmp_path / "sc")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, [*soft, "-o", str(tmp_path / "n"), "--cache", str(tmp_path / "nc"), "--topk", "0"])
    assert r.exit_code == 2 and "error:" in r.output and "--topk" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "n").exists()


def test_block_training_resumes_bit_identically(tiny, tmp_path):
    """Anchors are drawn from (seed, step): an interrupted run resumed from its checkpoint sees the same
    batches and ends with the same weights as an uninterrupted one."""
    from trtspec.train.cache import HiddenCache, build_cache
    from trtspec.train.trainer import TrainConfig, train

    target = tiny["target"]
    items = [[5, 9, 17, 3], [60, 61, 62, 63, 64], [2, 40, 2], [7, 7, 8]]
    build_cache(target, items, tmp_path / "cache", gen_tokens=12, batch_size=2, progress=False)
    cache = HiddenCache(tmp_path / "cache")

    def cfg() -> TrainConfig:
        return TrainConfig(kind=KIND, num_heads=3, steps=6, batch_tokens=64, lm_dtype="float32", ckpt_every=0)

    full, r_full = train(target, cache, cfg(), progress=False)
    train(target, cache, cfg(), ckpt_dir=tmp_path / "ck", progress=False, stop_after=3)
    resumed, r_res = train(target, cache, cfg(), ckpt_dir=tmp_path / "ck", resume=True, progress=False)
    assert r_res.losses == r_full.losses
    for (n, a), (_, b) in zip(full.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), n


def test_dspark_saves_for_a_tied_embedding_target(tmp_path):
    """DeepSpec's layout carries copies of the embedding and lm_head; a tied target (SmolLM2) shares one
    tensor for both, and the writer must still give each its own storage."""
    from trtspec.train.heads import make_module, save_heads

    tdir = make_tiny_llama(tmp_path / "target", seed=1, num_hidden_layers=3, tie_word_embeddings=True)
    target = load_hf_causal_lm(tdir)
    out = save_heads("dspark", make_module("dspark", target, 3), target, tmp_path / "spark", {})
    assert load_spec_model(tdir, out).drafter.kind == "dspark"


def test_the_cache_records_the_context_layers_while_the_target_writes(tiny, tmp_path):
    """A cache asked for the context layers records them during generation: the same states as the side
    file's teacher-forced pass over the finished replies, read straight from the cache (no side file),
    also as a column range of more layers or picked in another order; a cache without them is reused only
    where they are optional."""
    import numpy as np

    from trtspec.errors import UsageError
    from trtspec.train.aux_cache import aux_dir, layer_states
    from trtspec.train.cache import HiddenCache, build_cache

    target = tiny["target"]
    L = target.arch.num_hidden_layers
    items = [[5, 9, 17, 3], [60, 61, 62, 63, 64], [2, 40, 2]]
    layers, H = (1, 3, L), target.arch.hidden_size
    build_cache(target, items, tmp_path / "plain", gen_tokens=10, batch_size=2, progress=False)
    build_cache(target, items, tmp_path / "rec", gen_tokens=10, batch_size=2, progress=False, aux_layers=(0, *layers))
    plain, rec = HiddenCache(tmp_path / "plain"), HiddenCache(tmp_path / "rec")
    assert [list(s.tokens) for s in plain.shards] == [list(s.tokens) for s in rec.shards]
    side = layer_states(plain, target, layers, progress=False)
    own = layer_states(rec, target, layers, progress=False)
    assert aux_dir(plain, layers).is_dir() and not aux_dir(rec, layers).exists()
    for a, b in zip(side, own):
        assert a.shape == b.shape
        assert np.allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=2e-2)
    reordered = layer_states(rec, target, (3, 1), progress=False)  # not a column range: picked, not aside
    assert not aux_dir(rec, (3, 1)).exists() and reordered[0].shape == (len(rec.shards[0].tokens), 2 * H)
    assert np.allclose(
        np.asarray(reordered[0][:], np.float32)[:, :H], np.asarray(own[0][:, H : 2 * H], np.float32), atol=2e-2
    )
    with pytest.raises(UsageError, match="layer inputs"):
        build_cache(target, items, tmp_path / "plain", gen_tokens=10, batch_size=2, progress=False, aux_layers=layers)
    build_cache(
        target,
        items,
        tmp_path / "plain",
        gen_tokens=10,
        batch_size=2,
        progress=False,
        aux_layers=layers,
        aux_optional=True,
    )


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_soft_labels_mix_the_targets_top_k_into_the_block_loss(tiny, tmp_path, kind):
    """The block loss is linear in its target weights: at soft weight w it is (1 - w) x the hard-label
    loss + w x the loss against the target's cached top-k alone, with or without a Markov head; at w = 0
    a batch carrying top-k trains exactly as one without."""
    import numpy as np

    from trtspec.train.aux_cache import aux_features
    from trtspec.train.block import BlockLoss, block_batch
    from trtspec.train.cache import HiddenCache, build_cache
    from trtspec.train.heads import make_module
    from trtspec.train.trainer import shared_weights, windows

    target = tiny["target"]
    items = [[5, 9, 17, 3], [60, 61, 62, 63, 64], [2, 40, 2]]
    build_cache(target, items, tmp_path / "cache", gen_tokens=12, topk=4, batch_size=2, progress=False)
    cache = HiddenCache(tmp_path / "cache")
    module = make_module(kind, target, num_heads=3)
    aux = aux_features(cache, target, module.aux_layers, progress=False)
    wins = windows(cache, 512)
    ids = np.arange(len(wins))
    args = (cache, aux, wins, ids, module.block_size, module.num_drafts, module.mask_token_id, 0, 0)
    plain, soft = block_batch(*args), block_batch(*args, want_topk=True)
    embed, lm = shared_weights(target, torch.float32)

    def loss(batch: dict, w: float) -> torch.Tensor:
        with torch.no_grad():
            return BlockLoss(module, embed, lm, 0.8, confidence_weight=0.0, soft_weight=w)(batch)[1].sum()

    hard, only_topk, mixed = loss(soft, 0.0), loss(soft, 1.0), loss(soft, 0.3)
    assert torch.allclose(hard, loss(plain, 0.0))
    assert not torch.allclose(hard, only_topk)
    assert torch.allclose(mixed, 0.7 * hard + 0.3 * only_topk, rtol=1e-4)


def test_markov_bias_over_some_rows_is_those_rows_of_the_full_bias():
    """The training loss over a draft vocabulary asks the Markov head for those rows only (the full [N, V]
    bias was most of a DSpark step); the rows must be exactly the full bias's, gradients included."""
    from trtspec.models.block_draft import MarkovHead

    torch.manual_seed(0)
    head = MarkovHead(vocab=300, rank=8)
    prev = torch.randint(0, 300, (17,))
    rows = torch.tensor([5, 0, 299, 42, 7])
    full = head(prev)
    some = head(prev, rows)
    torch.testing.assert_close(some, full[:, rows])
    (g_full,) = torch.autograd.grad(full[:, rows].square().sum(), head.markov_w2.weight)
    (g_some,) = torch.autograd.grad(some.square().sum(), head.markov_w2.weight)
    torch.testing.assert_close(g_some, g_full)
    assert g_some[rows].abs().sum() > 0 and g_some[1:5].abs().sum() == 0


def test_dspark_over_a_draft_vocabulary(tiny, spark, tmp_path):
    """With a draft vocabulary the Markov bias is taken over its rows only: a complete vocabulary in
    another order proposes exactly what the full one does, and a subset proposes only its own tokens
    while the output stays token-identical to greedy."""
    import shutil

    from trtspec.checkpoint.heads.draft_vocab import save_draft_vocab

    V = tiny["target"].arch.vocab_size
    prompts = [[5, 9, 17, 3, 44], [8, 2, 30]]
    tree = "[[0],[1],[0,0],[1,0],[0,0,0]]"

    def proposals(heads):
        gen = SpeculativeGenerator(load_spec_model(tiny["target_dir"], heads, tree=tree))
        seen, real = [], gen.drafter.propose

        def propose(t, root, rows=None):
            out = real(t, root, rows)
            seen.append(out[:, 1:].clone())
            return out

        gen.drafter.propose = propose
        res = gen.generate(prompts, GenerationConfig(max_new_tokens=16))
        plain = gen.generate(prompts, GenerationConfig(max_new_tokens=16, speculative=False))
        assert res.tokens == plain.tokens
        return torch.cat([s.flatten() for s in seen])

    from safetensors.torch import load_file, save_file

    strong = tmp_path / "strong"  # the demo's Markov bias is too weak to move a top-1: make it count
    shutil.copytree(spark, strong)
    weights = load_file(strong / "model.safetensors")
    weights["markov_head.markov_w1.weight"] *= 40.0
    save_file(weights, strong / "model.safetensors")
    full = proposals(strong)
    permuted = tmp_path / "permuted"
    shutil.copytree(strong, permuted)
    save_draft_vocab(permuted, torch.randperm(V, generator=torch.Generator().manual_seed(3)))
    assert torch.equal(proposals(permuted), full)
    subset_dir = tmp_path / "subset"
    shutil.copytree(strong, subset_dir)
    subset = torch.randperm(V, generator=torch.Generator().manual_seed(4))[: V // 4]
    save_draft_vocab(subset_dir, subset)
    assert torch.isin(proposals(subset_dir), subset).all()


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_draft_layers_sets_a_block_drafters_depth_and_init_from_keeps_it(tmp_path, kind):
    """--draft-layers 3 trains a three-layer drafter that the public loader reads back as three layers and
    that decodes token-identical to greedy; --init-from those heads goes on at their depth; a kind of fixed
    depth refuses the option before any caching."""
    from click.testing import CliRunner
    from safetensors import safe_open

    from trtspec.cli import main
    from trtspec.demo.tokenizer import write_char_tokenizer

    tdir = make_tiny_llama(tmp_path / "target", seed=0, vocab_size=128, num_hidden_layers=3)
    write_char_tokenizer(tdir, 128)
    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(json.dumps({"messages": [{"role": "user", "content": f"hi {i}"}]}) + "\n" for i in range(8))
    )
    base = ["train-heads", "-t", str(tdir), "-d", str(data), "--gen-tokens", "12", "--batch-tokens", "64"]
    args = [*base, "-k", kind, "--num-heads", "4", "--steps", "2", "--cache", str(tmp_path / "c")]
    r = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "h3"), "--draft-layers", "3"])
    assert r.exit_code == 0, r.output
    cfg = json.loads((tmp_path / "h3" / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 3
    with safe_open(str(tmp_path / "h3" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert any(n.startswith("layers.2.") for n in names) and not any(n.startswith("layers.3.") for n in names)
    spec = load_spec_model(tdir, tmp_path / "h3")
    assert spec.drafter.arch.num_hidden_layers == 3
    gen = SpeculativeGenerator(spec, dtype=torch.float32)
    prompts = [[5, 9, 17, 3], [60, 61, 62, 63, 64, 65, 66]]
    plain = gen.generate(prompts, GenerationConfig(max_new_tokens=16, speculative=False))
    assert gen.generate(prompts, GenerationConfig(max_new_tokens=16)).tokens == plain.tokens

    r = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "more"), "--init-from", str(tmp_path / "h3")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "more" / "config.json").read_text())["num_hidden_layers"] == 3

    r = CliRunner().invoke(main, [*base, "-k", "eagle", "-o", str(tmp_path / "e"), "--draft-layers", "3"])
    assert r.exit_code == 2 and "error:" in r.output and "dflash" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "e").exists() and not (tmp_path / "e.cache").exists()
