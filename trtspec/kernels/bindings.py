"""ctypes bindings to libtrtspec_kernels.so: thin wrappers that take torch CUDA tensors.

Why ctypes: the kernels have a C ABI (plugins/include/trtspec_kernels.h), so testing and benchmarking
them against the PyTorch reference needs no compiled Python extension and no TensorRT. The library
links cudart statically and touches the driver only when a kernel is launched, so it loads (and its
argument checks run) on a machine without a GPU; a launch there fails with a KernelError.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from trtspec.errors import UsageError
from trtspec.kernels.build import KERNELS_LIB, default_kernels_library

#: Must equal TRTSPEC_KERNELS_ABI_VERSION in the header.
ABI_VERSION = 2
MAX_TREE_NODES = 1024

STATUS_OK, STATUS_INVALID, STATUS_UNSUPPORTED, STATUS_CUDA = 0, 1, 2, 3
DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
LAYOUTS = {"head-major": 0, "token-major": 1}
VERIFY_MODES = {("greedy", "ids"): 0, ("greedy", "logits"): 1, ("sampling", "logits"): 2, ("sampling", "probs"): 3}


class KernelError(RuntimeError):
    """A kernel call returned an error status (bad arguments past the Python checks, or a CUDA error)."""

    def __init__(self, function: str, status: int, detail: str):
        self.status = status
        super().__init__(f"{function}: {detail} (status {status})")


_i32, _i64, _f32, _p = ctypes.c_int32, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
_SIGNATURES = {
    "trtspec_kernels_abi_version": (ctypes.c_int, []),
    "trtspec_status_string": (ctypes.c_char_p, [ctypes.c_int]),
    "trtspec_last_cuda_error": (ctypes.c_char_p, []),
    "trtspec_rmsnorm_heads": (
        ctypes.c_int,
        [_p, _i64, _p, _i64, _p, _i64, _i64, _i32, _i32, _i32, _f32, ctypes.c_int, _p],
    ),
    "trtspec_rmsnorm_heads_layout": (
        ctypes.c_int,
        [_p, _p, _p, _i32, _i32, _i32, _f32, ctypes.c_int, ctypes.c_int, _p],
    ),
    "trtspec_tree_verify": (
        ctypes.c_int,
        [ctypes.c_int, _p, _i32, _i32, _p, _i32, _i32, _p, _p, ctypes.c_int, _i32, _p, _p, _i32, _p, _p, _p, _p, _p],
    ),
}


class KernelLibrary:
    """A loaded libtrtspec_kernels.so with typed entry points."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise UsageError(
                f"{self.path}: kernel library not found",
                fix="build it with `trtspec plugins build` (or set TRTSPEC_KERNELS_LIB)",
            )
        try:
            self.lib = ctypes.CDLL(str(self.path))
        except OSError as exc:
            raise UsageError(
                f"{self.path}: cannot load the kernel library: {exc}", fix="rebuild it with `trtspec plugins build`"
            ) from None
        for name, (restype, argtypes) in _SIGNATURES.items():
            try:
                fn = getattr(self.lib, name)
            except AttributeError:
                raise UsageError(f"{self.path}: {name} missing", fix="rebuild with `trtspec plugins build`") from None
            fn.restype, fn.argtypes = restype, argtypes
        #: A host-emulation build (plugins/emu) runs the same kernel sources on the CPU, on host pointers.
        self.host_emulation = hasattr(self.lib, "trtspec_kernels_host_emulation")
        version = self.lib.trtspec_kernels_abi_version()
        if version != ABI_VERSION:
            raise UsageError(
                f"{self.path}: kernel ABI version {version}, this trtspec expects {ABI_VERSION}",
                fix="rebuild with `trtspec plugins build`",
            )

    def status_string(self, status: int) -> str:
        return self.lib.trtspec_status_string(status).decode()

    def check(self, function: str, status: int) -> None:
        if status == STATUS_OK:
            return
        detail = self.status_string(status)
        if status == STATUS_CUDA:
            detail = f"{detail}: {self.lib.trtspec_last_cuda_error().decode()}"
        raise KernelError(function, status, detail)

    def __getattr__(self, name: str):
        if name.startswith("trtspec_"):
            return getattr(self.lib, name)
        raise AttributeError(name)


_LOADED: dict[Path, KernelLibrary] = {}


def load_library(path: str | Path | None = None) -> KernelLibrary:
    """The kernel library at ``path``, $TRTSPEC_KERNELS_LIB, or the default build location (cached)."""
    chosen = Path(path or os.environ.get("TRTSPEC_KERNELS_LIB") or default_kernels_library()).resolve()
    if chosen.is_dir():
        chosen = chosen / KERNELS_LIB
    if chosen not in _LOADED:
        _LOADED[chosen] = KernelLibrary(chosen)
    return _LOADED[chosen]


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _stream(device: torch.device) -> int | None:
    """The current torch stream of ``device`` as a cudaStream_t (kernels order with torch's own work)."""
    if device.type != "cuda":
        return None  # host emulation: no stream
    return torch.cuda.current_stream(device).cuda_stream


