"""Model-free drafters (the kinds with an ``address``): what they propose, how they are selected, how the
loop verifies only what they drafted, and a model drafter with a model-free one beside it.

The registry's conformance test already runs each model-free kind through greedy identity (batched,
different lengths) and the sampling distribution test; this file checks the behaviour specific to them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file
from trtllm_facts import facts

from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.demo.tiny import make_tiny_llama
from trtspec.drafters import registry
from trtspec.drafters.combined import CombinedDrafter, accepted_along, prefer_model_free
from trtspec.drafters.matching import TokenIndex, fill_tree
from trtspec.errors import CheckpointError, UsageError
from trtspec.load import load_spec_model
from trtspec.runtime.adaptive import SourceChoice
from trtspec.runtime.generate import Batch, GenerationConfig, SpeculativeGenerator, trim_to_drafted
from trtspec.tree import build_tree, parse_choices

FREE = registry.model_free()
DEPLOY_FORMATS = Path(__file__).resolve().parents[1].parent / "shared" / "docs" / "DEPLOY_FORMATS.md"


def _drafter(kind: str, target_dir: Path, arg: str = ""):
    spec = load_spec_model(target_dir, kind + arg).drafter
    return registry.get(kind).build(spec, None, torch.float32), spec


def _observe(drafter, history: list[int]) -> None:
    """What the prefill hands a drafter: the prompt and the tokens after each (the last is the root)."""
    drafter.reset(1, 64)
    t = torch.tensor(history)
    drafter.observe(None, None, [t[:-1]], [t[1:]])


def test_token_index_finds_the_longest_earlier_match():
    idx = TokenIndex(4)
    idx.extend([1, 2, 3, 9, 7, 2, 3, 5, 1, 2, 3])
    n, hits = idx.longest_match(idx.tokens, 1, 4)
    assert n == 3 and hits == [3]  # [1, 2, 3] occurred once before, followed by 9; the current one never counts
    assert idx.continuation(hits[0], 3) == [9, 7, 2]
    assert idx.longest_match(idx.tokens, 4, 4) == (0, [])


def test_fill_tree_ranks_siblings_by_weight_and_prunes_unlikely_paths():
    tree = build_tree(parse_choices("[[0],[1],[2],[0,0]]"))
    cands = [([5, 6], 1.0), ([5, 7], 1.0), ([8], 1.0), ([5, 6], 1.0)]
    tokens, drafted = fill_tree(tree, 0, cands, max_depth=2)
    assert tokens[1:] == [5, 8, 0, 6] and drafted == [True, True, True, False, True]  # no third sibling
    _, drafted = fill_tree(tree, 0, cands, max_depth=2, min_prob=0.4)
    assert drafted == [True, True, False, False, True]  # 8 has 1/4; [5, 6] has 3/4 * 2/3 = 1/2
    _, drafted = fill_tree(tree, 0, cands, max_depth=1)
    assert drafted[4] is False


def test_ngram_proposes_what_followed_the_most_recent_occurrence(demo_paths):
    drafter, spec = _drafter("ngram", demo_paths["target"])
    _observe(drafter, [4, 5, 6, 11, 12, 5, 6, 13, 14, 15, 5, 6])
    tree = build_tree(parse_choices("chain:4"))
    tokens = drafter.propose(tree, torch.tensor([6]))
    assert tokens[0].tolist() == [6, 13, 14, 15, 5]  # the most recent [5, 6] was followed by 13 14 15 5
    assert drafter.drafted().all()


def test_suffix_ranks_continuations_by_count_and_drafts_by_match_length(demo_paths):
    drafter, _ = _drafter("suffix", demo_paths["target"])
    # [7, 8] was followed by 1 3 7, 2 4 7 and 1 5 7; the match is 2 tokens long ([5, 7, 8] is new)
    _observe(drafter, [7, 8, 1, 3, 7, 8, 2, 4, 7, 8, 1, 5, 7, 8])
    tree = build_tree(parse_choices("[[0],[1],[0,0],[0,0,0],[0,0,0,0]]"))
    tokens = drafter.propose(tree, torch.tensor([8]))
    drafted = drafter.drafted()[0].tolist()
    # 1 (2 of 3 occurrences) before 2; after 1, 5 and 3 tie on count and the newer (5) wins; the
    # runner-up 2 (a third of the weight) is still drafted (min_token_prob 0.1)
    assert tokens[0, 1:].tolist() == [1, 2, 5, 7, 8] and all(drafted)
    _observe(drafter, [9, 1, 2, 3, 4, 5, 6, 7, 9])  # a 1-token match: 2.0 * 1 + 2 = 4 tokens at most
    chain = build_tree(parse_choices("chain:6"))
    assert drafter.propose(chain, torch.tensor([9]))[0, 1:5].tolist() == [1, 2, 3, 4]
    assert drafter.drafted()[0].tolist() == [True] * 5 + [False] * 2
    _observe(drafter, [3, 4, 5, 6])  # nothing occurred before: nothing drafted
    drafter.propose(tree, torch.tensor([6]))
    assert not drafter.drafted()[0, 1:].any()


def test_addresses_select_model_free_kinds_without_files(demo_paths, tmp_path):
    spec = load_spec_model(demo_paths["target"], "ngram:4")
    assert spec.drafter.kind == "ngram" and spec.drafter.config["max_ngram"] == 4 and spec.tree.depth == 6
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps\n\nover the lazy dog")
    spec = load_spec_model(demo_paths["target"], f"suffix:{corpus}")
    drafter = registry.get("suffix").build(spec.drafter, None, torch.float32)
    tok = load_hf_causal_lm(demo_paths["target"])
    from trtspec.checkpoint.target import load_tokenizer

    ids = load_tokenizer(tok)("quick br", add_special_tokens=False)["input_ids"]
    _observe(drafter, ids)
    tokens = drafter.propose(build_tree(parse_choices("chain:3")), torch.tensor([ids[-1]]))
    assert load_tokenizer(tok).decode(tokens[0, 1:].tolist()) == "own"  # from the corpus, not the sequence
    with pytest.raises(UsageError, match="ngram:N"):
        load_spec_model(demo_paths["target"], "ngram:x")
    with pytest.raises(CheckpointError, match="corpus file not found"):
        load_spec_model(demo_paths["target"], f"suffix:{tmp_path / 'missing.txt'}")
    with pytest.raises(UsageError, match="no vocabulary"):
        load_spec_model(demo_paths["target"], "suffix", draft_vocab=8)


def test_cli_bad_address_is_one_error_line(demo_paths, tmp_path):
    from trtspec.cli import main

    r = CliRunner().invoke(
        main, ["generate", "-t", str(demo_paths["target"]), "-H", f"suffix:{tmp_path / 'no.txt'}", "-p", "hi"]
    )
    assert r.exit_code == 2 and "error:" in r.output and "no.txt" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(
        main, ["generate", "-t", str(demo_paths["target"]), "-H", "ngram", "--also-draft", "suffix", "-p", "hi"]
    )
    assert r.exit_code == 2 and "beside model heads" in r.output


def test_trim_keeps_only_drafted_nodes_down_to_a_plain_step():
    tree = build_tree(parse_choices("[[0],[1],[0,0],[0,0,0]]"))
    drafts = torch.tensor([[9, 1, 2, 3, 4], [9, 5, 6, 7, 8]])
    batch = Batch(None, torch.tensor([9, 9]), [[], []], [False, False], frozenset(), GenerationConfig())
    drafted = torch.tensor([[1, 1, 0, 1, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
    cut, cols = trim_to_drafted(tree, drafts, drafted, batch.done, {})
    assert cut.choices == ((0,), (0, 0)) and cols.tolist() == [[9, 1, 3], [9, 5, 7]]
    batch.done[0] = True  # a finished sequence's drafts do not count
    cut, cols = trim_to_drafted(tree, drafts, drafted, batch.done, {})
    assert cut.choices == ((0,),) and cols.tolist() == [[9, 1], [9, 5]]
    cut, cols = trim_to_drafted(tree, drafts, torch.zeros_like(drafted), batch.done, {})
    assert cut.num_nodes == 0 and cols.shape == (2, 1)
    assert trim_to_drafted(tree, drafts, None, batch.done, {})[0] is tree


def test_engine_refusal_matches_trtllm_build_modes():
    """No trtllm-build --speculative_decoding_mode drafts from text, and the refusal names them all."""
    flag = next(f for f in facts()["trtllm_build_flags"]["flags"] if f["flag"] == "--speculative_decoding_mode")
    for kind in FREE:
        route = registry.get(kind).engine
        assert not route.supported
        assert all(mode in route.refusal for mode in flag["choices"])
        assert not any("ngram" in m or "lookup" in m for m in flag["choices"])


def test_serving_configs_use_documented_decoding_types(demo_paths):
    if not DEPLOY_FORMATS.is_file():
        pytest.skip(f"{DEPLOY_FORMATS} not found")
    line = next(x for x in DEPLOY_FORMATS.read_text().splitlines() if "Documented `decoding_type` values" in x)
    documented = {v.strip(" .") for v in line.split(":", 1)[1].split(",")}
    for kind in FREE:
        spec = load_spec_model(demo_paths["target"], kind).drafter
        cfg = registry.get(kind).serving_configs(spec, 5)
        assert cfg["trtllm-pytorch"]["decoding_type"] in documented and cfg["trtllm-pytorch"]["max_draft_len"] == 5


@pytest.fixture(scope="module")
def cycling(tmp_path_factory) -> dict[str, Path]:
    """A target whose greedy output falls into a short cycle (its layers write nothing: the next token is
    a function of the current one) and random Medusa heads for it, which predict that cycle badly."""
    root = tmp_path_factory.mktemp("cycling")
    t = make_tiny_llama(root / "target", seed=1, vocab_size=128, num_hidden_layers=2)
    f = t / "model.safetensors"
    w = load_file(str(f))
    w = {k: v * 0 if k.endswith(("o_proj.weight", "down_proj.weight")) else v for k, v in w.items()}
    save_file(w, str(f), metadata={"format": "pt"})
    kind = next(n for n, k in registry.KINDS.items() if k.engine.layout == "MedusaForCausalLM")
    return {"target": t, "heads": registry.get(kind).make_demo(load_hf_causal_lm(t), root / "heads")}


@pytest.mark.parametrize("free", FREE)
def test_useless_heads_with_a_model_free_drafter_beside_them(cycling, free):
    prompts = [[5, 6, 7, 8, 9] * 3, [40, 41, 42] * 2 + [7], [3, 4] * 5]
    cfg = GenerationConfig(max_new_tokens=40)
    alone = SpeculativeGenerator(load_spec_model(cycling["target"], cycling["heads"]))
    both = SpeculativeGenerator(load_spec_model(cycling["target"], cycling["heads"], also_draft=free))
    assert isinstance(both.drafter, CombinedDrafter)
    plain = alone.generate(prompts, GenerationConfig(max_new_tokens=40, speculative=False))
    a, b = alone.generate(prompts, cfg), both.generate(prompts, cfg)
    assert a.tokens == plain.tokens and b.tokens == plain.tokens
    assert both.drafter.chosen["model-free"] > both.drafter.chosen["model"] / 2
    assert b.metrics.mean_acceptance_length > a.metrics.mean_acceptance_length + 1.0
    assert both.drafter.model_gain < 0.2 < both.drafter.free_ratio
    adaptive = both.generate(prompts, GenerationConfig(max_new_tokens=40, adaptive=True))
    assert adaptive.tokens == plain.tokens


def test_per_sequence_choice_and_acceptance_measure():
    assert prefer_model_free(3, 0.5, 1.0) and not prefer_model_free(1, 0.5, 1.0) and not prefer_model_free(0, 1, 0)
    tree = build_tree(parse_choices("[[0],[1],[0,0]]"))
    tokens, drafted = [9, 4, 5, 6], [True, True, True, False]
    assert accepted_along(tree, tokens, drafted, [4, 6, 1]) == (1, 1)  # node [0,0] was not drafted
    assert accepted_along(tree, tokens, [True] * 4, [4, 6, 1]) == (2, 2)
    assert accepted_along(tree, tokens, [True] * 4, [7]) == (0, 2)


def test_source_choice_drops_the_model_below_break_even():
    """The model drafter's steps commit 1.1 tokens in 10 ms, the model-free ones 1.5 in 6 ms: switch."""
    s = SourceChoice(warmup=2, probe_every=5)
    modes = []
    for _ in range(20):
        m = s.use_model()
        modes.append(m)
        s.record(m, [0, 0, 1, 0, 0, 0, 0, 0, 0, 0] if m else [1, 0], 0.010 if m else 0.006)
    assert modes[:4] == [True, True, False, False]
    assert modes[4:].count(False) >= 12 and True in modes[4:]  # mostly model-free, the model still probed
    s = SourceChoice(warmup=2)
    for _ in range(10):
        m = s.use_model()
        s.record(m, [3] if m else [0], 0.010 if m else 0.006)
    assert s.use_model()  # a model that pays keeps drafting


