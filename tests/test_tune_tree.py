"""tune-tree: the greedy builder is optimal on synthetic statistics, ranks turn into path probabilities,
and the command writes choices that build and the runtime accept."""

from __future__ import annotations

import json
import random
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.errors import CheckpointError
from trtspec.load import load_spec_model
from trtspec.train.tune import (
    brute_force_best,
    build_tree,
    expected_length,
    marginal_path_probs,
    path_probs_from_ranks,
    per_depth_topk,
)
from trtspec.tree import TREE_FILE, parse_choices, write_recorded_tree


def test_known_optimal_trees_for_small_budgets():
    probs = marginal_path_probs([[0.6, 0.3], [0.8, 0.1]])
    # P: (0)=.6 (1)=.3 (0,0)=.48 (1,0)=.24 (0,1)=.06 (1,1)=.03
    assert build_tree(probs, 1) == ((0,),)
    assert build_tree(probs, 2) == ((0,), (0, 0))
    assert build_tree(probs, 3) == ((0,), (1,), (0, 0))
    assert build_tree(probs, 4) == ((0,), (1,), (0, 0), (1, 0))
    assert expected_length(probs, build_tree(probs, 4)) == pytest.approx(1 + 0.6 + 0.3 + 0.48 + 0.24)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("nodes", [1, 2, 3, 4, 5])
def test_greedy_equals_brute_force(seed, nodes):
    rng = np.random.default_rng(seed)
    table = []
    for _ in range(3):
        row = np.sort(rng.dirichlet(np.ones(4)))[::-1][:3] * rng.uniform(0.5, 1.0)
        table.append(row.tolist())
    probs = marginal_path_probs(table)
    greedy = build_tree(probs, nodes)
    best, best_val = brute_force_best(probs, nodes, max_rank=3, max_depth=3)
    assert expected_length(probs, greedy) == pytest.approx(best_val)
    assert len(greedy) == nodes and all(c[:i] in set(greedy) for c in greedy for i in range(1, len(c)))


def test_joint_statistics_beat_the_product_model_when_hits_correlate():
    """Depth-2 hits only after a rank-1 depth-1 hit: the empirical joint sees it, the product does not."""
    ranks = np.array([[0, 5]] * 50 + [[1, 0]] * 40 + [[9, 9]] * 10)
    joint = path_probs_from_ranks(ranks, topk=4)
    assert joint[(0,)] == pytest.approx(0.5) and joint[(1, 0)] == pytest.approx(0.4) and (0, 0) not in joint
    tree = build_tree(joint, 3)
    assert tree == ((0,), (1,), (1, 0))
    table = per_depth_topk(ranks, 4)
    assert table[0][:2] == [pytest.approx(0.5), pytest.approx(0.4)]
    assert table[1][0] == pytest.approx(40 / 90)