def _require_device(name: str, lib: KernelLibrary | None, *tensors: torch.Tensor) -> torch.device:
    """One device for all tensors: CUDA, or the CPU when ``lib`` is a host-emulation build."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise UsageError(f"{name}: all tensors must be on one device, got {sorted(map(str, devices))}")
    device = devices.pop()
    if device.type == "cpu" and lib is not None and lib.host_emulation:
        return device
    if device.type != "cuda":
        raise UsageError(
            f"{name}: the kernels run on CUDA tensors, got {device}",
            fix="move the tensors with .cuda() (the CPU reference is trtspec.kernels.reference)",
        )
    return device


def rmsnorm_heads_call_args(
    hidden: torch.Tensor, weights: torch.Tensor, eps: float, layout: str, out: torch.Tensor
) -> tuple:
    """The argument tuple of trtspec_rmsnorm_heads_layout (no stream); split out so it is checkable."""
    k, h = weights.shape
    t = hidden.numel() // h
    return (_ptr(hidden), _ptr(weights), _ptr(out), t, h, k, float(eps), DTYPES[hidden.dtype], LAYOUTS[layout])


def rmsnorm_out_shape(hidden_shape, num_heads: int, layout: str) -> tuple[int, ...]:
    *lead, h = hidden_shape
    return (num_heads, *lead, h) if layout == "head-major" else (*lead, num_heads, h)


def check_rmsnorm_inputs(hidden: torch.Tensor, weights: torch.Tensor, layout: str) -> None:
    if layout not in LAYOUTS:
        raise UsageError(f"rmsnorm_heads: layout {layout!r} unknown", fix=f"use one of {sorted(LAYOUTS)}")
    if hidden.dtype not in DTYPES:
        raise UsageError(f"rmsnorm_heads: dtype {hidden.dtype} unsupported", fix="use float32, float16 or bfloat16")
    if weights.dtype != hidden.dtype:
        raise UsageError(
            f"rmsnorm_heads: weights are {weights.dtype} but hidden is {hidden.dtype}",
            fix="cast the weights to the activation dtype",
        )
    if hidden.dim() < 1 or weights.dim() != 2 or weights.shape[1] != hidden.shape[-1] or hidden.shape[-1] == 0:
        raise UsageError(
            f"rmsnorm_heads: hidden {tuple(hidden.shape)} and weights {tuple(weights.shape)} do not fit",
            fix="hidden is [..., H], weights [K, H]",
        )
    if hidden.numel() // hidden.shape[-1] >= 2**31:
        raise UsageError("rmsnorm_heads: more than 2^31 - 1 tokens")


def prepare_rmsnorm_heads(
    hidden: torch.Tensor,
    weights: torch.Tensor,
    eps: float,
    layout: str = "head-major",
    out: torch.Tensor | None = None,
    lib: KernelLibrary | None = None,
) -> tuple[Callable[[], None], torch.Tensor]:
    """Check once, allocate the output, and return (launch, out): ``launch()`` runs the kernel on the
    current stream with no further checks or allocations (cheap to call; safe to capture in a CUDA graph)."""
    check_rmsnorm_inputs(hidden, weights, layout)
    device = _require_device("rmsnorm_heads", lib, hidden, weights)
    lib = lib or load_library()
    hidden, weights = hidden.contiguous(), weights.contiguous()
    shape = rmsnorm_out_shape(hidden.shape, weights.shape[0], layout)
    if out is None:
        out = torch.empty(shape, dtype=hidden.dtype, device=device)
    elif tuple(out.shape) != shape or out.dtype != hidden.dtype or not out.is_contiguous() or out.device != device:
        raise UsageError(f"rmsnorm_heads: out must be a contiguous {hidden.dtype} tensor of shape {shape}")
    args = rmsnorm_heads_call_args(hidden, weights, eps, layout, out)
    fn = lib.trtspec_rmsnorm_heads_layout

    def launch(_inputs=(hidden, weights)) -> None:  # the default argument keeps the inputs alive
        lib.check("trtspec_rmsnorm_heads_layout", fn(*args, _stream(device)))

    return launch, out


def rmsnorm_heads(
    hidden: torch.Tensor,
    weights: torch.Tensor,
    eps: float,
    layout: str = "head-major",
    out: torch.Tensor | None = None,
    lib: KernelLibrary | None = None,
) -> torch.Tensor:
    """K RMSNorm'ed copies of ``hidden`` [..., H] with ``weights`` [K, H] on the GPU.

    head-major -> [K, ..., H]; token-major -> [..., K, H]. Same numerics as trtspec.models.llama.rms_norm.
    """
    launch, out = prepare_rmsnorm_heads(hidden, weights, eps, layout, out, lib)
    launch()
    return out


def rmsnorm_heads_strided(
    hidden: torch.Tensor, weights: torch.Tensor, out: torch.Tensor, eps: float, lib: KernelLibrary | None = None
) -> torch.Tensor:
    """The raw strided entry point: hidden [T, H], weights [K, H] and out [K, T, H] may be views with any
    row/head/token strides (the last axis contiguous), e.g. weights sliced out of a wider buffer.

    Why exposed: a network rarely hands the kernel three freshly packed tensors; this is the call that
    checks the kernel honours each stride instead of assuming H."""
    if hidden.dim() != 2 or weights.dim() != 2 or out.dim() != 3:
        raise UsageError("rmsnorm_heads_strided: hidden [T, H], weights [K, H] and out [K, T, H]")
    t, h = hidden.shape
    k = weights.shape[0]
    if weights.shape[1] != h or tuple(out.shape) != (k, t, h):
        raise UsageError(
            f"rmsnorm_heads_strided: shapes {tuple(hidden.shape)}, {tuple(weights.shape)}, "
            f"{tuple(out.shape)} do not fit"
        )
    if (
        1 not in (hidden.stride(-1), weights.stride(-1), out.stride(-1))
        or min(hidden.stride(-1), weights.stride(-1), out.stride(-1)) != 1
        or max(hidden.stride(-1), weights.stride(-1), out.stride(-1)) != 1
    ):
        raise UsageError("rmsnorm_heads_strided: the hidden axis must be contiguous in every tensor")
    check_rmsnorm_inputs(hidden, weights, "head-major")
    if out.dtype != hidden.dtype:
        raise UsageError("rmsnorm_heads_strided: out must have the hidden state's dtype")
    device = _require_device("rmsnorm_heads_strided", lib, hidden, weights, out)
    lib = lib or load_library()
    status = lib.trtspec_rmsnorm_heads(
        _ptr(hidden),
        hidden.stride(0),
        _ptr(weights),
        weights.stride(0),
        _ptr(out),
        out.stride(0),
        out.stride(1),
        t,
        h,
        k,
        float(eps),
        DTYPES[hidden.dtype],
        _stream(device),
    )
    lib.check("trtspec_rmsnorm_heads", status)
    return out


@dataclass
class TreeVerifyOutput:
    """Kernel outputs, int32 tensors: accepted_len [B], tokens [B, L] (accepted + bonus, -1 padded),
    best_path [B], keep_nodes [B, L] (root + accepted node indices, -1 padded)."""

    accepted_len: torch.Tensor
    tokens: torch.Tensor
    best_path: torch.Tensor
    keep_nodes: torch.Tensor

    def as_lists(self) -> dict[str, list]:
        return {k: getattr(self, k).tolist() for k in ("accepted_len", "tokens", "best_path", "keep_nodes")}


def check_tree_verify_inputs(
    paths: torch.Tensor,
    draft_tokens: torch.Tensor,
    mode: str,
    target_kind: str,
    target: torch.Tensor,
    temperature: torch.Tensor | None,
    seed: torch.Tensor | None,
) -> None:
    """Shape and dtype checks shared by the wrapper and its CPU tests."""
    if (mode, target_kind) not in VERIFY_MODES:
        raise UsageError(
            f"tree_verify: mode {mode!r} with target {target_kind!r} unsupported",
            fix="greedy takes ids or logits; sampling takes logits or probs",
        )
    if paths.dtype != torch.int32 or paths.dim() != 2 or paths.shape[0] < 1 or paths.shape[1] < 1:
        raise UsageError(
            f"tree_verify: paths must be int32 [P, L], got {paths.dtype} {tuple(paths.shape)}",
            fix="pass TreeBuffers.paths.int()",
        )
    if draft_tokens.dtype != torch.int32 or draft_tokens.dim() != 2:
        raise UsageError(
            f"tree_verify: draft_tokens must be int32 [B, N1], got {draft_tokens.dtype} {tuple(draft_tokens.shape)}"
        )
    b, n1 = draft_tokens.shape
    if n1 > MAX_TREE_NODES:
        raise UsageError(f"tree_verify: {n1} tree nodes, the kernel handles at most {MAX_TREE_NODES}")
    if paths.shape[1] > n1 or paths.shape[0] > n1 or int(paths.max()) >= n1:
        raise UsageError(f"tree_verify: paths {tuple(paths.shape)} do not fit a tree of {n1} nodes")
    if target_kind == "ids":
        if target.dtype != torch.int32 or tuple(target.shape) != (b, n1):
            raise UsageError(
                f"tree_verify: target ids must be int32 [{b}, {n1}], got {target.dtype} {tuple(target.shape)}"
            )
    else:
        if target.dtype not in DTYPES or target.dim() != 3 or tuple(target.shape[:2]) != (b, n1) or target.shape[2] < 1:
            raise UsageError(
                f"tree_verify: target {target_kind} must be float [{b}, {n1}, V], got "
                f"{target.dtype} {tuple(target.shape)}"
            )
    if mode == "sampling":
        if seed is None or seed.dtype != torch.int64 or seed.numel() not in (1, 2):
            raise UsageError("tree_verify: sampling needs seed as an int64 tensor: [seed] or [seed, step]")
        if (
            target_kind == "logits"
            and temperature is not None
            and (temperature.dtype != torch.float32 or tuple(temperature.shape) != (b,))
        ):
            raise UsageError(f"tree_verify: temperature must be float32 [{b}]")


def prepare_tree_verify(
    paths: torch.Tensor,
    draft_tokens: torch.Tensor,
    target: torch.Tensor,
    mode: str = "greedy",
    target_kind: str = "ids",
    temperature: torch.Tensor | float | None = None,
    seed: torch.Tensor | int | None = None,
    lib: KernelLibrary | None = None,
    step: int | None = None,
) -> tuple[Callable[[], None], TreeVerifyOutput]:
    """Check once, allocate the outputs, and return (launch, outputs); ``launch()`` reruns the kernel on
    the current stream with no checks or allocations (safe to capture in a CUDA graph).

    Sampling draws with key = seed + step * 0x9E3779B97F4A7C15 (``reference.step_key``): pass an int seed
    and ``step``, or an int64 tensor [seed, step] that a captured graph updates in place between steps."""
    device = target.device
    if isinstance(seed, int):
        seed = torch.tensor([seed] if step is None else [seed, step], dtype=torch.int64, device=device)
    elif step is not None:
        raise UsageError("tree_verify: pass step with an int seed, or a seed tensor [seed, step]")
    if isinstance(temperature, (int, float)):
        temperature = torch.full((draft_tokens.shape[0],), float(temperature), dtype=torch.float32, device=device)
    check_tree_verify_inputs(paths, draft_tokens, mode, target_kind, target, temperature, seed)
    sampling = mode == "sampling"
    extra = [t for t in (temperature, seed) if t is not None and sampling]
    device = _require_device("tree_verify", lib, paths, draft_tokens, target, *extra)
    lib = lib or load_library()
    paths, draft_tokens, target = paths.contiguous(), draft_tokens.contiguous(), target.contiguous()
    b, n1 = draft_tokens.shape
    p, length = paths.shape
    i32 = dict(dtype=torch.int32, device=device)
    res = TreeVerifyOutput(
        torch.empty(b, **i32), torch.empty(b, length, **i32), torch.empty(b, **i32), torch.empty(b, length, **i32)
    )
    ids = target if target_kind == "ids" else None
    scores = None if target_kind == "ids" else target
    args = (
        VERIFY_MODES[(mode, target_kind)],
        _ptr(paths),
        p,
        length,
        _ptr(draft_tokens),
        b,
        n1,
        _ptr(ids),
        _ptr(scores),
        DTYPES.get(target.dtype, 0),
        target.shape[2] if scores is not None else 0,
        _ptr(temperature) if sampling else None,
        _ptr(seed) if sampling else None,
        seed.numel() if sampling else 0,
        _ptr(res.accepted_len),
        _ptr(res.tokens),
        _ptr(res.best_path),
        _ptr(res.keep_nodes),
    )
    fn = lib.trtspec_tree_verify

    def launch(_inputs=(paths, draft_tokens, target, temperature, seed)) -> None:  # keeps the inputs alive
        lib.check("trtspec_tree_verify", fn(*args, _stream(device)))

    return launch, res


def tree_verify(
    paths: torch.Tensor,
    draft_tokens: torch.Tensor,
    target: torch.Tensor,
    mode: str = "greedy",
    target_kind: str = "ids",
    temperature: torch.Tensor | float | None = None,
    seed: torch.Tensor | int | None = None,
    lib: KernelLibrary | None = None,
    step: int | None = None,
) -> TreeVerifyOutput:
    """Verify a batch of draft trees on the GPU (trtspec/runtime/verify.py semantics).

    paths int32 [P, L] (TreeBuffers.paths), draft_tokens int32 [B, N1], target: int32 argmax ids [B, N1]
    (target_kind="ids"), logits [B, N1, V] ("logits") or probabilities ("probs"); sampling also takes
    temperature (float or float32 [B], logits only; default 1), seed (int, int64 [1] or [seed, step]) and
    step (with an int seed): the step counter that keeps draws fresh across steps under one seed.
    """
    launch, res = prepare_tree_verify(paths, draft_tokens, target, mode, target_kind, temperature, seed, lib, step)
    launch()
    return res
