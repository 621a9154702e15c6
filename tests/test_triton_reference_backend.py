"""The queue + worker behind the `reference` runtime's tensorrt_llm model, in-process (no server): batched
requests keep their own limits, stop sequences and end ids, and their tokens equal batch-1 decoding."""

from __future__ import annotations

import threading

import pytest
from triton_support import PROMPTS, Oracle, make_model

from trtspec.triton.reference_backend import GenRequest, ReferenceBackend, Reply


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    m = make_model(tmp_path_factory.mktemp("ref_backend_model"))
    return Oracle(m["target"], m["heads"])


class Collector:
    def __init__(self):
        self.replies: list[Reply] = []
        self.done = threading.Event()

    def __call__(self, reply: Reply) -> None:
        self.replies.append(reply)
        if reply.final:
            self.done.set()

    @property
    def tokens(self) -> list[int]:
        return [t for r in self.replies for t in r.tokens]


def _submit(backend, oracle, prompt, n, streaming, **kw):
    c = Collector()
    backend.submit(
        GenRequest(
            prompt=oracle.tok.encode(prompt),
            max_new_tokens=n,
            emit=c,
            streaming=streaming,
            end_id=oracle.tok.eos_token_id,
            **kw,
        )
    )
    return c


def test_batched_requests_match_batch_one(oracle):
    backend = ReferenceBackend(oracle.gen, speculative=True, max_batch_size=8, start=False)
    try:
        jobs = [(PROMPTS[i], 5 + 3 * i, i % 2 == 0) for i in range(8)]
        collectors = [_submit(backend, oracle, p, n, s) for p, n, s in jobs]
        backend.start()  # all eight are queued: they run as one batch
        for c in collectors:
            assert c.done.wait(60)
        for (p, n, streaming), c in zip(jobs, collectors):
            assert c.tokens == list(oracle.tokens(p, n)), (p, n)
            assert sum(r.final for r in c.replies) == 1 and c.replies[-1].final
            assert len(c.replies) > 1 if streaming and n > 1 else len(c.replies) == 1
            last = c.replies[-1]
            assert last.num_output_tokens == len(c.tokens)
            assert last.draft_tokens == last.target_steps * oracle.spec.tree.num_nodes
            assert 0 <= last.accepted_draft_tokens <= last.draft_tokens
        assert backend.batches_run == 1
    finally:
        backend.close()


def test_plain_mode_and_stop_sequences(oracle):
    # the table model.py passes a plain repository (its heads are loaded, speculation is off)
    backend = ReferenceBackend(oracle.gen, speculative=False, schedule={1: oracle.gen.tree.max_depth, 4: 1})
    try:
        prompt = PROMPTS[1]
        full = list(oracle.tokens(prompt, 16))
        stop = full[5:7]
        c = _submit(backend, oracle, prompt, 16, True, stop_sequences=[stop])
        assert c.done.wait(60)
        toks = c.tokens
        # ends at the first occurrence of the stop sequence, which is kept (like TensorRT-LLM)
        first = next(i for i in range(len(full)) if full[i : i + 2] == stop)
        assert toks == full[: first + 2]
        assert c.replies[-1].draft_tokens == 0 and c.replies[-1].accepted_draft_tokens == 0
    finally:
        backend.close()


def test_cancelled_and_failing_requests_are_closed(oracle):
    backend = ReferenceBackend(oracle.gen)
    try:
        c = _submit(backend, oracle, PROMPTS[2], 40, True, cancelled=lambda: True)
        assert c.done.wait(60) and c.replies[-1].final
        bad = Collector()
        backend.submit(GenRequest(prompt=[], max_new_tokens=4, emit=bad))  # the runtime refuses it
        assert bad.done.wait(60) and bad.replies[-1].error and "prompt" in bad.replies[-1].error
        ok = _submit(backend, oracle, PROMPTS[3], 6, False)  # the worker still serves
        assert ok.done.wait(60) and ok.tokens == list(oracle.tokens(PROMPTS[3], 6))
    finally:
        backend.close()


def test_a_request_joins_while_another_runs(oracle):
    """In-flight batching: a short request submitted while a long one streams finishes first, and both are
    exact; the long one is never restarted (one admission each)."""
    backend = ReferenceBackend(oracle.gen, max_batch_size=4)
    try:
        long_c = Collector()
        started = threading.Event()

        def long_emit(reply):
            long_c(reply)
            started.set()

        backend.submit(
            GenRequest(prompt=oracle.tok.encode(PROMPTS[0]), max_new_tokens=60, emit=long_emit, streaming=True)
        )
        assert started.wait(60)
        short = _submit(backend, oracle, PROMPTS[1], 4, True)
        assert short.done.wait(60)
        assert not long_c.done.is_set()  # the short one did not wait for the long one
        assert long_c.done.wait(120)
        assert short.tokens == list(oracle.tokens(PROMPTS[1], 4))
        assert long_c.tokens == list(oracle.gen.generate([oracle.tok.encode(PROMPTS[0])], _greedy(60)).tokens[0])
        assert backend.batches_run == 2 and backend.in_flight == 0 and backend.engine.free == 4
    finally:
        backend.close()


