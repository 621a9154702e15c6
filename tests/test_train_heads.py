"""train-heads on a tiny random target: loss goes down, heads load and decode exactly like plain greedy,
resume is bit-identical, the cache is aligned with the runtime and resumes after an interruption."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.cli import main
from trtspec.demo.tiny import make_tiny_llama
from trtspec.demo.tokenizer import write_char_tokenizer
from trtspec.drafters import registry
from trtspec.errors import UsageError
from trtspec.load import load_spec_model
from trtspec.models.llama import build_llama, causal_mask
from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator
from trtspec.train import cache as cache_mod
from trtspec.train.cache import HiddenCache, build_cache
from trtspec.train.heads import save_heads
from trtspec.train.trainer import TrainConfig, draft_label_vocab, train

VOCAB = 128


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    tdir = make_tiny_llama(root / "target", seed=0, vocab_size=VOCAB, num_hidden_layers=2)
    write_char_tokenizer(tdir, VOCAB)
    target = load_hf_causal_lm(tdir)
    rng = random.Random(0)
    items = [[rng.randrange(3, VOCAB) for _ in range(rng.randrange(3, 10))] for _ in range(40)]
    build_cache(
        target,
        items,
        root / "cache",
        gen_tokens=24,
        topk=4,
        batch_size=8,
        shard_tokens=300,
        progress=False,
        aux_layers=aux_layers_of_trainable_kinds(target),
    )
    return {"root": root, "dir": tdir, "target": target, "items": items, "cache": HiddenCache(root / "cache")}


def aux_layers_of_trainable_kinds(target) -> tuple[int, ...]:
    """Every target layer some trainable kind reads (one cache then serves every kind)."""
    recipes = [registry.get(k).training for k in registry.trainable()]
    return tuple(sorted({i for r in recipes if r.aux_layers is not None for i in r.aux_layers(target)}))


def _cfg(kind: str, **kw) -> TrainConfig:
    base = dict(kind=kind, steps=30, batch_tokens=256, lr=3e-3, lm_dtype="float32", warmup=5, ckpt_every=0)
    base.update(kw)
    return TrainConfig(**base)


def test_cache_labels_are_the_targets_greedy_choices(tiny):
    """generate mode: each cached sequence is prompt + the target's greedy reply, its hidden states are the
    target's (batched) forward, and past the prompt argmax[q] is the token that follows q."""
    cache, target, items = tiny["cache"], tiny["target"], tiny["items"]
    model = build_llama(target.arch, target.tensors)
    order = sorted(range(len(items)), key=lambda i: (len(items[i]), i))
    gen = SpeculativeGenerator(load_spec_model(tiny["dir"]))
    for j in (0, 7, 21):
        seq = cache.sequence(j)
        prompt = items[order[j]]
        toks = np.asarray(seq["tokens"])
        assert toks[: len(prompt)].tolist() == prompt
        P = len(prompt)
        assert np.array_equal(np.asarray(seq["argmax"])[P - 1 : -1], toks[P:])
        ref = gen.generate([prompt], GenerationConfig(max_new_tokens=24, speculative=False)).tokens[0]
        assert toks[len(prompt) :].tolist() + [int(seq["argmax"][-1])] == ref[: len(toks) - len(prompt) + 1]
        with torch.no_grad():
            c = model.new_cache(1, len(toks))
            h, _ = model(torch.tensor(toks)[None], torch.arange(len(toks))[None], c, causal_mask(len(toks)))
        assert torch.allclose(torch.from_numpy(np.asarray(seq["hidden"], dtype=np.float32)), h[0], atol=2e-2)


@pytest.mark.parametrize("kind", registry.trainable())
def test_training_lowers_loss_and_heads_decode_like_greedy(tiny, kind):
    module, res = train(tiny["target"], tiny["cache"], _cfg(kind), progress=False)
    assert res.steps == 30
    first, last = np.mean(res.losses[:3]), np.mean(res.losses[-3:])
    assert last < first - 0.2, (first, last)
    out = save_heads(kind, module, tiny["target"], tiny["root"] / f"heads-{kind}", {"loss": res.final_loss})
    spec = load_spec_model(tiny["dir"], out, tree=[[0], [0, 0], [1], [0, 1]])
    assert spec.drafter.kind == kind
    gen = SpeculativeGenerator(spec)
    prompts = tiny["items"][:4]
    spec_out = gen.generate(prompts, GenerationConfig(max_new_tokens=20))
    plain = gen.generate(prompts, GenerationConfig(max_new_tokens=20, speculative=False))
    assert spec_out.tokens == plain.tokens
    assert spec_out.metrics.mean_acceptance_length > 1.0  # trained on these very prompts


