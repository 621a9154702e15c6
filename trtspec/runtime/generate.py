"""The speculative decoding loop (the oracle every kernel, engine and server path is checked against).

Four flat steps, each a short function over one ``Batch`` of sequences:

    prefill  -> the target reads the prompts; the first token is picked; the drafter observes the prompts
    propose  -> the drafter turns what it observed into a tree of token ids [B, tree.size]
    verify   -> the target runs [root + tree] with the tree mask and depth offsets; greedy or lossless
                sampling picks the accepted path and the bonus token per sequence
    commit   -> the KV cache keeps root + accepted nodes; the tokens are clipped at eos / max tokens; the
                target's hidden states at the kept nodes wait for the drafter, which observes them before
                its next proposal (with ``adaptive``, steps without a tree let them pile up)

Plain decoding is the same loop with an empty tree, so "speculative == plain" compares two runs of the
very same model code. Metrics are values: every step returns its own ``SpecMetrics`` and callers
``merge`` them; nothing is stored on the generator between calls.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace

import torch

from trtspec.drafters import registry
from trtspec.drafters.base import Drafter
from trtspec.drafters.combined import CombinedDrafter
from trtspec.drafters.proposers import pad_rows
from trtspec.models.llama import KVCache, LlamaModel, build_llama, causal_mask
from trtspec.models.packed import pack_if_bf16
from trtspec.models.small_rows import tune_small_rows
from trtspec.runtime.adaptive import AdaptiveSpeculation, SourceChoice
from trtspec.runtime.ops import verify_greedy_op
from trtspec.runtime.verify import VerifyResult, process_logits, verify_greedy, verify_sampling
from trtspec.spec import SpecModel
from trtspec.tree import TreeBuffers, build_tree


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    eos_token_id: int | list[int] | None = None
    speculative: bool = True
    #: choose each step's tree (down to none) from measured step costs and acceptance (runtime.adaptive);
    #: off by default here so the oracle's step count is a function of its inputs alone
    adaptive: bool = False
    #: greedy verification through the torch operator ``trtspec::tree_verify`` (runtime.ops) instead of
    #: verify.py's loop: the path the PyTorch backend and the CUDA kernels take; same tokens
    kernel_ops: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class SpecMetrics:
    """Acceptance metrics as the field reports them (vLLM / TensorRT-LLM naming in to_dict)."""

    target_steps: int = 0  # target forward passes after the prefill (batched)
    sequence_steps: int = 0  # (sequence, step) pairs that produced tokens
    draft_tokens: int = 0  # draft tokens verified (tree nodes x sequence steps)
    accepted_draft_tokens: int = 0
    new_tokens: int = 0
    wall_s: float = 0.0
    prefill_s: float = 0.0
    acceptance_histogram: list[int] = field(default_factory=list)  # [a] = steps that accepted a drafts
    max_depth: int = 0
    speculative_steps: int = 0  # target steps that verified a draft tree (adaptive runs skip some)

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens committed per target step per sequence, the bonus token included."""
        return (self.accepted_draft_tokens + self.sequence_steps) / max(self.sequence_steps, 1)

    @property
    def per_position_acceptance(self) -> list[float]:
        """For depth d = 1..D: the fraction of steps that accepted at least d draft tokens."""
        h, n = self.acceptance_histogram, max(self.sequence_steps, 1)
        return [sum(h[d:]) / n for d in range(1, self.max_depth + 1)]

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def merge(self, other: SpecMetrics) -> SpecMetrics:
        """The metrics of both runs (or steps) together; neither operand changes."""
        n = max(len(self.acceptance_histogram), len(other.acceptance_histogram))
        hist = [
            (self.acceptance_histogram[i] if i < len(self.acceptance_histogram) else 0)
            + (other.acceptance_histogram[i] if i < len(other.acceptance_histogram) else 0)
            for i in range(n)
        ]
        return SpecMetrics(
            target_steps=self.target_steps + other.target_steps,
            sequence_steps=self.sequence_steps + other.sequence_steps,
            draft_tokens=self.draft_tokens + other.draft_tokens,
            accepted_draft_tokens=self.accepted_draft_tokens + other.accepted_draft_tokens,
            new_tokens=self.new_tokens + other.new_tokens,
            wall_s=self.wall_s + other.wall_s,
            prefill_s=self.prefill_s + other.prefill_s,
            acceptance_histogram=hist,
            max_depth=max(self.max_depth, other.max_depth),
            speculative_steps=self.speculative_steps + other.speculative_steps,
        )

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            mean_acceptance_length=self.mean_acceptance_length,
            per_position_acceptance=self.per_position_acceptance,
            tokens_per_s=self.tokens_per_s,
            acceptance_rate=self.accepted_draft_tokens / max(self.draft_tokens, 1),
        )
        return d


