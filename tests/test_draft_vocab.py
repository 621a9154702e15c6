"""Draft vocabularies: drafting over a subset of the target's tokens stays token-identical to greedy for
every kind, a complete (permuted) vocabulary changes nothing, proposals stay inside the subset, the
frequency choice is the target's own, and bad files give one-line errors."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from trtspec.checkpoint.heads.draft_vocab import DRAFT_VOCAB_FILE, load_draft_vocab, save_draft_vocab, to_draft_index
from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.cli import main
from trtspec.demo.build import DEMO_VOCAB
from trtspec.errors import CheckpointError, UsageError
from trtspec.load import load_spec_model
from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator
from trtspec.train.cache import HiddenCache, build_cache
from trtspec.train.draft_vocab import frequent_tokens, target_choice_counts
from trtspec.train.ranks import measure_ranks

KINDS = ["draft-model", "medusa", "mtp-linear", "mtp-single", "eagle"]
PROMPTS = [[1, 40, 50, 60, 70], [1, 7], [5, 6, 7, 8, 9, 10, 11, 12]]


def _heads_copy(demo_paths, kind, tmp_path):
    src = demo_paths[kind]
    dst = tmp_path / kind
    shutil.copytree(src if src.is_dir() else src.parent, dst)
    return dst


def _recording(gen):
    """Wrap the drafter's propose to keep what it proposed (the real drafter still does the work)."""
    seen = []
    real = gen.drafter.propose

    def propose(tree, root):
        out = real(tree, root)
        seen.append(out[:, 1:].clone())
        return out

    gen.drafter.propose = propose
    return seen


@pytest.mark.parametrize("kind", KINDS)
def test_subset_vocabulary_is_lossless_and_proposes_only_its_tokens(demo_paths, tmp_path, kind):
    heads = _heads_copy(demo_paths, kind, tmp_path)
    subset = torch.randperm(DEMO_VOCAB, generator=torch.Generator().manual_seed(1))[:40]
    save_draft_vocab(heads, subset)
    spec = load_spec_model(demo_paths["target"], heads)
    assert torch.equal(spec.drafter.draft_vocab, subset) and "draft vocab 40" in spec.describe()
    gen = SpeculativeGenerator(spec)
    seen = _recording(gen)
    plain = gen.generate(PROMPTS, GenerationConfig(max_new_tokens=20, speculative=False))
    res = gen.generate(PROMPTS, GenerationConfig(max_new_tokens=20))
    assert res.tokens == plain.tokens
    proposed = torch.cat([s.flatten() for s in seen])
    assert proposed.numel() > 0 and torch.isin(proposed, subset).all()


@pytest.mark.parametrize("kind", ["medusa", "mtp-single"])
def test_complete_permuted_vocabulary_changes_nothing(demo_paths, tmp_path, kind):
    """All V tokens in another order: the drafter proposes exactly what the full-vocabulary drafter does."""
    heads = _heads_copy(demo_paths, kind, tmp_path)
    full = SpeculativeGenerator(load_spec_model(demo_paths["target"], heads))
    save_draft_vocab(heads, torch.randperm(DEMO_VOCAB, generator=torch.Generator().manual_seed(2)))
    permuted = SpeculativeGenerator(load_spec_model(demo_paths["target"], heads))
    a, b = _recording(full), _recording(permuted)
    ra = full.generate(PROMPTS, GenerationConfig(max_new_tokens=20))
    rb = permuted.generate(PROMPTS, GenerationConfig(max_new_tokens=20))
    assert ra.tokens == rb.tokens and len(a) == len(b)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    off = SpeculativeGenerator(load_spec_model(demo_paths["target"], heads, draft_vocab=0))
    assert off.drafter.draft_vocab is None


def test_first_n_entries_and_inverse_map(demo_paths, tmp_path):
    heads = _heads_copy(demo_paths, "mtp-single", tmp_path)
    ids = torch.tensor([9, 3, 70, 5])
    save_draft_vocab(heads, ids)
    assert load_draft_vocab(heads, DEMO_VOCAB, 2).tolist() == [9, 3]
    inv = to_draft_index(ids, DEMO_VOCAB)
    assert inv[70] == 2 and inv[4] == -1 and (inv >= 0).sum() == 4


