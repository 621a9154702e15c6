"""The "block" training style: a block drafter learns to fill B-1 positions at once from random anchors.

Shaped like serving (trtspec/drafters/block_proposer.py): at an anchor position p the committed context
is every position < p (the target's aux-layer states there), the block is ``[x_p, mask x (B-1)]`` at
positions p .. p+B-1, and block position j is trained towards a_{p+j-1}, the target's own greedy choice
for position p+j (on the target's replies that is the text itself). Many anchors of one sequence share
one forward: the context keys are computed once and each block's queries see the context before its own
anchor plus their own block (a block-sparse mask). Position j's loss is weighted ``step_decay ** (j-1)``:
a late position only counts when every earlier one is accepted. The module's own methods do the math,
so the trained drafter is exactly the one the runtime runs.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trtspec.train.cache import HiddenCache
from trtspec.train.losses import dense_ce, sparse_ce, targets

#: anchors drawn per sequence window and step (fewer when the window has fewer)
ANCHORS = 16
#: weight of the confidence head's loss against the drafts' cross-entropy
CONFIDENCE_WEIGHT = 0.2


def per_batch(batch_tokens: int, block_size: int) -> int:
    """Sequence windows per step so that a step runs about ``batch_tokens`` block tokens."""
    return max(1, int(round(batch_tokens / (ANCHORS * block_size))))


def block_batch(
    cache: HiddenCache,
    aux: list[np.ndarray],
    wins: list[tuple[int, int, int]],
    ids: np.ndarray,
    block_size: int,
    num_drafts: int,
    mask_token_id: int,
    seed: int,
    step: int,
    generated_only: bool = True,
    want_topk: bool = False,
) -> dict[str, torch.Tensor]:
    """Windows ``ids`` of ``wins`` (sequence, first position, length) with up to ANCHORS anchors each,
    drawn by a generator seeded with (seed, step) so a resumed run sees the same batch. Anchor p needs
    a context (p > window start) and, with ``generated_only``, lies in the target's reply. ``want_topk``:
    also each draft's cached top-k of the target (``topk_ids``/``topk_logits`` [S, A, D, k])."""
    sel = [wins[int(i)] for i in ids]
    S, T = len(sel), max(w[2] for w in sel)
    B, A, D = block_size, ANCHORS, num_drafts
    width = aux[0].shape[1]
    ctx = np.zeros((S, T, width), dtype=np.float32)
    ctx_pos = np.zeros((S, T), dtype=np.int64)
    ctx_valid = np.zeros((S, T), dtype=bool)
    anchor = np.full((S, A), -1, dtype=np.int64)  # absolute position, -1 = no anchor
    tokens = np.full((S, A * B), mask_token_id, dtype=np.int64)
    labels = np.full((S, A, D), -1, dtype=np.int64)  # draft i: the target's choice for position p+i+1
    prev = np.zeros((S, A, D), dtype=np.int64)  # the token before draft i's position (x_{p+i})
    k_top = cache.shards[0].topk_ids.shape[1] if want_topk else 0
    topk_ids = np.zeros((S, A, D, k_top), dtype=np.int64)
    topk_logits = np.full((S, A, D, k_top), -1e4, dtype=np.float32)  # padding: no weight
    rng = np.random.default_rng([seed, step])
    for s, (qi, a, m) in enumerate(sel):
        shard_i, start, n = cache.sequences[qi]
        seq = cache.sequence(qi)
        ctx[s, :m] = aux[shard_i][start + a : start + a + m]
        ctx_pos[s, :m] = np.arange(a, a + m)
        ctx_valid[s, :m] = True
        first = max(a + 1, cache.prompt_lengths[qi] if generated_only else 1)
        cand = np.arange(first, a + m)
        if len(cand) == 0:
            continue
        picks = np.sort(rng.choice(cand, size=min(A, len(cand)), replace=False))
        for k, p in enumerate(picks):
            anchor[s, k] = p
            tokens[s, k * B] = seq["tokens"][p]
            last = min(p + D, n)  # a_{p+i} for positions p+i+1, i = 0 .. D-1, within the sequence
            labels[s, k, : last - p] = seq["argmax"][p:last]
            prev[s, k, : last - p] = seq["tokens"][p:last]
            if want_topk:
                topk_ids[s, k, : last - p] = seq["topk_ids"][p:last]
                topk_logits[s, k, : last - p] = seq["topk_logits"][p:last]
    out = {
        "ctx": torch.from_numpy(ctx),
        "ctx_pos": torch.from_numpy(ctx_pos),
        "ctx_valid": torch.from_numpy(ctx_valid),
        "anchor": torch.from_numpy(anchor),
        "tokens": torch.from_numpy(tokens),
        "labels": torch.from_numpy(labels),
        "prev": torch.from_numpy(prev),
    }
    if want_topk:
        out["topk_ids"], out["topk_logits"] = torch.from_numpy(topk_ids), torch.from_numpy(topk_logits)
    return out