def step_metrics(
    accepted: list[int | None], new_tokens: int, draft_nodes: int, max_depth: int, wall_s: float
) -> SpecMetrics:
    """One target step's metrics; ``accepted`` has None for sequences that had already finished."""
    live = [a for a in accepted if a is not None]
    hist = [0] * (max(live + [max_depth]) + 1)
    for a in live:
        hist[a] += 1
    return SpecMetrics(
        target_steps=1,
        sequence_steps=len(live),
        draft_tokens=draft_nodes * len(live),
        accepted_draft_tokens=sum(live),
        new_tokens=new_tokens,
        wall_s=wall_s,
        acceptance_histogram=hist,
        max_depth=max_depth,
        speculative_steps=int(draft_nodes > 0),
    )


@dataclass(frozen=True)
class StepOutput:
    """What one iteration of the loop committed, per sequence: the new tokens (clipped at eos and
    max_new_tokens), the number of draft tokens the target accepted (None for the prefill's first token
    and for sequences that had already finished), and this step's metrics alone."""

    tokens: list[list[int]]
    accepted: list[int | None]
    metrics: SpecMetrics
    draft_nodes: int = 0  # draft tokens this step verified per live sequence (0 = a plain step)


@dataclass
class GenerationResult:
    tokens: list[list[int]]
    metrics: SpecMetrics


@dataclass
class Batch:
    """The loop's state for one batch of sequences: the target's KV cache, the next root token per
    sequence, what each sequence produced, and which are done."""

    cache: KVCache
    root: torch.Tensor  # [B] the last committed token, not yet fed to the target
    produced: list[list[int]]
    done: list[bool]
    eos: frozenset[int]
    cfg: GenerationConfig
    steps: int = 0
    #: what the target committed since the drafter last observed (steps without a tree defer it)
    pending: list[tuple] = field(default_factory=list)


def eos_set(eos) -> frozenset[int]:
    if eos is None:
        return frozenset()
    return frozenset({int(eos)} if isinstance(eos, int) else {int(e) for e in eos})


def pick_token(logits: torch.Tensor, cfg: GenerationConfig, gen: torch.Generator) -> torch.Tensor:
    """Greedy or sampled token per row (the prefill's first token: no draft to verify yet)."""
    if cfg.greedy:
        return logits.argmax(-1)
    probs = process_logits(logits, cfg.temperature, cfg.top_k, cfg.top_p)
    return torch.multinomial(probs, 1, generator=gen).flatten()


def clip_tokens(produced: list[int], new: list[int], cfg: GenerationConfig, eos: frozenset[int]) -> list[int]:
    """The committed tokens a sequence keeps: up to max_new_tokens, through the first eos."""
    out = []
    for t in new[: cfg.max_new_tokens - len(produced)]:
        out.append(t)
        if t in eos:
            break
    return out


def finished(produced: list[int], cfg: GenerationConfig, eos: frozenset[int]) -> bool:
    return len(produced) >= cfg.max_new_tokens or (bool(produced) and produced[-1] in eos)


def prefill(
    target: LlamaModel, drafter: Drafter | None, prompts: list[list[int]], cfg: GenerationConfig, tree: TreeBuffers
) -> tuple[Batch, StepOutput]:
    """Run the prompts through the target, pick each sequence's first token, let the drafter observe."""
    t0 = time.perf_counter()
    B = len(prompts)
    longest = max(len(p) for p in prompts)
    capacity = longest + cfg.max_new_tokens + tree.size + 1
    cache = target.new_cache(B, capacity)
    ids, valid = pad_rows([torch.tensor(p, dtype=torch.long) for p in prompts])
    positions = torch.arange(ids.shape[1])[None].expand(B, -1)
    aux_layers = drafter.aux_layers if drafter is not None else ()
    hidden, aux = target(ids, positions, cache, causal_mask(ids.shape[1]) & valid[:, None, :], aux_layers)
    lengths = valid.sum(1)
    cache.commit([torch.arange(int(n)) for n in lengths])
    last = hidden[torch.arange(B), lengths - 1]
    root = pick_token(target.logits(last), cfg, torch.Generator().manual_seed(cfg.seed))
    if drafter is not None:
        drafter.reset(B, capacity)
        aux_cat = torch.cat(aux, -1) if aux else None
        drafter.observe(
            [hidden[b, : lengths[b]] for b in range(B)],
            [aux_cat[b, : lengths[b]] for b in range(B)] if aux_cat is not None else None,
            [ids[b, : lengths[b]] for b in range(B)],
            [torch.cat([ids[b, 1 : lengths[b]], root[b : b + 1]]) for b in range(B)],
        )
    eos = eos_set(cfg.eos_token_id)
    produced = [[int(root[b])] for b in range(B)]
    batch = Batch(cache, root, produced, [finished(p, cfg, eos) for p in produced], eos, cfg)
    wall = time.perf_counter() - t0
    metrics = SpecMetrics(new_tokens=B, wall_s=wall, prefill_s=wall, max_depth=tree.max_depth)
    return batch, StepOutput([list(p) for p in produced], [None] * B, metrics)


