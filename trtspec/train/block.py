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
from trtspec.train.losses import sparse_ce, targets

#: anchors drawn per sequence window and step (fewer when the window has fewer)
ANCHORS = 16


def per_batch(batch_tokens: int, block_size: int) -> int:
    """Sequence windows per step so that a step runs about ``batch_tokens`` block tokens."""
    return max(1, int(round(batch_tokens / (ANCHORS * block_size))))


def block_batch(
    cache: HiddenCache,
    aux: list[np.ndarray],
    wins: list[tuple[int, int, int]],
    ids: np.ndarray,
    block_size: int,
    mask_token_id: int,
    seed: int,
    step: int,
    generated_only: bool = True,
) -> dict[str, torch.Tensor]:
    """Windows ``ids`` of ``wins`` (sequence, first position, length) with up to ANCHORS anchors each,
    drawn by a generator seeded with (seed, step) so a resumed run sees the same batch. Anchor p needs
    a context (p > window start) and, with ``generated_only``, lies in the target's reply."""
    sel = [wins[int(i)] for i in ids]
    S, T = len(sel), max(w[2] for w in sel)
    B, A = block_size, ANCHORS
    width = aux[0].shape[1]
    ctx = np.zeros((S, T, width), dtype=np.float32)
    ctx_pos = np.zeros((S, T), dtype=np.int64)
    ctx_valid = np.zeros((S, T), dtype=bool)
    anchor = np.full((S, A), -1, dtype=np.int64)  # absolute position, -1 = no anchor
    tokens = np.full((S, A * B), mask_token_id, dtype=np.int64)
    labels = np.full((S, A, B - 1), -1, dtype=np.int64)
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
            last = min(p + B - 1, n)  # label a_{p+j-1} for positions p+j, j = 1 .. B-1, within the sequence
            labels[s, k, : last - p] = seq["argmax"][p:last]
    return {
        "ctx": torch.from_numpy(ctx),
        "ctx_pos": torch.from_numpy(ctx_pos),
        "ctx_valid": torch.from_numpy(ctx_valid),
        "anchor": torch.from_numpy(anchor),
        "tokens": torch.from_numpy(tokens),
        "labels": torch.from_numpy(labels),
    }


def block_mask(anchor: torch.Tensor, ctx_pos: torch.Tensor, ctx_valid: torch.Tensor, B: int) -> torch.Tensor:
    """[S, 1, A*B, T + A*B]: block k's queries see context positions before its anchor and block k."""
    S, A = anchor.shape
    sees_ctx = ctx_valid[:, None, :] & (ctx_pos[:, None, :] < anchor[:, :, None])  # [S, A, T]
    sees_ctx = sees_ctx.repeat_interleave(B, 1)  # [S, A*B, T]
    own = torch.block_diag(*[torch.ones(B, B, dtype=torch.bool, device=anchor.device)] * A)
    return torch.cat([sees_ctx, own[None].expand(S, -1, -1)], -1)[:, None]


class BlockLoss(nn.Module):
    """One forward = the whole step's loss (so DDP sees one graph); returns (loss, per-position CE sums,
    per-position label counts) like the trainer's other losses."""

    def __init__(self, module: nn.Module, embed: torch.Tensor, lm_head: torch.Tensor, step_decay: float):
        super().__init__()
        self.module, self.step_decay = module, step_decay
        self.register_buffer("embed", embed, persistent=False)
        self.register_buffer("lm_head", lm_head, persistent=False)

    def forward(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        m = self.module
        B = m.block_size
        anchor = batch["anchor"]
        S, A = anchor.shape
        prefix = m.context_kv(batch["ctx"], batch["ctx_pos"])
        pos = anchor.clamp_min(0).repeat_interleave(B, 1) + torch.arange(B, device=anchor.device).repeat(A)[None]
        mask = block_mask(anchor, batch["ctx_pos"], batch["ctx_valid"], B)
        h = m.blocks(F.embedding(batch["tokens"], self.embed), pos, prefix, mask)
        z = h.view(S, A, B, -1)[:, :, 1:]  # [S, A, B-1, H]
        total = h.new_zeros(())
        losses, counts = [], []
        for j in range(B - 1):
            lab = batch["labels"][:, :, j].reshape(-1)
            valid = lab >= 0
            idx, w = targets(lab, valid)
            ce = sparse_ce(z[:, :, j].reshape(-1, z.shape[-1]), self.lm_head, idx, w)
            total = total + (self.step_decay**j) * ce / valid.sum().clamp_min(1)
            losses.append(ce.detach())
            counts.append(valid.sum())
        return total, torch.stack(losses), torch.stack(counts).float()
