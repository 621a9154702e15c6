"""tune-tree's teacher-forced measurement is the runtime's drafter: at every step of real speculative
decoding, the token the runtime proposes at depth 1 is the argmax of the measured depth-1 logits at that
position, for every kind that scores candidates with a model (EAGLE-3's fused layers and the block
drafters included). A DFlash block has no dependency inside the block, so there every depth is checked.
The calibration cache path (aux-layer side file included) is checked the same way through
measure_ranks: its top-1 hits are the runtime's accepted drafts on the same text."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.cli import main
from trtspec.load import load_spec_model
from trtspec.models.llama import causal_mask
from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator
from trtspec.train.aux_cache import aux_features
from trtspec.train.cache import HiddenCache, build_cache
from trtspec.train.ranks import depth_logits, measure_ranks, ranks_by_sequence, simulated_length

KINDS = ["medusa", "mtp-linear", "mtp-single", "eagle", "eagle3", "native-mtp", "draft-model", "dflash", "dspark"]
PROMPTS = [[1, 40, 50, 60, 70], [5, 6, 7, 8, 9, 10, 11, 12], [3, 9]]
DEPTH = 3
NEW = 14


def _generator(demo_paths, kind: str) -> SpeculativeGenerator:
    target, heads = (demo_paths[kind], None) if kind == "native-mtp" else (demo_paths["target"], demo_paths[kind])
    spec = load_spec_model(target, heads, tree=f"chain:{DEPTH}", dtype="float32")
    return SpeculativeGenerator(spec, dtype=torch.float32)


def _record(gen) -> list[tuple[int, list[int]]]:
    """Wrap the drafter's propose to keep (root, drafted chain) per step; the real drafter does the work."""
    seen = []
    real = gen.drafter.propose

    def propose(tree, root, *args, **kwargs):
        out = real(tree, root, *args, **kwargs)
        seen.append((int(root[0]), out[0, 1:].tolist()))
        return out

    gen.drafter.propose = propose
    return seen


def _target_states(gen, tokens: list[int]) -> torch.Tensor:
    """The target's last hidden state, or the drafter's aux-layer states, at every position of ``tokens``."""
    n = len(tokens)
    aux_layers = tuple(gen.drafter.aux_layers)
    with torch.no_grad():
        hidden, aux = gen.target(
            torch.tensor([tokens]), torch.arange(n)[None], gen.target.new_cache(1, n), causal_mask(n), aux_layers
        )
    return (torch.cat(aux, -1) if aux_layers else hidden)[0]


def _to_target(gen, ids: torch.Tensor) -> list[int]:
    id_map = getattr(gen.drafter, "id_map", None)
    return (id_map(ids) if id_map is not None else ids).tolist()


@pytest.mark.parametrize("kind", KINDS)
def test_measured_logits_are_what_the_runtime_proposes(demo_paths, kind):
    gen = _generator(demo_paths, kind)
    seen = _record(gen)
    steps = 0
    for prompt in PROMPTS:
        seen.clear()
        out = gen.generate([prompt], GenerationConfig(max_new_tokens=NEW)).tokens[0]
        seq = prompt + out
        first = len(prompt) - 1  # rows start at the prompt's last position (root: the first generated token)
        logits = depth_logits(gen.drafter, _target_states(gen, seq), torch.tensor(seq), DEPTH, first)
        depths = range(1, DEPTH + 1) if kind == "dflash" else [1]
        best = {d: _to_target(gen, logits(d).argmax(-1)) for d in depths}
        r = len(prompt)  # the root's position: the first generated token
        for root, chain in seen:
            assert root == seq[r]
            for d in depths:
                assert chain[d - 1] == best[d][r - 1 - first], (kind, r, d)
            accepted = 0
            while accepted < len(chain) and r + accepted + 1 < len(seq) and chain[accepted] == seq[r + accepted + 1]:
                accepted += 1
            r += accepted + 1
            steps += 1
    assert steps >= len(PROMPTS)


