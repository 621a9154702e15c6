"""In-flight batching (runtime.inflight): requests that join and leave between steps get exactly what
batch-1 decoding of each alone gives (tokens, and with greedy the very same drafts and acceptance), with
a per-slot KV cache that is reused without recomputing anybody's prefix."""

from __future__ import annotations

from functools import cache

import pytest
import torch
from triton_support import PROMPTS, make_model

from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.demo.tiny import make_tiny_llama
from trtspec.drafters import registry
from trtspec.load import load_spec_model, load_tokenizer
from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator
from trtspec.runtime.inflight import InflightBatcher
from trtspec.tree import build_tree


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("inflight_model"))


#: every registered kind, and a model drafter with a model-free one beside it (--also-draft)
KINDS = [*registry.KINDS, "eagle+ngram"]


@pytest.fixture(scope="module")
def kind_generator(tmp_path_factory):
    """``kind -> SpeculativeGenerator`` on a 12-token target, with that kind's demo heads (``make_demo``).
    Why 12 tokens: random demo heads then get drafts accepted (on a large vocabulary most kinds accept
    none), so the acceptance comparisons below compare something."""
    root = tmp_path_factory.mktemp("inflight_kinds")
    tdir = make_tiny_llama(root / "target", vocab_size=12, num_hidden_layers=3, seed=3)  # 3: room for a draft model
    target = load_hf_causal_lm(tdir)

    @cache  # both tests of a kind share it (InflightBatcher resets its drafter)
    def build(kind: str) -> SpeculativeGenerator:
        model, _, free = kind.partition("+")
        heads = registry.get(model).make_demo(target, root / model)
        also = registry.get(free).make_demo(target, root / free) if free else None
        return SpeculativeGenerator(load_spec_model(tdir, heads, also_draft=also))

    return build


def _medusa(tiny):
    """FasterDecoding-format Medusa heads (``make_model``) on the char-tokenizer target, and its tokenizer."""
    spec = load_spec_model(tiny["target"], tiny["heads"])
    return SpeculativeGenerator(spec), load_tokenizer(spec.target)


def _alone(gen: SpeculativeGenerator, prompt: list[int], cfg: GenerationConfig) -> tuple[list[int], list, list]:
    """Batch-1 decoding of one request: its tokens, accepted drafts per step, and nodes verified per step."""
    steps = list(gen.stream_batch([prompt], cfg))
    tokens = [t for s in steps for t in s.tokens[0]]
    return tokens, [s.accepted[0] for s in steps[1:]], [s.draft_nodes for s in steps[1:]]


def _verifies_as_alone(kind: str, gen: SpeculativeGenerator) -> bool:
    """Does a batch verify, per row, exactly the tree that row would verify alone? Not when the drafter
    may leave nodes undrafted (model-free: the batch verifies every node some row drafted) or schedules
    the depth (the batch verifies the deepest any row asks for): there a row may get a filler or deeper
    node accepted that alone it would not have verified. Tokens are identical either way."""
    model, _, free = kind.partition("+")
    return not free and not registry.get(model).model_free and getattr(gen.drafter, "min_survival", None) is None


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


def _jobs(n: int) -> list[tuple[list[int], GenerationConfig]]:
    """``n`` requests of different lengths (prompts and limits); repetitive prompts, so model-free kinds
    match, and an eos that some requests reach before their limit."""
    prompts = [[(5 * i + 3 * k) % 12 for k in range(2 + i % 4)] * 2 for i in range(n)]
    return [(p, GenerationConfig(max_new_tokens=4 + 3 * i, eos_token_id=11)) for i, p in enumerate(prompts)]


@pytest.mark.parametrize("kind", KINDS)
def test_joining_and_leaving_requests_equal_batch_one(kind, kind_generator):
    gen = kind_generator(kind)
    jobs = _jobs(7)
    batcher = InflightBatcher(gen, max_slots=3, capacity=8)  # 7 requests through 3 slots; the cache grows
    tokens, accepted, slots = _serve(batcher, jobs)
    assert slots == {0, 1, 2} and batcher.free == 3
    exact = _verifies_as_alone(kind, gen)
    for j, (prompt, cfg) in enumerate(jobs):
        alone_tokens, alone_accepted, _ = _alone(gen, prompt, cfg)
        assert tokens[j] == alone_tokens, j
        if exact:  # the same drafts were verified as when it ran alone: acceptance per step is identical
            assert accepted[j] == alone_accepted, j
    assert any(a for acc in accepted.values() for a in acc)  # the drafter did get drafts accepted


#: one depth, six ranks: the first draft's top-6 depends on the drafter's state more visibly than a chain
#: (a random demo drafter's top-1 can be the same token whatever it observed)
WIDE = build_tree(tuple((r,) for r in range(6)))


def _first_draft(batcher: InflightBatcher, prompt: list[int], cfg: GenerationConfig):
    """Admit one request; its admission output and the ``WIDE`` tree the drafter proposes for its first
    step (observing the prompt first, as ``step`` does; ``step`` then proposes its own tree anew)."""
    (out,) = batcher.admit([prompt], [cfg])
    batcher._observe_pending([out.slot])
    return out, batcher.drafter.propose(WIDE, torch.tensor(out.tokens), rows=[out.slot])


@pytest.mark.parametrize("kind", KINDS)
def test_a_reused_slot_drafts_as_if_new(kind, kind_generator):
    """Requests one after another through one slot: each drafts, gets accepted and verifies exactly what
    it would alone, so nothing of the slot's previous request (history, context cache, measures) leaks."""
    gen = kind_generator(kind)
    jobs = _jobs(4)[::-1]  # longest first: a leftover longer history would show
    fresh = [_first_draft(InflightBatcher(gen, max_slots=1), p, c)[1] for p, c in jobs]  # each drafter new
    batcher = InflightBatcher(gen, max_slots=1, capacity=8)
    for (prompt, cfg), want in zip(jobs, fresh):
        first, drafts = _first_draft(batcher, prompt, cfg)
        assert torch.equal(drafts, want)
        tokens, accepted, drafted = list(first.tokens), [], []
        if first.done:
            batcher.release(first.slot)
        while batcher.live:
            for out in batcher.step():
                tokens += out.tokens
                accepted.append(out.accepted)
                drafted.append(out.drafted)
                if out.done:
                    batcher.release(out.slot)
        assert (tokens, accepted, drafted) == _alone(gen, prompt, cfg)


def test_sampled_and_greedy_requests_share_steps(tiny):
    """Each row is verified with its own settings: a sampled request equals its own batch-1 run (same seed)."""
    gen, tok = _medusa(tiny)
    cfgs = [
        GenerationConfig(max_new_tokens=12, temperature=0.0),
        GenerationConfig(max_new_tokens=12, temperature=0.9, seed=5),
        GenerationConfig(max_new_tokens=9, temperature=1.2, top_k=20, seed=11),
    ]
    jobs = [(tok.encode(PROMPTS[i]), c) for i, c in enumerate(cfgs)]
    tokens, _, _ = _serve(InflightBatcher(gen, max_slots=4), jobs, per_admission=3)
    for j, (prompt, cfg) in enumerate(jobs):
        assert tokens[j] == gen.generate([prompt], cfg).tokens[0], j


def test_a_released_slot_is_reused_without_touching_the_others(tiny):
    gen, tok = _medusa(tiny)
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


def test_schedule_turns_speculation_off_for_large_batches(tiny):
    gen, tok = _medusa(tiny)
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


def test_each_request_keeps_its_own_acceptance(tiny):
    gen, tok = _medusa(tiny)
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
