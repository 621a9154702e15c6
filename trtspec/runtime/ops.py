"""trtspec's two kernels as PyTorch custom operators: ``torch.ops.trtspec.rmsnorm_heads`` and
``torch.ops.trtspec.tree_verify``.

Why: TensorRT-LLM's PyTorch backend (and any torch program) calls kernels as torch operators, not as
TensorRT plugins. The operators are defined here with a CPU implementation (the oracle's own maths: the
RMSNorm formula of models.llama and verify.py's greedy walk, vectorised) and a fake (meta) implementation
so torch.compile and opcheck can trace them; ``trtspec.kernels.torch_ops`` registers the CUDA
implementation, the very kernels compiled from ``plugins/kernels/*.cu`` that the TensorRT plugins run.
``verify_greedy_op`` lets the reference runtime verify through the operator
(``GenerationConfig.kernel_ops``); the tests check it is token-identical to verify.py.
"""

from __future__ import annotations

import torch

from trtspec.models.llama import rms_norm
from trtspec.runtime.verify import VerifyResult
from trtspec.tree import TreeBuffers

LAYOUTS = ("head-major", "token-major")


@torch.library.custom_op("trtspec::rmsnorm_heads", mutates_args=())
def rmsnorm_heads(hidden: torch.Tensor, weights: torch.Tensor, eps: float, layout: str = "head-major") -> torch.Tensor:
    """K RMSNorm'ed copies of ``hidden`` [..., H], one per row of ``weights`` [K, H]: [K, ..., H]
    (head-major) or [..., K, H] (token-major); fp32 accumulation, output in hidden's dtype."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    outs = torch.stack([rms_norm(hidden, w, eps).to(hidden.dtype) for w in weights])
    return (outs.movedim(0, -2) if layout == "token-major" else outs).contiguous()


@rmsnorm_heads.register_fake
def _(hidden: torch.Tensor, weights: torch.Tensor, eps: float, layout: str = "head-major") -> torch.Tensor:
    K = weights.shape[0]
    shape = (*hidden.shape[:-1], K, hidden.shape[-1]) if layout == "token-major" else (K, *hidden.shape)
    return hidden.new_empty(shape)


def greedy_walk(
    paths: torch.Tensor, draft_tokens: torch.Tensor, target_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """verify.py's greedy walk with tensor ops only (any device), one tree level at a time.

    At depth d every sequence still walking looks at the paths through its current node: a path's node at
    depth d is a candidate when its token equals the target's argmax at the current node, and the sequence
    moves to the candidate with the lowest node index (the first child in rank order, what verify.py takes
    when siblings share a token). Returns int32 (accepted_len [B], tokens [B, L], best_path [B],
    keep_nodes [B, L]), -1 padded; L = paths.shape[1] = max depth + 1.
    """
    paths = paths.long()
    device = paths.device
    b = draft_tokens.shape[0]
    p, width = paths.shape
    tok = draft_tokens.long()
    arg = target_ids.long()
    big = torch.iinfo(torch.long).max
    cur = torch.zeros(b, dtype=torch.long, device=device)
    alive = torch.ones(b, dtype=torch.bool, device=device)
    accepted = torch.zeros(b, dtype=torch.long, device=device)
    keep = torch.full((b, width), -1, dtype=torch.long, device=device)
    keep[:, 0] = 0
    tokens = torch.full((b, width), -1, dtype=torch.long, device=device)
    want = arg[:, 0]
    for d in range(1, width):
        node = paths[:, d]  # [P] node at depth d of each path
        parent = paths[:, d - 1]
        valid = (node >= 0)[None, :] & (parent[None, :] == cur[:, None])  # [B, P]
        node_tok = tok[:, node.clamp(min=0)]  # [B, P]
        match = valid & (node_tok == want[:, None]) & alive[:, None]
        nxt = torch.where(match, node[None, :].expand(b, p), torch.full_like(node_tok, big)).min(-1).values
        moved = nxt != big
        tokens[:, d - 1] = torch.where(moved, want, tokens[:, d - 1])
        keep[:, d] = torch.where(moved, nxt, keep[:, d])
        cur = torch.where(moved, nxt, cur)
        accepted += moved.long()
        alive &= moved
        want = arg.gather(1, cur[:, None])[:, 0]
    bonus = arg.gather(1, cur[:, None])  # argmax at the last accepted node
    tokens.scatter_(1, accepted[:, None], bonus)
    at_depth = paths.t()[accepted]  # [B, P] node of each path at that depth
    best = (at_depth == cur[:, None]).int().argmax(-1)  # first path holding it
    return accepted.int(), tokens.int(), best.int(), keep.int()


@torch.library.custom_op("trtspec::tree_verify", mutates_args=())
def tree_verify(
    paths: torch.Tensor, draft_tokens: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy tree verification. paths [P, L] (TreeBuffers.paths), draft_tokens [B, N1], target: the
    target's argmax ids [B, N1] or its logits [B, N1, V] (argmax taken). Returns int32 accepted_len [B],
    tokens [B, L] (accepted + bonus), best_path [B], keep_nodes [B, L] (root + accepted), -1 padded."""
    ids = target if target.dim() == 2 else target.argmax(-1)
    return greedy_walk(paths, draft_tokens, ids)


@tree_verify.register_fake
def _(paths: torch.Tensor, draft_tokens: torch.Tensor, target: torch.Tensor):
    b, width = draft_tokens.shape[0], paths.shape[1]
    new = draft_tokens.new_empty
    return (
        new(b, dtype=torch.int32),
        new(b, width, dtype=torch.int32),
        new(b, dtype=torch.int32),
        new(b, width, dtype=torch.int32),
    )


def verify_greedy_op(tree: TreeBuffers, draft_tokens: torch.Tensor, target_argmax: torch.Tensor) -> VerifyResult:
    """verify.verify_greedy through ``torch.ops.trtspec.tree_verify`` (same result, the operator's path)."""
    acc, toks, best, keep = (
        t.cpu().tolist() for t in torch.ops.trtspec.tree_verify(tree.paths, draft_tokens, target_argmax)
    )
    res = VerifyResult([], [], [], [], [])
    for b, n in enumerate(acc):
        res.accepted_len.append(n)
        res.tokens.append(toks[b][: n + 1])
        res.keep_nodes.append(keep[b][: n + 1])
        res.best_path.append(best[b])
        res.bonus.append(toks[b][n])
    return res
