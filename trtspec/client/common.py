"""What every client shares: the request fields (TensorRT-LLM ensemble names) and the result shape.

The request goes to the `ensemble` (or `tensorrt_llm_bls`) model under the tensor names of TensorRT-LLM's
inflight_batcher_llm repository, so these clients work against an engine-backed server unchanged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from trtspec.errors import UsageError

DEFAULT_MODEL = "ensemble"
#: what TensorRT-LLM 1.2's backend sends with return_perf_metrics (+ return_num_*_tokens)
METRIC_NAMES = (
    "acceptance_rate",
    "total_accepted_draft_tokens",
    "total_draft_tokens",
    "num_input_tokens",
    "num_output_tokens",
    "kv_cache_alloc_new_blocks",
    "kv_cache_reused_blocks",
    "kv_cache_alloc_total_blocks",
    "arrival_time_ns",
    "first_scheduled_time_ns",
    "first_token_time_ns",
    "last_token_time_ns",
    # trtspec's reference runtime also sends (tensorrt_llm and tensorrt_llm_bls models): the request's target
    # steps, and its acceptance histogram ([a] = steps that accepted a drafts; a list, not a scalar)
    "trtspec_target_steps",
    "trtspec_acceptance_histogram",
)
#: metrics that are lists (every other one is a scalar)
LIST_METRICS = ("trtspec_acceptance_histogram",)


class ServerError(UsageError):
    """The server answered a request with an error (bad request, model failure): the message is Triton's."""


@dataclass
class GenerateParams:
    max_tokens: int = 64
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    end_id: int | None = None
    stop_words: list[str] | None = None
    return_perf_metrics: bool = True
    #: the token counts are only sent when asked for (return_num_*_tokens), as TensorRT-LLM's backend does
    return_num_tokens: bool = True

    def fields(self, text: str, stream: bool) -> dict[str, Any]:
        """Ensemble input name -> Python value (None fields are left out: the model's default applies)."""
        d: dict[str, Any] = {
            "text_input": text,
            "max_tokens": self.max_tokens,
            "stream": stream,
            "return_perf_metrics": self.return_perf_metrics,
        }
        if self.return_num_tokens:
            d.update(return_num_input_tokens=True, return_num_output_tokens=True)
        for k in ("temperature", "top_k", "top_p", "seed", "end_id"):
            v = getattr(self, k)
            if v is not None:
                d[k] = v
        if self.stop_words:
            d["stop_words"] = list(self.stop_words)
        return d


@dataclass
class GenerateResult:
    """Text and timing of one request; ``piece_times`` are seconds since the request was sent."""

    text: str
    pieces: list[str] = field(default_factory=list)
    piece_times: list[float] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    latency_s: float = 0.0

    @property
    def ttft_s(self) -> float:
        return self.piece_times[0] if self.piece_times else self.latency_s

    @property
    def num_output_tokens(self) -> int:
        return int(self.metrics.get("num_output_tokens", 0))

    @property
    def itl_s(self) -> float | None:
        """Mean inter-token latency of this request: (end - first token) / (tokens - 1)."""
        n = self.num_output_tokens
        if n < 2 or not self.piece_times:
            return None
        return (self.latency_s - self.ttft_s) / (n - 1)

    def acceptance_counts(self) -> tuple[float, float, bool] | None:
        """(accepted draft tokens, target steps, exact) of this request; None when the server sent no draft
        counts. Steps: what the server reports (trtspec_target_steps: exact), else the output tokens after
        the prefill's one, less the accepted drafts (each step commits its accepted drafts and one token of
        its own; only a last step clipped at max_tokens makes this inexact). The stock TensorRT-LLM outputs
        carry no step count, and drafts / max_draft_len is wrong wherever a step drafts less than the most
        (model-free drafters, adaptive and batch-size schedules)."""
        if self.metrics.get("total_draft_tokens") is None:
            return None
        accepted = float(self.metrics.get("total_accepted_draft_tokens", 0))
        steps = self.metrics.get("trtspec_target_steps")
        if steps:
            return accepted, float(steps), True
        rest = self.num_output_tokens - 1 - accepted
        return (accepted, rest, False) if rest > 0 else None

    def mean_acceptance_length(self) -> float | None:
        """Tokens per target step (bonus included) = 1 + accepted / steps."""
        counts = self.acceptance_counts()
        return None if counts is None else 1.0 + counts[0] / counts[1]


def pooled_acceptance_length(results: list[GenerateResult]) -> tuple[float, bool] | None:
    """Mean acceptance length over many requests as vLLM and the offline runtime report it, all accepted
    tokens over all steps (a mean of per-request ratios lets a few short, very predictable requests
    dominate), and whether every request reported its steps."""
    counts = [c for r in results if (c := r.acceptance_counts()) is not None]
    steps = sum(c[1] for c in counts)
    if not counts or not steps:
        return None
    return 1.0 + sum(c[0] for c in counts) / steps, all(c[2] for c in counts)


def per_position_acceptance(histogram: list[int]) -> list[float]:
    """From an acceptance histogram ([a] = steps that accepted a drafts): for depth d = 1.., the fraction of
    steps that accepted at least d draft tokens."""
    n = sum(histogram)
    return [sum(histogram[d:]) / n for d in range(1, len(histogram))] if n else []


def scalar(value: Any) -> Any:
    """First element of a (nested) list / numpy array, or the value itself."""
    while isinstance(value, (list, tuple)) and value:
        value = value[0]
    try:
        import numpy as np

        if isinstance(value, np.ndarray):
            value = value.reshape(-1)[0] if value.size else None
        if isinstance(value, np.generic):
            value = value.item()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    return value


class Timer:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.t0
