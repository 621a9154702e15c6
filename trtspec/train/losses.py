"""The shared-lm_head cross-entropy, memory-light: logits over a 50k-150k vocabulary are never kept in fp32.

Why a custom autograd function: every head kind ends in the target's frozen lm_head, and for a batch of
a few thousand positions the fp32 logits alone are gigabytes. Here the forward keeps only the softmax in
the matmul dtype (bf16 on CPUs with AMX/AVX512-BF16 runs ~2x faster than fp32; on AVX2-only CPUs it is
emulated and several times slower, hence trtspec.dtypes' auto policy) and the backward turns it
into the gradient w.r.t. the head's output; the lm_head gets no gradient (it is the target's).

Targets are sparse distributions: ``idx`` [N, J] token ids with weights ``w`` [N, J]. A hard label is one
id with weight 1; soft labels (the target's cached top-k) add more ids; a row of zero weights is ignored.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class _SparseCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, weight, idx, w, chunk: int):  # type: ignore[override]
        total = torch.zeros((), dtype=torch.float32, device=z.device)
        probs = []
        for s in range(0, z.shape[0], chunk):
            lg = F.linear(z[s : s + chunk], weight).float()
            lse = torch.logsumexp(lg, -1)
            rw = w[s : s + chunk]
            total = total + (lse * rw.sum(1) - (lg.gather(1, idx[s : s + chunk]) * rw).sum(1)).sum()
            probs.append(torch.exp(lg - lse[:, None]).to(z.dtype))
        ctx.save_for_backward(weight, idx, w, torch.cat(probs) if probs else z.new_zeros(0, weight.shape[0]))
        ctx.chunk = chunk
        return total

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        weight, idx, w, probs = ctx.saved_tensors
        out = []
        for s in range(0, probs.shape[0], ctx.chunk):
            rw = w[s : s + ctx.chunk]
            g = probs[s : s + ctx.chunk].float() * rw.sum(1, keepdim=True)
            g.scatter_add_(1, idx[s : s + ctx.chunk], -rw)
            out.append((g * grad).to(weight.dtype) @ weight)
        gz = torch.cat(out) if out else probs.new_zeros(0, weight.shape[1])
        return gz, None, None, None, None


def sparse_ce(
    z: torch.Tensor, weight: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, chunk: int = 1024
) -> torch.Tensor:
    """Sum over rows of CE(softmax(z @ weight.T), sparse target). ``z`` is cast to ``weight``'s dtype."""
    return _SparseCE.apply(z.to(weight.dtype), weight, idx, w.float(), chunk)


def dense_ce(logits: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Sum over rows of CE(softmax(logits), sparse target): for logits that already exist in full (a
    drafter's own small vocabulary, or lm_head logits plus a bias), where ``sparse_ce``'s fused matmul
    does not apply."""
    return -(torch.log_softmax(logits.float(), -1).gather(1, idx) * w).sum()


def targets(
    hard: torch.Tensor,
    valid: torch.Tensor,
    topk_ids: torch.Tensor | None = None,
    topk_logits: torch.Tensor | None = None,
    soft_weight: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse targets [N, J] from hard labels (and optionally the target's top-k logits)."""
    idx = hard.clamp_min(0)[:, None]
    w = valid.float()[:, None]
    if topk_ids is not None and soft_weight > 0:
        p = torch.softmax(topk_logits.float(), -1) * soft_weight * valid.float()[:, None]
        idx = torch.cat([idx, topk_ids.long()], 1)
        w = torch.cat([w * (1 - soft_weight), p], 1)
    return idx, w