@pytest.mark.parametrize("kind", ["eagle3", "dspark", "mtp-single"])
def test_cache_ranks_count_the_runtimes_accepted_drafts(demo_paths, kind, tmp_path):
    """measure_ranks on a calibration cache (aux states from the side file) against greedy decoding of
    the same prompts: the leading rank-0 run at each step's root is what the runtime accepted."""
    gen = _generator(demo_paths, kind)
    target = load_hf_causal_lm(demo_paths["native-mtp" if kind == "native-mtp" else "target"])
    build_cache(target, PROMPTS, tmp_path / "c", gen_tokens=NEW, batch_size=1, progress=False)
    cache = HiddenCache(tmp_path / "c")
    aux = aux_features(cache, target, tuple(gen.drafter.aux_layers), progress=False) if gen.drafter.aux_layers else None
    ranks = measure_ranks(gen.drafter, cache, DEPTH, aux=aux)
    predicted = accepted = offset = 0
    for i in range(len(cache.sequences)):  # cache order; ranks rows follow it
        seq = np.asarray(cache.sequence(i)["tokens"]).tolist()
        prompt = seq[: cache.prompt_lengths[i]]
        res = gen.generate([prompt], GenerationConfig(max_new_tokens=len(seq) - len(prompt)))
        assert prompt + res.tokens[0] == seq  # the cache holds the target's greedy reply
        rows = ranks[offset : offset + len(seq) - len(prompt)]  # q = len(prompt) - 1 ..
        offset += len(seq) - len(prompt)
        r = len(prompt)
        while r < len(seq) - 1:
            run = 0
            while run < DEPTH and r + run + 1 < len(seq) and rows[r - len(prompt), run] == 0:
                run += 1
            predicted += run
            r += run + 1
        accepted += res.metrics.accepted_draft_tokens
    assert predicted == accepted


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_cli_tune_tree_tunes_drafters_that_read_other_layers(demo_paths, kind, tmp_path):
    import json

    data = tmp_path / "calib.jsonl"
    data.write_text(
        "".join(json.dumps({"messages": [{"role": "user", "content": f"hello {i}"}]}) + "\n" for i in range(4))
    )
    out = tmp_path / "tree.json"
    r = CliRunner().invoke(
        main,
        [
            "tune-tree",
            "-t",
            str(demo_paths["target"]),
            "-H",
            str(demo_paths[kind]),
            "-d",
            str(data),
            "--nodes",
            "2,4",
            "--calib-samples",
            "3",
            "--eval-samples",
            "2",
            "--max-new-tokens",
            "8",
            "--gen-tokens",
            "8",
            "--depth",
            "2",
            "--topk",
            "64",  # of the demo's 128 tokens: a random drafter still hits within it
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    rep = json.loads(out.read_text())
    assert rep["calibration_positions"] > 0
    assert "per-depth top-64 acceptance" in r.output
    for b in rep["budgets"]:  # a random drafter hits few paths: the tree holds the ones it hit
        assert 1 <= len(b["choices"]) <= b["nodes"] and b["identical_to_plain"] is True


def test_simulated_length_walks_the_text_as_decoding_does():
    """Steps skip what they accept: from a root, the deepest tree path the ranks start with, plus the
    bonus token; never past the end of the text."""
    ranks = [np.array([[1, 0], [0, 0], [0, 0], [0, 0]])]
    assert simulated_length(ranks, [(0,)]) == pytest.approx(4 / 3)  # roots 0, 1, 3
    assert simulated_length(ranks, [(0,), (1,)]) == pytest.approx(2.0)  # roots 0, 2
    assert simulated_length(ranks, [(0,), (1,), (1, 0)]) == pytest.approx(4 / 2)  # root 0 takes (1, 0), root 3
    assert simulated_length([np.array([[5, 5]])], [(0,)]) == 1.0


def test_simulated_length_is_what_decoding_gets(demo_paths, tmp_path):
    """A draft model that agrees with the target only part of the time (the target's weights, perturbed):
    the length simulated from its ranks on a cache of the target's replies is the tokens per step that
    chain decoding of the same prompts measures, where the mean over positions of 1 + sum P(node)
    is not."""
    import shutil

    from safetensors.torch import load_file, save_file

    from trtspec.train.tune import expected_length, path_probs_from_ranks

    draft = tmp_path / "draft"
    shutil.copytree(demo_paths["target"], draft)
    weights = load_file(str(draft / "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    noisy = {k: v + 0.1 * v.std() * torch.randn(v.shape, generator=g) for k, v in weights.items()}
    save_file(noisy, str(draft / "model.safetensors"), metadata={"format": "pt"})
    spec = load_spec_model(demo_paths["target"], draft, tree=f"chain:{DEPTH}", dtype="float32")
    gen = SpeculativeGenerator(spec, dtype=torch.float32)
    prompts = [[1 + (7 * i + j) % 90 for j in range(3 + i % 5)] for i in range(8)]
    build_cache(spec.target, prompts, tmp_path / "c", gen_tokens=40, batch_size=1, progress=False)
    decoded = 30  # fewer than cached: the last step's drafts have their labels
    cache = HiddenCache(tmp_path / "c")
    sequences = ranks_by_sequence(gen.drafter, cache, DEPTH)
    assert len(sequences) == len(cache.sequences)
    chain = [(0,) * d for d in range(1, DEPTH + 1)]
    tokens = steps = 0
    kept = []
    for i in range(len(cache.sequences)):
        seq = np.asarray(cache.sequence(i)["tokens"]).tolist()
        prompt = seq[: cache.prompt_lengths[i]]
        if len(seq) - len(prompt) <= decoded:  # the target ended its reply (eos) early: not this test's walk
            continue
        m = gen.generate([prompt], GenerationConfig(max_new_tokens=decoded)).metrics
        tokens += m.accepted_draft_tokens + m.sequence_steps
        steps += m.sequence_steps
        kept.append(sequences[i])
    assert len(kept) >= 5
    measured = tokens / steps
    simulated = simulated_length(kept, chain, limit=decoded)
    mean = expected_length(path_probs_from_ranks(np.concatenate(kept), 1), chain)
    assert 1.2 < measured < DEPTH + 0.5, measured  # the draft is right part of the time
    assert simulated == pytest.approx(measured, abs=1e-9), (simulated, measured, mean)
    assert mean > measured + 0.05  # what the position mean would have promised