def test_resume_is_identical_to_an_uninterrupted_run(tiny, tmp_path):
    for kind in ("mtp-linear", "mtp-single"):
        cfg = _cfg(kind, steps=8, soft_weight=0.3)
        full, r_full = train(tiny["target"], tiny["cache"], cfg, progress=False)
        ck = tmp_path / kind
        _, r_half = train(
            tiny["target"],
            tiny["cache"],
            _cfg(kind, steps=8, soft_weight=0.3),
            ckpt_dir=ck,
            progress=False,
            stop_after=3,
        )
        assert r_half.steps == 3 and (ck / "checkpoint.pt").is_file()
        resumed, r_res = train(
            tiny["target"],
            tiny["cache"],
            _cfg(kind, steps=8, soft_weight=0.3),
            ckpt_dir=ck,
            resume=True,
            progress=False,
        )
        assert r_res.steps == 8
        assert r_res.losses == r_full.losses
        for (n, a), (_, b) in zip(full.state_dict().items(), resumed.state_dict().items()):
            assert torch.equal(a, b), n


def test_resume_with_other_options_is_refused(tiny, tmp_path):
    train(tiny["target"], tiny["cache"], _cfg("medusa", steps=4), ckpt_dir=tmp_path, progress=False, stop_after=2)
    with pytest.raises(Exception, match="other options"):
        train(
            tiny["target"],
            tiny["cache"],
            _cfg("medusa", steps=4, lr=1e-2),
            ckpt_dir=tmp_path,
            resume=True,
            progress=False,
        )


def test_cache_resumes_after_an_interruption(tiny, tmp_path, monkeypatch):
    items = tiny["items"][:20]
    ref = build_cache(
        tiny["target"], items, tmp_path / "ref", gen_tokens=8, batch_size=4, shard_tokens=40, progress=False
    )
    real, calls = cache_mod.run_items, {"n": 0}

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:  # one call per pool of POOL_BATCHES batches: the first pool's shard is written
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(cache_mod, "run_items", flaky)
    with pytest.raises(KeyboardInterrupt):
        build_cache(tiny["target"], items, tmp_path / "c", gen_tokens=8, batch_size=4, shard_tokens=40, progress=False)
    part = next((tmp_path / "c").glob("part-*"))
    assert not json.loads((part / "meta.json").read_text())["complete"]
    with pytest.raises(Exception, match="incomplete"):
        HiddenCache(tmp_path / "c")
    build_cache(tiny["target"], items, tmp_path / "c", gen_tokens=8, batch_size=4, shard_tokens=40, progress=False)
    a, b = HiddenCache(ref), HiddenCache(tmp_path / "c")
    assert len(a.sequences) == len(b.sequences) == 20
    for i in range(20):
        for key in ("tokens", "argmax", "hidden"):
            assert np.array_equal(a.sequence(i)[key], b.sequence(i)[key])
    with pytest.raises(Exception, match="other data"):
        build_cache(tiny["target"], items[:5], tmp_path / "c", gen_tokens=8, batch_size=4, progress=False)


def test_unrolled_training_forward_matches_the_runtime_drafter(tiny):
    """Step 0 / step 1 logits of the trainer's unrolled forward = the runtime drafter's depth-1 / depth-2."""
    from trtspec.train.unroll import unrolled
    from trtspec.tree import build_tree

    out = tiny["root"] / "heads-mtp-single"
    if not out.exists():
        module, _ = train(tiny["target"], tiny["cache"], _cfg("mtp-single", steps=5), progress=False)
        save_heads("mtp-single", module, tiny["target"], out)
    gen = SpeculativeGenerator(load_spec_model(tiny["dir"], out, tree="chain:2"))
    d = gen.drafter
    seq = tiny["cache"].sequence(5)
    toks = torch.tensor(np.asarray(seq["tokens"]), dtype=torch.long)
    h = torch.from_numpy(np.asarray(seq["hidden"], dtype=np.float32))
    n = len(toks)
    with torch.no_grad():
        step0 = unrolled(
            d.module,
            d.embed.weight,
            d.lm_head,
            h[None, : n - 1],
            [toks[None, 1:]],
            torch.zeros(1, dtype=torch.long),
            torch.ones(1, n - 1, dtype=torch.bool),
        )[0][1][0]
        first = step0.argmax(-1)
        res = unrolled(
            d.module,
            d.embed.weight,
            d.lm_head,
            h[None, : n - 1],
            [toks[None, 1:], first[None]],
            torch.zeros(1, dtype=torch.long),
            torch.ones(1, n - 1, dtype=torch.bool),
        )
        q = n - 3
        d.reset(1, n + 8)
        d.observe([h[: q + 1]], None, [toks[: q + 1]], [toks[1 : q + 2]])
        assert torch.allclose(d.last_logits[0], step0[q], atol=1e-4)
        drafts = d.propose(build_tree(((0,), (0, 0))), toks[q + 1 : q + 2])
    assert int(drafts[0, 1]) == int(first[q])
    assert int(drafts[0, 2]) == int(res[1][1][0, q].argmax())


