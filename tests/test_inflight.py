"""In-flight batching (runtime.inflight): requests that join and leave between steps get exactly what
batch-1 decoding of each alone gives (tokens, and with greedy the very same drafts and acceptance), with
a per-slot KV cache that is reused without recomputing anybody's prefix."""

from __future__ import annotations

import pytest
import torch
from triton_support import PROMPTS, make_model

from trtspec.load import load_spec_model, load_tokenizer
from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator
from trtspec.runtime.inflight import InflightBatcher


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("inflight_model"))


def _generator(tiny, kind: str, tmp_path_factory):
    if kind == "medusa":
        spec = load_spec_model(tiny["target"], tiny["heads"])
    else:  # a draft model with its own KV cache: per-slot drafter state must not mix requests up
        from trtspec.checkpoint.target import load_hf_causal_lm
        from trtspec.checkpoint.truncate import write_truncated_draft

        draft = write_truncated_draft(load_hf_causal_lm(tiny["target"]), 1, tmp_path_factory.mktemp("draft") / "d")
        spec = load_spec_model(tiny["target"], draft, heads_format="draft-model", tree="[[0],[1],[0,0],[0,0,0]]")
    return SpeculativeGenerator(spec), load_tokenizer(spec.target)


def _serve(batcher: InflightBatcher, jobs: list[tuple[list[int], GenerationConfig]], per_admission: int = 2):
    """Admit ``per_admission`` jobs whenever slots are free, step, release finished ones: the order a
    server sees when requests keep arriving. Returns per job (tokens, accepted per step, slots used)."""
    waiting = list(enumerate(jobs))
    owner: dict[int, int] = {}
    tokens: dict[int, list[int]] = {}
    accepted: dict[int, list[int]] = {}
    slots_used: set[int] = set()
    while waiting or batcher.live:
        n = min(batcher.free, len(waiting), per_admission)
        if n:
            batch, waiting = waiting[:n], waiting[n:]
            for (j, _), out in zip(batch, batcher.admit([p for _, (p, _) in batch], [c for _, (_, c) in batch])):
                owner[out.slot], tokens[j], accepted[j] = j, list(out.tokens), []
                slots_used.add(out.slot)
                if out.done:
                    batcher.release(out.slot)
        for out in batcher.step():
            j = owner[out.slot]
            tokens[j].extend(out.tokens)
            accepted[j].append(out.accepted)
            if out.done:
                batcher.release(out.slot)
    return tokens, accepted, slots_used


@pytest.mark.parametrize("kind", ["medusa", "draft-model"])
def test_joining_and_leaving_requests_equal_batch_one(tiny, kind, tmp_path_factory):
    gen, tok = _generator(tiny, kind, tmp_path_factory)
    eos = tok.eos_token_id
    jobs = [(tok.encode(PROMPTS[i]), GenerationConfig(max_new_tokens=4 + 3 * i, eos_token_id=eos)) for i in range(9)]
    batcher = InflightBatcher(gen, max_slots=3, capacity=8)  # 9 requests through 3 slots; the cache grows
    tokens, accepted, slots = _serve(batcher, jobs)
    assert slots == {0, 1, 2} and batcher.free == 3
    for j, (prompt, cfg) in enumerate(jobs):
        alone = [s for s in gen.stream_batch([prompt], cfg)]
        assert tokens[j] == [t for s in alone for t in s.tokens[0]], j
        # the same drafts were verified as when it ran alone: acceptance per step is identical
        assert accepted[j] == [s.accepted[0] for s in alone[1:]], j
    assert any(a for acc in accepted.values() for a in acc)  # the drafter did get drafts accepted