def propose(drafter: Drafter | None, tree: TreeBuffers, batch: Batch) -> torch.Tensor:
    """The draft tree's tokens [B, tree.size] (column 0 = root); just the root when not speculating."""
    return drafter.propose(tree, batch.root) if drafter is not None else batch.root[:, None]


def trim_to_drafted(
    tree: TreeBuffers, drafts: torch.Tensor, drafted: torch.Tensor | None, done: list[bool], trees: dict
) -> tuple[TreeBuffers, torch.Tensor]:
    """The step's tree cut to the nodes some live sequence (``done[b]`` False) drafted
    (``Drafter.drafted``), and those columns of the drafts: a model-free drafter that matched little
    costs the target little, and one that matched nothing costs a plain step. A drafted node's parent is
    drafted, so the cut is a tree; node order is kept (both trees sort choices the same way). ``trees``
    caches the cut trees."""
    if drafted is None:
        return tree, drafts
    live = torch.tensor([not d for d in done])
    keep = (drafted[live] if live.any() else drafted).any(0)
    if bool(keep.all()):
        return tree, drafts
    nodes = tuple(int(n) for n in torch.nonzero(keep[1:]).flatten() + 1)
    key = (tree.choices, nodes)
    if key not in trees:
        trees[key] = build_tree(tuple(tree.choices[n - 1] for n in nodes))
    return trees[key], drafts[:, [0, *nodes]]


_SUBTREES: dict[tuple, TreeBuffers] = {}


def scheduled(drafter: Drafter, tree: TreeBuffers, drafts: torch.Tensor) -> tuple[TreeBuffers, torch.Tensor]:
    """Confidence-scheduled verification: a drafter with ``verify_depth(tree)`` (one that predicts how
    deep its draft survives) may ask for only the tree's nodes up to that depth to be verified. Nodes are
    sorted by depth, so that subtree is a prefix of the draft columns; output is unaffected."""
    depth_of = getattr(drafter, "verify_depth", None)
    k = depth_of(tree) if depth_of is not None else tree.max_depth
    if k >= tree.max_depth:
        return tree, drafts
    key = (tree.choices, k)
    if key not in _SUBTREES:
        _SUBTREES[key] = build_tree(tuple(c for c in tree.choices if len(c) <= k))
    sub = _SUBTREES[key]
    return sub, drafts[:, : sub.size]


def to_verify(
    drafter: Drafter, tree: TreeBuffers, drafts: torch.Tensor, done: list[bool], trees: dict
) -> tuple[TreeBuffers, torch.Tensor]:
    """The part of a proposal the target verifies, shared by the oracle loop and in-flight batching:
    only as deep as the drafter asks (``scheduled``), then only the nodes some live sequence drafted
    (``trim_to_drafted``; ``trees`` caches its cut trees). Output is unaffected; the cost is not."""
    tree, drafts = scheduled(drafter, tree, drafts)  # a prefix of the columns
    drafted = drafter.drafted()
    drafted = drafted[:, : tree.size] if drafted is not None else None
    return trim_to_drafted(tree, drafts, drafted, done, trees)


