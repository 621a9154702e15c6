"""PyTorch references of both kernels, in the kernels' own input/output layout.

Why a second reference next to trtspec/runtime/verify.py: the kernels take and return padded batch
tensors (paths, [B, N1] tokens, [B, L] outputs), while verify.py works on one TreeBuffers and returns
Python lists. ``tree_verify_reference`` calls verify.py (the specification) and pads its answer, so tests
compare tensors exactly. ``tree_verify_greedy_batched`` is a vectorised torch version (no Python loop over
the batch, one step per tree level) that runs on the GPU; the benchmark times it against the kernel and
the tests check that it agrees with verify.py, including siblings that share a token (first child wins).
"""

from __future__ import annotations

import torch

from trtspec.kernels.bindings import TreeVerifyOutput, rmsnorm_out_shape
from trtspec.models.llama import rms_norm
from trtspec.runtime.ops import greedy_walk
from trtspec.runtime.verify import (
    VerifyResult,
    process_logits,
    verify_greedy,
    verify_sampling,
)
from trtspec.tree import TreeBuffers

#: Stated tolerances of the RMSNorm kernel against rms_norm (atol, rtol), per dtype. The kernel's sum of
#: squares runs in another order than torch's, so r may differ in the last fp32 bit; after rounding to
#: the I/O dtype that is at most one unit in the last place, which these bounds cover.
RMSNORM_TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def rmsnorm_heads_reference(
    hidden: torch.Tensor, weights: torch.Tensor, eps: float, layout: str = "head-major"
) -> torch.Tensor:
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
    return TreeVerifyOutput(
        torch.tensor(res.accepted_len, dtype=torch.int32), tokens, torch.tensor(res.best_path, dtype=torch.int32), keep
    )


#: Odd 64-bit constant of splitmix64: the key of step s is the s-th state of the sequence started at seed.
STEP_GAMMA = 0x9E3779B97F4A7C15


def step_key(seed: int, step: int = 0) -> int:
    """The counter_uniform seed the sampling kernel uses at ``step`` (seed tensor [seed, step]).

    Why: without a step term every verification step with one seed draws the same uniforms, so
    acceptance decisions repeat and the output is no longer distributed as the target. Step 0 is the seed
    itself, so a one-element seed keeps verify.py's numbers."""
    return (int(seed) + int(step) * STEP_GAMMA) & 0xFFFFFFFFFFFFFFFF


def sampling_probs(target: torch.Tensor, target_kind: str, temperature) -> torch.Tensor:
    """The distribution the sampling kernel works on: softmax(logits / max(T, 1e-6)) per row, or probs."""
    if target_kind == "probs":
        return target.float()
    b = target.shape[0]
    temps = torch.as_tensor(1.0 if temperature is None else temperature, dtype=torch.float32).cpu()
    temps = temps.expand(b) if temps.dim() == 0 else temps
    return torch.stack([process_logits(target[i].float(), float(temps[i])) for i in range(b)])


def tree_verify_reference(
    tree: TreeBuffers,
    draft_tokens: torch.Tensor,
    target: torch.Tensor,
    mode: str = "greedy",
    target_kind: str = "ids",
    temperature=None,
    seed: int = 0,
    step: int = 0,
) -> TreeVerifyOutput:
    """What the TreeVerify kernel must return, computed by trtspec/runtime/verify.py on the CPU
    (sampling at ``step`` uses ``step_key(seed, step)``)."""
    draft = draft_tokens.cpu().long()
    target = target.cpu()
    width = tree.max_depth + 1
    if mode == "greedy":
        ids = target.long() if target_kind == "ids" else target.float().argmax(-1)
        return pad_result(verify_greedy(tree, draft, ids), width)
    probs = sampling_probs(target, target_kind, temperature)
    return pad_result(verify_sampling(tree, draft, probs, step_key(seed, step)), width)


def tree_verify_greedy_batched(
    paths: torch.Tensor, draft_tokens: torch.Tensor, target_ids: torch.Tensor
) -> TreeVerifyOutput:
    """Greedy verification with tensor ops only (any device): trtspec.runtime.ops.greedy_walk, the CPU
    implementation of the ``trtspec::tree_verify`` operator, in the kernel's output type."""
    return TreeVerifyOutput(*greedy_walk(paths, draft_tokens, target_ids))
