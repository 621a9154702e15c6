"""In-flight (continuous) batching of the oracle's steps: requests join and leave between target steps.

The oracle loop (runtime.generate) runs one batch from prefill to the last token. A server cannot wait
for that: a request that arrives while a long one runs would sit idle. ``InflightBatcher`` keeps one
target KV cache with a row (slot) per request in flight and, between steps,

    admit    -> new requests take the lowest free slots; their prompts are prefilled together (only theirs:
                nobody else's prefix is recomputed) and the drafter observes them
    step     -> one propose -> verify -> commit over every live slot (models.kv_rows: a view of the live
                rows), drafts batched across requests, each row verified with its own sampling settings;
                the target verifies what the oracle loop would (runtime.generate.to_verify: as deep as
                a confidence-scheduled drafter asks, only the nodes a model-free drafter drafted)
    release  -> a finished or cancelled request frees its slot at once for the next admission

Each request keeps its own limit, eos, sampling config and step counter, so its tokens are what batch-1
decoding of it alone gives (greedy; sampled rows draw from their own seed and step, as batch 1 does). The
tree of each step comes from ``BatchAwareSpeculation``: deep while few requests are in flight, shallower
or none when many are. Nothing here knows about Triton or threads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from trtspec.drafters.combined import CombinedDrafter
from trtspec.drafters.proposers import pad_rows
from trtspec.models.kv_rows import KVRows, free_rows
from trtspec.models.llama import causal_mask
from trtspec.runtime.adaptive import SourceChoice
from trtspec.runtime.batch_policy import BatchAwareSpeculation, bucket
from trtspec.runtime.generate import GenerationConfig, clip_tokens, eos_set, finished, pick_token, to_verify
from trtspec.runtime.verify import VerifyResult, process_logits, verify_greedy, verify_sampling
from trtspec.tree import TreeBuffers, build_tree


@dataclass
class Slot:
    """One request in flight: its settings, the next root token, what it produced, and what the drafter has
    not observed yet (steps without a tree defer it, as in runtime.generate)."""

    cfg: GenerationConfig
    eos: frozenset[int]
    root: int
    produced: list[int]
    steps: int = 0
    pending: list[tuple] = field(default_factory=list)
    #: this request's own P(accept >= d) per depth (moving averages; None until a tree reached depth d)
    accept: list[float | None] = field(default_factory=list)
    #: the same while the model-free drafter drafts alone (a source's acceptance is its own)
    accept_model_free: list[float | None] = field(default_factory=list)

    def acceptance(self, use_model: bool = True) -> list[float | None]:
        return self.accept if use_model else self.accept_model_free

    def record_acceptance(self, accepted: int, depth: int, alpha: float = 0.3, use_model: bool = True) -> None:
        """Blend one step's outcome (``accepted`` drafts of a tree of ``depth``) into the estimates."""
        est = self.acceptance(use_model)
        if len(est) < depth:
            est.extend([None] * (depth - len(est)))
        for d in range(1, depth + 1):
            hit = float(accepted >= d)
            old = est[d - 1]
            est[d - 1] = hit if old is None else (1 - alpha) * old + alpha * hit

    @property
    def done(self) -> bool:
        return finished(self.produced, self.cfg, self.eos)


@dataclass(frozen=True)
class SlotOutput:
    """What one slot committed in one admission or step: tokens (clipped at its eos / limit), the draft
    tokens the target accepted (None for the prefill's first token), the draft nodes it verified, and
    whether the request is finished (its slot is then free once ``release``d)."""

    slot: int
    tokens: list[int]
    accepted: int | None
    drafted: int
    done: bool


@dataclass(frozen=True)
class StepInfo:
    """One target step over the live slots: how many, how big the tree was, and what it took."""

    batch_size: int
    draft_nodes: int
    draft_depth: int
    wall_s: float


