"""Training loop for draft heads on the self-distillation cache (no target forward during training).

Alignment (the runtime's, see trtspec/drafters/proposers.py), with a_q the target's greedy choice at q:
  * medusa / mtp-linear: head k on h_q is trained towards a_{q+k+1} (= x_{q+k+2} on the target's text).
  * eagle / mtp-single: step s on (feature, x_{q+s+1}) at position q+s is trained towards a_{q+s+1};
    step 0's feature is h_q, later steps feed the drafter's own output (``unroll`` steps, as at depth > 1).
    EAGLE also regresses its output onto h_{q+s+1} (smooth L1), the feature it stands in for.
    A kind whose recipe names ``aux_layers`` reads the cached inputs of those target layers, concatenated,
    as step 0's feature instead of h_q (EAGLE-3's fused low/mid/high features); one with ``prepare``
    projects onto its own vocabulary and is trained with a softmax over it (labels outside it ignored).
  * block drafters: at a random anchor p, block position j (of [x_p, mask...]) is trained towards
    a_{p+j-1}, the context being the target's aux-layer states before p (trtspec/train/block.py).

Determinism: the batch of step t is a pure function of (seed, t), so a resumed run replays exactly the
batches an uninterrupted run would see. Checkpoints (head, optimiser, step) are written atomically every
``ckpt_every`` steps and on Ctrl-C. Under torchrun (torch.distributed initialised, or WORLD_SIZE > 1)
the module is wrapped in DistributedDataParallel and each rank takes its slice of every global batch;
only rank 0 writes.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trtspec.dtypes import resolve_dtype
from trtspec.errors import UsageError
from trtspec.spec import DrafterSpec, TargetSpec
from trtspec.train.aux_cache import layer_states
from trtspec.train.block import BlockLoss, block_batch
from trtspec.train.block import per_batch as block_per_batch
from trtspec.train.cache import HiddenCache
from trtspec.train.heads import make_module, recipe, warm_start
from trtspec.train.losses import dense_ce, sparse_ce, targets
from trtspec.train.unroll import unrolled


@dataclass
class TrainConfig:
    kind: str
    num_heads: int = 3  # linear kinds
    draft_layers: int | None = None  # block kinds: decoder layers of a fresh drafter (None: the kind's default)
    rmsnorm: bool = True  # mtp kinds
    unroll: int = 2  # recurrent kinds: training steps per position (1 = target features only)
    window: int = 512  # recurrent kinds: max positions per sequence window
    batch_tokens: int = 2048  # positions per global batch
    epochs: float = 1.0
    steps: int | None = None  # overrides epochs
    lr: float = 1e-3
    warmup: int | None = None  # linear warm-up steps; None: 10% of the run, at most 20 (warmup_steps)
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    soft_weight: float = 0.0  # weight of the target's distribution in the loss (see soft_labels)
    soft_labels: str = "topk"  # "topk": the cached top-k logits (needs a --topk cache); "full": the target's
    # whole softmax over the loss vocabulary, recomputed from the cached final hidden state (recurrent kinds)
    reg_weight: float = 1.0  # eagle feature regression
    step_decay: float = 0.8  # weight of unrolled step s = step_decay ** s
    lm_dtype: str = "auto"  # dtype of the shared lm_head matmul; auto: bf16 where native (~2x faster), else fp32
    train_on: str = "generated"  # "generated": loss on the target's own reply only (q >= prompt_len - 1)
    label_vocab: str = "full"  # "cache": softmax over the tokens the target ever chose on the data only;
    # "draft": over the draft_vocab tokens it chose most often (the ones the runtime drafts over)
    draft_vocab: int = 0  # own-vocabulary kinds: its size (0 = the kind's default); label_vocab draft: N
    seed: int = 0
    ckpt_every: int = 50
    log_every: int = 1

    def check(self) -> None:
        if self.train_on not in ("generated", "all"):
            raise UsageError("--train-on must be generated or all")
        if self.label_vocab not in ("full", "cache", "draft"):
            raise UsageError("--label-vocab must be full, cache or draft")
        if self.label_vocab == "draft" and self.draft_vocab < 1:
            raise UsageError("--label-vocab draft needs --draft-vocab N (N >= 1)")
        if self.soft_labels not in ("topk", "full"):
            raise UsageError("--soft-labels must be topk or full")
        if self.batch_tokens < 1 or self.unroll < 1 or self.num_heads < 1:
            raise UsageError("--batch-tokens, --unroll and --num-heads must be >= 1")


@dataclass
class TrainResult:
    steps: int
    losses: list[float] = field(default_factory=list)
    step_losses: list[float] = field(default_factory=list)  # per head / per unrolled step, last 10% average
    tokens_per_s: float = 0.0
    wall_s: float = 0.0

    @property
    def final_loss(self) -> float:
        tail = self.losses[-max(1, len(self.losses) // 10) :]
        return float(np.mean(tail)) if tail else float("nan")


# Data -------------------------------------------------------------------------------------------------


class _Positions:
    """Flat index of every (shard, position) with a label, for the linear kinds."""

    def __init__(self, cache: HiddenCache, generated_only: bool = True):
        shard, local, end = [], [], []
        for i, (si, a, n) in enumerate(cache.sequences):
            q = np.nonzero(cache.trained(i)[: n - 1])[0] if generated_only else np.arange(n - 1)
            if len(q) < 1:
                continue
            shard.append(np.full(len(q), si, dtype=np.int32))
            local.append(a + q.astype(np.int64))
            end.append(np.full(len(q), a + n, dtype=np.int64))
        if not shard:
            raise UsageError("the cache has no sequence longer than one token")
        self.shard, self.local, self.end = np.concatenate(shard), np.concatenate(local), np.concatenate(end)

    def __len__(self) -> int:
        return len(self.shard)


def _epoch_perm(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n)


def _slice(seq: np.ndarray, rank: int, world: int) -> np.ndarray:
    return seq[rank::world]


def linear_batch(cache: HiddenCache, pos: _Positions, ids: np.ndarray, K: int, want_topk: bool):
    """h [N, H] and per head k labels a_{q+k+1} [K, N] (-1 = past the sequence end) (+ top-k)."""
    N = len(ids)
    H = cache.hidden_size
    h = np.empty((N, H), dtype=np.float16)
    lab = np.full((K, N), -1, dtype=np.int64)
    tk = tv = None
    if want_topk:
        k = cache.shards[0].topk_ids.shape[1]
        tk = np.zeros((K, N, k), dtype=np.int64)
        tv = np.zeros((K, N, k), dtype=np.float32)
    sh, loc, end = pos.shard[ids], pos.local[ids], pos.end[ids]
    for si in np.unique(sh):
        sel = np.nonzero(sh == si)[0]
        s = cache.shards[int(si)]
        h[sel] = s.hidden[loc[sel]]
        for j in range(K):
            t = loc[sel] + j + 1
            ok = t < end[sel]
            lab[j, sel[ok]] = s.argmax[t[ok]]
            if want_topk:
                tk[j, sel[ok]] = s.topk_ids[t[ok]]
                tv[j, sel[ok]] = s.topk_logits[t[ok]]
    out = {"h": torch.from_numpy(h.astype(np.float32)), "labels": torch.from_numpy(lab)}
    if want_topk:
        out["topk_ids"], out["topk_logits"] = torch.from_numpy(tk), torch.from_numpy(tv)
    return out


def windows(cache: HiddenCache, window: int) -> list[tuple[int, int, int]]:
    """(sequence, first position, length) windows covering every position that has a label."""
    out = []
    for i, (_, _, n) in enumerate(cache.sequences):
        for a in range(0, n - 1, window):
            out.append((i, a, min(window, n - 1 - a)))
    if not out:
        raise UsageError("the cache has no sequence longer than one token")
    return out


def recurrent_batch(
    cache: HiddenCache,
    wins: list[tuple[int, int, int]],
    ids: np.ndarray,
    steps: int,
    want_topk: bool,
    generated_only: bool = True,
    aux: list | None = None,
):
    """Padded windows: feats h_q (or, with ``aux``, per cache shard the fused target layers' states),
    tokens[s] = x_{q+s+1}, labels[s] = a_{q+s+1}, regression target h_{q+s+1} (-1 / zero where q+s+1 is
    past the end)."""
    sel = [wins[int(i)] for i in ids]
    B, T = len(sel), max(w[2] for w in sel)
    H = cache.hidden_size
    feats = np.zeros((B, T, H if aux is None else aux[0].shape[1]), dtype=np.float32)
    valid = np.zeros((B, T), dtype=bool)
    toks = np.zeros((steps, B, T), dtype=np.int64)
    labs = np.full((steps, B, T), -1, dtype=np.int64)
    nxt = np.zeros((steps, B, T, H), dtype=np.float32)
    start = np.zeros(B, dtype=np.int64)
    tk = tv = None
    if want_topk:
        k = cache.shards[0].topk_ids.shape[1]
        tk, tv = np.zeros((steps, B, T, k), dtype=np.int64), np.zeros((steps, B, T, k), dtype=np.float32)
    for b, (si, a, m) in enumerate(sel):
        seq = cache.sequence(si)
        n = len(seq["tokens"])
        trained = cache.trained(si) if generated_only else None
        if aux is None:
            feats[b, :m] = seq["hidden"][a : a + m]
        else:
            shard_i, first, _ = cache.sequences[si]
            feats[b, :m] = aux[shard_i][first + a : first + a + m]
        valid[b, :m] = True
        start[b] = a
        for s in range(steps):
            q = np.arange(a, a + m)
            t = q + s + 1
            ok = t < n
            if trained is not None:
                ok &= trained[q]
            cols = np.nonzero(ok)[0]
            toks[s, b, cols] = seq["tokens"][t[ok]]
            labs[s, b, cols] = seq["argmax"][t[ok]]
            nxt[s, b, cols] = seq["hidden"][t[ok]]
            if want_topk:
                tk[s, b, cols], tv[s, b, cols] = seq["topk_ids"][t[ok]], seq["topk_logits"][t[ok]]
    out = {
        "feats": torch.from_numpy(feats),
        "valid": torch.from_numpy(valid),
        "tokens": torch.from_numpy(toks),
        "labels": torch.from_numpy(labs),
        "next_hidden": torch.from_numpy(nxt),
        "start": torch.from_numpy(start),
    }
    if want_topk:
        out["topk_ids"], out["topk_logits"] = torch.from_numpy(tk), torch.from_numpy(tv)
    return out


# Loss modules (one forward = the whole loss, so DDP sees one graph per step) ----------------------------


class LinearLoss(nn.Module):
    def __init__(self, heads: nn.Module, lm_head: torch.Tensor, cfg: TrainConfig):
        super().__init__()
        self.heads, self.cfg = heads, cfg
        self.register_buffer("lm_head", lm_head, persistent=False)

    def forward(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = batch["h"]
        losses, counts = [], []
        for k, head in enumerate(self.heads.heads):
            z = _head_features(head, h)
            valid = batch["labels"][k] >= 0
            soft = "topk_ids" in batch
            idx, w = targets(
                batch["labels"][k],
                valid,
                batch["topk_ids"][k] if soft else None,
                batch["topk_logits"][k] if soft else None,
                self.cfg.soft_weight,
            )
            losses.append(sparse_ce(z, self.lm_head, idx, w))
            counts.append(valid.sum())
        L, C = torch.stack(losses), torch.stack(counts).float()
        return (L / C.clamp_min(1)).sum(), L.detach(), C


def _head_features(head: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """The LinearHead's input to its lm_head (its forward, minus the final matmul)."""
    z = head.norm(h) if head.norm is not None else h
    for block in head.res:
        z = block(z)
    return z


class RecurrentLoss(nn.Module):
    def __init__(
        self,
        module: nn.Module,
        embed: torch.Tensor,
        lm_head: torch.Tensor,
        cfg: TrainConfig,
        feature_regression: bool = False,
        own_vocab: bool = False,
        teacher: torch.Tensor | None = None,
    ):
        super().__init__()
        self.module, self.cfg = module, cfg
        self.register_buffer("embed", embed, persistent=False)
        self.register_buffer("lm_head", lm_head, persistent=False)
        self.register_buffer("eye", torch.eye(embed.shape[1], dtype=embed.dtype), persistent=False)
        self.feature_regression = feature_regression  # EAGLE: also regress the target's next hidden state
        self.own_vocab = own_vocab  # the module's logits are over its own (trained) vocabulary
        # soft_labels full: the target's lm_head rows of the loss vocabulary, in its order [V_loss, H]
        self.register_buffer("teacher", teacher, persistent=False)

    def forward(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        results = unrolled(
            self.module, self.embed, self.eye, batch["feats"], list(batch["tokens"]), batch["start"], batch["valid"]
        )
        total = batch["feats"].new_zeros(())
        losses, counts = [], []
        H = self.embed.shape[1]
        for s, (out, z) in enumerate(results):
            lab = batch["labels"][s].flatten()
            valid = (lab >= 0) & batch["valid"].flatten()
            if self.teacher is not None:
                ce = self._full_soft_ce(z, batch["next_hidden"][s].reshape(-1, H), lab, valid)
            else:
                tk = batch["topk_ids"][s].flatten(0, 1) if "topk_ids" in batch else None
                tv = batch["topk_logits"][s].flatten(0, 1) if "topk_logits" in batch else None
                idx, w = targets(lab, valid, tk, tv, self.cfg.soft_weight)
                if self.own_vocab:
                    ce = dense_ce(z.reshape(-1, z.shape[-1]), idx, w)
                else:
                    ce = sparse_ce(z.reshape(-1, H), self.lm_head, idx, w)
            n = valid.sum().clamp_min(1)
            step_loss = ce / n
            if self.feature_regression and self.cfg.reg_weight > 0:
                reg = F.smooth_l1_loss(out.reshape(-1, H), batch["next_hidden"][s].reshape(-1, H), reduction="none")
                step_loss = step_loss + self.cfg.reg_weight * (reg.mean(-1) * valid.float()).sum() / n
            total = total + (self.cfg.step_decay**s) * step_loss
            losses.append(ce.detach())
            counts.append(valid.sum())
        return total, torch.stack(losses), torch.stack(counts).float()

    def _full_soft_ce(self, z: torch.Tensor, h_next: torch.Tensor, lab: torch.Tensor, valid: torch.Tensor):
        """Sum over valid rows of (1 - w) CE(hard label) + w CE(the target's whole softmax over the loss
        vocabulary), the target's logits recomputed from its cached post-norm hidden state h_{q+s+1} (the
        state that chose the label). Why: the full distribution tells the drafter how the target ranks
        every candidate, not only its top-k, which is how SafeAILab's EAGLE and EAGLE-3 trainers distill
        (the target's lm_head, restricted to the draft vocabulary for EAGLE-3, softmaxed); a row whose
        label lies outside the loss vocabulary (-1) is ignored, as there."""
        V = self.teacher.shape[0]
        logits = (
            z.reshape(-1, V)
            if self.own_vocab
            else F.linear(z.reshape(-1, z.shape[-1]).to(self.lm_head.dtype), self.lm_head)
        )
        logp = torch.log_softmax(logits.float(), -1)
        with torch.no_grad():
            p = torch.softmax(F.linear(h_next.to(self.teacher.dtype), self.teacher).float(), -1)
        sw, v = self.cfg.soft_weight, valid.float()
        hard = logp.gather(1, lab.clamp_min(0)[:, None]).squeeze(1)
        return -(((1 - sw) * hard + sw * (logp * p).sum(-1)) * v).sum()


# The loop ----------------------------------------------------------------------------------------------


def dist_info() -> tuple[int, int, bool]:
    """(rank, world, initialised-by-us). Initialises torch.distributed under torchrun."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), False
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and dist.is_available():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        return dist.get_rank(), dist.get_world_size(), True
    return 0, 1, False


def warmup_steps(cfg: TrainConfig, total: int) -> int:
    """The warm-up length: as given, else a tenth of the run, at most 20 steps. A fixed 20 spent a third
    of a 60-step CPU budget (the README recipe on an AVX2 machine) at a reduced learning rate."""
    if cfg.warmup is not None:
        return max(0, int(cfg.warmup))
    return max(1, min(20, round(0.1 * total)))


def _lr(cfg: TrainConfig, step: int, total: int) -> float:
    warmup = warmup_steps(cfg, total)
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def shared_weights(target: TargetSpec, lm_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's embedding (fp32) and lm_head (``lm_dtype``), frozen: heads share, never copy, them."""
    embed = target.tensors.load("model.embed_tokens.weight").float()
    lm = target.tensors.load(target.lm_head_name).to(lm_dtype)
    return embed, lm


def cache_vocab(cache: HiddenCache) -> np.ndarray:
    """Every token the target chose (argmax or cached top-k) anywhere in the cache, sorted."""
    seen = []
    for sh in cache.shards:
        seen.append(np.unique(np.asarray(sh.argmax)))
        if sh.topk_ids is not None:
            seen.append(np.unique(np.asarray(sh.topk_ids)))
    return np.unique(np.concatenate(seen)).astype(np.int64)


def draft_label_vocab(cache: HiddenCache, target: TargetSpec, size: int) -> np.ndarray:
    """The ``size`` tokens the target chose most often on the data, sorted: the draft vocabulary
    train-heads writes beside the heads, so the loss is a softmax over exactly what the runtime drafts
    over (why: a label outside it can never be drafted, and the lm_head matmul, most of a CPU training
    step, shrinks by vocab_size / size)."""
    from trtspec.train.draft_vocab import frequent_tokens

    return np.sort(frequent_tokens(cache, target.arch.vocab_size, size).ids.numpy())


class _Remap:
    """Maps full-vocabulary label ids into a label-vocabulary subset (why: the lm_head matmul is most of
    the training cost and a 135M chat model uses a fraction of its 49k tokens on one corpus), or into a
    kind's own output vocabulary (``table``: -1 = outside it; such labels are ignored, such top-k entries
    get no weight)."""

    def __init__(self, vocab: np.ndarray | None, size: int, table: torch.Tensor | None = None):
        if table is None:
            table = torch.full((size,), -1, dtype=torch.long)
            table[torch.from_numpy(vocab)] = torch.arange(len(vocab))
        self.table = table

    def __call__(self, batch: dict) -> dict:
        lab = batch["labels"]
        batch["labels"] = torch.where(lab >= 0, self.table[lab.clamp_min(0)], lab)
        if "topk_ids" in batch:
            mapped = self.table[batch["topk_ids"]]
            batch["topk_logits"] = torch.where(mapped >= 0, batch["topk_logits"], -1e4)
            batch["topk_ids"] = mapped.clamp_min(0)
        return batch


def check_soft_labels(kind: str, style: str, soft_labels: str, soft_weight: float) -> None:
    """--soft-labels full recomputes the target's distribution from the cached hidden state of the
    position that chose each label: the recurrent kinds' batches carry that state (their regression
    target); the others read the cached top-k."""
    if soft_weight > 0 and soft_labels == "full" and style != "recurrent":
        from trtspec.drafters import registry

        recurrent = ", ".join(n for n, k in registry.KINDS.items() if k.training and k.training.style == "recurrent")
        raise UsageError(
            f"--soft-labels full applies to the recurrent kinds ({recurrent}), not {kind}: "
            "pass --soft-labels topk with --topk K"
        )


def _own_vocab_rows(lm_head: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The target's ``lm_head`` rows of a kind's own output vocabulary, in its order: ``table`` maps target
    id -> output id (-1 outside), so output id i reads the row of the target id that maps to i."""
    ids = torch.nonzero(table >= 0).flatten()
    return lm_head[ids[table[ids].argsort()]]


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def train(
    target: TargetSpec,
    cache: HiddenCache,
    cfg: TrainConfig,
    ckpt_dir: str | Path | None = None,
    resume: bool = False,
    progress: bool = True,
    stop_after: int | None = None,
    device: str | None = None,
    init: DrafterSpec | None = None,
    first_batch: int = 0,
) -> tuple[nn.Module, TrainResult]:
    """Train a fresh head (or resume from ``ckpt_dir``) and return (module, result). ``init``: trained
    heads of the same kind and shape to start from instead of a fresh initialisation (a warm start);
    ``first_batch``: step 0 takes the data order's batch of that index, so a warm start from heads trained
    N steps with the same seed takes the batches that follow theirs, not the ones they already saw.

    ``stop_after`` ends the run early after that many steps (in total), checkpointing first -- how the
    tests simulate an interruption."""
    from tqdm import tqdm

    cfg.check()
    rank, world, _ = dist_info()
    if device is None:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(cfg.seed)
    lm_dtype = resolve_dtype(cfg.lm_dtype, device).dtype
    embed, lm = shared_weights(target, lm_dtype)
    remap = label_ids = None
    if cfg.label_vocab in ("cache", "draft"):
        vocab = cache_vocab(cache) if cfg.label_vocab == "cache" else draft_label_vocab(cache, target, cfg.draft_vocab)
        label_ids = torch.from_numpy(vocab)
        lm = lm[label_ids].contiguous()
        remap = _Remap(vocab, target.arch.vocab_size)
    module = make_module(cfg.kind, target, cfg.num_heads, cfg.rmsnorm, cfg.seed, cfg.draft_layers)
    kind_recipe = recipe(cfg.kind)
    if kind_recipe.prepare is not None:
        if remap is not None:
            raise UsageError(
                f"--label-vocab {cfg.label_vocab} does not apply to {cfg.kind}: it trains its own vocabulary "
                "(--draft-vocab)"
            )
        from trtspec.train.draft_vocab import token_ranking

        table = kind_recipe.prepare(module, target, token_ranking(cache, target.arch.vocab_size), cfg.draft_vocab)
        remap = _Remap(None, 0, table=table)
    if init is not None:
        warm_start(module, init)
    linear = kind_recipe.style == "heads"
    block = kind_recipe.style == "block"  # a block drafter: many anchors per window, context from aux layers
    reads_layers = kind_recipe.aux_layers is not None  # EAGLE-3's fused layers, a block drafter's context
    aux = layer_states(cache, target, kind_recipe.aux_layers(target), progress and rank == 0) if reads_layers else None
    full_soft = cfg.soft_weight > 0 and cfg.soft_labels == "full"
    want_topk = cfg.soft_weight > 0 and not full_soft
    if want_topk and not cache.has_topk:
        raise UsageError("--soft-weight needs a cache built with --topk > 0")
    check_soft_labels(cfg.kind, kind_recipe.style, cfg.soft_labels, cfg.soft_weight)
    teacher = None
    if full_soft:
        teacher = lm if kind_recipe.prepare is None else _own_vocab_rows(lm, remap.table)  # lm: the full rows here
    if linear:
        pos = _Positions(cache, cfg.train_on == "generated")
        universe = len(pos)
        per_batch = cfg.batch_tokens
    elif block:
        wins = windows(cache, cfg.window)
        universe = len(wins)
        per_batch = block_per_batch(cfg.batch_tokens, module.block_size)
    else:
        wins = windows(cache, cfg.window)
        universe = len(wins)
        mean_len = float(np.mean([w[2] for w in wins]))
        per_batch = max(1, int(round(cfg.batch_tokens / mean_len)))
    per_batch = max(per_batch, world)
    steps_per_epoch = max(1, universe // per_batch)
    total = cfg.steps if cfg.steps is not None else max(1, int(round(cfg.epochs * steps_per_epoch)))
    wrapper: nn.Module = (
        LinearLoss(module, lm, cfg)
        if linear
        else BlockLoss(module, embed, lm, cfg.step_decay, label_ids, soft_weight=cfg.soft_weight)
        if block
        else RecurrentLoss(
            module,
            embed,
            lm,
            cfg,
            kind_recipe.feature_regression,
            own_vocab=kind_recipe.prepare is not None,
            teacher=teacher,
        )
    )
    wrapper = wrapper.to(device)
    params = [p for p in wrapper.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    other = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": other, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    result = TrainResult(steps=0)
    start = 0
    ckpt = Path(ckpt_dir) / "checkpoint.pt" if ckpt_dir is not None else None
    key = {k: v for k, v in asdict(cfg).items() if k not in ("steps", "epochs", "ckpt_every", "log_every")}
    if not key["draft_vocab"]:  # checkpoints written before the option existed keep their key
        del key["draft_vocab"]
    if key["soft_labels"] == "topk":  # likewise
        del key["soft_labels"]
    if key["draft_layers"] is None:  # likewise
        del key["draft_layers"]
    key.update(total=total, cache=cache.meta.get("data_hash"), fingerprint=target.fingerprint)
    if init is not None:  # a run without one keeps the key it always had
        key["init_from"] = str(Path(init.path).resolve())
    if first_batch:
        key["first_batch"] = first_batch
    if resume and ckpt is not None and ckpt.is_file():
        state = torch.load(ckpt, map_location=device, weights_only=True)
        if state["key"] != key:
            diff = sorted(k for k in key if state["key"].get(k) != key[k])
            raise UsageError(
                f"{ckpt}: the checkpoint was written with other options ({', '.join(diff)}); "
                "rerun with the same options or without --resume"
            )
        module.load_state_dict(state["module"])
        opt.load_state_dict(state["optimizer"])
        start = int(state["step"])
        result.losses = list(state["losses"])
    model = wrapper
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(wrapper, device_ids=[torch.device(device).index] if device.startswith("cuda") else None)

    def save(step: int) -> None:
        if ckpt is None or rank != 0:
            return
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        _atomic_save(
            {
                "key": key,
                "module": module.state_dict(),
                "optimizer": opt.state_dict(),
                "step": step,
                "losses": result.losses,
            },
            ckpt,
        )

    bar = tqdm(
        total=total,
        initial=start,
        desc=f"train {cfg.kind}",
        unit="step",
        disable=not progress or rank != 0,
        dynamic_ncols=True,
    )
    t0, seen = time.perf_counter(), 0
    n_sub = cfg.num_heads if linear else module.num_drafts if block else cfg.unroll
    sums = torch.zeros(n_sub)
    cnts = torch.zeros(n_sub)
    completed = start
    try:
        for step in range(start, total):
            if stop_after is not None and step >= stop_after:
                break
            epoch, b = divmod(step + first_batch, steps_per_epoch)
            ids = _epoch_perm(universe, cfg.seed, epoch)[b * per_batch : (b + 1) * per_batch]
            ids = _slice(ids, rank, world)
            if linear:
                batch = linear_batch(cache, pos, ids, cfg.num_heads, want_topk)
            elif block:
                batch = block_batch(
                    cache,
                    aux,
                    wins,
                    ids,
                    module.block_size,
                    module.num_drafts,
                    module.mask_token_id,
                    cfg.seed,
                    step + first_batch,
                    cfg.train_on == "generated",
                    want_topk,
                )
            else:
                batch = recurrent_batch(cache, wins, ids, cfg.unroll, want_topk, cfg.train_on == "generated", aux)
            if remap is not None:
                batch = remap(batch)
            batch = {k: v.to(device) for k, v in batch.items()}
            for g in opt.param_groups:
                g["lr"] = _lr(cfg, step, total)
            loss, per, cnt = model(batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            completed = step + 1
            lv = float(loss.detach())
            result.losses.append(lv)
            if step >= total - max(1, (total - start) // 10):
                sums += per.cpu()
                cnts += cnt.cpu()
            seen += int(cnt[0])
            if (step + 1) % cfg.log_every == 0:
                bar.set_postfix(loss=f"{lv:.3f}", tok_s=f"{seen * world / (time.perf_counter() - t0):.0f}")
            bar.update(1)
            if cfg.ckpt_every and (step + 1) % cfg.ckpt_every == 0:
                save(completed)
        save(completed)
    except KeyboardInterrupt:
        save(completed)
        bar.close()
        raise
    bar.close()
    result.steps = completed
    result.wall_s = time.perf_counter() - t0
    result.tokens_per_s = seen * world / max(result.wall_s, 1e-9)
    result.step_losses = (sums / cnts.clamp_min(1)).tolist()
    return module.eval(), result
