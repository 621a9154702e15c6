"""Pre-packed bfloat16 linears for CPU inference (oneDNN; AMX/AVX512-BF16 where the CPU has them).

Why: a decode step of a small model on a CPU is a few hundred small matmuls. ``F.linear`` in bfloat16
re-lays the weight out for oneDNN on every call (a fixed ~35-70 us per call, more than the math), and
fp32 GEMM cost grows with the number of rows, so verifying a tree of 9 tokens costs far more than one
token. Packing every weight once into oneDNN's blocked layout makes a call cost nearly the same for 1
and for 17 rows, which is what speculative decoding needs: the target verifies a whole tree for about
the price of one token, as on a GPU. Attention q/k/v and the MLP gate/up are fused into one matmul
each (fewer calls, the same math).

Packed modules are also batch-invariant: a token's result is the same bits whether the target runs it
alone (plain decoding) or inside a tree. oneDNN's packed matmul already is (rows never mix); attention
switches to ``llama.exact_attention`` (float64 sums), because fused SDPA is not. That is what keeps
greedy speculative output token-identical to plain decoding in bfloat16.

Only inference modules are packed (the runtime's target and drafters); training keeps ``nn.Linear``.
Where the CPU or the torch build lacks bfloat16 oneDNN kernels, ``packing_supported`` says so and the
callers keep the plain modules.
"""

from __future__ import annotations

import functools

import torch
from torch import nn


@functools.cache
def packing_supported(dtype: torch.dtype = torch.bfloat16) -> bool:
    """True when this torch build and CPU run oneDNN ``dtype`` linears on pre-packed weights correctly."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return False
        w = torch.randn(8, 16).to(dtype)
        x = torch.randn(3, 16).to(dtype)
        y = packed_matmul(x, pack_weight(w), None)
        tol = 0.1 if dtype == torch.bfloat16 else 1e-3  # bfloat16 rounds the operands; float32 must be exact-ish
        return bool(torch.allclose(y.float(), (x.float() @ w.float().t()), atol=tol, rtol=tol / 2))
    except (RuntimeError, AttributeError):
        return False


class PackedLinear(nn.Module):
    """y = x W^T + b with W held in oneDNN's packed layout. Several linears on the same input may be fused
    (their weights stacked); ``forward`` then returns the stacked output and ``split_sizes`` its parts.
    ``weight`` keeps the plain tensor for code that reads it (the drafters share the target's lm_head)."""

    def __init__(self, linears: list[nn.Linear]):
        super().__init__()
        weight = torch.cat([m.weight.detach() for m in linears]).to(torch.bfloat16).contiguous()
        biases = [m.bias for m in linears]
        if any(b is not None for b in biases):
            bias = torch.cat(
                [b.detach() if b is not None else weight.new_zeros(m.out_features) for b, m in zip(biases, linears)]
            ).to(torch.bfloat16)
        else:
            bias = None
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.split_sizes = [m.out_features for m in linears]
        self.register_buffer("weight", weight, persistent=False)
        self.register_buffer("bias", bias, persistent=False)
        self.register_buffer("packed", pack_weight(weight), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        return packed_matmul(rows, self.packed, self.bias).reshape(*lead, self.out_features)


def pack_weight(weight: torch.Tensor, rows_hint: int = 1) -> torch.Tensor:
    """``weight`` [out, in] laid out once in oneDNN's blocked format, chosen for about ``rows_hint`` rows."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), rows_hint)


def packed_matmul(rows: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """rows [N, in] times a weight in oneDNN's packed layout (``_reorder_linear_weight``), plus bias.

    oneDNN runs a single row through a kernel of its own whose sums round differently (seen in bfloat16 on
    AVX512-BF16 without AMX, SmolLM2's down_proj, K=1536, and in float32 on AVX2 and AVX-512); two rows
    take the kernel every larger batch takes, so plain decoding (1 row) and a tree step (N rows) give the
    same bits."""
    single = rows.shape[0] == 1
    y = torch.ops.mkldnn._linear_pointwise(
        rows.expand(2, -1) if single else rows.contiguous(), packed, bias, "none", [], ""
    )
    return y[:1] if single else y


def pack_module(module: nn.Module, batch_invariant: bool = True) -> int:
    """Replace, in place, every plain ``nn.Linear`` under ``module`` by a PackedLinear, fusing attention
    q/k/v (``Attention.qkv``) and MLP gate/up (``MLP.gate_up``). The module must already be bfloat16 and
    in eval mode. Returns the number of matmuls per forward that were packed.

    ``batch_invariant`` also switches attention to float64 exact sums, so a token's result does not
    depend on how many tokens a step verifies (what keeps speculative output identical to plain). Code
    that only needs the target's outputs, not bit-equality across step shapes (the self-distillation
    cache), passes False: float64 attention re-reads every row's whole KV cache in float64 per layer and
    step, which dominated a 64-row cache of long chat prompts."""
    from trtspec.models.llama import MLP, Attention

    count = 0
    for sub in list(module.modules()):
        if isinstance(sub, Attention) and sub.qkv is None:
            sub.batch_invariant = batch_invariant
            sub.qkv = PackedLinear([sub.q_proj, sub.k_proj, sub.v_proj])
            sub.o_proj = PackedLinear([sub.o_proj])
            del sub.q_proj, sub.k_proj, sub.v_proj
            count += 2
        elif isinstance(sub, MLP) and sub.gate_up is None:
            sub.gate_up = PackedLinear([sub.gate_proj, sub.up_proj])
            sub.down_proj = PackedLinear([sub.down_proj])
            del sub.gate_proj, sub.up_proj
            count += 2
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:  # subclasses (Medusa's ResBlock) have their own forward
                setattr(parent, name, PackedLinear([child]))
                count += 1
    return count


def pack_projection(weight: torch.Tensor) -> PackedLinear:
    """A vocabulary projection (an lm_head weight [V, H]) as a packed callable."""
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    lin.weight = nn.Parameter(weight.detach(), requires_grad=False)
    return PackedLinear([lin])


def pack_if_bf16(
    module: nn.Module, dtype: torch.dtype, device: str | torch.device = "cpu", batch_invariant: bool = True
) -> bool:
    """Pack ``module`` when it runs in bfloat16 on a CPU that supports it; returns whether it did."""
    if dtype != torch.bfloat16 or torch.device(device).type != "cpu" or not packing_supported():
        return False
    pack_module(module, batch_invariant)
    return True
