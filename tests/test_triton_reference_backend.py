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
    backend = ReferenceBackend(oracle.gen, speculative=False)
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
