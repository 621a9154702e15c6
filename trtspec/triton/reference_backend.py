"""The engine behind the `reference` runtime's `tensorrt_llm` model: requests in, token chunks out.

Triton's python backend calls ``execute`` on one thread; a decoupled model may return at once and answer
later from any thread. So requests go into a queue and one worker thread serves them with in-flight
batching (runtime.inflight): between two target steps it admits waiting requests into free KV-cache slots
(prefilling only their prompts), runs one speculative step over every request in flight, sends each its
new tokens, and frees the slots of finished and cancelled requests at once. A request never waits for
another one to finish. Each request keeps its own limit, sampling settings, stop sequences and acceptance
counts, so batching never mixes requests up; a bad or failing request is answered with an error and
the others go on.

Nothing here imports Triton: the python-backend ``model.py`` converts tensors to ``GenRequest`` and
``Reply`` back to responses (and reports ``StepInfo``/``Reply`` to Prometheus), which keeps this part
testable in-process.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
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
    scheduled_ns: int = 0  # when its prefill ran (TensorRT-LLM's first_scheduled_time_ns)
    first_token_ns: int = 0
    last_token_ns: int = 0
    #: [a] = target steps of this request that accepted a draft tokens (so far)
    acceptance_histogram: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_draft_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Mean acceptance length: tokens committed per target step, the bonus token included."""
        return (self.accepted_draft_tokens + self.target_steps) / self.target_steps if self.target_steps else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        """For depth d = 1..: the fraction of this request's steps that accepted at least d draft tokens."""
        h, n = self.acceptance_histogram, max(self.target_steps, 1)
        return [sum(h[d:]) / n for d in range(1, len(h))]


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

    def config(self, adaptive: bool = False):
        """The request's own GenerationConfig (each slot of an in-flight batch has one)."""
        from trtspec.runtime.generate import GenerationConfig

        return GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            seed=self.seed,
            eos_token_id=self.end_id,
            adaptive=adaptive,
        )


class _Live:
    """Per-request bookkeeping while it is in flight."""

    def __init__(self, req: GenRequest):
        self.req = req
        self.tokens: list[int] = []
        self.done = False
        self.steps = 0
        self.accepted = 0
        self.drafted = 0  # draft tokens verified for this request (shallower trees verify fewer, or none)
        self.histogram: list[int] = []
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
        if self.done:
            return []
        if accepted is not None:
            self.steps += 1
            self.accepted += accepted
            self.drafted += draft_nodes
            if len(self.histogram) <= accepted:
                self.histogram.extend([0] * (accepted + 1 - len(self.histogram)))
            self.histogram[accepted] += 1
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

    def reply(self, tokens: list[int], final: bool, error: str | None = None) -> Reply:
        return Reply(
            tokens=tokens,
            final=final,
            error=error,
            accepted_draft_tokens=self.accepted,
            draft_tokens=self.drafted,
            target_steps=self.steps,
            num_output_tokens=len(self.tokens),
            arrival_ns=self.req.arrival_ns,
            scheduled_ns=self.scheduled_ns,
            first_token_ns=self.first_ns,
            last_token_ns=self.last_ns,
            acceptance_histogram=list(self.histogram),
        )


def _safe_emit(req: GenRequest, reply: Reply) -> None:
    """Send a reply; a client that went away (its sender raises) must not take the worker down."""
    try:
        req.emit(reply)
    except Exception:
        pass


def _is_cancelled(req: GenRequest) -> bool:
    try:
        return bool(req.cancelled())
    except Exception:  # the sender is gone: treat as cancelled
        return True


def serving_compute(dtype: str | None, device: str, threads: int = 0, echo=print):
    """The served runtime's dtype and threads: ``threads`` > 0 is obeyed, else every core the server
    process is given (affinity / cgroup quota); ``dtype`` None or ``auto`` follows the auto policy of
    the machine that serves (trtspec.dtypes), a name is obeyed. Prints the one line every command prints."""
    from trtspec.cpu import configure_threads, setup_compute

    if threads > 0:
        configure_threads(threads)
    return setup_compute(dtype or "auto", device, echo=echo)


