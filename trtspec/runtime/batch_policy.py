"""How deep to speculate at a given batch size: TensorRT-LLM's ``draft_len_schedule``, plus measurement.

Why: verifying a tree of N nodes costs about one token's step while a batch is small (the weights are read
once for all rows), but when many requests are in flight the target is compute-bound and every draft node
costs nearly a token of its own. Then speculation that wins at batch 1 loses at batch 32. TensorRT-LLM's
``draft_len_schedule`` (``{batch-size threshold: draft length}``; batch sizes above the largest key get 0)
states that as a table; ``max_concurrency`` is the one-key case. ``schedule_depth`` reads such a table,
``parse_schedule`` validates one the way TensorRT-LLM does, and ``BatchAwareSpeculation`` applies it each
step, optionally with ``runtime.adaptive`` measuring per batch-size bucket whether the allowed depth (or a
shallower one, or none) is fastest with the acceptance the live requests actually have.

The table a served model uses is written to the repository manifest (``draft_len_schedule``).
"""

from __future__ import annotations

from trtspec.errors import UsageError
from trtspec.runtime.adaptive import AdaptiveSpeculation
from trtspec.tree import TreeBuffers, build_tree

#: batch-size buckets the adaptive measurement keeps apart (a batch counts in the smallest bucket >= it)
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def default_schedule(max_depth: int) -> dict[int, int]:
    """The default table, a starting point rather than a measurement of every machine: the full depth for
    one request, at most 2 up to 4 requests, 1 up to 16, none above (where a small CPU is compute-bound and
    every draft node costs about a token). A drafter's acceptance, a faster machine or a larger target
    move the thresholds: scripts/bench_batch_policy.py measures the table for a machine and drafter, and
    deployments pass their own (``triton emit --draft-len-schedule``)."""
    return {k: v for k, v in {1: max_depth, 4: min(max_depth, 2), 16: 1}.items() if max_depth > 0}


def parse_schedule(value, max_depth: int) -> dict[int, int]:
    """A schedule from a dict or ``"1:4,8:2,16:1"`` / JSON text, checked as TensorRT-LLM checks it: keys are
    positive batch sizes, values 0..max_depth, and the smallest key maps to ``max_depth``."""
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return {}
        try:
            import json

            raw = json.loads(text) if text.startswith("{") else dict(p.split(":") for p in text.split(","))
        except ValueError:
            raise UsageError(
                f"draft_len_schedule {value!r} is not a table", fix='write it as "1:4,8:2,16:1" (batch size:depth)'
            ) from None
    else:
        raw = dict(value or {})
    try:
        table = {int(k): int(v) for k, v in raw.items()}
    except (TypeError, ValueError):
        raise UsageError(f"draft_len_schedule {value!r}: batch sizes and depths must be integers") from None
    if not table:
        return {}
    if min(table) < 1 or any(not 0 <= v <= max_depth for v in table.values()):
        raise UsageError(
            f"draft_len_schedule {table}: batch sizes must be >= 1 and depths 0..{max_depth} (the tree's depth)"
        )
    if table[min(table)] != max_depth:
        raise UsageError(
            f"draft_len_schedule {table}: the smallest batch size must map to the full depth {max_depth}",
            fix=f"start the table with {min(table)}:{max_depth}",
        )
    return dict(sorted(table.items()))


def schedule_depth(batch_size: int, schedule: dict[int, int], max_depth: int) -> int:
    """The draft depth for ``batch_size``: the value of the smallest key >= batch_size; 0 above the largest
    key; the full depth when there is no table."""
    if not schedule:
        return max_depth
    for threshold in sorted(schedule):
        if batch_size <= threshold:
            return schedule[threshold]
    return 0


def cut_tree(full: TreeBuffers, depth: int) -> TreeBuffers:
    """The tree's nodes down to ``depth`` (an empty tree = plain decoding)."""
    return build_tree(tuple(c for c in full.choices if len(c) <= depth))