def _greedy(n):
    from trtspec.runtime.generate import GenerationConfig

    return GenerationConfig(max_new_tokens=n)


def test_cancelled_and_disconnected_requests_free_their_slot_at_once(oracle):
    backend = ReferenceBackend(oracle.gen, max_batch_size=2)
    try:
        cancel = threading.Event()
        c = Collector()

        def emit_then_cancel(reply):
            c(reply)
            if len(c.tokens) >= 3:
                cancel.set()  # the client cancels after a few tokens

        backend.submit(
            GenRequest(
                prompt=oracle.tok.encode(PROMPTS[2]),
                max_new_tokens=200,
                emit=emit_then_cancel,
                streaming=True,
                cancelled=cancel.is_set,
            )
        )
        gone = threading.Event()

        def disconnected(reply):  # the client went away: sending raises
            if not reply.final:
                gone.set()
                raise ConnectionError("client disconnected")

        backend.submit(
            GenRequest(prompt=oracle.tok.encode(PROMPTS[3]), max_new_tokens=200, emit=disconnected, streaming=True)
        )
        assert c.done.wait(60) and gone.wait(60)
        assert len(c.tokens) < 200
        ok = _submit(backend, oracle, PROMPTS[4], 6, True)  # both slots are free again and the worker serves
        assert ok.done.wait(60) and ok.tokens == list(oracle.tokens(PROMPTS[4], 6))
        assert backend.in_flight == 0 and backend.engine.free == 2
    finally:
        backend.close()


def test_bad_requests_get_one_clear_error_each(oracle):
    backend = ReferenceBackend(oracle.gen, max_seq_len=64)
    try:
        cases = [
            (GenRequest(prompt=[], max_new_tokens=4, emit=Collector()), "prompt is empty"),
            (GenRequest(prompt=[5, 6], max_new_tokens=0, emit=Collector()), "max_tokens must be >= 1"),
            (GenRequest(prompt=[5] * 60, max_new_tokens=10, emit=Collector()), "lower max_tokens to at most 4"),
        ]
        for req, _ in cases:
            backend.submit(req)
        ok = _submit(backend, oracle, PROMPTS[5], 5, False)
        for req, message in cases:
            c = req.emit
            assert c.done.wait(60) and len(c.replies) == 1 and message in c.replies[0].error
        assert ok.done.wait(60) and ok.tokens == list(oracle.tokens(PROMPTS[5], 5))
    finally:
        backend.close()


def test_replies_carry_per_request_acceptance(oracle):
    backend = ReferenceBackend(oracle.gen)
    try:
        c = _submit(backend, oracle, PROMPTS[6], 20, False)
        assert c.done.wait(60)
        r = c.replies[-1]
        assert sum(r.acceptance_histogram) == r.target_steps
        assert sum(a * n for a, n in enumerate(r.acceptance_histogram)) == r.accepted_draft_tokens
        assert r.tokens_per_step == pytest.approx((r.accepted_draft_tokens + r.target_steps) / r.target_steps)
        pos = r.per_position_acceptance
        assert all(1 >= a >= b >= 0 for a, b in zip(pos, pos[1:]))
    finally:
        backend.close()


@pytest.mark.parametrize("adaptive", [False, True])
def test_heads_with_a_model_free_drafter_beside_them_serve_greedy_text(oracle, adaptive):
    """What ``triton emit --also-draft suffix`` serves: the Medusa heads and the suffix drafter in one
    in-flight batch. Repetitive prompts make the suffix drafter match, so both sources propose; every
    request still gets exactly the plain greedy tokens."""
    from trtspec.load import load_spec_model
    from trtspec.runtime.generate import SpeculativeGenerator

    spec = load_spec_model(oracle.spec.target.path, oracle.spec.drafter.path, also_draft="suffix")
    gen = SpeculativeGenerator(spec)
    backend = ReferenceBackend(gen, speculative=True, max_batch_size=4, adaptive=adaptive, start=False)
    try:
        prompts = ["abc abc abc abc abc", "la la la la la la", *PROMPTS[:2]]
        collectors = [_submit(backend, oracle, p, 24, i % 2 == 0) for i, p in enumerate(prompts)]
        backend.start()
        for c in collectors:
            assert c.done.wait(120)
        for p, c in zip(prompts, collectors):
            assert c.tokens == list(oracle.tokens(p, 24)), p
        if not adaptive:  # (adaptive may stop speculating: the demo heads are random)
            assert gen.drafter.chosen["model-free"] > 0  # the suffix drafter did propose
    finally:
        backend.close()
