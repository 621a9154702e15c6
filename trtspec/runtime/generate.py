"""The speculative decoding loop (the oracle every kernel, engine and server path is checked against).

One step, per batch:  drafter proposes a tree -> target runs [root + tree] with the tree mask and depth
position offsets -> verify (greedy or lossless sampling) -> KV cache keeps root + accepted nodes ->
drafter observes the target's hidden states at the kept nodes. Plain decoding is the same loop with an
empty tree, so "speculative == plain" compares two runs of the very same model code.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import torch

from trtspec.models.llama import build_llama, causal_mask
from trtspec.models.packed import pack_if_bf16
from trtspec.runtime.drafters import Drafter, _pad, build_drafter
from trtspec.runtime.tree import TreeBuffers, build_tree
from trtspec.runtime.verify import process_logits, verify_greedy, verify_sampling
from trtspec.spec import SpecModel


@dataclass
class GenerationConfig:
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    eos_token_id: int | list[int] | None = None
    speculative: bool = True

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class SpecMetrics:
    """Acceptance metrics as the field reports them (vLLM / TensorRT-LLM naming in to_dict)."""

    target_steps: int = 0           # target forward passes after the prefill (batched)
    sequence_steps: int = 0         # (sequence, step) pairs that produced tokens
    draft_tokens: int = 0           # draft tokens verified (tree nodes x sequence steps)
    accepted_draft_tokens: int = 0
    new_tokens: int = 0
    wall_s: float = 0.0
    prefill_s: float = 0.0
    acceptance_histogram: list[int] = field(default_factory=list)  # [a] = steps that accepted a drafts
    max_depth: int = 0

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

    def record(self, accepted: int, nodes: int) -> None:
        while len(self.acceptance_histogram) <= max(accepted, self.max_depth):
            self.acceptance_histogram.append(0)
        self.acceptance_histogram[accepted] += 1
        self.sequence_steps += 1
        self.accepted_draft_tokens += accepted
        self.draft_tokens += nodes

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(mean_acceptance_length=self.mean_acceptance_length,
                 per_position_acceptance=self.per_position_acceptance, tokens_per_s=self.tokens_per_s,
                 acceptance_rate=self.accepted_draft_tokens / max(self.draft_tokens, 1))
        return d


@dataclass
class StepOutput:
    """What one iteration of the loop committed, per sequence: the new tokens (clipped at eos and
    max_new_tokens) and the number of draft tokens the target accepted (None for the prefill's first
    token and for sequences that had already finished)."""

    tokens: list[list[int]]
    accepted: list[int | None]


@dataclass
class GenerationResult:
    tokens: list[list[int]]
    metrics: SpecMetrics


def _eos_set(eos) -> set[int]:
    if eos is None:
        return set()
    return {int(eos)} if isinstance(eos, int) else {int(e) for e in eos}


class SpeculativeGenerator:
    """Holds the target and drafter modules (built once from a SpecModel) and runs the loop."""

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
            self.drafter = build_drafter(spec.drafter, self.target, self.dtype)
        self.packed = pack_if_bf16(self.target, self.dtype, device)
        if self.packed and self.drafter is not None:
            self.drafter.pack(self.target.lm_head)
        self.tree: TreeBuffers = build_tree(spec.tree.choices)
        self.plain_tree: TreeBuffers = build_tree(())
        self.last_metrics = SpecMetrics()

    # The loop -----------------------------------------------------------------------------------
    @torch.no_grad()
    def stream_batch(self, prompts: list[list[int]], cfg: GenerationConfig) -> Iterator[StepOutput]:
        """Yield, after the prefill and after every target step, what each sequence committed."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if cfg.max_new_tokens <= 0:
            raise ValueError("max_new_tokens must be >= 1")
        spec_on = cfg.speculative and self.drafter is not None and self.tree.num_nodes > 1
        tree = self.tree if spec_on else self.plain_tree
        B = len(prompts)
        eos = _eos_set(cfg.eos_token_id)
        metrics = SpecMetrics(max_depth=tree.max_depth)
        self.last_metrics = metrics
        t0 = time.perf_counter()
        longest = max(len(p) for p in prompts)
        cache = self.target.new_cache(B, longest + cfg.max_new_tokens + tree.num_nodes + 1)
        ids, valid = _pad([torch.tensor(p, dtype=torch.long) for p in prompts])
        positions = torch.arange(ids.shape[1])[None].expand(B, -1)
        aux_layers = self.drafter.aux_layers if spec_on else ()
        hidden, aux = self.target(ids, positions, cache, causal_mask(ids.shape[1]) & valid[:, None, :], aux_layers)
        lengths = valid.sum(1)
        cache.commit([torch.arange(int(n)) for n in lengths])
        last = hidden[torch.arange(B), lengths - 1]
        gen = torch.Generator().manual_seed(cfg.seed)
        root = self._pick(self.target.logits(last), cfg, gen)
        if spec_on:
            self.drafter.reset(B, longest + cfg.max_new_tokens + tree.num_nodes + 1)
            aux_cat = torch.cat(aux, -1) if aux else None
            self.drafter.observe([hidden[b, : lengths[b]] for b in range(B)],
                                 [aux_cat[b, : lengths[b]] for b in range(B)] if aux_cat is not None else None,
                                 [ids[b, : lengths[b]] for b in range(B)],
                                 [torch.cat([ids[b, 1: lengths[b]], root[b:b + 1]]) for b in range(B)])
        metrics.prefill_s = time.perf_counter() - t0
        produced = [[int(root[b])] for b in range(B)]
        done = [self._finished(produced[b], cfg, eos) for b in range(B)]
        metrics.new_tokens = B
        yield StepOutput([list(p) for p in produced], [None] * B)
        step = 0
        while not all(done):
            drafts = self.drafter.propose(tree, root) if spec_on else root[:, None]
            positions = cache.lengths[:, None] + tree.depths[None, :]
            hidden, aux = self.target(drafts, positions, cache, tree.mask[None], aux_layers)
            logits = self.target.logits(hidden)
            if cfg.greedy:
                res = verify_greedy(tree, drafts, logits.argmax(-1))
            else:
                probs = process_logits(logits, cfg.temperature, cfg.top_k, cfg.top_p)
                res = verify_sampling(tree, drafts, probs, seed=cfg.seed * 1_000_003 + step)
            keep = [torch.tensor(k, dtype=torch.long) for k in res.keep_nodes]
            cache.commit(keep)
            step += 1
            metrics.target_steps += 1
            fresh: list[list[int]] = []
            accepted: list[int | None] = []
            for b in range(B):
                if done[b]:
                    fresh.append([])
                    accepted.append(None)
                    continue
                accepted.append(res.accepted_len[b])
                metrics.record(res.accepted_len[b], tree.num_nodes - 1)
                new = self._clip(produced[b], res.tokens[b], cfg, eos)
                produced[b].extend(new)
                metrics.new_tokens += len(new)
                fresh.append(new)
                done[b] = self._finished(produced[b], cfg, eos)
            root = torch.tensor(res.bonus, dtype=torch.long)
            if spec_on:
                aux_cat = torch.cat(aux, -1) if aux else None
                self.drafter.observe([hidden[b, keep[b]] for b in range(B)],
                                     [aux_cat[b, keep[b]] for b in range(B)] if aux_cat is not None else None,
                                     [drafts[b, keep[b]] for b in range(B)],
                                     [torch.tensor(res.tokens[b]) for b in range(B)])
            metrics.wall_s = time.perf_counter() - t0
            yield StepOutput(fresh, accepted)
        metrics.wall_s = time.perf_counter() - t0

    @staticmethod
    def _pick(logits: torch.Tensor, cfg: GenerationConfig, gen: torch.Generator) -> torch.Tensor:
        if cfg.greedy:
            return logits.argmax(-1)
        probs = process_logits(logits, cfg.temperature, cfg.top_k, cfg.top_p)
        return torch.multinomial(probs, 1, generator=gen).flatten()

    @staticmethod
    def _clip(produced: list[int], new: list[int], cfg: GenerationConfig, eos: set[int]) -> list[int]:
        room = cfg.max_new_tokens - len(produced)
        out = []
        for t in new[:room]:
            out.append(t)
            if t in eos:
                break
        return out

    @staticmethod
    def _finished(produced: list[int], cfg: GenerationConfig, eos: set[int]) -> bool:
        return len(produced) >= cfg.max_new_tokens or (bool(produced) and produced[-1] in eos)

    # Public API ---------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], cfg: GenerationConfig | None = None) -> GenerationResult:
        cfg = cfg or GenerationConfig()
        out: list[list[int]] = [[] for _ in prompts]
        for step in self.stream_batch(prompts, cfg):
            for b, toks in enumerate(step.tokens):
                out[b].extend(toks)
        return GenerationResult(out, self.last_metrics)

    def stream(self, prompt: list[int], cfg: GenerationConfig | None = None) -> Iterator[list[int]]:
        """Batch-1 streaming: one list of newly committed tokens per target step."""
        for step in self.stream_batch([prompt], cfg or GenerationConfig()):
            if step.tokens[0]:
                yield step.tokens[0]
