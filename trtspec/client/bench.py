"""Load generator: N streaming requests at a fixed concurrency, latency percentiles and acceptance.

Each worker thread owns one client (HTTP connection or gRPC stream) and sends its next request as soon as
the previous one finished (closed loop), which is how serving benchmarks usually define concurrency.
TTFT is the time to the first non-empty text piece; ITL per request is (end - first token) / (tokens - 1)
with the token count the server reports; percentiles are over requests.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field

from trtspec.client.common import GenerateParams, GenerateResult, pooled_acceptance_length

DEFAULT_PROMPTS = (
    "Write a short story about a robot who learns to paint.",
    "Explain why the sky is blue in simple words.",
    "List three tips for staying focused while studying.",
    "What is the capital of France, and what is it famous for?",
    "Describe your ideal weekend in a few sentences.",
    "How do plants make their own food?",
    "Give me a recipe for a simple tomato soup.",
    "Why do cats like to sit in boxes?",
)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    v = sorted(values)
    k = (len(v) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


@dataclass
class BenchResult:
    concurrency: int
    results: list[GenerateResult]
    errors: list[str]
    wall_s: float
    max_draft_len: int | None = None
    label: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def requests_per_s(self) -> float:
        return len(self.results) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def output_tokens_per_s(self) -> float:
        return sum(r.num_output_tokens for r in self.results) / self.wall_s if self.wall_s > 0 else 0.0

    def summary(self) -> dict:
        ttft = [r.ttft_s for r in self.results]
        itl = [r.itl_s for r in self.results if r.itl_s is not None]
        mal = pooled_acceptance_length(self.results)
        drafted = sum(r.metrics.get("total_draft_tokens", 0) for r in self.results)
        accepted = sum(r.metrics.get("total_accepted_draft_tokens", 0) for r in self.results)
        return {
            "label": self.label,
            "concurrency": self.concurrency,
            "requests": len(self.results),
            "errors": len(self.errors),
            "wall_s": self.wall_s,
            "requests_per_s": self.requests_per_s,
            "output_tokens_per_s": self.output_tokens_per_s,
            "ttft_p50_ms": 1e3 * percentile(ttft, 50),
            "ttft_p99_ms": 1e3 * percentile(ttft, 99),
            "itl_p50_ms": 1e3 * percentile(itl, 50),
            "itl_p99_ms": 1e3 * percentile(itl, 99),
            "e2e_p50_ms": 1e3 * percentile([r.latency_s for r in self.results], 50),
            "e2e_mean_ms": 1e3 * statistics.fmean([r.latency_s for r in self.results])
            if self.results
            else float("nan"),
            "mean_acceptance_length": mal[0] if mal is not None else float("nan"),
            # false: the model's outputs carry no step count (the stock ensemble), so steps were inferred
            "acceptance_length_exact": mal[1] if mal is not None else False,
            "acceptance_rate": accepted / drafted if drafted else float("nan"),
        }


def format_summary(s: dict) -> str:
    return (
        f"{s['label'] + ' ' if s['label'] else ''}concurrency {s['concurrency']}: {s['requests']} requests "
        f"({s['errors']} errors) in {s['wall_s']:.2f} s  {s['requests_per_s']:.2f} req/s  "
        f"{s['output_tokens_per_s']:.1f} tok/s  TTFT p50 {s['ttft_p50_ms']:.0f} ms p99 {s['ttft_p99_ms']:.0f} ms  "
        f"ITL p50 {s['itl_p50_ms']:.1f} ms p99 {s['itl_p99_ms']:.1f} ms  "
        f"mean acceptance length {s['mean_acceptance_length']:.2f}"
        + ("" if s.get("acceptance_length_exact", True) else " (steps inferred from token counts)")
    )


def make_client(protocol: str, url: str, model: str):
    if protocol == "grpc":
        from trtspec.client.grpc import GrpcClient

        return GrpcClient(url, model)
    from trtspec.client.http import HttpClient

    return HttpClient(url, model)


def run_bench(
    url: str,
    protocol: str = "http",
    model: str = "ensemble",
    prompts: list[str] | None = None,
    num_requests: int = 16,
    concurrency: int = 1,
    params: GenerateParams | None = None,
    warmup: int = 1,
    label: str = "",
) -> BenchResult:
    """Closed-loop load at ``concurrency``; request i uses prompt i mod len(prompts)."""
    prompts = list(prompts or DEFAULT_PROMPTS)
    params = params or GenerateParams()
    probe = make_client(protocol, url, model)
    max_draft_len = probe.max_draft_len()
    for i in range(warmup):
        probe.generate_stream(prompts[i % len(prompts)], params)
    if hasattr(probe, "close"):
        probe.close()
    next_i, lock = [0], threading.Lock()
    results: list[GenerateResult] = []
    errors: list[str] = []

    def worker() -> None:
        client = make_client(protocol, url, model)
        try:
            while True:
                with lock:
                    i = next_i[0]
                    if i >= num_requests:
                        return
                    next_i[0] += 1
                try:
                    r = client.generate_stream(prompts[i % len(prompts)], params)
                    with lock:
                        results.append(r)
                except Exception as exc:  # counted and reported, the run goes on
                    with lock:
                        errors.append(str(exc))
        finally:
            if hasattr(client, "close"):
                client.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, concurrency))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return BenchResult(concurrency, results, errors, time.perf_counter() - t0, max_draft_len, label)