# CLI ---------------------------------------------------------------------------------------------------


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_cli_train_heads_writes_loadable_heads(tiny, tmp_path):
    data = _jsonl(
        tmp_path / "d.jsonl",
        [{"messages": [{"role": "user", "content": f"hello number {i}"}]} for i in range(12)]
        + [{"text": "a plain text sample"}],
    )
    out = tmp_path / "heads"
    r = CliRunner().invoke(
        main,
        [
            "train-heads",
            "-t",
            str(tiny["dir"]),
            "-k",
            "mtp-linear",
            "-d",
            str(data),
            "-o",
            str(out),
            "--steps",
            "6",
            "--gen-tokens",
            "12",
            "--batch-tokens",
            "128",
            "--lm-dtype",
            "float32",
            "--no-rmsnorm",
            "--draft-vocab",
            "20",
        ],
    )
    assert r.exit_code == 0, r.output
    meta = json.loads((out / "trtspec_heads.json").read_text())
    assert meta["has_rmsnorm"] is False and meta["target"]["fingerprint"] == tiny["target"].fingerprint
    assert (tmp_path / "heads.cache").is_dir() and (tmp_path / "heads.train" / "checkpoint.pt").is_file()
    spec = load_spec_model(tiny["dir"], out)
    assert spec.drafter.kind == "mtp-linear" and "heads.0.norm.weight" not in spec.drafter.tensors
    assert "covering" in r.output and 0 < spec.drafter.draft_vocab.numel() <= 20
    # --draft-vocab without --label-vocab: the loss's softmax is over exactly the tokens the runtime drafts over
    assert "label vocab: the 20 draft-vocabulary tokens" in r.output
    trained_over = draft_label_vocab(HiddenCache(tmp_path / "heads.cache"), tiny["target"], 20)
    assert sorted(spec.drafter.draft_vocab.tolist()) == trained_over.tolist()


def test_cli_label_vocab_draft_without_a_draft_vocab_is_refused(tiny, tmp_path):
    args = ["train-heads", "-t", str(tiny["dir"]), "-k", "mtp-single", "-d", "chat:4", "-o", str(tmp_path / "h")]
    r = CliRunner().invoke(main, args + ["--label-vocab", "draft", "--steps", "1"])
    assert r.exit_code == 2, r.output
    assert "error: --label-vocab draft needs --draft-vocab N" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "h").exists() and not (tmp_path / "h.cache").exists()


@pytest.mark.parametrize(
    "content, distill, message",
    [
        ("", "generate", "empty"),
        ('{"text": "ok"}\n{not json}\n', "generate", "line 2 is not valid JSON"),
        ('{"prompt": "x"}\n', "generate", "none of 'text', 'messages'"),
        ('{"text": "ab"}\n{"text": "c"}\n', "teacher", "too short for the heads' horizon"),
    ],
)
def test_cli_bad_data_gives_a_clear_error(tiny, tmp_path, content, distill, message):
    data = tmp_path / "bad.jsonl"
    data.write_text(content)
    r = CliRunner().invoke(
        main,
        [
            "train-heads",
            "-t",
            str(tiny["dir"]),
            "-k",
            "medusa",
            "-d",
            str(data),
            "-o",
            str(tmp_path / "h"),
            "--distill",
            distill,
            "--no-chat",
            "--steps",
            "1",
        ],
    )
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output
    assert not (tmp_path / "h").exists()


def test_torchrun_trains_with_ddp(tiny, tmp_path):
    """The same command under torchrun (2 CPU ranks, gloo): per-rank cache parts, DDP, heads written once."""
    import os
    import subprocess
    import sys

    data = _jsonl(tmp_path / "d.jsonl", [{"text": f"sample {i} hello"} for i in range(8)])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "-m",
        "trtspec.cli",
        "train-heads",
        "-t",
        str(tiny["dir"]),
        "-k",
        "medusa",
        "-d",
        str(data),
        "-o",
        str(tmp_path / "h"),
        "--steps",
        "4",
        "--gen-tokens",
        "8",
        "--batch-tokens",
        "64",
        "--lm-dtype",
        "float32",
        "--no-chat",
    ]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "h.cache").iterdir()) == ["part-0-of-2", "part-1-of-2"]
    assert load_spec_model(tiny["dir"], tmp_path / "h").drafter.kind == "medusa"


