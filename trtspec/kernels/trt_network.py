"""Add the trtspec TensorRT plugins to a network (TensorRT or TensorRT-LLM) by creator name/version/namespace.

The creators live in libtrtspec_plugins.so and register themselves with TensorRT's global plugin registry
when the library is loaded into the process (namespace "trtspec"). The engine builder calls these helpers
while it defines the network; the Triton server must load the same library (LD_PRELOAD) before it
deserializes an engine that uses them. `tensorrt` is imported inside the functions: this module imports on
machines without TensorRT, and every entry point says clearly when TensorRT is missing.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtspec.errors import UsageError
from trtspec.kernels.build import PLUGINS_LIB, default_plugins_library

PLUGIN_NAMESPACE = "trtspec"
PLUGIN_VERSION = "1"
RMSNORM_HEADS = "TrtspecRmsNormHeads"
TREE_VERIFY = "TrtspecTreeVerify"

RMSNORM_LAYOUTS = {"head-major": 0, "token-major": 1}
VERIFY_MODES = {"greedy": 0, "sampling": 1}
VERIFY_TARGETS = {"ids": 0, "logits": 1, "probs": 2}

_loaded_library: Path | None = None


def _tensorrt():
    try:
        import tensorrt  # noqa: PLC0415 - only where TensorRT is installed
    except ImportError:
        raise UsageError(
            "the TensorRT Python package is not installed",
            fix="add the trtspec plugins on a machine with TensorRT 10+ (e.g. NVIDIA's TensorRT-LLM container)",
        ) from None
    return tensorrt


def plugin_library_path(path: str | Path | None = None) -> Path:
    """``path``, $TRTSPEC_PLUGIN_LIBRARY, or the default build location of libtrtspec_plugins.so."""
    chosen = Path(path or os.environ.get("TRTSPEC_PLUGIN_LIBRARY") or default_plugins_library())
    return chosen / PLUGINS_LIB if chosen.is_dir() else chosen


def load_plugin_library(path: str | Path | None = None) -> Path:
    """dlopen libtrtspec_plugins.so globally (its creators register on load); once per process."""
    global _loaded_library
    lib = plugin_library_path(path).resolve()
    if _loaded_library == lib:
        return lib
    if not lib.is_file():
        raise UsageError(
            f"{lib}: TensorRT plugin library not found",
            fix="build it where TensorRT is with `trtspec plugins build --with-trt`",
        )
    try:
        ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        raise UsageError(
            f"{lib}: cannot load the plugin library: {exc}",
            fix="load it in a process that has TensorRT's libnvinfer (same major version)",
        ) from None
    _loaded_library = lib
    return lib


def get_creator(name: str, library: str | Path | None = None):
    """The registered creator ``name`` (version "1", namespace "trtspec"), loading the library if needed."""
    trt = _tensorrt()
    registry = trt.get_plugin_registry()
    creator = registry.get_creator(name, PLUGIN_VERSION, PLUGIN_NAMESPACE)
    if creator is None:
        load_plugin_library(library)
        creator = registry.get_creator(name, PLUGIN_VERSION, PLUGIN_NAMESPACE)
    if creator is None:
        raise UsageError(
            f"TensorRT plugin creator {PLUGIN_NAMESPACE}::{name} v{PLUGIN_VERSION} is not registered",
            fix="rebuild libtrtspec_plugins.so with `trtspec plugins build --with-trt`",
        )
    return creator


def rmsnorm_heads_fields(eps: float, layout: str = "head-major") -> list[tuple[str, np.ndarray, str]]:
    """(name, value, PluginFieldType member) of the RmsNormHeads plugin; checked without TensorRT."""
    if layout not in RMSNORM_LAYOUTS:
        raise UsageError(f"unknown RmsNormHeads layout {layout!r}", fix=f"use one of {sorted(RMSNORM_LAYOUTS)}")
    if not eps >= 0:
        raise UsageError(f"RmsNormHeads eps must be >= 0, got {eps}")
    return [
        ("eps", np.array([eps], dtype=np.float32), "FLOAT32"),
        ("layout", np.array([RMSNORM_LAYOUTS[layout]], dtype=np.int32), "INT32"),
    ]


def tree_verify_fields(mode: str = "greedy", target: str = "ids") -> list[tuple[str, np.ndarray, str]]:
    if mode not in VERIFY_MODES or target not in VERIFY_TARGETS or (mode == "sampling" and target == "ids"):
        raise UsageError(
            f"TreeVerify mode {mode!r} with target {target!r} unsupported",
            fix="greedy takes ids, logits or probs; sampling takes logits or probs",
        )
    return [
        ("mode", np.array([VERIFY_MODES[mode]], dtype=np.int32), "INT32"),
        ("target", np.array([VERIFY_TARGETS[target]], dtype=np.int32), "INT32"),
    ]


def tree_verify_num_inputs(mode: str, target: str) -> int:
    """paths, draft_tokens, target (+ temperature for sampling on logits) (+ seed for sampling)."""
    tree_verify_fields(mode, target)
    if mode == "greedy":
        return 3
    return 5 if target == "logits" else 4


def _create(name: str, fields: list[tuple[str, np.ndarray, str]], library):
    trt = _tensorrt()
    creator = get_creator(name, library)
    collection = trt.PluginFieldCollection(
        [trt.PluginField(n, value, getattr(trt.PluginFieldType, kind)) for n, value, kind in fields]
    )
    plugin = creator.create_plugin(name, collection, trt.TensorRTPhase.BUILD)
    if plugin is None:
        raise UsageError(f"TensorRT plugin {name} rejected its fields {[(n, v.tolist()) for n, v, _ in fields]}")
    return plugin


def _unwrap(network, tensors):
    """TensorRT-LLM passes its own Network/Tensor wrappers; TensorRT wants the raw objects."""
    raw_net = getattr(network, "trt_network", network)
    raw = [getattr(t, "trt_tensor", t) for t in tensors]
    wrapped = any(hasattr(t, "trt_tensor") for t in tensors)
    return raw_net, raw, wrapped


def _outputs(layer, count: int, wrapped: bool) -> list[Any]:
    outs = [layer.get_output(i) for i in range(count)]
    if wrapped:  # hand TensorRT-LLM tensors back to TensorRT-LLM code
        from tensorrt_llm.functional import _create_tensor  # noqa: PLC0415

        outs = [_create_tensor(o, layer) for o in outs]
    return outs


def add_rmsnorm_heads(network, hidden, weights, eps: float, layout: str = "head-major", library=None):
    """K RMSNorm'ed copies of ``hidden`` [..., H] with ``weights`` [K, H] (same dtype); returns the output
    tensor: [K, ..., H] (head-major) or [..., K, H] (token-major)."""
    plugin = _create(RMSNORM_HEADS, rmsnorm_heads_fields(eps, layout), library)
    raw_net, inputs, wrapped = _unwrap(network, [hidden, weights])
    layer = raw_net.add_plugin_v3(inputs, [], plugin)
    layer.name = f"{RMSNORM_HEADS}_{layer.name}"
    return _outputs(layer, 1, wrapped)[0]


@dataclass
class TreeVerifyTensors:
    """Network tensors out of TreeVerify (int32): accepted_len [B], tokens [B, L], best_path [B],
    keep_nodes [B, L]."""

    accepted_len: Any
    tokens: Any
    best_path: Any
    keep_nodes: Any


def add_tree_verify(
    network,
    paths,
    draft_tokens,
    target,
    mode: str = "greedy",
    target_kind: str = "ids",
    temperature=None,
    seed=None,
    library=None,
) -> TreeVerifyTensors:
    """Tree verification inside the engine. paths int32 [P, L] (a constant of TreeBuffers.paths),
    draft_tokens int32 [B, N1], target ids int32 [B, N1] or logits/probs [B, N1, V]; sampling needs seed
    (int64 [1], or [2] = (seed, step): the step keeps draws fresh under one seed) and, on logits,
    temperature (float32 [B])."""
    n = tree_verify_num_inputs(mode, target_kind)
    inputs = [paths, draft_tokens, target]
    if mode == "sampling":
        if seed is None or (target_kind == "logits" and temperature is None):
            raise UsageError("TreeVerify sampling needs a seed tensor (and a temperature tensor for logits)")
        inputs += ([temperature] if target_kind == "logits" else []) + [seed]
    assert len(inputs) == n
    plugin = _create(TREE_VERIFY, tree_verify_fields(mode, target_kind), library)
    raw_net, raw_inputs, wrapped = _unwrap(network, inputs)
    layer = raw_net.add_plugin_v3(raw_inputs, [], plugin)
    layer.name = f"{TREE_VERIFY}_{layer.name}"
    return TreeVerifyTensors(*_outputs(layer, 4, wrapped))