def verify(
    target: LlamaModel, tree: TreeBuffers, drafts: torch.Tensor, batch: Batch, aux_layers: tuple[int, ...]
) -> tuple[VerifyResult, torch.Tensor, tuple[torch.Tensor, ...]]:
    """One target forward over [root + tree]; the accepted path and bonus token per sequence, plus the
    hidden states (and aux layers') the drafter will observe at the kept nodes."""
    positions = batch.cache.lengths[:, None] + tree.depths[None, :]
    hidden, aux = target(drafts, positions, batch.cache, tree.mask[None], aux_layers)
    logits = target.logits(hidden)
    cfg = batch.cfg
    if cfg.greedy:
        walk = verify_greedy_op if cfg.kernel_ops else verify_greedy
        return walk(tree, drafts, logits.argmax(-1)), hidden, aux
    probs = process_logits(logits, cfg.temperature, cfg.top_k, cfg.top_p)
    return verify_sampling(tree, drafts, probs, seed=cfg.seed * 1_000_003 + batch.steps), hidden, aux


def commit(
    drafter: Drafter | None,
    tree: TreeBuffers,
    batch: Batch,
    drafts: torch.Tensor,
    res: VerifyResult,
    hidden: torch.Tensor,
    aux: tuple[torch.Tensor, ...],
) -> tuple[list[list[int]], list[int | None]]:
    """Keep root + accepted nodes in the KV cache, hand each live sequence its new tokens, and queue the
    target's states at the kept nodes for the drafter (it observes them before its next proposal)."""
    keep = [torch.tensor(k, dtype=torch.long) for k in res.keep_nodes]
    batch.cache.commit(keep)
    batch.steps += 1
    fresh: list[list[int]] = []
    accepted: list[int | None] = []
    for b in range(len(batch.produced)):
        if batch.done[b]:
            fresh.append([])
            accepted.append(None)
            continue
        new = clip_tokens(batch.produced[b], res.tokens[b], batch.cfg, batch.eos)
        batch.produced[b].extend(new)
        batch.done[b] = finished(batch.produced[b], batch.cfg, batch.eos)
        fresh.append(new)
        accepted.append(res.accepted_len[b])
    batch.root = torch.tensor(res.bonus, dtype=torch.long)
    if drafter is not None:  # observed before the next proposal (observe_pending), in one call
        B = len(keep)
        aux_cat = torch.cat(aux, -1) if aux else None
        batch.pending.append(
            (
                [hidden[b, keep[b]] for b in range(B)],
                [aux_cat[b, keep[b]] for b in range(B)] if aux_cat is not None else None,
                [drafts[b, keep[b]] for b in range(B)],
                [torch.tensor(res.tokens[b]) for b in range(B)],
            )
        )
    return fresh, accepted


def observe_pending(drafter: Drafter, batch: Batch) -> None:
    """Hand the drafter everything committed since it last looked, one observation per sequence: after
    plain steps of an adaptive run it catches up in one forward instead of one per skipped step."""
    chunks, batch.pending = batch.pending, []
    if not chunks:
        return
    if len(chunks) == 1:
        drafter.observe(*chunks[0])
        return
    B = len(chunks[0][0])

    def joined(i: int) -> list[torch.Tensor] | None:
        return None if chunks[0][i] is None else [torch.cat([c[i][b] for c in chunks]) for b in range(B)]

    drafter.observe(joined(0), joined(1), joined(2), joined(3))


