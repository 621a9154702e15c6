"""Linears for the few rows of a decode step, each computed the way that is fastest on this CPU, measured.

Why: a decode step multiplies 1 row (plain decoding) or a handful (a draft tree) by every weight, and on
CPUs the BLAS call ``F.linear`` makes for that is often far from the memory bandwidth. Measured on a
2-core AMD EPYC in float32, SmolLM2-135M's lm_head (576 x 49152): ``F.linear`` takes 9.7 ms for 1 row,
22.6 ms for 2 and 33.5 ms for 3 (each row re-reads the weight), while ``W @ x^T`` takes 3.2 ms for 2 rows;
plain decoding went from 16-17 to 24-26 tokens/s, and a step verifying a chain of 1 costs 1.1-1.3x a plain
step instead of 1.6x.
Other CPUs and BLAS builds differ (bfloat16 on the same CPU has no such gap), so nothing is assumed:
``tune_small_rows`` times the candidate ways for each weight shape and row count on the machine it runs on
and keeps the fastest (``F.linear`` when nothing beats it by a margin).

Candidates: ``linear`` (F.linear), ``wxt`` (W @ x^T: the BLAS sees a tall-skinny GEMM), for one row
``wxt2`` (the row twice, so the same GEMM kernel runs as for a 2-row tree, a token's sums being the
same whether it is decoded alone or verified in a chain of 1), and ``packed`` (oneDNN on a copy of the
weight laid out once in its blocked format, where this torch build has float32 oneDNN linears). Packed
costs nearly the same for 1 and for 16 rows, where BLAS grows with the rows: on the 2-core EPYC above,
capped at AVX2, a whole SmolLM2-135M forward over 9 tree tokens took 72 ms packed against 102 ms with
``wxt``, while for 1 row ``wxt2`` stayed ahead (52 vs 59 ms), so the plan mixes them by row count. A
weight gets its packed copy only when its plan uses it. Every candidate computes the same
product; only the order of the floating-point sums may differ, as it already does between BLAS kernels
for 1 and for N rows. Only modules that run inference get this (the runtime's target); training keeps
``nn.Linear``. ``TRTSPEC_SMALL_ROWS=0`` turns it off.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from trtspec.models.packed import pack_weight, packed_matmul, packing_supported

#: row counts that are measured; a step with another count uses the next measured one above it
MEASURED_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
#: a candidate must be this much faster than F.linear to be chosen (timing noise)
MARGIN = 0.10

_PLANS: dict[tuple, dict[int, str]] = {}


def _wxt(x2: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    # both ends contiguous: W @ x^T is [out, rows], whose transpose as a view would hand the next layer a
    # column-major input (and BLAS a different, slower kernel); the copy is rows x out floats
    return (weight @ x2.contiguous().T).T.contiguous()


#: oneDNN's packed layout is chosen for this many rows; measured on AVX2 and AVX-512 CPUs, 16 keeps 1-2
#: rows as fast as the default hint (1) and makes 9-16 rows up to 1.4x faster
PACK_ROWS_HINT = 16


def _apply(
    how: str, x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor | None = None
) -> torch.Tensor:
    if how == "linear":
        return F.linear(x2, weight, bias)
    if how == "packed":
        return packed_matmul(x2, packed, bias)
    # the row twice in real memory: an expand()ed (stride-0) operand sends BLAS down a slow path
    y = _wxt(x2.repeat(2, 1), weight)[:1] if how == "wxt2" else _wxt(x2, weight)
    return y + bias if bias is not None else y


def _time(fn: Callable[[], object], reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


#: weights are timed from memory, not from cache, as a decode step streams them: a small weight is timed
#: over enough copies to exceed this many bytes (hot in cache, the fastest way for small weights differs)
COLD_BYTES = 96 << 20


def measure_plan(weight: torch.Tensor, bias: torch.Tensor | None, reps: int = 3) -> dict[int, str]:
    """For each measured row count, the fastest way to multiply by ``weight`` on this machine."""
    plan: dict[int, str] = {}
    size = weight.numel() * weight.element_size()
    copies = [weight] + [weight.clone() for _ in range(min(64, COLD_BYTES // max(size, 1)) - 1)]
    can_pack = packing_supported(weight.dtype)
    packs = [pack_weight(w, PACK_ROWS_HINT) for w in copies] if can_pack else [None] * len(copies)
    for rows in MEASURED_ROWS:
        x = torch.randn(rows, weight.shape[1], dtype=weight.dtype)
        options = ["linear", "wxt"] + (["wxt2"] if rows == 1 else []) + (["packed"] if can_pack else [])

        def run(how: str, x: torch.Tensor = x) -> None:
            for w, p in zip(copies, packs):
                _apply(how, x, w, bias, p)

        times = {how: _time(lambda how=how: run(how), reps) for how in options}
        best = min(times, key=times.get)
        plan[rows] = best if times[best] < times["linear"] * (1 - MARGIN) else "linear"
    return plan


class SmallRowsLinear(nn.Module):
    """An ``nn.Linear`` whose forward follows a measured plan for up to ``MEASURED_ROWS[-1]`` rows (more
    rows: F.linear). ``weight``/``bias`` are the original parameters (drafters read the lm_head's)."""

    def __init__(self, linear: nn.Linear, plan: dict[int, str]):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        #: row count -> way, for every count up to the largest measured one
        self.by_rows = [plan[min(r for r in MEASURED_ROWS if r >= n)] for n in range(1, MEASURED_ROWS[-1] + 1)]
        self.packed = pack_weight(linear.weight, PACK_ROWS_HINT) if "packed" in self.by_rows else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows == 0 or rows > len(self.by_rows) or self.by_rows[rows - 1] == "linear":
            return F.linear(x, self.weight, self.bias)
        y = _apply(self.by_rows[rows - 1], x.reshape(rows, self.in_features), self.weight, self.bias, self.packed)
        return y.reshape(*x.shape[:-1], self.out_features)


def small_rows_projection(weight: torch.Tensor, device: str | torch.device = "cpu") -> torch.Tensor | nn.Module:
    """A vocabulary projection (a weight [V, H]) as a callable module tuned like the linears, or the weight
    itself where nothing beats F.linear (``models.heads.project`` takes either)."""
    holder = nn.Module()
    holder.proj = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    holder.proj.weight = nn.Parameter(weight.detach(), requires_grad=False)
    changed = tune_small_rows(holder, weight.dtype, device)
    return holder.proj if changed else weight


def tune_small_rows(module: nn.Module, dtype: torch.dtype, device: str | torch.device = "cpu") -> dict[tuple, dict]:
    """Replace, in place, every plain ``nn.Linear`` under ``module`` whose measured plan beats F.linear
    somewhere by a SmallRowsLinear. One measurement per weight shape, dtype and thread count per process.
    Returns the plans that changed something, by (out_features, in_features)."""
    if torch.device(device).type != "cpu" or os.environ.get("TRTSPEC_SMALL_ROWS", "1") == "0":
        return {}
    changed: dict[tuple, dict] = {}
    with torch.no_grad():
        for parent in list(module.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is not nn.Linear or child.weight.dtype != dtype:
                    continue  # subclasses (Medusa's ResBlock) have their own forward
                key = (child.out_features, child.in_features, child.bias is not None, dtype, torch.get_num_threads())
                if key not in _PLANS:
                    _PLANS[key] = measure_plan(
                        child.weight.detach(), None if child.bias is None else child.bias.detach()
                    )
                plan = _PLANS[key]
                if any(how != "linear" for how in plan.values()):
                    setattr(parent, name, SmallRowsLinear(child, plan))
                    changed[(child.out_features, child.in_features)] = plan
    return changed