@pytest.mark.parametrize(
    "tensors, message",
    [
        ({"draft_vocab": torch.tensor([1, 2, DEMO_VOCAB])}, "outside the target vocabulary"),
        ({"draft_vocab": torch.tensor([1, 2, 2])}, "repeated token ids"),
        ({"draft_vocab": torch.tensor([1.0, 2.0])}, "integer tensor"),
        ({"draft_vocab": torch.zeros(0, dtype=torch.long)}, "non-empty"),
        ({"other": torch.tensor([1])}, "integer tensor 'draft_vocab'"),
        (None, "not a readable safetensors"),
    ],
)
def test_bad_draft_vocabulary_files(demo_paths, tmp_path, tensors, message):
    from safetensors.torch import save_file

    heads = _heads_copy(demo_paths, "mtp-single", tmp_path)
    if tensors is None:
        (heads / DRAFT_VOCAB_FILE).write_bytes(b"\x10\x00\x00\x00garbage")
    else:
        save_file(tensors, str(heads / DRAFT_VOCAB_FILE))
    with pytest.raises(CheckpointError, match=message):
        load_spec_model(demo_paths["target"], heads)
    r = CliRunner().invoke(main, ["generate", "-t", str(demo_paths["target"]), "-H", str(heads), "-p", "hi"])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and DRAFT_VOCAB_FILE in r.output, r.output


def test_size_without_file_and_eagle3_are_refused(demo_paths, tmp_path):
    with pytest.raises(UsageError, match="has no draft_vocab|have no draft_vocab"):
        load_spec_model(demo_paths["target"], demo_paths["mtp-single"], draft_vocab=8)
    heads = _heads_copy(demo_paths, "eagle3", tmp_path)
    save_draft_vocab(heads, torch.arange(10))
    with pytest.raises(CheckpointError, match="own draft vocabulary"):
        load_spec_model(demo_paths["target"], heads)
    assert load_spec_model(demo_paths["target"], heads, draft_vocab=0).drafter.kind == "eagle3"


@pytest.fixture(scope="module")
def demo_cache(demo_paths, tmp_path_factory):
    target = load_hf_causal_lm(demo_paths["target"])
    items = [[1 + (7 * i + j) % 90 for j in range(3 + i % 5)] for i in range(12)]
    d = tmp_path_factory.mktemp("dvcache") / "cache"
    build_cache(target, items, d, gen_tokens=16, batch_size=4, progress=False)
    return target, HiddenCache(d)


def test_frequent_tokens_are_the_targets_own_choices(demo_cache):
    target, cache = demo_cache
    counts = np.zeros(DEMO_VOCAB, dtype=np.int64)
    for i, plen in enumerate(cache.prompt_lengths):  # by hand: the target's choices past each prompt
        for t in np.asarray(cache.sequence(i)["argmax"])[plen - 1 :]:
            counts[int(t)] += 1
    assert np.array_equal(target_choice_counts(cache, DEMO_VOCAB), counts)
    dv = frequent_tokens(cache, DEMO_VOCAB, 5)
    top = sorted(range(DEMO_VOCAB), key=lambda t: (-counts[t], t))[:5]
    assert dv.ids.tolist() == top
    assert dv.coverage == pytest.approx(counts[top].sum() / counts.sum())
    assert dv.coverage_of(2) == pytest.approx(counts[top[:2]].sum() / counts.sum())
    assert dv.distinct == int((counts > 0).sum())
    everything = frequent_tokens(cache, DEMO_VOCAB, DEMO_VOCAB)
    assert everything.ids.numel() == dv.distinct and everything.coverage == 1.0


def test_tuning_ranks_count_tokens_outside_the_vocabulary_as_misses(demo_paths, demo_cache, tmp_path):
    _, cache = demo_cache
    heads = _heads_copy(demo_paths, "mtp-single", tmp_path)
    full = measure_ranks(SpeculativeGenerator(load_spec_model(demo_paths["target"], heads)).drafter, cache, 2)
    save_draft_vocab(heads, torch.randperm(DEMO_VOCAB, generator=torch.Generator().manual_seed(3)))
    same = measure_ranks(SpeculativeGenerator(load_spec_model(demo_paths["target"], heads)).drafter, cache, 2)
    assert np.array_equal(full, same)
    labels = np.concatenate(
        [np.asarray(cache.sequence(i)["argmax"])[max(p - 1, 0) :] for i, p in enumerate(cache.prompt_lengths)]
    )
    keep = torch.tensor(sorted(set(labels.tolist()))[: max(1, len(set(labels.tolist())) // 2)])
    save_draft_vocab(heads, keep)
    half = measure_ranks(SpeculativeGenerator(load_spec_model(demo_paths["target"], heads)).drafter, cache, 2)
    assert (half[:, 0] < 0).sum() > (full[:, 0] < 0).sum()
    assert (half[:, 0] >= 0).sum() > 0
