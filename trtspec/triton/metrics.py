"""Prometheus metrics of the served reference runtime: which families exist and what each step adds.

Why here and not in model.py: the python backend's ``pb_utils.MetricFamily`` only exists inside the
Triton stub, so this module turns a step of the in-flight batcher (runtime.inflight ``StepInfo`` and
``SlotOutput``s) into plain ``Update`` values, testable in-process; model.py creates the families and
applies the updates on the server's metrics port. The names follow what vLLM exports for speculative
decoding (drafted and accepted tokens, acceptance per position), under a ``trtspec_`` prefix.

Updates are cheap to compute; applying one is an IPC round trip to the server, so model.py applies them
on a thread of its own and the decoding loop never waits for Prometheus.
"""

from __future__ import annotations

from dataclasses import dataclass

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"


@dataclass(frozen=True)
class Family:
    name: str
    description: str
    kind: str


FAMILIES = (
    Family("trtspec_draft_tokens_total", "Draft tokens the target verified", COUNTER),
    Family("trtspec_accepted_draft_tokens_total", "Draft tokens the target accepted", COUNTER),
    Family("trtspec_target_steps_total", "Target steps (each over every request in flight)", COUNTER),
    Family("trtspec_speculative_steps_total", "Target steps that verified draft tokens", COUNTER),
    Family(
        "trtspec_acceptance_length",
        "Tokens one request committed in one speculative step (accepted drafts + the bonus token)",
        HISTOGRAM,
    ),
    Family("trtspec_position_drafted_total", "Speculative request-steps whose tree reached this depth", COUNTER),
    Family("trtspec_position_accepted_total", "Speculative request-steps that accepted a draft at this depth", COUNTER),
    Family("trtspec_position_acceptance", "Acceptance rate at this depth since the model loaded", GAUGE),
    Family(
        "trtspec_speculation_active", "1 when the last step verified draft tokens, 0 when it decoded plainly", GAUGE
    ),
    Family("trtspec_draft_depth", "Tree depth of the last step (0 = no speculation)", GAUGE),
    Family("trtspec_batch_size", "Requests in the last target step", GAUGE),
    Family("trtspec_requests_in_flight", "Requests holding a KV-cache slot", GAUGE),
    Family("trtspec_requests_total", "Requests that left their slot, by reason: finished, cancelled, failed", COUNTER),
)


@dataclass(frozen=True)
class Update:
    """One operation on one metric: ``op`` is increment, set or observe."""

    family: str
    labels: tuple[tuple[str, str], ...]
    op: str
    value: float


class StepMetrics:
    """Turns steps into updates; keeps the per-position totals the acceptance gauges are computed from."""

    def __init__(self, model: str, max_depth: int):
        self.model = model
        self.max_depth = max_depth
        self.drafted = [0] * (max_depth + 1)  # [d] = request-steps whose tree reached depth d
        self.accepted = [0] * (max_depth + 1)  # [d] = request-steps that accepted >= d drafts

    def buckets(self) -> list[float]:
        """Histogram buckets of the acceptance length: 1 (only the bonus token) .. max_depth + 1."""
        return [float(k) for k in range(1, self.max_depth + 2)]

    def _labels(self, **extra: str) -> tuple[tuple[str, str], ...]:
        return (("model", self.model), *sorted(extra.items()))

    def step(
        self, batch_size: int, draft_nodes: int, draft_depth: int, accepted: list[int], in_flight: int
    ) -> list[Update]:
        """The updates for one target step: ``accepted`` has each live request's accepted draft count."""
        base = self._labels()
        n = len(accepted)
        out = [
            Update("trtspec_target_steps_total", base, "increment", 1),
            Update("trtspec_batch_size", base, "set", batch_size),
            Update("trtspec_requests_in_flight", base, "set", in_flight),
            Update("trtspec_speculation_active", base, "set", 1 if draft_nodes else 0),
            Update("trtspec_draft_depth", base, "set", draft_depth),
        ]
        if not draft_nodes:
            return out
        out += [
            Update("trtspec_speculative_steps_total", base, "increment", 1),
            Update("trtspec_draft_tokens_total", base, "increment", draft_nodes * n),
            Update("trtspec_accepted_draft_tokens_total", base, "increment", sum(accepted)),
        ]
        out += [Update("trtspec_acceptance_length", base, "observe", a + 1) for a in accepted]
        for d in range(1, min(draft_depth, self.max_depth) + 1):
            hits = sum(1 for a in accepted if a >= d)
            self.drafted[d] += n
            self.accepted[d] += hits
            pos = self._labels(position=str(d))
            out += [
                Update("trtspec_position_drafted_total", pos, "increment", n),
                Update("trtspec_position_accepted_total", pos, "increment", hits),
                Update("trtspec_position_acceptance", pos, "set", self.accepted[d] / self.drafted[d]),
            ]
        return out

    def finished(self, reason: str, in_flight: int) -> list[Update]:
        """A request left its slot (``reason``: finished, cancelled or failed); ``in_flight`` are still held."""
        return [
            Update("trtspec_requests_total", self._labels(reason=reason), "increment", 1),
            Update("trtspec_requests_in_flight", self._labels(), "set", in_flight),
        ]
