"""Speculation that never makes a request slower: choose each step's tree from measured costs and acceptance.

A drafter trained on chat may accept almost nothing on code, another language or random text; then every
tree node is target compute spent for nothing and speculative decoding is slower than plain. This policy
measures, on this machine and this request, what each step costs (wall time per tree option, the minimum
of its recent steps) and how often each depth is accepted (moving averages), and each step picks the
option with the highest expected tokens per second:

    rate(option) = (1 + sum over depths d <= D of P(accept >= d)) / step_time(option)

over the options {no tree (plain), the full tree cut at depth 1, 2, ..., D_max}. Plain decoding's rate is
1 / plain_step_time: the break-even is measured, never a constant. When plain wins, speculation stops;
every ``probe_every`` plain steps one step probes the best speculative option again (a probe that does
not pay doubles the interval, up to ``max_probe_every``), so speculation resumes when the text turns
predictable again. Exploration starts shallow (the tree cut at ``explore_depth``); deeper depths'
acceptance is extrapolated geometrically and unmeasured options' times linearly in their node count,
until a chosen tree measures them. Output is unaffected: the tree only changes which drafts are verified, never what is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trtspec.tree import TreeBuffers, build_tree


@dataclass
class AdaptiveSpeculation:
    """Per-batch tree choice; ``choose`` before a step, ``record`` after it."""

    full: TreeBuffers
    alpha: float = 0.3  # weight of the newest step in the moving averages
    prior_accept: float = 0.6  # P(accept >= 1) before anything is measured (depth d: prior ** d)
    prior_steps: float = 2.0  # the prior weighs as much as this many measured steps (one unlucky step is not proof)
    probe_every: int = 8
    max_probe_every: int = 64
    explore_steps: int = 2  # steps with the exploration tree (cut at ``explore_depth``) before the first decision
    explore_depth: int = 2  # deeper depths are extrapolated until a chosen tree reaches them
    remeasure_every: int = 64  # while speculating, one plain step this often keeps the break-even current
    margin: float = 0.03  # speculate only when it is expected to be this much faster (timing noise)
    window: int = 8  # step times kept per option; the estimate is their minimum
    options: list[TreeBuffers] = field(init=False)
    times: list[list[float]] = field(init=False)
    accept: list[float] = field(init=False)  # accept[d-1] = P(accepted >= d)

    def __post_init__(self) -> None:
        depth = self.full.max_depth
        self.options = [build_tree(())] + [
            build_tree(tuple(c for c in self.full.choices if len(c) <= d)) for d in range(1, depth + 1)
        ]
        self.times = [[] for _ in self.options]
        self.accept = [self.prior_accept**d for d in range(1, depth + 1)]
        self.seen = [0] * depth  # steps that measured each depth
        self._interval = self.probe_every
        self._since_probe = 0
        self._explored = 0
        self._since_plain = 0
        self._last = 0
        #: (wall time, verified nodes) of recent trimmed steps: a model-free drafter whose every step matched
        #: only part of the tree still tells what a node costs, or no speculative option would ever get a time
        self.partial: list[tuple[float, int]] = []

    def share_plain_times(self, other: AdaptiveSpeculation) -> None:
        """Measure plain decoding once for both policies: a plain step costs the same whichever drafter
        sits idle (each source's policy then starts exploring at once instead of re-measuring plain)."""
        self.times[0] = other.times[0]

    # estimates ----------------------------------------------------------------------------------
    def acceptance(self) -> list[float]:
        """P(accept >= d) per depth: measured depths as measured; deeper ones extrapolated geometrically
        from the deepest two measured (never above the depth before them)."""
        out: list[float] = []
        for d, a in enumerate(self.accept):
            if self.seen[d] or d == 0:
                out.append(min(a, out[-1]) if out else a)
                continue
            prev = out[-1]
            ratio = prev / out[-2] if len(out) >= 2 and out[-2] > 0 else prev
            out.append(prev * min(ratio, 1.0))
        return out

    def expected_tokens(self, option: int) -> float:
        """Tokens committed per step with the tree cut at depth ``option`` (0 = plain: one token)."""
        return 1.0 + sum(self.acceptance()[:option])

    def measured_time(self, option: int) -> float | None:
        """The minimum of the option's recent step times: other processes only ever add time, and an
        option's first step (warm-up) counts only until a second one is measured."""
        t = self.times[option]
        if not t:
            return None
        return min(t[1:][-self.window :]) if len(t) > 1 else t[0]

    def estimated_time(self, option: int) -> float | None:
        """Measured, else linear in the tree's nodes through plain and the nearest measured option."""
        t = self.measured_time(option)
        if t is not None:
            return t
        t0 = self.measured_time(0)
        ref = min(
            (k for k in range(1, len(self.options)) if self.measured_time(k) is not None),
            key=lambda k: abs(k - option),
            default=None,
        )
        if t0 is None:
            return None
        if ref is not None:
            per_node = max(self.measured_time(ref) - t0, 0.0) / max(self.options[ref].num_nodes, 1)
        elif self.partial:  # only trimmed steps so far: their mean extra time per verified node
            per_node = max(sum(t for t, _ in self.partial) / len(self.partial) - t0, 0.0) / max(
                sum(n for _, n in self.partial) / len(self.partial), 1
            )
        else:
            return None
        return t0 + per_node * self.options[option].num_nodes

    def rate(self, option: int) -> float | None:
        t = self.estimated_time(option)
        return None if t is None or t <= 0 else self.expected_tokens(option) / t

    def best_speculative(self) -> int:
        rates = [(self.rate(k) or 0.0, k) for k in range(1, len(self.options))]
        return max(rates)[1] if rates else 0

    # the two calls the loop makes ---------------------------------------------------------------
    def choose(self) -> TreeBuffers:
        """The tree for the next step (an empty tree = a plain step)."""
        self._last = self._choose_option()
        return self.options[self._last]

    def _choose_option(self) -> int:
        if len(self.options) == 1:
            return 0
        if len(self.times[0]) < 2:
            return 0  # measure plain decoding (twice: the first step pays warm-up): the break-even
        if self._explored < self.explore_steps:
            return min(self.explore_depth, len(self.options) - 1)
        best = self.best_speculative()
        plain_rate, spec_rate = self.rate(0) or 0.0, self.rate(best) or 0.0
        if spec_rate > plain_rate * (1 + self.margin):
            self._since_plain += 1
            # a narrow win is re-checked against a fresh plain step sooner than a wide one
            every = self.remeasure_every if spec_rate > 1.25 * plain_rate else max(4, self.remeasure_every // 4)
            if self._since_plain >= every:
                self._since_plain = 0
                return 0
            return best
        self._since_probe += 1
        if self._since_probe >= self._interval:  # look again: the text may have turned predictable
            self._since_probe = 0
            return best
        return 0

    def record(
        self,
        accepted: list[int],
        wall_s: float,
        trimmed: bool = False,
        verified_depth: int | None = None,
        verified_nodes: int | None = None,
    ) -> None:
        """What the step chosen by the last ``choose`` cost and accepted (one entry per live sequence).
        ``trimmed``: the drafter filled only part of the tree (model-free, short matches) and the loop
        verified only ``verified_depth`` levels, so the wall time is not this option's cost, and the
        levels nobody drafted say nothing about acceptance. Acceptance is thus measured where the drafter
        drafts; steps where it drafts nothing cost a plain step, so speculating pays exactly when this
        conditional rate beats plain decoding's. ``verified_nodes``: the nodes a trimmed step verified (its
        time then estimates a node's cost until an untrimmed step measures an option)."""
        k = self._last
        if not trimmed:
            self.times[k].append(wall_s)
            del self.times[k][1 : -self.window]  # keep the first (warm-up) sample and a window of recent ones
        elif verified_nodes:
            self.partial = [*self.partial, (wall_s, verified_nodes)][-self.window :]
        if verified_depth is not None:  # equals the chosen depth unless the step was trimmed
            k = min(k, verified_depth)
        if k == 0 or not accepted:
            return
        if self._explored < self.explore_steps:
            self._explored += 1
        n = len(accepted)
        for d in range(1, k + 1):
            hit = sum(1 for a in accepted if a >= d) / n
            # a running mean with the prior as ``prior_steps`` pseudo-steps, then a moving average
            w = max(self.alpha, 1.0 / (self.seen[d - 1] + 1 + self.prior_steps))
            self.accept[d - 1] = (1 - w) * self.accept[d - 1] + w * hit
            self.seen[d - 1] += 1
        if self._explored >= self.explore_steps:
            pays = (self.rate(k) or 0.0) > (self.rate(0) or 0.0) * (1 + self.margin)
            self._interval = self.probe_every if pays else min(2 * self._interval, self.max_probe_every)


@dataclass
class SourceChoice:
    """With a model drafter and a model-free one beside it: keep running the model drafter while that pays.

    Two modes are measured on this request: "model" (the model drafter proposes; the model-free proposal
    replaces it per sequence where it is expected to do better) and "model-free" (the model-free drafter
    alone: no model forward, and plain steps where nothing matches). Each mode's rate is committed tokens
    per sequence per second over its recent steps; the faster one is used, and the other is probed every
    ``probe_every`` steps. So when the model drafter's acceptance falls below its break-even (its tokens no
    longer pay for its forward and its tree), drafting switches to the model-free drafter; only when that
    does not pay either does ``AdaptiveSpeculation`` stop speculating altogether.
    """

    warmup: int = 3  # steps measured in each mode before the first decision
    window: int = 8
    probe_every: int = 16
    samples: dict[bool, list[tuple[float, float]]] = field(init=False)

    def __post_init__(self) -> None:
        self.samples = {True: [], False: []}
        self._since_probe = 0

    def rate(self, use_model: bool) -> float | None:
        """Tokens per sequence per second in that mode (its first step, the warm-up, dropped once others exist)."""
        s = self.samples[use_model]
        s = s[1:][-self.window :] if len(s) > 1 else s
        wall = sum(w for _, w in s)
        return sum(t for t, _ in s) / wall if s and wall > 0 else None

    def use_model(self) -> bool:
        for mode in (True, False):
            if len(self.samples[mode]) < self.warmup:
                return mode
        best = (self.rate(True) or 0.0) >= (self.rate(False) or 0.0)
        self._since_probe += 1
        if self._since_probe >= self.probe_every:
            self._since_probe = 0
            return not best
        return best

    def record(self, used_model: bool, accepted: list[int], wall_s: float) -> None:
        """One step in a mode: ``accepted`` per live sequence (each also committed a bonus token)."""
        if accepted:
            self.samples[used_model].append((1 + sum(accepted) / len(accepted), wall_s))
            del self.samples[used_model][1 : -self.window]