def test_cli_tune_tree_writes_choices_the_runtime_takes(tmp_path):
    from trtspec.checkpoint.target import load_hf_causal_lm
    from trtspec.demo.tiny import make_tiny_llama
    from trtspec.demo.tokenizer import write_char_tokenizer
    from trtspec.train.cache import HiddenCache, build_cache
    from trtspec.train.heads import save_heads
    from trtspec.train.trainer import TrainConfig, train

    tdir = make_tiny_llama(tmp_path / "t", seed=1, vocab_size=128, num_hidden_layers=2)
    write_char_tokenizer(tdir, 128)
    target = load_hf_causal_lm(tdir)
    rng = random.Random(0)
    rows = [
        {"messages": [{"role": "user", "content": "".join(rng.choice("abcdef ") for _ in range(6))}]} for _ in range(10)
    ]
    data = tmp_path / "calib.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    from trtspec.load import load_tokenizer
    from trtspec.train.data import encode_prompt, load_samples

    tok = load_tokenizer(target)
    items = [encode_prompt(tok, s) for s in load_samples([str(data)])]
    build_cache(target, items, tmp_path / "c", gen_tokens=16, progress=False)
    module, _ = train(
        target,
        HiddenCache(tmp_path / "c"),
        TrainConfig(kind="mtp-single", steps=20, batch_tokens=128, lr=3e-3, lm_dtype="float32"),
        progress=False,
    )
    heads = save_heads("mtp-single", module, target, tmp_path / "heads")
    out = tmp_path / "tree.json"
    r = CliRunner().invoke(
        main,
        [
            "tune-tree",
            "-t",
            str(tdir),
            "-H",
            str(heads),
            "-d",
            str(data),
            "--nodes",
            "3,6",
            "--calib-samples",
            "6",
            "--eval-samples",
            "3",
            "--max-new-tokens",
            "12",
            "--gen-tokens",
            "16",
            "--depth",
            "3",
            "--out",
            str(out),
            "--write-heads",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "expected acceptance length" in r.output and "measured" in r.output
    rep = json.loads(out.read_text())
    assert [b["nodes"] for b in rep["budgets"]] == [3, 6]
    for b in rep["budgets"]:
        assert len(b["choices"]) == b["nodes"]
        assert parse_choices(b["choices_trtllm"]) == parse_choices(b["choices_json"])
        assert b["identical_to_plain"] is True
    spec = load_spec_model(tdir, heads)
    if rep["beats_plain"]:  # the recorded tree is the default now
        assert [list(c) for c in spec.tree.choices] == rep["best"]["choices"]
    else:  # a tree slower than plain decoding is reported, never recorded
        assert rep["best"]["speedup"] <= 1.0
        assert "no tree beats plain decoding" in r.output and "not recording a tree" in r.output
        assert "tree_choices" not in spec.drafter.config


def test_cli_tune_tree_rejects_bad_budgets(tmp_path):
    r = CliRunner().invoke(main, ["tune-tree", "-t", str(tmp_path), "-H", str(tmp_path), "-d", "x", "--nodes", "a"])
    assert r.exit_code == 2 and "--nodes" in r.output


@pytest.mark.parametrize("kind", ["ngram", "suffix"])
def test_cli_tune_tree_refuses_drafters_it_cannot_measure(kind, demo_paths, tmp_path):
    """Drafters that draft from text have no logits to rank: one clear line, not a traceback."""
    data = tmp_path / "calib.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hello there"}]}) + "\n")
    r = CliRunner().invoke(
        main, ["tune-tree", "-t", str(demo_paths["target"]), "-H", str(demo_paths[kind]), "-d", str(data)]
    )
    assert r.exit_code == 2 and "error:" in r.output and "--tree" in r.output and "cache:" not in r.output, r.output


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "dspark", "medusa"])
def test_a_tree_recorded_beside_any_format_is_the_default(kind, demo_paths, tmp_path):
    """tune-tree --write-heads records beside heads of any format (their public layouts have no tree
    field): the loader takes it as the default tree, --tree still overrides it, and the heads' own
    files are untouched."""
    heads = shutil.copytree(demo_paths[kind], tmp_path / kind)
    before = {p.name: p.read_bytes() for p in heads.iterdir()}
    default = load_spec_model(demo_paths["target"], heads).tree.choices
    tuned = [[0], [1], [0, 0]]
    written = write_recorded_tree(heads, tuned, "test")
    assert written == heads / TREE_FILE
    assert {p.name: p.read_bytes() for p in heads.iterdir() if p.name != TREE_FILE} == before
    assert [list(c) for c in load_spec_model(demo_paths["target"], heads).tree.choices] == tuned != default
    assert load_spec_model(demo_paths["target"], heads, tree="chain:2").tree.choices == ((0,), (0, 0))


def test_a_bad_recorded_tree_is_one_error_naming_the_file(demo_paths, tmp_path):
    heads = shutil.copytree(demo_paths["dflash"], tmp_path / "dflash")  # a block of 4: 3 drafts deep
    (heads / TREE_FILE).write_text(json.dumps({"tree_choices": [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]}))
    with pytest.raises(CheckpointError, match="deeper than the 3 dflash drafts") as e:
        load_spec_model(demo_paths["target"], heads)
    assert str(heads / TREE_FILE) in str(e.value)
    (heads / TREE_FILE).write_text("{not json")
    r = CliRunner().invoke(
        main, ["generate", "-t", str(demo_paths["target"]), "-H", str(heads), "-p", "hi", "--max-new-tokens", "2"]
    )
    assert r.exit_code != 0 and "error:" in r.output and TREE_FILE in r.output and "Traceback" not in r.output
