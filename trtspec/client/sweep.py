"""A concurrency sweep, speculative and plain in the same run: where does speculation pay under load?

Two servers serve the same target, one speculative and one plain (`trtspec triton emit --no-speculative`).
At each concurrency the sweep runs the closed-loop load (client.bench) against the speculative one, then
the plain one, back to back, so both see the same machine load (on a shared machine, the load drifts
between minutes, not between seconds). Each row is a ``BenchResult.summary()`` with its label; the ratio
line says how speculative compares with plain at that concurrency.
"""

from __future__ import annotations

from collections.abc import Callable

from trtspec.client.bench import format_summary, run_bench
from trtspec.client.common import GenerateParams

SWEEP = (1, 2, 4, 8, 16, 32)


def run_sweep(
    targets: dict[str, str],
    protocol: str,
    model: str,
    prompts: list[str] | None,
    concurrency: tuple[int, ...] = SWEEP,
    requests: int = 16,
    params: GenerateParams | None = None,
    warmup: int = 1,
    echo: Callable[[str], None] = print,
) -> list[dict]:
    """``targets`` maps a label (speculative, plain) to a server URL. Each level sends at least two rounds
    of requests (``max(requests, 2 * concurrency)``) so every stream measures more than its start-up."""
    rows: list[dict] = []
    for i, c in enumerate(concurrency):
        n = max(requests, 2 * c)
        level = {}
        for label, url in targets.items():
            res = run_bench(url, protocol, model, prompts, n, c, params, warmup if i == 0 else 0, label=label)
            s = res.summary()
            rows.append(s)
            level[label] = s
            echo(format_summary(s))
            for e in res.errors[:3]:
                echo(f"  error: {e}")
        if "speculative" in level and "plain" in level and level["plain"]["output_tokens_per_s"] > 0:
            ratio = level["speculative"]["output_tokens_per_s"] / level["plain"]["output_tokens_per_s"]
            echo(f"concurrency {c}: speculative / plain tokens/s = {ratio:.2f}x")
    return rows


def ratios(rows: list[dict]) -> dict[int, float]:
    """Speculative tokens/s over plain tokens/s per concurrency (levels where both ran)."""
    by = {(r["label"], r["concurrency"]): r["output_tokens_per_s"] for r in rows}
    return {
        c: by[("speculative", c)] / by[("plain", c)]
        for (label, c) in by
        if label == "speculative" and by.get(("plain", c))
    }
