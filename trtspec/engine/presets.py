"""Build presets (build_configs/*.yaml): strict keys, typed values, command-line overrides on top.

Why strict: a misspelt key in a deployment preset (``max_batchsize``) would otherwise be silently
ignored and the engine built with a default nobody chose.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from trtspec.errors import UsageError

_CHECKOUT_PRESETS = Path(__file__).resolve().parents[2] / "build_configs"
#: the checkout's build_configs/, else the copy a wheel installs under <prefix>/share/trtspec/
PRESET_DIR = (
    _CHECKOUT_PRESETS if _CHECKOUT_PRESETS.is_dir() else Path(sys.prefix) / "share" / "trtspec" / "build_configs"
)

#: key -> (types, default, help). None default = "derive it" (from the model, the tree, or the GPU).
KEYS: dict[str, tuple[tuple[type, ...], Any, str]] = {
    "description": ((str,), "", "free text"),
    "dtype": ((str,), None, "float16 | bfloat16 | float32 (default: the checkpoint's)"),
    "max_batch_size": ((int,), 8, "trtllm-build --max_batch_size"),
    "max_input_len": ((int,), 1024, "trtllm-build --max_input_len"),
    "max_seq_len": ((int,), 2048, "trtllm-build --max_seq_len (prompt + output)"),
    "max_num_tokens": ((int, type(None)), None, "trtllm-build --max_num_tokens (default: TensorRT-LLM's)"),
    "max_draft_len": ((int, type(None)), None, "draft tokens per step (default: the tree's node count)"),
    "tree": ((list, str, type(None)), None, "draft tree: a choices list, 'chain:N', or the heads' default"),
    "tp_size": ((int,), 1, "tensor parallel size"),
    "pp_size": ((int,), 1, "pipeline parallel size"),
    "draft_tp_size": ((int, type(None)), None, "draft-model engine TP size (default: tp_size)"),
    "use_parallel_embedding": ((bool, type(None)), None, "vocab-parallel embedding (default: on when tp > 1)"),
    "embedding_sharding_dim": ((int,), 0, "0 = shard the vocab, 1 = shard the hidden dim"),
    "kv_cache_free_gpu_mem_fraction": ((float,), 0.9, "Triton tensorrt_llm parameter"),
    "runtime": ((str,), "trtllm", "Triton repository runtime: trtllm | reference"),
    "decoupled": ((bool,), True, "Triton decoupled_mode: streaming (true) or plain unary requests (false)"),
    "gpus_per_node": ((int,), 8, "GPUs per node (TensorRT-LLM mapping)"),
}
DTYPES = ("float16", "bfloat16", "float32")


def defaults() -> dict[str, Any]:
    return {k: v[1] for k, v in KEYS.items()}


def resolve_preset_path(name_or_path: str | Path) -> Path:
    p = Path(name_or_path)
    if p.is_file():
        return p
    for cand in (PRESET_DIR / f"{name_or_path}.yaml", PRESET_DIR / str(name_or_path)):
        if cand.is_file():
            return cand
    known = ", ".join(sorted(x.stem for x in PRESET_DIR.glob("*.yaml"))) if PRESET_DIR.is_dir() else "none"
    raise UsageError(f"build config {name_or_path!r} not found (presets: {known})")


def validate(values: dict[str, Any], where: str) -> dict[str, Any]:
    """Check keys and types; returns the values (ints accepted where floats are expected)."""
    unknown = sorted(set(values) - set(KEYS))
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(KEYS)})")
    out = {}
    for k, v in values.items():
        types = KEYS[k][0]
        if float in types and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
            raise UsageError(f"{where}: {k} must be {'/'.join(t.__name__ for t in types)}, got {v!r}")
        out[k] = v
    if out.get("dtype") is not None and out["dtype"] not in DTYPES:
        raise UsageError(f"{where}: dtype must be one of {', '.join(DTYPES)}, got {out['dtype']!r}")
    for k in ("max_batch_size", "max_input_len", "max_seq_len", "tp_size", "pp_size"):
        if k in out and out[k] < 1:
            raise UsageError(f"{where}: {k} must be >= 1")
    frac = out.get("kv_cache_free_gpu_mem_fraction")
    if frac is not None and not 0.0 < frac <= 1.0:
        raise UsageError(f"{where}: kv_cache_free_gpu_mem_fraction must be in (0, 1]")
    if out.get("runtime") not in (None, "trtllm", "reference"):
        raise UsageError(f"{where}: runtime must be trtllm or reference")
    return out


def load_preset(name_or_path: str | Path) -> tuple[Path, dict[str, Any]]:
    path = resolve_preset_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping of options")
    return path, validate(data, str(path))


def merge(preset: dict[str, Any] | None, overrides: dict[str, Any]) -> dict[str, Any]:
    """defaults < preset < command line (only options the user actually gave, i.e. not None)."""
    out = defaults()
    out.update(preset or {})
    given = {k: v for k, v in overrides.items() if v is not None}
    out.update(validate(given, "command line"))
    if out["max_input_len"] > out["max_seq_len"]:
        raise UsageError(f"max_input_len {out['max_input_len']} exceeds max_seq_len {out['max_seq_len']}")
    return out