class InflightBatcher:
    """Slots, one KV cache and the drafter's per-slot state, driven by ``admit`` / ``step`` / ``release``."""

    def __init__(
        self,
        gen,
        max_slots: int,
        speculative: bool = True,
        schedule: dict[int, int] | None = None,
        adaptive: bool = False,
        capacity: int = 256,
    ):
        """``gen`` is a SpeculativeGenerator (its target, drafter and tree); ``capacity`` the KV positions a
        slot starts with (the cache grows by doubling when a longer sequence needs it)."""
        self.target = gen.target
        self.drafter = gen.drafter if speculative else None
        tree = gen.tree if self.drafter is not None else build_tree(())
        if tree.num_nodes == 0:
            self.drafter = None
        self.tree = tree
        self.max_slots = max(1, int(max_slots))
        self.cache = self.target.new_cache(self.max_slots, capacity)
        if self.drafter is not None:
            self.drafter.reset(self.max_slots, capacity)
        self.aux_layers = self.drafter.aux_layers if self.drafter is not None else ()
        # heads with a model-free drafter beside them, adaptive: per batch-size bucket, measure whether the
        # model drafter still pays for its forward or the model-free drafter alone is faster (as the
        # offline loop does per request; here a step's batch shares one mode)
        self.source_choice: dict[int, SourceChoice] | None = (
            {} if adaptive and isinstance(self.drafter, CombinedDrafter) else None
        )
        # one tree policy per source (key: drafting with the model): heads that do not pay turn only
        # themselves off, and the model-free drafter is still measured
        self.policy = BatchAwareSpeculation(tree, schedule, adaptive)
        self.policies = {True: self.policy}
        if self.source_choice is not None:
            self.policies[False] = BatchAwareSpeculation(tree, schedule, adaptive, plain_with=self.policy)
        self.slots: list[Slot | None] = [None] * self.max_slots
        self.last_step: StepInfo | None = None
        self._cut_trees: dict = {}  # the trees to_verify cut, by (tree, nodes)

    # bookkeeping --------------------------------------------------------------------------------
    @property
    def live(self) -> list[int]:
        return [i for i, s in enumerate(self.slots) if s is not None]

    @property
    def free(self) -> int:
        return sum(s is None for s in self.slots)

    def release(self, slot: int) -> None:
        """Free a slot now (finished, cancelled or failed): the next admission may take it."""
        self.slots[slot] = None

    # admission ----------------------------------------------------------------------------------
    @torch.no_grad()
    def admit(self, prompts: list[list[int]], cfgs: list[GenerationConfig]) -> list[SlotOutput]:
        """Prefill new requests into the lowest free slots; returns each one's first token (in order)."""
        if len(prompts) != len(cfgs):
            raise ValueError("one GenerationConfig per prompt")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if any(c.max_new_tokens <= 0 for c in cfgs):
            raise ValueError("max_new_tokens must be >= 1")
        if len(prompts) > self.free:
            raise ValueError(f"{len(prompts)} requests for {self.free} free slots")
        if not prompts:
            return []
        rows = [i for i, s in enumerate(self.slots) if s is None][: len(prompts)]
        free_rows(self.cache, rows)
        view = KVRows(self.cache, rows)
        ids, valid = pad_rows([torch.tensor(p, dtype=torch.long) for p in prompts])
        B = len(prompts)
        positions = torch.arange(ids.shape[1])[None].expand(B, -1)
        hidden, aux = self.target(ids, positions, view, causal_mask(ids.shape[1]) & valid[:, None, :], self.aux_layers)
        lengths = valid.sum(1)
        view.commit([torch.arange(int(n)) for n in lengths])
        logits = self.target.logits(hidden[torch.arange(B), lengths - 1])
        roots = [
            int(pick_token(logits[i : i + 1], c, torch.Generator().manual_seed(c.seed))[0]) for i, c in enumerate(cfgs)
        ]
        if self.drafter is not None:
            self.drafter.forget(rows)
            aux_cat = torch.cat(aux, -1) if aux else None
        out = []
        for b, (row, cfg, root) in enumerate(zip(rows, cfgs, roots)):
            slot = Slot(cfg, eos_set(cfg.eos_token_id), root, [root])
            if self.drafter is not None:  # the drafter reads the prompt before this slot's first tree, if any
                n = int(lengths[b])
                slot.pending.append(
                    (
                        hidden[b, :n],
                        aux_cat[b, :n] if aux_cat is not None else None,
                        ids[b, :n],
                        torch.cat([ids[b, 1:n], torch.tensor([root])]),
                    )
                )
            self.slots[row] = slot
            out.append(SlotOutput(row, [root], None, 0, slot.done))
        return out

    # one step over every live slot --------------------------------------------------------------
    def _observe_pending(self, live: list[int]) -> None:
        """Hand the drafter what the target committed since it last looked (a prompt, the steps since its
        last tree), for the rows that have any. Nothing is observed while no tree is drafted: a plain step
        (large batch, or speculation that does not pay) costs the drafter nothing. Rows are observed in
        groups of similar length, so one row's long prompt does not pad every other row's few tokens."""
        pending: list[tuple[int, list]] = []
        for s in live:
            chunks, self.slots[s].pending = self.slots[s].pending, []
            if chunks:
                joined = [None if chunks[0][i] is None else torch.cat([c[i] for c in chunks]) for i in range(4)]
                pending.append((s, joined))
        pending.sort(key=lambda item: item[1][2].shape[0])
        groups: list[list[tuple[int, list]]] = []
        for item in pending:
            n = item[1][2].shape[0]
            if groups and n <= 2 * groups[-1][0][1][2].shape[0] + 8:
                groups[-1].append(item)
            else:
                groups.append([item])
        for group in groups:
            rows = [s for s, _ in group]
            parts = [[p[i] for _, p in group] for i in range(4)]
            self.drafter.observe(parts[0], None if parts[1][0] is None else parts[1], parts[2], parts[3], rows=rows)

    def _live_acceptance(self, live: list[int], use_model: bool = True) -> list[float | None] | None:
        """P(accept >= d) per depth averaged over the live requests that measured depth d (None: nobody)."""
        if self.drafter is None:
            return None
        out: list[float | None] = []
        for d in range(self.tree.max_depth):
            vals = [a[d] for s in live if len(a := self.slots[s].acceptance(use_model)) > d and a[d] is not None]
            out.append(sum(vals) / len(vals) if vals else None)
        return out

    def _verify(self, tree: TreeBuffers, drafts: torch.Tensor, logits: torch.Tensor, live: list[int]) -> VerifyResult:
        """Each row verified with its own request's settings: greedy rows together, sampled rows one by one
        (seeded by their own seed and step, which is what batch-1 decoding of that request draws)."""
        per_row: list[tuple] = [None] * len(live)
        greedy = [i for i, s in enumerate(live) if self.slots[s].cfg.greedy]
        if greedy:
            g = torch.tensor(greedy)
            res = verify_greedy(tree, drafts[g], logits[g].argmax(-1))
            for j, i in enumerate(greedy):
                per_row[i] = (res.accepted_len[j], res.tokens[j], res.keep_nodes[j], res.best_path[j], res.bonus[j])
        for i, s in enumerate(live):
            if per_row[i] is not None:
                continue
            cfg, steps = self.slots[s].cfg, self.slots[s].steps
            probs = process_logits(logits[i : i + 1], cfg.temperature, cfg.top_k, cfg.top_p)
            res = verify_sampling(tree, drafts[i : i + 1], probs, seed=cfg.seed * 1_000_003 + steps)
            per_row[i] = (res.accepted_len[0], res.tokens[0], res.keep_nodes[0], res.best_path[0], res.bonus[0])
        return VerifyResult(*(list(col) for col in zip(*per_row)))

    @torch.no_grad()
    def step(self) -> list[SlotOutput]:
        """One propose -> verify -> commit over every live slot that is not finished."""
        live = [s for s in self.live if not self.slots[s].done]
        if not live:
            return []
        t0 = time.perf_counter()
        switch, use_model = None, True
        if self.source_choice is not None:
            switch = self.source_choice.setdefault(bucket(len(live)), SourceChoice())
            use_model = self.drafter.use_model = switch.use_model()
        policy = self.policies[use_model]
        chosen = tree = policy.choose(len(live), self._live_acceptance(live, use_model))
        speculating = self.drafter is not None and tree.num_nodes > 0
        view = KVRows(self.cache, live)
        roots = torch.tensor([self.slots[s].root for s in live], dtype=torch.long)
        if speculating:
            self._observe_pending(live)
            drafts = self.drafter.propose(tree, roots, rows=live)
            tree, drafts = to_verify(self.drafter, tree, drafts, [False] * len(live), self._cut_trees)
        else:
            drafts = roots[:, None]
        positions = view.lengths[:, None] + tree.depths[None, :]
        hidden, aux = self.target(drafts, positions, view, tree.mask[None], self.aux_layers)
        logits = self.target.logits(hidden)
        res = self._verify(tree, drafts, logits, live)
        keep = [torch.tensor(k, dtype=torch.long) for k in res.keep_nodes]
        view.commit(keep)
        aux_cat = torch.cat(aux, -1) if aux and self.drafter is not None else None
        out = []
        for i, s in enumerate(live):
            slot = self.slots[s]
            new = clip_tokens(slot.produced, res.tokens[i], slot.cfg, slot.eos)
            slot.produced.extend(new)
            slot.steps += 1
            slot.root = res.bonus[i]
            if tree.num_nodes:
                slot.record_acceptance(res.accepted_len[i], tree.max_depth, use_model=use_model)
            if self.drafter is not None:
                slot.pending.append(
                    (
                        hidden[i, keep[i]],
                        aux_cat[i, keep[i]] if aux_cat is not None else None,
                        drafts[i, keep[i]],
                        torch.tensor(res.tokens[i]),
                    )
                )
            out.append(SlotOutput(s, new, res.accepted_len[i], tree.num_nodes, slot.done))
        wall = time.perf_counter() - t0
        policy.record(
            list(res.accepted_len),
            wall,
            trimmed=tree is not chosen,
            verified_depth=tree.max_depth,
            verified_nodes=tree.num_nodes,
        )
        if switch is not None:  # plain steps too: a source's rate includes its policy's choice to not speculate
            switch.record(use_model, list(res.accepted_len), wall)
        self.last_step = StepInfo(len(live), tree.num_nodes, tree.max_depth, wall)
        return out