def slow_heads_recording_modes(drafter: CombinedDrafter, delay_s: float = 0.03) -> list[bool]:
    """Make the model drafter cost ``delay_s`` per proposal (heads much dearer than a tiny target step, as
    on a slow machine) and record, per proposal, whether the model drafter was on."""
    import time

    modes: list[bool] = []
    propose, model_propose = drafter.propose, drafter.model.propose

    def recording(tree, root, rows=None):
        modes.append(drafter.use_model)
        return propose(tree, root, rows=rows)

    def slow(tree, root, rows=None):
        time.sleep(delay_s)
        return model_propose(tree, root, rows=rows)

    drafter.propose, drafter.model.propose = recording, slow
    return modes


def test_heads_that_do_not_pay_switch_off_only_themselves(cycling):
    """Offline, adaptive: heads that cost more than they accept must not stop speculation before the
    model-free drafter beside them has been measured (each source has its own tree policy): the run
    drafts with the model-free drafter alone, and tokens stay those of plain decoding."""
    prompts = [[5, 6, 7, 8, 9] * 3]
    both = SpeculativeGenerator(load_spec_model(cycling["target"], cycling["heads"], also_draft="suffix"))
    plain = both.generate(prompts, GenerationConfig(max_new_tokens=40, speculative=False)).tokens
    modes = slow_heads_recording_modes(both.drafter)
    assert both.generate(prompts, GenerationConfig(max_new_tokens=40, adaptive=True)).tokens == plain
    assert True in modes and modes.count(False) > modes.count(True)


