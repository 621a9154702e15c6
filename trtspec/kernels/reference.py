"""PyTorch references of both kernels, in the kernels' own input/output layout.

Why a second reference next to trtspec/runtime/verify.py: the kernels take and return padded batch
tensors (paths, [B, N1] tokens, [B, L] outputs), while verify.py works on one TreeBuffers and returns
Python lists. ``tree_verify_reference`` calls verify.py (the specification) and pads its answer, so tests
compare tensors exactly. ``tree_verify_greedy_batched`` is a vectorised torch version (no Python loop over
the batch) that runs on the GPU; the benchmark times it against the kernel and the tests check that it
agrees with verify.py.
"""

from __future__ import annotations

import torch

from trtspec.kernels.bindings import TreeVerifyOutput, rmsnorm_out_shape
from trtspec.models.llama import rms_norm
from trtspec.tree import TreeBuffers
from trtspec.runtime.verify import VerifyResult, process_logits, verify_greedy, verify_sampling

#: Stated tolerances of the RMSNorm kernel against rms_norm (atol, rtol), per dtype. The kernel's sum of
#: squares runs in another order than torch's, so r may differ in the last fp32 bit; after rounding to
#: the I/O dtype that is at most one unit in the last place, which these bounds cover.
RMSNORM_TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def rmsnorm_heads_reference(hidden: torch.Tensor, weights: torch.Tensor, eps: float,
                            layout: str = "head-major") -> torch.Tensor:
    """rms_norm of ``hidden`` [..., H] with each of ``weights`` [K, H], stacked in the kernel's layout."""
    outs = torch.stack([rms_norm(hidden, w, eps) for w in weights])  # [K, ..., H]
    if layout == "token-major":
        outs = outs.movedim(0, -2)
    assert tuple(outs.shape) == rmsnorm_out_shape(hidden.shape, weights.shape[0], layout)
    return outs.contiguous()


def pad_result(res: VerifyResult, width: int) -> TreeVerifyOutput:
    """verify.py's lists -> the kernel's int32 tensors (-1 padded to ``width`` = max depth + 1)."""
    b = len(res.accepted_len)
    tokens = torch.full((b, width), -1, dtype=torch.int32)
    keep = torch.full((b, width), -1, dtype=torch.int32)
    for i in range(b):
        tokens[i, : len(res.tokens[i])] = torch.tensor(res.tokens[i], dtype=torch.int32)
        keep[i, : len(res.keep_nodes[i])] = torch.tensor(res.keep_nodes[i], dtype=torch.int32)
    return TreeVerifyOutput(torch.tensor(res.accepted_len, dtype=torch.int32), tokens,
                            torch.tensor(res.best_path, dtype=torch.int32), keep)


def sampling_probs(target: torch.Tensor, target_kind: str, temperature) -> torch.Tensor:
    """The distribution the sampling kernel works on: softmax(logits / max(T, 1e-6)) per row, or probs."""
    if target_kind == "probs":
        return target.float()
    b = target.shape[0]
    temps = torch.as_tensor(1.0 if temperature is None else temperature, dtype=torch.float32).cpu()
    temps = temps.expand(b) if temps.dim() == 0 else temps
    return torch.stack([process_logits(target[i].float(), float(temps[i])) for i in range(b)])


def tree_verify_reference(tree: TreeBuffers, draft_tokens: torch.Tensor, target: torch.Tensor,
                          mode: str = "greedy", target_kind: str = "ids", temperature=None,
                          seed: int = 0) -> TreeVerifyOutput:
    """What the TreeVerify kernel must return, computed by trtspec/runtime/verify.py on the CPU."""
    draft = draft_tokens.cpu().long()
    target = target.cpu()
    width = tree.max_depth + 1
    if mode == "greedy":
        ids = target.long() if target_kind == "ids" else target.float().argmax(-1)
        return pad_result(verify_greedy(tree, draft, ids), width)
    probs = sampling_probs(target, target_kind, temperature)
    return pad_result(verify_sampling(tree, draft, probs, int(seed)), width)


def tree_verify_greedy_batched(paths: torch.Tensor, draft_tokens: torch.Tensor,
                               target_ids: torch.Tensor) -> TreeVerifyOutput:
    """Greedy verification with tensor ops only (any device): the usual Medusa-style formulation.

    For each path, the accepted prefix is the run of positions where the node's token equals the target's
    argmax at its parent; the best path is the first one with the longest run. Equal to the greedy walk
    because children carry distinct tokens, so at most one path prefix matches at every depth.
    """
    paths = paths.long()
    b = draft_tokens.shape[0]
    p, width = paths.shape
    valid = paths >= 0
    idx = paths.clamp(min=0)
    tok = draft_tokens.long()[:, idx]                      # [B, P, L] token of each path node
    arg = target_ids.long()[:, idx]                        # [B, P, L] argmax after each path node
    match = (tok[:, :, 1:] == arg[:, :, :-1]) & valid[None, :, 1:]
    run = torch.cumprod(match.int(), dim=-1).sum(-1)      # [B, P]
    accepted = run.max(-1).values                          # [B]
    best = (run == accepted[:, None]).int().argmax(-1)     # first path with the longest run
    best_nodes = idx[best]                                 # [B, L]
    pos = torch.arange(width, device=paths.device)
    keep = torch.where(pos[None, :] <= accepted[:, None], best_nodes, torch.full_like(best_nodes, -1))
    last = best_nodes.gather(1, accepted[:, None])         # [B, 1] last accepted node
    bonus = target_ids.long().gather(1, last)             # [B, 1]
    acc_tokens = draft_tokens.long().gather(1, best_nodes[:, 1:]) if width > 1 else best_nodes[:, :0]
    tokens = torch.full((b, width), -1, dtype=torch.long, device=paths.device)
    tokens[:, :-1] = torch.where(pos[None, :-1] < accepted[:, None], acc_tokens, tokens[:, :-1])
    tokens.scatter_(1, accepted[:, None], bonus)
    return TreeVerifyOutput(accepted.int(), tokens.int(), best.int(), keep.int())