def decode(
    target: LlamaModel, drafter: Drafter | None, tree: TreeBuffers, prompts: list[list[int]], cfg: GenerationConfig
) -> Iterator[StepOutput]:
    """The whole loop: prefill, then propose -> verify -> commit until every sequence is done. With no
    drafter (or an empty tree) it is plain decoding through the same code."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if cfg.max_new_tokens <= 0:
        raise ValueError("max_new_tokens must be >= 1")
    if drafter is None or tree.num_nodes == 0:
        drafter, tree = None, build_tree(())
    adaptive = cfg.adaptive and drafter is not None
    # a model drafter with a model-free one beside it: adaptive runs measure whether the model still pays.
    # Each source has its own tree policy (its own acceptance, its own plain-or-speculate decision), so
    # heads that do not pay stop only themselves: the model-free drafter still gets measured
    switch = SourceChoice() if adaptive and isinstance(drafter, CombinedDrafter) else None
    policies = {mode: AdaptiveSpeculation(tree) for mode in ((True, False) if switch else (True,))} if adaptive else {}
    if switch is not None:
        policies[False].share_plain_times(policies[True])
    batch, first = prefill(target, drafter, prompts, cfg, tree)
    yield first
    aux_layers = drafter.aux_layers if drafter is not None else ()
    trimmed_trees: dict = {}
    while not all(batch.done):
        if switch is not None:
            drafter.use_model = switch.use_model()
        policy = policies.get(drafter.use_model if switch is not None else True)
        step_tree = policy.choose() if policy is not None else tree
        t0 = time.perf_counter()
        speculating = drafter is not None and step_tree.num_nodes > 0
        chosen_tree = step_tree
        if speculating:
            observe_pending(drafter, batch)
        drafts = propose(drafter if speculating else None, step_tree, batch)
        if speculating:
            step_tree, drafts = to_verify(drafter, step_tree, drafts, batch.done, trimmed_trees)
        res, hidden, aux = verify(target, step_tree, drafts, batch, aux_layers)
        fresh, accepted = commit(drafter, step_tree, batch, drafts, res, hidden, aux)
        wall = time.perf_counter() - t0
        live = [a for a in accepted if a is not None]
        if policy is not None:
            policy.record(
                live,
                wall,
                trimmed=step_tree is not chosen_tree,
                verified_depth=step_tree.max_depth,
                verified_nodes=step_tree.num_nodes,
            )
        if switch is not None:  # plain steps too: a source's rate includes its policy's choice to not speculate
            switch.record(drafter.use_model, live, wall)
        yield StepOutput(
            fresh,
            accepted,
            step_metrics(accepted, sum(len(f) for f in fresh), step_tree.num_nodes, tree.max_depth, wall),
            step_tree.num_nodes,
        )


class SpeculativeGenerator:
    """The target and drafter modules, built once from a SpecModel, and the loop's public entry points."""

    def __init__(self, spec: SpecModel, device: str = "cpu", dtype: torch.dtype | None = None):
        """``dtype`` defaults to float32 on a CPU (the exact oracle) and to the checkpoint's elsewhere. In
        bfloat16 on a CPU with oneDNN bfloat16 kernels the target's and drafter's matmuls are pre-packed
        (models.packed): a tree then costs the target about what one token does."""
        self.spec = spec
        self.dtype = dtype or (torch.float32 if device == "cpu" and spec.dtype != torch.float64 else spec.dtype)
        self.target = build_llama(spec.target.arch, spec.target.tensors, self.dtype).to(device)
        self.device = device
        self.drafter: Drafter | None = None
        if spec.drafter is not None:
            self.drafter = registry.get(spec.drafter.kind).build(spec.drafter, self.target, self.dtype)
        if spec.drafter is not None and spec.also is not None:  # a model-free drafter beside the model's
            free = registry.get(spec.also.kind).build(spec.also, self.target, self.dtype)
            self.drafter = CombinedDrafter(self.drafter, free)
        self.packed = pack_if_bf16(self.target, self.dtype, device)
        if self.packed and self.drafter is not None:
            self.drafter.pack(self.target.lm_head)
        #: unpacked (float32) on a CPU: the target's matmuls for a step's few rows, as measured fastest here
        self.small_rows = {} if self.packed else tune_small_rows(self.target, self.dtype, device)
        if self.small_rows and self.drafter is not None:
            self.drafter.tune_small_rows(self.target.lm_head, self.dtype, device)
        #: the spec's tree; a call may pass another one (trees are values, never swapped on the generator)
        self.tree: TreeBuffers = build_tree(spec.tree.choices)

    @torch.no_grad()
    def stream_batch(
        self, prompts: list[list[int]], cfg: GenerationConfig, tree: TreeBuffers | None = None
    ) -> Iterator[StepOutput]:
        """Yield, after the prefill and after every target step, what each sequence committed."""
        drafter = self.drafter if cfg.speculative else None
        yield from decode(self.target, drafter, tree if tree is not None else self.tree, prompts, cfg)

    def generate(
        self, prompts: list[list[int]], cfg: GenerationConfig | None = None, tree: TreeBuffers | None = None
    ) -> GenerationResult:
        cfg = cfg or GenerationConfig()
        out: list[list[int]] = [[] for _ in prompts]
        metrics = SpecMetrics()
        for step in self.stream_batch(prompts, cfg, tree):
            metrics = metrics.merge(step.metrics)
            for b, toks in enumerate(step.tokens):
                out[b].extend(toks)
        return GenerationResult(out, metrics)

    def stream(self, prompt: list[int], cfg: GenerationConfig | None = None) -> Iterator[list[int]]:
        """Batch-1 streaming: one list of newly committed tokens per target step."""
        for step in self.stream_batch([prompt], cfg or GenerationConfig()):
            if step.tokens[0]:
                yield step.tokens[0]


def plain(cfg: GenerationConfig) -> GenerationConfig:
    """The same settings with speculation off (for side-by-side comparisons)."""
    return replace(cfg, speculative=False)