def test_label_vocab_subset_and_generated_only_training(tiny):
    """The CPU speed path: softmax over the tokens the target used (remapped labels) still learns, and
    generated-only training sees fewer positions than training on everything."""
    from trtspec.train.trainer import _Positions, cache_vocab

    vocab = cache_vocab(tiny["cache"])
    labels = np.unique(np.concatenate([np.asarray(sh.argmax) for sh in tiny["cache"].shards]))
    assert set(labels.tolist()) <= set(vocab.tolist()) and len(vocab) <= VOCAB
    module, res = train(
        tiny["target"], tiny["cache"], _cfg("mtp-linear", label_vocab="cache", soft_weight=0.3), progress=False
    )
    assert np.mean(res.losses[-3:]) < np.mean(res.losses[:3]) - 0.2
    assert len(_Positions(tiny["cache"], True)) < len(_Positions(tiny["cache"], False))


def test_draft_label_vocab_trains_over_the_most_frequent_choices_only(tiny):
    """--label-vocab draft: the softmax covers the N tokens the target chose most often; labels outside
    them are ignored (they could never be drafted) and the heads still learn what is inside."""
    from trtspec.train.draft_vocab import target_choice_counts

    cache, target = tiny["cache"], tiny["target"]
    vocab = draft_label_vocab(cache, target, 16)
    counts = target_choice_counts(cache, VOCAB)
    assert len(vocab) == 16 and np.all(np.diff(vocab) > 0)
    outside = np.setdiff1d(np.arange(VOCAB), vocab)
    assert counts[vocab].min() >= counts[outside].max()  # the most frequent choices, ties aside
    with pytest.raises(Exception, match="needs --draft-vocab"):
        _cfg("mtp-single", label_vocab="draft").check()
    module, res = train(target, cache, _cfg("mtp-single", label_vocab="draft", draft_vocab=16), progress=False)
    assert np.mean(res.losses[-3:]) < np.mean(res.losses[:3]) - 0.2


def test_teacher_mode_learns_only_the_assistant_turns_of_chat_data(tiny, tmp_path):
    """Teacher-forced chat data: the loss mask, found with the tokenizer's chat template, covers exactly the
    assistant turns; the trainer's positions and the draft-vocabulary counts predict only those tokens."""
    from trtspec.load import load_tokenizer
    from trtspec.train.data import Sample, encode_text_with_mask
    from trtspec.train.draft_vocab import target_choice_counts
    from trtspec.train.trainer import _Positions

    tok = load_tokenizer(tiny["target"])
    turns = (("user", "hi there"), ("assistant", "hello!"), ("user", "how are you"), ("assistant", "fine."))
    ids, mask = encode_text_with_mask(tok, Sample(messages=turns))
    assert tok.decode([t for t, m in zip(ids, mask) if m]) == "hello!\nfine.\n"
    plain_ids, plain_mask = encode_text_with_mask(tok, Sample(text="just text"))
    assert all(plain_mask) and len(plain_ids) == len(plain_mask)
    build_cache(tiny["target"], [ids], tmp_path / "c", mode="teacher", loss_masks=[mask], progress=False)
    cache = HiddenCache(tmp_path / "c")
    predicted = [ids[int(q) + 1] for q in np.nonzero(cache.trained(0)[:-1])[0]]
    assert tok.decode(predicted) == "hello!\nfine.\n"
    assert len(_Positions(cache, True)) == sum(mask) < len(_Positions(cache, False))
    assert target_choice_counts(cache, VOCAB).sum() == sum(mask) + 1  # + the choice after the last token
    with pytest.raises(Exception, match="other data"):  # the mask is part of what the cache was built from
        build_cache(tiny["target"], [ids], tmp_path / "c", mode="teacher", loss_masks=[[1] * len(ids)], progress=False)