def test_sampled_and_greedy_requests_share_steps(tiny, tmp_path_factory):
    """Each row is verified with its own settings: a sampled request equals its own batch-1 run (same seed)."""
    gen, tok = _generator(tiny, "medusa", tmp_path_factory)
    cfgs = [
        GenerationConfig(max_new_tokens=12, temperature=0.0),
        GenerationConfig(max_new_tokens=12, temperature=0.9, seed=5),
        GenerationConfig(max_new_tokens=9, temperature=1.2, top_k=20, seed=11),
    ]
    jobs = [(tok.encode(PROMPTS[i]), c) for i, c in enumerate(cfgs)]
    tokens, _, _ = _serve(InflightBatcher(gen, max_slots=4), jobs, per_admission=3)
    for j, (prompt, cfg) in enumerate(jobs):
        assert tokens[j] == gen.generate([prompt], cfg).tokens[0], j


def test_a_released_slot_is_reused_without_touching_the_others(tiny, tmp_path_factory):
    gen, tok = _generator(tiny, "medusa", tmp_path_factory)
    b = InflightBatcher(gen, max_slots=2)
    cfg = GenerationConfig(max_new_tokens=30)
    long_one, short_one = tok.encode(PROMPTS[0]), tok.encode(PROMPTS[1])
    first = b.admit([long_one, short_one], [cfg, GenerationConfig(max_new_tokens=2)])
    out = {o.slot: list(o.tokens) for o in first}
    b.step()  # the short one finishes (2 tokens) ...
    b.release(first[1].slot)
    kept_len = int(b.cache.lengths[first[0].slot])
    again = b.admit([tok.encode(PROMPTS[2])], [GenerationConfig(max_new_tokens=3)])
    assert again[0].slot == first[1].slot  # ... and its slot takes the next request
    assert int(b.cache.lengths[first[0].slot]) == kept_len  # the long one's prefix was not recomputed
    with pytest.raises(ValueError, match="free slots"):
        b.admit([short_one], [cfg])
    with pytest.raises(ValueError, match="at least one token"):
        b.admit([[]], [cfg])
    del out


def test_schedule_turns_speculation_off_for_large_batches(tiny, tmp_path_factory):
    gen, tok = _generator(tiny, "medusa", tmp_path_factory)
    depth = gen.tree.max_depth
    b = InflightBatcher(gen, max_slots=4, schedule={1: depth, 2: 1})
    cfg = GenerationConfig(max_new_tokens=6)
    b.admit([tok.encode(PROMPTS[0])], [cfg])
    b.step()
    assert b.last_step.batch_size == 1 and b.last_step.draft_nodes == gen.tree.num_nodes
    b.admit([tok.encode(PROMPTS[1])], [cfg])
    b.step()
    assert b.last_step.batch_size == 2 and 0 < b.last_step.draft_nodes < gen.tree.num_nodes
    b.admit([tok.encode(PROMPTS[2]), tok.encode(PROMPTS[3])], [cfg, cfg])
    outs = b.step()
    assert b.last_step.batch_size == 4 and b.last_step.draft_nodes == 0
    assert all(o.accepted == 0 and o.drafted == 0 for o in outs)


def test_each_request_keeps_its_own_acceptance(tiny, tmp_path_factory):
    gen, tok = _generator(tiny, "medusa", tmp_path_factory)
    b = InflightBatcher(gen, max_slots=2)
    outs = b.admit([tok.encode(PROMPTS[0]), tok.encode(PROMPTS[1])], [GenerationConfig(max_new_tokens=12)] * 2)
    accepted = {o.slot: [] for o in outs}
    while any(not b.slots[s].done for s in accepted):
        for o in b.step():
            accepted[o.slot].append(o.accepted)
    for s, acc in accepted.items():  # the moving average of its own steps, nobody else's
        est = None
        for a in acc:
            est = float(a >= 1) if est is None else 0.7 * est + 0.3 * float(a >= 1)
        assert b.slots[s].accept[0] == pytest.approx(est)
    live = b._live_acceptance(list(accepted))
    assert live[0] == pytest.approx(sum(b.slots[s].accept[0] for s in accepted) / 2)
