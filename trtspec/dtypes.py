"""The one dtype table and the one ``auto`` dtype policy every command uses.

Why a policy and not a fixed default: bfloat16 matmuls are fast only where the hardware has them. On a
CPU with AVX512-BF16 or AMX a bfloat16 linear runs ~3x faster than float32; on an AVX2-only CPU the same
linear is emulated and runs ~7x *slower* than float32 (and parts of its backward run on one core). A
default tuned on one machine class is the wrong default on the other, so ``auto`` asks the hardware:

* CPU: bfloat16 when the CPU has native bfloat16 instructions (``avx512_bf16`` / ``amx_bf16`` in
  /proc/cpuinfo; ``bf16`` on Arm), float32 otherwise. Where /proc/cpuinfo cannot be read, a short
  float32 vs bfloat16 matmul measurement decides.
* CUDA: bfloat16 where the GPU supports it, float16 otherwise.

``TRTSPEC_CPU_BF16=0|1`` overrides the CPU probe (tests exercise both paths on any machine; a user can
force either). An explicit dtype is always obeyed. Every command prints ``DtypeChoice.describe()`` so a
user sees which dtype ran and why.

This module is a leaf (torch and the standard library only): loaders, the runtime, training and the
CLI all import it without import cycles.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass

import torch

#: name -> torch.dtype, with the short aliases users type. The only such table in trtspec.
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float64": torch.float64,
    "fp64": torch.float64,
}
#: torch.dtype -> canonical name (what configs, metadata and messages write).
DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float64: "float64",
}
#: the compute dtypes commands accept, ``auto`` first (click.Choice lists).
COMPUTE_DTYPES: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16")
#: environment override of the CPU probe: 1 = treat the CPU as having native bfloat16, 0 = as not.
ENV_CPU_BF16 = "TRTSPEC_CPU_BF16"
_NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


class DtypeError(ValueError):
    """An unknown dtype name. Callers that talk to users re-raise it as their own one-line error type."""


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"bf16"``, ``"torch.bfloat16"``, ``torch.bfloat16`` ... -> torch.dtype. ``auto`` is not a dtype:
    resolve it with ``resolve_dtype`` first."""
    if isinstance(name, torch.dtype):
        if name not in DTYPE_NAMES:
            raise DtypeError(f"unsupported dtype {name}; use one of {', '.join(DTYPE_NAMES.values())}")
        return name
    key = str(name).strip().lower().removeprefix("torch.")
    if key not in DTYPES:
        extra = " (or auto)" if key != "auto" else " (auto must be resolved for a device first)"
        raise DtypeError(f"unknown dtype {name!r}; use one of {', '.join(DTYPE_NAMES.values())}{extra}")
    return DTYPES[key]


def dtype_name(dtype: torch.dtype | str) -> str:
    """The canonical name of a dtype (``torch.bfloat16`` / ``"bf16"`` -> ``"bfloat16"``)."""
    return DTYPE_NAMES[parse_dtype(dtype)]


def _cpuinfo_flags() -> set[str] | None:
    """The CPU flags of the first processor in /proc/cpuinfo (``flags`` on x86, ``Features`` on Arm)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip().lower() in ("flags", "features"):
                    return set(value.split())
    except OSError:
        return None
    return None


def _measured_bf16_speedup() -> float:
    """float32 time / bfloat16 time of a mid-sized matmul on this CPU (> 1: bfloat16 is faster). ~0.1 s."""
    a = torch.randn(256, 576)
    b = torch.randn(576, 2048)
    times = []
    for x, y in ((a, b), (a.bfloat16(), b.bfloat16())):
        x @ y
        t0 = time.perf_counter()
        for _ in range(5):
            x @ y
        times.append(time.perf_counter() - t0)
    return times[0] / max(times[1], 1e-9)


@functools.cache
def _probe_cpu() -> tuple[bool, str]:
    """(native bfloat16?, why) for this CPU, without the environment override. Cached: flags do not change."""
    capability = torch.backends.cpu.get_cpu_capability()
    flags = _cpuinfo_flags()
    if flags is not None:
        native = [f for f in _NATIVE_BF16_FLAGS if f in flags]
        if not native and "bf16" in flags and "avx2" not in flags:  # Arm: the 'bf16' feature (BFMMLA)
            native = ["bf16"]
        if native:
            return True, "/".join(native)
        return False, capability
    speedup = _measured_bf16_speedup()
    return speedup > 1.2, f"{capability}, bfloat16 matmul measured {speedup:.1f}x float32's speed"


def cpu_native_bf16() -> tuple[bool, str]:
    """Whether this CPU runs bfloat16 matmuls natively, and the evidence (a flag, the ISA, or the
    ``TRTSPEC_CPU_BF16`` override). Read on every call so tests may flip the override."""
    env = os.environ.get(ENV_CPU_BF16, "").strip()
    if env in ("0", "1"):
        return env == "1", f"{ENV_CPU_BF16}={env}"
    if env:
        raise DtypeError(f"{ENV_CPU_BF16} must be 0 or 1, got {env!r}")
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    if isa and isa.upper() != "ALL" and "BF16" not in isa.upper() and "AMX" not in isa.upper():
        return False, f"ONEDNN_MAX_CPU_ISA={isa}"  # oneDNN was capped below its bfloat16 kernels
    return _probe_cpu()


@dataclass(frozen=True)
class DtypeChoice:
    """A resolved compute dtype and the reason, so every command can say the same thing in one line."""

    dtype: torch.dtype
    requested: str
    reason: str

    @property
    def name(self) -> str:
        return DTYPE_NAMES[self.dtype]

    def describe(self) -> str:
        """E.g. ``dtype: float32 (auto: this CPU has no native bfloat16: AVX2)``."""
        return f"dtype: {self.name} ({self.reason})"


def resolve_dtype(requested: str | torch.dtype | None = "auto", device: str | torch.device = "cpu") -> DtypeChoice:
    """``auto`` (or None) -> the fast dtype for ``device``; a name or dtype -> itself (always obeyed)."""
    if requested is not None and not (isinstance(requested, str) and requested.strip().lower() == "auto"):
        dt = parse_dtype(requested)
        return DtypeChoice(dt, DTYPE_NAMES[dt], "as requested")
    dev = torch.device(device)
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev) if torch.cuda.is_available() else "cuda"
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return DtypeChoice(torch.bfloat16, "auto", f"auto: {name} supports bfloat16")
        return DtypeChoice(torch.float16, "auto", f"auto: {name} has no bfloat16")
    if dev.type != "cpu":
        return DtypeChoice(torch.float32, "auto", f"auto: float32 on {dev.type}")
    native, why = cpu_native_bf16()
    if native:
        return DtypeChoice(torch.bfloat16, "auto", f"auto: this CPU has native bfloat16: {why}")
    return DtypeChoice(torch.float32, "auto", f"auto: this CPU has no native bfloat16: {why}")