def test_warmup_is_a_tenth_of_a_short_run_and_an_explicit_one_is_obeyed():
    """A fixed 20-step warm-up spent a third of the recipe's 60-step CPU budget below the peak rate:
    by default the peak arrives after a tenth of the run (at most 20 steps); --warmup N is obeyed."""
    from trtspec.train.trainer import TrainConfig, _lr, warmup_steps

    short = TrainConfig(kind="mtp-single", lr=1e-3)
    assert warmup_steps(short, 60) == 6 and warmup_steps(short, 1000) == 20 and warmup_steps(short, 3) == 1
    assert _lr(short, 5, 60) == pytest.approx(1e-3) and _lr(short, 4, 60) < 1e-3
    assert max(_lr(short, s, 60) for s in range(60)) == pytest.approx(1e-3)
    fixed = TrainConfig(kind="mtp-single", lr=1e-3, warmup=20)
    assert warmup_steps(fixed, 60) == 20 and _lr(fixed, 10, 60) < 0.6e-3


@pytest.mark.parametrize("kind", ["dspark", "eagle3", "medusa"])
def test_a_warm_start_begins_where_the_trained_heads_left_off(tiny, kind):
    """--init-from: the heads' weights, read back through the kind's loader, are the run's starting point
    (with the rate at 0 they come out untouched), and on the very batch a fresh run starts on (same seed)
    the warm start's first loss is far lower."""
    target, cache = tiny["target"], tiny["cache"]
    trained, res = train(target, cache, _cfg(kind, steps=30), progress=False)
    heads = save_heads(kind, trained, target, tiny["root"] / f"warm-{kind}", {"loss": res.final_loss})
    init = registry.get(kind).load(heads, target, False)
    fresh_run = train(target, cache, _cfg(kind, steps=2), progress=False)[1]
    kept, still = train(target, cache, _cfg(kind, steps=2, lr=0.0), progress=False, init=init)
    for name, tensor in kept.state_dict().items():
        if name in init.tensors:
            assert torch.equal(tensor.to(init.tensors.load(name).dtype), init.tensors.load(name)), name
    assert still.losses[0] < fresh_run.losses[0] - 0.5, (still.losses[0], fresh_run.losses[0])


def test_a_warm_start_from_other_heads_is_refused(tiny):
    target, cache = tiny["target"], tiny["cache"]
    module, _ = train(target, cache, _cfg("dspark", steps=1, num_heads=3), progress=False)
    init = registry.get("dspark").load(save_heads("dspark", module, target, tiny["root"] / "warm-b3"), target, False)
    with pytest.raises(UsageError, match="block_size 3 but this run trains a block of 4"):
        train(target, cache, _cfg("dspark", steps=1, num_heads=4), progress=False, init=init)
    module, _ = train(target, cache, _cfg("medusa", steps=1, num_heads=2), progress=False)
    init = registry.get("medusa").load(save_heads("medusa", module, target, tiny["root"] / "warm-m2"), target, False)
    with pytest.raises(UsageError, match=r"--init-from .*warm-m2: not the medusa module this run trains \(missing"):
        train(target, cache, _cfg("medusa", steps=1, num_heads=3), progress=False, init=init)


def test_cli_init_from_heads_of_another_kind_is_one_error_line(tiny, tmp_path):
    module, _ = train(tiny["target"], tiny["cache"], _cfg("medusa", steps=1), progress=False)
    heads = save_heads("medusa", module, tiny["target"], tmp_path / "medusa")
    args = ["train-heads", "-t", str(tiny["dir"]), "-k", "dspark", "-d", "chat:4", "-o", str(tmp_path / "h")]
    r = CliRunner().invoke(main, args + ["--init-from", str(heads), "--steps", "1"])
    assert r.exit_code != 0 and "Traceback" not in r.output, r.output
    assert f"error: {heads}: --init-from holds medusa heads, not dspark" in r.output, r.output
    assert not (tmp_path / "h").exists() and not (tmp_path / "h.cache").exists()


def test_a_warm_start_takes_the_batches_after_those_its_heads_saw(tiny, tmp_path):
    """first_batch k: step 0 trains on the batch a run from the start meets at step k (rate 0, so the
    losses depend on the batch only); the CLI reads k from the steps and seed the heads record."""
    from trtspec.cli.train import _trained_steps

    target, cache = tiny["target"], tiny["cache"]
    for kind in ("dspark", "mtp-linear"):
        module, _ = train(target, cache, _cfg(kind, steps=3), progress=False)
        heads = save_heads(kind, module, target, tmp_path / kind, {"steps": 3, "seed": 0})
        init = registry.get(kind).load(heads, target, False)
        whole = train(target, cache, _cfg(kind, steps=5, lr=0.0), progress=False, init=init)[1].losses
        after = train(target, cache, _cfg(kind, steps=2, lr=0.0), progress=False, init=init, first_batch=3)[1].losses
        assert after == whole[3:], (kind, whole, after)
        assert whole[0] != whole[3]
        assert _trained_steps(heads, 0) == 3 and _trained_steps(heads, 1) == 0