def test_the_inflight_batcher_measures_whether_the_model_drafter_still_pays(cycling):
    """Served (in-flight, adaptive): useless (and slow) heads with suffix beside them. Like the offline
    loop, each batch-size bucket measures steps with the model drafter and steps with the model-free
    drafter alone (SourceChoice), so the model is switched off; tokens stay those of plain decoding."""
    from trtspec.runtime.batch_policy import bucket
    from trtspec.runtime.inflight import InflightBatcher

    prompts = [[5, 6, 7, 8, 9] * 3, [40, 41, 42] * 2 + [7], [3, 4] * 5]
    both = SpeculativeGenerator(load_spec_model(cycling["target"], cycling["heads"], also_draft="suffix"))
    plain = both.generate(prompts, GenerationConfig(max_new_tokens=40, speculative=False)).tokens
    batcher = InflightBatcher(both, max_slots=4, adaptive=True)
    modes = slow_heads_recording_modes(both.drafter)
    outs = batcher.admit(prompts, [GenerationConfig(max_new_tokens=40)] * len(prompts))
    tokens = {o.slot: list(o.tokens) for o in outs}
    while any(not batcher.slots[s].done for s in batcher.live):
        for o in batcher.step():
            tokens[o.slot].extend(o.tokens)
    assert [tokens[o.slot] for o in outs] == plain
    first = batcher.source_choice[bucket(len(prompts))]  # every request in flight: the longest stretch
    assert first.samples[True] and first.samples[False]
    assert True in modes and modes.count(False) > modes.count(True)
    alone = InflightBatcher(
        SpeculativeGenerator(load_spec_model(cycling["target"], cycling["heads"])), 4, adaptive=True
    )
    assert alone.source_choice is None  # nothing to switch to without a model-free drafter