class ReferenceBackend:
    """Owns one in-flight batcher over a SpeculativeGenerator and the worker thread that feeds it."""

    def __init__(
        self,
        generator,
        speculative: bool = True,
        max_batch_size: int = 8,
        adaptive: bool = False,
        start: bool = True,
        batch_window_s: float = 0.0,
        schedule: dict[int, int] | None = None,
        max_seq_len: int | None = None,
        on_step: Callable | None = None,
        on_finish: Callable[[Reply, str], None] | None = None,
    ):
        """``max_batch_size`` requests are in flight at most (KV-cache slots); more wait in the queue.
        ``schedule`` is the draft-depth table per batch size (runtime.batch_policy); ``max_seq_len`` the
        longest prompt + max_tokens a request may ask for. ``on_step(StepInfo, outputs)`` and
        ``on_finish(final Reply, reason)`` (reason: finished, cancelled or failed) are called on the worker
        thread (Prometheus metrics in model.py)."""
        from trtspec.runtime.inflight import InflightBatcher

        self.gen = generator
        self.speculative = speculative
        self.adaptive = adaptive  # each step's tree also from measured costs and acceptance (runtime.adaptive)
        self.max_batch_size = max(1, int(max_batch_size))
        self.engine = InflightBatcher(generator, self.max_batch_size, speculative, schedule, adaptive)
        # when idle, wait this long after the first request for others to prefill with it (optional: a
        # request that misses it only waits for the next step, never for a whole batch)
        self.batch_window_s = max(0.0, float(batch_window_s))
        self.max_seq_len = max_seq_len
        self.on_step = on_step
        self.on_finish = on_finish
        self.queue: queue.Queue[GenRequest | None] = queue.Queue()
        self._waiting: deque[GenRequest] = deque()
        self._live: dict[int, _Live] = {}  # slot -> request in flight
        self._thread = threading.Thread(target=self._loop, name="trtspec-reference", daemon=True)
        self._stopping = False
        self.batches_run = 0  # admissions (prefills), each of one or more requests
        self.steps_run = 0
        if start:
            self._thread.start()

    def start(self) -> None:
        """Start the worker (deferred starts let a caller queue several requests first)."""
        if not self._thread.is_alive():
            self._thread.start()

    @property
    def spec_nodes(self) -> int:
        """Draft tokens verified per target step at batch size 1 (tree nodes without the root)."""
        return self.engine.tree.num_nodes if self.engine.drafter is not None else 0

    @property
    def in_flight(self) -> int:
        return len(self._live)

    def submit(self, req: GenRequest) -> None:
        if self._stopping:
            _safe_emit(req, Reply([], True, error="the model is shutting down"))
            return
        self.queue.put(req)

    def close(self, timeout_s: float = 10.0) -> None:
        self._stopping = True
        self.queue.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    # worker -----------------------------------------------------------------------------------
    def _check(self, req: GenRequest) -> str | None:
        """Why a request cannot run (it is answered with this error), or None."""
        if not req.prompt:
            return "the prompt is empty: send at least one token"
        if req.max_new_tokens <= 0:
            return f"max_tokens must be >= 1, got {req.max_new_tokens}"
        if self.max_seq_len and len(req.prompt) >= self.max_seq_len:
            return (
                f"the prompt ({len(req.prompt)} tokens) does not fit max_seq_len {self.max_seq_len}: "
                f"shorten it to at most {self.max_seq_len - 1} tokens"
            )
        if self.max_seq_len and len(req.prompt) + req.max_new_tokens > self.max_seq_len:
            return (
                f"prompt ({len(req.prompt)} tokens) + max_tokens ({req.max_new_tokens}) exceeds max_seq_len "
                f"{self.max_seq_len}: lower max_tokens to at most {max(self.max_seq_len - len(req.prompt), 0)}"
            )
        return None

    def _drain(self, block: bool) -> None:
        """Move submitted requests to the waiting line (blocking for the first one when idle)."""
        try:
            if block:
                item = self.queue.get()
                self._take(item)
                if item is not None and self.batch_window_s:
                    deadline = time.monotonic() + self.batch_window_s
                    while len(self._waiting) < self.engine.free and not self._stopping:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._take(self.queue.get(timeout=left))
            while True:
                self._take(self.queue.get_nowait())
        except queue.Empty:
            pass

    def _take(self, item: GenRequest | None) -> None:
        if item is None:
            self._stopping = True
            return
        error = self._check(item)
        if error:
            _safe_emit(item, Reply([], True, error=error))
        else:
            self._waiting.append(item)

    def _loop(self) -> None:
        while True:
            self._drain(block=not self._live and not self._waiting and not self._stopping)
            if self._stopping and not self._live and not self._waiting:
                return
            self._drop_cancelled()
            self._admit()
            if self._live:
                self._step()

    def _finish(self, slot: int, lv: _Live, reply: Reply, reason: str = "finished") -> None:
        self.engine.release(slot)
        self._live.pop(slot, None)
        lv.done = True
        _safe_emit(lv.req, reply)
        if self.on_finish is not None:
            try:
                self.on_finish(reply, reason)
            except Exception:
                pass

    def _drop_cancelled(self) -> None:
        """Cancelled or disconnected requests leave now: waiting ones are closed, live ones free their slot."""
        kept = deque()
        for r in self._waiting:
            if _is_cancelled(r):
                _safe_emit(r, Reply([], True))
            else:
                kept.append(r)
        self._waiting = kept
        for slot, lv in list(self._live.items()):
            if _is_cancelled(lv.req):
                self._finish(slot, lv, lv.reply([], True), "cancelled")

    def _admit(self) -> None:
        n = min(self.engine.free, len(self._waiting))
        if n == 0:
            return
        reqs = [self._waiting.popleft() for _ in range(n)]
        try:
            outs = self.engine.admit([r.prompt for r in reqs], [r.config(self.adaptive) for r in reqs])
        except Exception as exc:  # e.g. out of memory for a huge prompt: these requests fail, nobody else
            for slot in [i for i, s in enumerate(self.engine.slots) if s is not None and i not in self._live]:
                self.engine.release(slot)
            for r in reqs:
                _safe_emit(r, Reply([], True, error=f"generation failed: {exc.__class__.__name__}: {exc}"))
            return
        self.batches_run += 1
        for r, out in zip(reqs, outs):
            lv = _Live(r)
            self._live[out.slot] = lv
            self._deliver(out.slot, lv, out.tokens, None, 0)

    def _deliver(self, slot: int, lv: _Live, chunk: list[int], accepted: int | None, drafted: int) -> None:
        kept = lv.add(chunk, accepted, drafted)
        if lv.done:
            self._finish(slot, lv, lv.reply(kept if lv.req.streaming else list(lv.tokens), True))
        elif lv.req.streaming and kept:
            try:
                lv.req.emit(lv.reply(kept, False))
            except Exception:  # the client went away mid-stream: free its slot now
                self._finish(slot, lv, lv.reply([], True), "cancelled")

    def _step(self) -> None:
        try:
            outs = self.engine.step()
        except Exception as exc:  # a failing step answers the requests in it; the worker keeps serving
            for slot, lv in list(self._live.items()):
                error = f"generation failed: {exc.__class__.__name__}: {exc}"
                self._finish(slot, lv, lv.reply([], True, error=error), "failed")
            return
        self.steps_run += 1
        if self.on_step is not None and self.engine.last_step is not None:
            try:
                self.on_step(self.engine.last_step, outs)
            except Exception:
                pass
        for out in outs:
            lv = self._live.get(out.slot)
            if lv is not None:
                self._deliver(out.slot, lv, out.tokens, out.accepted, out.drafted)
        for slot, lv in list(self._live.items()):  # the runtime finished it (its own limit / eos)
            if self.engine.slots[slot] is not None and self.engine.slots[slot].done and not lv.done:
                self._finish(slot, lv, lv.reply([] if lv.req.streaming else list(lv.tokens), True))


def parse_bool(value: str | None, default: bool = False) -> bool:
    if value is None or value == "":
        return default
    v = str(value).strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise UsageError(f"expected true/false, got {value!r}")
