"""The engine behind the `reference` runtime's `tensorrt_llm` model: requests in, token chunks out.

Triton's python backend calls ``execute`` on one thread; a decoupled model may return at once and answer
later from any thread. So requests go into a queue and one worker thread runs them through trtspec's
SpeculativeGenerator, waiting requests that share a sampling configuration batched together (static
batching: a batch runs to the end before the next one starts). Each request gets its own chunks, limit,
stop sequences and acceptance counts, so batching never mixes requests up.

Nothing here imports Triton: the python-backend ``model.py`` converts tensors to ``GenRequest`` and
``Reply`` back to responses, which keeps this part testable in-process.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from trtspec.errors import UsageError


@dataclass
class Reply:
    """One response for one request: the new tokens (streaming) or all of them (final, non-streaming)."""

    tokens: list[int]
    final: bool
    error: str | None = None
    accepted_draft_tokens: int = 0
    draft_tokens: int = 0
    target_steps: int = 0
    num_output_tokens: int = 0
    arrival_ns: int = 0
    scheduled_ns: int = 0  # when its batch started (TensorRT-LLM's first_scheduled_time_ns)
    first_token_ns: int = 0
    last_token_ns: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_draft_tokens / self.draft_tokens if self.draft_tokens else 0.0


@dataclass
class GenRequest:
    prompt: list[int]
    max_new_tokens: int
    emit: Callable[[Reply], None]
    streaming: bool = False
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    end_id: int | None = None
    stop_sequences: list[list[int]] = field(default_factory=list)
    cancelled: Callable[[], bool] = lambda: False
    arrival_ns: int = field(default_factory=time.time_ns)

    def batch_key(self) -> tuple:
        """Requests that can share one generate loop (the loop takes one sampling config)."""
        return (self.temperature, self.top_k, self.top_p, self.seed, self.end_id)


class _Live:
    """Per-request bookkeeping while its batch runs."""

    def __init__(self, req: GenRequest):
        self.req = req
        self.tokens: list[int] = []
        self.pending: list[int] = []  # non-streaming: everything is sent at the end
        self.done = False
        self.steps = 0
        self.accepted = 0
        self.drafted = 0  # draft tokens verified for this request (adaptive steps verify fewer, or none)
        self.first_ns = 0
        self.last_ns = 0
        self.scheduled_ns = time.time_ns()

    def _stop_hit(self) -> int | None:
        """Length to cut at if a stop sequence ends inside the tokens so far (kept, like TensorRT-LLM)."""
        for seq in self.req.stop_sequences:
            n = len(seq)
            if n == 0:
                continue
            for end in range(max(n, len(self.tokens) - 64), len(self.tokens) + 1):
                if self.tokens[end - n : end] == seq:
                    return end
        return None

    def add(self, chunk: list[int], accepted: int | None, draft_nodes: int = 0) -> list[int]:
        """Take a chunk from the loop (``accepted`` drafts in it; None for the prefill token); returns the
        part this request keeps (clipped at its own limits)."""
        if self.done or not chunk:
            return []
        if accepted is not None:
            self.steps += 1
            self.accepted += accepted
            self.drafted += draft_nodes
        room = self.req.max_new_tokens - len(self.tokens)
        kept = []
        for t in chunk[:room]:
            kept.append(t)
            if self.req.end_id is not None and t == self.req.end_id:
                break
        start = len(self.tokens)
        self.tokens.extend(kept)
        cut = self._stop_hit()
        if cut is not None and cut >= start:
            kept = kept[: cut - start]
            del self.tokens[cut:]
            self.done = True
        now = time.time_ns()
        self.first_ns = self.first_ns or now
        self.last_ns = now
        if len(self.tokens) >= self.req.max_new_tokens or (
            self.tokens and self.req.end_id is not None and self.tokens[-1] == self.req.end_id
        ):
            self.done = True
        return kept

    def reply(self, tokens: list[int], final: bool) -> Reply:
        return Reply(
            tokens=tokens,
            final=final,
            accepted_draft_tokens=self.accepted,
            draft_tokens=self.drafted,
            target_steps=self.steps,
            num_output_tokens=len(self.tokens),
            arrival_ns=self.req.arrival_ns,
            scheduled_ns=self.scheduled_ns,
            first_token_ns=self.first_ns,
            last_token_ns=self.last_ns,
        )


def serving_compute(dtype: str | None, device: str, threads: int = 0, echo=print):
    """The served runtime's dtype and threads: ``threads`` > 0 is obeyed, else every core the server
    process is given (affinity / cgroup quota); ``dtype`` None or ``auto`` follows the auto policy of
    the machine that serves (trtspec.dtypes), a name is obeyed. Prints the one line every command prints."""
    from trtspec.cpu import configure_threads, setup_compute

    if threads > 0:
        configure_threads(threads)
    return setup_compute(dtype or "auto", device, echo=echo)


class ReferenceBackend:
    """Owns one SpeculativeGenerator and the worker thread that feeds it."""

    def __init__(
        self,
        generator,
        speculative: bool = True,
        max_batch_size: int = 8,
        adaptive: bool = False,
        start: bool = True,
        batch_window_s: float = 0.01,
    ):
        self.gen = generator
        self.speculative = speculative
        self.adaptive = adaptive  # each step's tree from measured costs and acceptance (runtime.adaptive)
        self.max_batch_size = max(1, int(max_batch_size))
        # after the first request of a batch, wait this long for more: concurrent clients never arrive in
        # the same microsecond, and a request that just misses a batch waits for the whole batch to finish
        self.batch_window_s = max(0.0, float(batch_window_s))
        self.queue: queue.Queue[GenRequest | None] = queue.Queue()
        self._held: list[GenRequest] = []  # drained from the queue but of another batch key
        self._thread = threading.Thread(target=self._loop, name="trtspec-reference", daemon=True)
        self._stopping = False
        self.batches_run = 0
        if start:
            self._thread.start()

    def start(self) -> None:
        """Start the worker (deferred starts let a caller queue a whole batch first)."""
        if not self._thread.is_alive():
            self._thread.start()

    @property
    def spec_nodes(self) -> int:
        """Draft tokens verified per target step (tree nodes without the root) when speculation is on."""
        on = self.speculative and self.gen.drafter is not None
        return self.gen.tree.num_nodes if on else 0

    def submit(self, req: GenRequest) -> None:
        if self._stopping:
            req.emit(Reply([], True, error="the model is shutting down"))
            return
        self.queue.put(req)

    def close(self, timeout_s: float = 10.0) -> None:
        self._stopping = True
        self.queue.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    # worker -----------------------------------------------------------------------------------
    def _next_batch(self) -> list[GenRequest] | None:
        first = self._held.pop(0) if self._held else self.queue.get()
        if first is None:
            return None
        batch, key = [first], first.batch_key()
        rest = []
        for r in self._held:
            (batch if r.batch_key() == key and len(batch) < self.max_batch_size else rest).append(r)
        self._held = rest
        deadline = time.monotonic() + self.batch_window_s
        while len(batch) < self.max_batch_size:
            try:
                r = (
                    self.queue.get(timeout=max(deadline - time.monotonic(), 0.0))
                    if self.batch_window_s
                    else self.queue.get_nowait()
                )
            except queue.Empty:
                break
            if r is None:
                self._stopping = True
                break
            (batch if r.batch_key() == key else self._held).append(r)
        return batch

    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            try:
                self._run(batch)
            except Exception as exc:  # a failing batch answers its requests, the worker keeps serving
                for r in batch:
                    try:
                        r.emit(Reply([], True, error=f"generation failed: {exc.__class__.__name__}: {exc}"))
                    except Exception:
                        pass
            if self._stopping and self.queue.empty() and not self._held:
                return

    def _run(self, batch: list[GenRequest]) -> None:
        from trtspec.runtime.generate import GenerationConfig

        r0 = batch[0]
        cfg = GenerationConfig(
            max_new_tokens=max(r.max_new_tokens for r in batch),
            temperature=r0.temperature,
            top_k=r0.top_k,
            top_p=r0.top_p,
            seed=r0.seed,
            eos_token_id=r0.end_id,
            speculative=self.speculative,
            adaptive=self.adaptive,
        )
        live = [_Live(r) for r in batch]
        self.batches_run += 1
        for step in self.gen.stream_batch([r.prompt for r in batch], cfg):
            for lv, chunk, accepted in zip(live, step.tokens, step.accepted):
                if lv.done:
                    continue
                if lv.req.cancelled():
                    lv.done = True
                    lv.req.emit(lv.reply([], True))
                    continue
                kept = lv.add(chunk, accepted, step.draft_nodes)
                if lv.req.streaming:
                    if kept or lv.done:
                        lv.req.emit(lv.reply(kept, lv.done))
                elif lv.done:
                    lv.req.emit(lv.reply(list(lv.tokens), True))
            if all(lv.done for lv in live):
                break
        for lv in live:  # the loop ended first (cannot normally happen): close every request anyway
            if not lv.done:
                lv.done = True
                lv.req.emit(lv.reply([] if lv.req.streaming else list(lv.tokens), True))


def parse_bool(value: str | None, default: bool = False) -> bool:
    if value is None or value == "":
        return default
    v = str(value).strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise UsageError(f"expected true/false, got {value!r}")
