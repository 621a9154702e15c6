"""CUDA implementations of the ``trtspec::`` torch operators: the kernels of ``libtrtspec_kernels.so``,
built from the same ``plugins/kernels/*.cu`` sources as the TensorRT plugins.

Importing this module registers them (``torch.library.register_kernel``); the operators themselves and
their CPU and fake implementations live in ``trtspec.runtime.ops``. Nothing is loaded until a CUDA tensor
reaches an operator, so the import is safe on a machine without a GPU.
"""

from __future__ import annotations

import torch

from trtspec.kernels import bindings
from trtspec.runtime import ops


def _rmsnorm_heads_cuda(hidden: torch.Tensor, weights: torch.Tensor, eps: float, layout: str = "head-major"):
    return bindings.rmsnorm_heads(hidden, weights, eps, layout)


def _tree_verify_cuda(paths: torch.Tensor, draft_tokens: torch.Tensor, target: torch.Tensor):
    kind = "ids" if target.dim() == 2 else "logits"
    out = bindings.tree_verify(
        paths.int(), draft_tokens.int(), target.int() if kind == "ids" else target, "greedy", kind
    )
    return out.accepted_len, out.tokens, out.best_path, out.keep_nodes


torch.library.register_kernel(ops.rmsnorm_heads, "cuda", _rmsnorm_heads_cuda)
torch.library.register_kernel(ops.tree_verify, "cuda", _tree_verify_cuda)
