"""Human-readable metric lines and tables, shared by generate, demo and the benchmarks."""

from __future__ import annotations

from collections.abc import Sequence

from trtspec.runtime.generate import SpecMetrics


def metrics_lines(m: SpecMetrics) -> list[str]:
    pos = " ".join(f"{p:.2f}" for p in m.per_position_acceptance) or "-"
    hist = " ".join(str(h) for h in m.acceptance_histogram) or "-"
    return [
        f"mean acceptance length {m.mean_acceptance_length:.3f} tokens/step (bonus included)",
        f"per-position acceptance {pos}",
        f"accepted-drafts histogram {hist}",
        f"target steps {m.target_steps} ({m.speculative_steps} speculative), new tokens {m.new_tokens}, "
        f"draft tokens {m.draft_tokens}, accepted {m.accepted_draft_tokens}",
        f"wall {m.wall_s:.3f}s (prefill {m.prefill_s:.3f}s), {m.tokens_per_s:.1f} tokens/s",
    ]


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(c: object) -> str:
    return f"{c:.3f}" if isinstance(c, float) else str(c)
