"""EAGLE-3 training on a tiny random target: the cache holds the fused target layers' inputs exactly as
the runtime hands them to the drafter, the draft vocabulary and d2t follow the target's own choices
(SafeAILab's convention), an interrupted run (in process, and a killed CLI process) resumes to the same
loss, caches and tokenizers that do not fit are refused, and trained heads keep greedy output and the
sampling distribution."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.cli import main
from trtspec.demo.tiny import make_tiny_llama
from trtspec.demo.tokenizer import write_char_tokenizer
from trtspec.drafters import registry
from trtspec.errors import UsageError
from trtspec.load import load_spec_model
from trtspec.models.llama import build_llama, causal_mask
from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator
from trtspec.train.aux_cache import aux_dir
from trtspec.train.cache import HiddenCache, build_cache
from trtspec.train.draft_vocab import token_ranking
from trtspec.train.heads import make_module, recipe, save_heads
from trtspec.train.trainer import RecurrentLoss, TrainConfig, _own_vocab_rows, train

KIND = "eagle3"
VOCAB = 128
LAYERS = (1, 2, 3)  # (1, L//2, L-1): the default (2, L//2, L-3) would repeat a layer on 4 layers


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("e3")
    tdir = make_tiny_llama(root / "target", seed=1, vocab_size=VOCAB, num_hidden_layers=4)
    write_char_tokenizer(tdir, VOCAB)
    target = load_hf_causal_lm(tdir)
    assert registry.get(KIND).training.aux_layers(target) == LAYERS
    rng = random.Random(1)
    items = [[rng.randrange(3, VOCAB) for _ in range(rng.randrange(3, 10))] for _ in range(32)]
    build_cache(target, items, root / "cache", gen_tokens=20, topk=4, batch_size=8, progress=False, aux_layers=LAYERS)
    return {"root": root, "dir": tdir, "target": target, "items": items, "cache": HiddenCache(root / "cache")}


def _cfg(**kw) -> TrainConfig:
    base = dict(kind=KIND, steps=20, batch_tokens=256, lr=3e-3, lm_dtype="float32", warmup=5, ckpt_every=0)
    base.update(kw)
    return TrainConfig(**base)


def test_cache_holds_the_layer_inputs_the_runtime_hands_the_drafter(tiny):
    cache, target = tiny["cache"], tiny["target"]
    assert cache.aux_layers == tuple(sorted(set(LAYERS)))  # stored once each, sorted
    model = build_llama(target.arch, target.tensors)
    cols = cache.aux_columns(LAYERS)
    for j in (0, 9, 30):
        seq = cache.sequence(j)
        toks = torch.tensor(np.asarray(seq["tokens"]), dtype=torch.long)
        with torch.no_grad():
            c = model.new_cache(1, len(toks))
            _, aux = model(toks[None], torch.arange(len(toks))[None], c, causal_mask(len(toks)), LAYERS)
        want = torch.cat(aux, -1)[0]
        got = torch.from_numpy(np.asarray(seq["aux"], dtype=np.float32)[:, cols])
        assert got.shape == (len(toks), 3 * target.arch.hidden_size)
        assert torch.allclose(got, want, atol=2e-2)


def test_draft_vocabulary_is_the_targets_most_chosen_tokens_with_d2t_offsets(tiny):
    n = 24
    module, res = train(tiny["target"], tiny["cache"], _cfg(draft_vocab=n), progress=False)
    assert np.mean(res.losses[-3:]) < np.mean(res.losses[:3]) - 0.2
    out = save_heads(KIND, module, tiny["target"], tiny["root"] / "heads-vocab", {"steps": res.steps})
    w = load_file(str(out / "model.safetensors"))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["draft_vocab_size"] == n and cfg["eagle_aux_hidden_state_layer_ids"] == list(LAYERS)
    assert w["d2t"].dtype == torch.int64 and w["t2d"].dtype == torch.bool
    assert w["lm_head.weight"].shape == (n, tiny["target"].arch.hidden_size)
    used = torch.arange(n) + w["d2t"]  # target id = draft id + d2t[draft id]
    assert bool((used[1:] > used[:-1]).all())  # sorted by target id
    assert set(used.tolist()) == set(token_ranking(tiny["cache"], VOCAB)[:n].tolist())
    assert torch.equal(w["t2d"].nonzero().flatten(), used)
    assert any(k.startswith("midlayer.") for k in w) and not any(k.startswith("layer.") for k in w)
    spec = load_spec_model(tiny["dir"], out, tree="chain:3")
    assert spec.drafter.kind == KIND and spec.drafter.config["aux_layers"] == list(LAYERS)
    gen = SpeculativeGenerator(spec)
    prompts = tiny["items"][:4]
    fast = gen.generate(prompts, GenerationConfig(max_new_tokens=16))
    assert fast.tokens == gen.generate(prompts, GenerationConfig(max_new_tokens=16, speculative=False)).tokens
    assert fast.metrics.mean_acceptance_length > 1.0
    drafted = torch.tensor(sorted({t for row in fast.tokens for t in row}))
    assert drafted.numel() > 0


def test_resume_after_an_interruption_is_identical(tiny, tmp_path):
    cfg = dict(steps=8, soft_weight=0.3, draft_vocab=32, unroll=3)
    full, r_full = train(tiny["target"], tiny["cache"], _cfg(**cfg), progress=False)
    _, r_half = train(tiny["target"], tiny["cache"], _cfg(**cfg), ckpt_dir=tmp_path, progress=False, stop_after=3)
    assert r_half.steps == 3
    resumed, r_res = train(tiny["target"], tiny["cache"], _cfg(**cfg), ckpt_dir=tmp_path, resume=True, progress=False)
    assert r_res.steps == 8 and r_res.losses == r_full.losses
    for (name, a), (_, b) in zip(full.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name


def test_a_cache_without_the_layer_inputs_trains_from_the_side_file_and_a_richer_one_is_reused(tiny, tmp_path):
    """Any cache serves EAGLE-3: one written without the fused layers (another kind's) gets them from one
    teacher-forced pass beside it, and trains as the cache that recorded them while the target wrote."""
    items = tiny["items"][:6]
    plain = build_cache(tiny["target"], items, tmp_path / "plain", gen_tokens=6, batch_size=4, progress=False)
    with pytest.raises(UsageError, match=r"not \[1, 2, 3\]"):
        build_cache(tiny["target"], items, plain, gen_tokens=6, batch_size=4, progress=False, aux_layers=LAYERS)
    rich = build_cache(
        tiny["target"], items, tmp_path / "rich", gen_tokens=6, batch_size=4, progress=False, aux_layers=LAYERS
    )
    before = {p: p.stat().st_mtime_ns for p in rich.rglob("*")}
    build_cache(tiny["target"], items, rich, gen_tokens=6, batch_size=4, progress=False)  # no aux asked: reused
    assert {p: p.stat().st_mtime_ns for p in rich.rglob("*")} == before
    _, on_plain = train(tiny["target"], HiddenCache(plain), _cfg(steps=4, batch_tokens=64), progress=False)
    _, on_rich = train(tiny["target"], HiddenCache(rich), _cfg(steps=4, batch_tokens=64), progress=False)
    assert aux_dir(HiddenCache(plain), LAYERS).is_dir() and not aux_dir(HiddenCache(rich), LAYERS).exists()
    assert np.allclose(on_plain.losses, on_rich.losses, rtol=1e-2)
    with pytest.raises(UsageError, match="own vocabulary"):
        train(tiny["target"], HiddenCache(rich), _cfg(steps=1, label_vocab="cache"), progress=False)


def test_sampling_with_trained_heads_keeps_the_target_distribution(tmp_path):
    """A trained EAGLE-3 head (not the demo's random one) on a 12-token target: the second token's marginal
    under speculative sampling equals the target's, by the registry's chi-square test."""
    from test_drafter_registry import _chi_square_p, _second_token_counts

    tdir = make_tiny_llama(tmp_path / "target", vocab_size=12, num_hidden_layers=4, seed=3)
    target = load_hf_causal_lm(tdir)
    rng = random.Random(3)
    items = [[rng.randrange(0, 12) for _ in range(5)] for _ in range(24)]
    build_cache(target, items, tmp_path / "c", gen_tokens=12, batch_size=8, progress=False, aux_layers=LAYERS)
    module, _ = train(target, HiddenCache(tmp_path / "c"), _cfg(steps=15, draft_vocab=8, batch_tokens=128))
    out = save_heads(KIND, module, target, tmp_path / "h")
    gen = SpeculativeGenerator(load_spec_model(tdir, out, tree="[[0],[1],[0,0]]"))
    prompt = [1, 5, 7]
    with torch.no_grad():
        m = gen.target

        def dist(ids):
            c = m.new_cache(1, 8)
            h, _ = m(torch.tensor([ids]), torch.arange(len(ids))[None], c, causal_mask(len(ids)))
            return torch.softmax(m.logits(h[0, -1]).double(), -1)

        p1 = dist(prompt)
        exact = sum(p1[a] * dist(prompt + [a]) for a in range(12))
    counts = _second_token_counts(gen, prompt, 1500)
    assert _chi_square_p(counts, exact) > 1e-3, (counts.tolist(), exact.tolist())


# CLI ---------------------------------------------------------------------------------------------------


def _jsonl(path, n):
    rows = [{"messages": [{"role": "user", "content": f"hello there number {i}, how are you?"}]} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cli(tdir, data, out, *extra):
    return [
        "train-heads", "-t", str(tdir), "-k", KIND, "-d", str(data), "-o", str(out), "--gen-tokens", "12",
        "--batch-tokens", "96", "--lm-dtype", "float32", "--cache-dtype", "float32", "--draft-vocab", "30", *extra,
    ]  # fmt: skip


def test_cli_trains_eagle3_with_its_own_vocabulary_and_a_progress_bar(tiny, tmp_path):
    data = _jsonl(tmp_path / "d.jsonl", 10)
    out = tmp_path / "heads"
    r = CliRunner().invoke(main, _cli(tiny["dir"], data, out, "--steps", "4"))
    assert r.exit_code == 0, r.output
    assert "tok_s=" in r.output and "loss=" in r.output  # the progress bar's postfix
    assert not (out / "draft_vocab.safetensors").exists()  # the size went into d2t instead
    assert json.loads((out / "config.json").read_text())["draft_vocab_size"] <= 30
    assert HiddenCache(tmp_path / "heads.cache").aux_layers == (1, 2, 3)
    assert load_spec_model(tiny["dir"], out).drafter.kind == KIND


def _rates(text: str, prefix: str) -> tuple[int, list[float]]:
    line = next(ln for ln in text.splitlines() if ln.startswith(prefix))
    positions = int(line.split(" positions)")[0].split()[-1].lstrip("("))
    return positions, [float(x) for x in line.split("top-1 per depth ")[1].split(",")[0].split()]


def test_cli_held_out_report_on_the_training_prompts_equals_the_training_data_report(tiny, tmp_path):
    """--eval-data naming the training prompts: the target writes the same replies again, so the held-out
    measurement (aux states from a side file of a fresh cache) must equal the one on the training cache
    (its stored aux columns), position for position."""
    data = _jsonl(tmp_path / "d.jsonl", 10)
    out = tmp_path / "heads"
    r = CliRunner().invoke(main, _cli(tiny["dir"], data, out, "--steps", "20", "--eval-data", str(data)))
    assert r.exit_code == 0, r.output
    held, train = _rates(r.output, "held-out ("), _rates(r.output, "training data (")
    assert held[0] == train[0] > 0 and len(held[1]) == 3
    assert held[1] == pytest.approx(train[1], abs=1e-3)
    assert (tmp_path / "heads.eval-cache").is_dir()


def test_cli_refuses_a_tokenizer_that_does_not_fit_the_target(tmp_path):
    tdir = make_tiny_llama(tmp_path / "target", vocab_size=64, num_hidden_layers=4, seed=0)
    write_char_tokenizer(tdir, 128)  # ids up to 98: not this target's
    data = _jsonl(tmp_path / "d.jsonl", 3)
    r = CliRunner().invoke(main, _cli(tdir, data, tmp_path / "h", "--steps", "1"))
    assert r.exit_code == 2, r.output
    assert "error:" in r.output and "do not match" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "h").exists() and not (tmp_path / "h.cache").exists()


def _final_loss(text: str) -> str:
    line = next(ln for ln in text.splitlines() if ln.startswith("wrote "))
    return line.split("(loss ")[1].split(",")[0]


@pytest.mark.slow
def test_a_killed_training_process_resumes_to_the_same_loss(tiny, tmp_path):
    """SIGKILL mid-run (no Ctrl-C handler runs), then --resume: the same loss and the same weights as an
    uninterrupted run of the same options (here the trainer in this process, on the cache the CLI built)."""
    data = _jsonl(tmp_path / "d.jsonl", 10)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "trtspec.cli", *_cli(tiny["dir"], data, tmp_path / "run", "--steps", "60")]
    cmd += ["--ckpt-every", "1"]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    ckpt = tmp_path / "run.train" / "checkpoint.pt"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if ckpt.is_file() and torch.load(ckpt, weights_only=True)["step"] >= 5:
            break
        time.sleep(0.005)
    assert proc.poll() is None, "training ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    step = torch.load(ckpt, weights_only=True)["step"]
    assert 5 <= step < 60 and not (tmp_path / "run").exists()
    resumed = subprocess.run(cmd + ["--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the CLI ran: the same kernels, bit for bit
    try:
        cfg = TrainConfig(kind=KIND, steps=60, batch_tokens=96, lm_dtype="float32", draft_vocab=30)
        module, ref = train(tiny["target"], HiddenCache(tmp_path / "run.cache"), cfg, progress=False)
    finally:
        torch.set_num_threads(threads)
    assert _final_loss(resumed.stdout) == f"{ref.final_loss:.4f}"
    written = load_file(str(tmp_path / "run" / "model.safetensors"))
    assert torch.equal(written["fc.weight"], module.fc.weight.detach().to(written["fc.weight"].dtype))


# --soft-labels full: the target's whole softmax over the loss vocabulary -----------------------------


def _loss_module(own_vocab: bool, V: int = 24, H: int = 16, sw: float = 1.0):
    torch.manual_seed(0)
    teacher = torch.randn(V, H)
    cfg = _cfg(soft_weight=sw, soft_labels="full")
    return RecurrentLoss(torch.nn.Linear(1, 1), torch.zeros(4, H), teacher, cfg, own_vocab=own_vocab, teacher=teacher)


@pytest.mark.parametrize("own_vocab", [True, False])
def test_full_soft_loss_is_least_where_the_drafter_matches_the_targets_softmax(own_vocab):
    """With weight 1 the loss is the cross-entropy to softmax(h_next @ teacher.T): the drafter that
    reproduces the target's logits scores the target's entropy, any other scores more; invalid rows add
    nothing; with weight 0 it is the hard label's cross-entropy."""
    loss = _loss_module(own_vocab)
    h = torch.randn(6, 16)
    lab = torch.tensor([3, 1, 0, 7, -1, 5])
    valid = lab >= 0
    exact = h @ loss.teacher.T if own_vocab else h  # own vocab: logits; else the state the lm_head reads
    p = torch.softmax(h @ loss.teacher.T, -1)
    entropy = -(p * p.log()).sum(-1)[valid].sum()
    got = loss._full_soft_ce(exact, h, lab, valid)
    assert torch.allclose(got, entropy, rtol=1e-5)
    assert loss._full_soft_ce(exact + 0.3 * torch.randn_like(exact), h, lab, valid) > got
    loss.cfg.soft_weight = 0.0
    logits = h @ loss.teacher.T
    hard = -torch.log_softmax(logits, -1)[valid].gather(1, lab[valid][:, None]).sum()
    assert torch.allclose(loss._full_soft_ce(exact, h, lab, valid), hard, rtol=1e-5)


def test_full_soft_teacher_rows_follow_the_draft_vocabulary_order(tiny):
    """EAGLE-3's teacher is the target's lm_head at the draft ids, in d2t order: exactly the rows its own
    lm_head starts from."""
    target, cache = tiny["target"], tiny["cache"]
    module = make_module(KIND, target, 1, True, 0)
    table = recipe(KIND).prepare(module, target, token_ranking(cache, VOCAB), 24)
    rows = _own_vocab_rows(target.tensors.load(target.lm_head_name).float(), table)
    assert rows.shape == module.lm_head.weight.shape
    assert torch.equal(rows, module.lm_head.weight.detach().float())


@pytest.mark.parametrize("kind", [KIND, "eagle"])
def test_full_soft_labels_train_without_a_topk_cache(tiny, tmp_path, kind):
    items = tiny["items"][:12]
    plain = build_cache(tiny["target"], items, tmp_path / "plain", gen_tokens=16, batch_size=4, progress=False)
    assert not HiddenCache(plain).has_topk
    cfg = _cfg(kind=kind, steps=12, soft_weight=0.7, soft_labels="full", draft_vocab=32, unroll=2, batch_tokens=128)
    if kind == "eagle":
        cfg.label_vocab = "draft"
    _, res = train(tiny["target"], HiddenCache(plain), cfg, progress=False)
    assert np.isfinite(res.losses).all()
    assert np.mean(res.losses[-3:]) < np.mean(res.losses[:3])
    with pytest.raises(UsageError, match="needs a cache built with --topk"):
        train(tiny["target"], HiddenCache(plain), _cfg(kind=kind, steps=1, soft_weight=0.7), progress=False)


def test_cli_full_soft_labels_on_a_block_kind_is_one_error_line(tiny, tmp_path):
    data = _jsonl(tmp_path / "d.jsonl", 4)
    out = tmp_path / "heads"
    args = _cli(tiny["dir"], data, out, "--steps", "1", "--soft-weight", "0.5", "--soft-labels", "full")
    args[args.index(KIND)] = "dspark"
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2
    assert len([ln for ln in r.output.splitlines() if ln.startswith("error:")]) == 1
    assert "--soft-labels topk" in r.output and not out.exists() and not (tmp_path / "heads.cache").exists()
    r = CliRunner().invoke(main, _cli(tiny["dir"], data, out, "--steps", "1", "--soft-weight", "0.5"))
    assert r.exit_code == 2 and "--soft-labels full" in r.output