def block_mask(anchor: torch.Tensor, ctx_pos: torch.Tensor, ctx_valid: torch.Tensor, B: int) -> torch.Tensor:
    """[S, 1, A*B, T + A*B]: block k's queries see context positions before its anchor and block k."""
    S, A = anchor.shape
    sees_ctx = ctx_valid[:, None, :] & (ctx_pos[:, None, :] < anchor[:, :, None])  # [S, A, T]
    sees_ctx = sees_ctx.repeat_interleave(B, 1)  # [S, A*B, T]
    own = torch.block_diag(*[torch.ones(B, B, dtype=torch.bool, device=anchor.device)] * A)
    return torch.cat([sees_ctx, own[None].expand(S, -1, -1)], -1)[:, None]


def anchored_states(
    module: nn.Module,
    emb: torch.Tensor,
    anchor: torch.Tensor,
    prefix: list[tuple[torch.Tensor, torch.Tensor]],
    ctx_pos: torch.Tensor,
    ctx_valid: torch.Tensor,
) -> torch.Tensor:
    """Draft states [S, A, D, H] of A blocks per row whose embedded tokens ``emb`` [S, A*B, H] start at
    ``anchor`` [S, A] (-1: no block), over the context keys/values ``prefix`` at ``ctx_pos`` [S, T]
    (used where ``ctx_valid``): block k sees the context before its anchor and itself (``block_mask``)."""
    S, A = anchor.shape
    B = module.block_size
    pos = anchor.clamp_min(0).repeat_interleave(B, 1) + torch.arange(B, device=anchor.device).repeat(A)[None]
    h = module.blocks(emb, pos, prefix, block_mask(anchor, ctx_pos, ctx_valid, B))
    return module.draft_states(h.view(S, A, B, -1))


class BlockLoss(nn.Module):
    """One forward = the whole step's loss (so DDP sees one graph); returns (loss, per-draft CE sums,
    per-draft label counts) like the trainer's other losses.

    A module with a Markov head (``markov_head``) adds its bias of the true previous token to each draft's
    logits (teacher forcing, as DeepSpec trains it); one with a confidence head (``confidence``) also
    learns, by binary cross-entropy weighted like the drafts, whether its draft's top-1 equals the
    target's choice (greedy acceptance given the true prefix). ``label_ids``: the vocabulary rows of
    ``lm_head`` when it is restricted (train-heads --label-vocab cache). With ``soft_weight`` > 0 and a
    batch carrying the target's top-k, each draft's target mixes the hard label with the target's top-k
    distribution (DFlash's self-distillation on the target's logits, truncated to the cached top-k)."""

    def __init__(
        self,
        module: nn.Module,
        embed: torch.Tensor,
        lm_head: torch.Tensor,
        step_decay: float,
        label_ids: torch.Tensor | None = None,
        confidence_weight: float = CONFIDENCE_WEIGHT,
        soft_weight: float = 0.0,
    ):
        super().__init__()
        self.module, self.step_decay, self.confidence_weight = module, step_decay, confidence_weight
        self.soft_weight = soft_weight
        self.register_buffer("embed", embed, persistent=False)
        self.register_buffer("lm_head", lm_head, persistent=False)
        self.label_ids = label_ids

    def forward(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        m = self.module
        D = m.num_drafts
        anchor = batch["anchor"]
        prefix = m.context_kv(batch["ctx"], batch["ctx_pos"])
        emb = F.embedding(batch["tokens"], self.embed)
        z = anchored_states(m, emb, anchor, prefix, batch["ctx_pos"], batch["ctx_valid"])  # [S, A, D, H]
        markov = getattr(m, "markov_head", None)
        total = z.new_zeros(())
        losses, counts = [], []
        for i in range(D):
            lab = batch["labels"][:, :, i].reshape(-1)
            valid = lab >= 0
            zi = z[:, :, i].reshape(-1, z.shape[-1])
            prev = batch["prev"][:, :, i].reshape(-1)
            weight = self.step_decay**i
            soft = "topk_ids" in batch
            tk = batch["topk_ids"][:, :, i].reshape(lab.shape[0], -1) if soft else None
            tv = batch["topk_logits"][:, :, i].reshape(lab.shape[0], -1) if soft else None
            idx, w = targets(lab, valid, tk, tv, self.soft_weight)
            if markov is None:
                ce = sparse_ce(zi, self.lm_head, idx, w)
                logits = None
            else:
                bias = markov(prev, self.label_ids)
                logits = F.linear(zi.to(self.lm_head.dtype), self.lm_head).float() + bias.float()
                ce = dense_ce(logits, idx, w)
            n = valid.sum().clamp_min(1)
            total = total + weight * ce / n
            conf = m.confidence(zi, prev) if hasattr(m, "confidence") else None
            if conf is not None:
                if logits is None:
                    logits = F.linear(zi.detach().to(self.lm_head.dtype), self.lm_head).float()
                hit = (logits.detach().argmax(-1) == lab).float()
                bce = F.binary_cross_entropy_with_logits(conf, hit, reduction="none")
                total = total + self.confidence_weight * weight * (bce * valid).sum() / n
            losses.append(ce.detach())
            counts.append(valid.sum())
        return total, torch.stack(losses), torch.stack(counts).float()