def bucket(batch_size: int) -> int:
    return next((b for b in BUCKETS if batch_size <= b), batch_size)


class BatchAwareSpeculation:
    """Each step's tree from the batch size (the schedule) and, with ``adaptive``, from what each option
    measured at that batch size: ``choose(batch_size)`` before a step, ``record(accepted, wall_s)`` after."""

    def __init__(
        self,
        full: TreeBuffers,
        schedule: dict[int, int] | None = None,
        adaptive: bool = False,
        plain_with: BatchAwareSpeculation | None = None,
    ):
        """``plain_with``: another source's policy over the same batches; plain steps are timed once for both."""
        self.full = full
        self.plain_with = plain_with
        self.schedule = dict(schedule or {})
        self.adaptive = adaptive
        self._trees = {d: cut_tree(full, d) for d in range(full.max_depth + 1)}
        self._policies: dict[tuple[int, int], AdaptiveSpeculation] = {}
        self._last: AdaptiveSpeculation | None = None
        # acceptance is the drafter's and the text's, not the batch size's: every bucket reads and updates
        # the same per-depth estimates (only step times are measured per bucket), so a bucket that probes
        # informs all others and a new bucket skips exploration once acceptance has been measured
        self._accept = [AdaptiveSpeculation.prior_accept**d for d in range(1, full.max_depth + 1)]
        self._seen = [0] * full.max_depth

    def choose(self, batch_size: int, acceptance: list[float | None] | None = None) -> TreeBuffers:
        """The next step's tree. ``acceptance`` (adaptive only): P(accept >= d) per depth averaged over the
        requests in this step, from each one's own measured steps (None where none of them measured that
        depth yet): the decision then follows the batch actually in flight, not the history of the server.
        What the step measures still updates the shared estimates (``record``)."""
        # a table written for a deeper tree (or for speculation that is off) never asks for more than there is
        depth = min(schedule_depth(batch_size, self.schedule, self.full.max_depth), self.full.max_depth)
        self._last = None
        if depth == 0 or not self.adaptive:
            return self._trees[depth]
        self._last = policy = self._policy((bucket(batch_size), depth))
        if acceptance is None or not any(a is not None for a in acceptance):
            return policy.choose()
        policy.accept = [g if a is None else a for a, g in zip(acceptance, self._accept)]
        policy.seen = [max(n, int(a is not None)) for a, n in zip(acceptance, self._seen)]
        try:
            return policy.choose()
        finally:  # record() blends the step's outcome into the shared estimates again
            policy.accept, policy.seen = self._accept, self._seen

    def _policy(self, key: tuple[int, int]) -> AdaptiveSpeculation:
        """The policy of one (batch-size bucket, depth), made on first use."""
        if key not in self._policies:
            policy = AdaptiveSpeculation(self._trees[key[1]])
            policy.accept, policy.seen = self._accept, self._seen  # shared (updated in place by record)
            if self._seen[0]:  # acceptance is known: no exploration, and probe as rarely as the others do
                policy._explored = policy.explore_steps
                policy._interval = max((p._interval for p in self._policies.values()), default=policy.probe_every)
            if self.plain_with is not None:
                policy.share_plain_times(self.plain_with._policy(key))
            self._policies[key] = policy
        return self._policies[key]

    def record(
        self,
        accepted: list[int],
        wall_s: float,
        trimmed: bool = False,
        verified_depth: int | None = None,
        verified_nodes: int | None = None,
    ) -> None:
        """``trimmed``: the step verified less than the chosen tree (AdaptiveSpeculation.record)."""
        if self._last is not None:
            self._last.record(accepted, wall_s, trimmed, verified_depth, verified_nodes)

    def table(self) -> dict[int, int]:
        """The schedule in effect (for manifests and metrics): batch-size threshold -> depth."""
        return dict(self.schedule) if self.schedule else {1: self.full.max_depth}
