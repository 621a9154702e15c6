"""trtspec's own heads format, shared by the MTP kinds: ``trtspec_heads.json`` + ``heads.safetensors``.

``trtspec_heads.json``: {"format": "trtspec-heads", "version": 1, "kind": <kind name>, "num_heads",
"num_layers", "hidden_size", "vocab_size", "has_rmsnorm", "rms_norm_eps", kind-specific fields (e.g. the
decoder layer's widths), "target": {"fingerprint", "model_type", "path"}}. Tensor names are the
canonical names (the head modules' parameter names), so no renaming happens on load or save. Which
tensors a kind's metadata implies is the kind module's business (``shapes``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from trtspec.checkpoint.heads.common import check_hidden, check_vocab, expect_shape, open_weights, single_dtype
from trtspec.checkpoint.target import read_json
from trtspec.errors import CheckpointError
from trtspec.fsutil import atomic_directory
from trtspec.spec import DrafterSpec, LlamaArch, TargetSpec

META_FILE = "trtspec_heads.json"
#: why MTP heads trained by trtspec have no TensorRT-LLM PyTorch-backend route (llm_args.py MTPDecodingConfig,
#: modeling_speculative.MTPForCausalLM: MTP runs only the MTP layers inside a supported target's checkpoint)
NO_GENERIC_MTP = (
    "TensorRT-LLM's PyTorch backend runs MTP only from the MTP layers inside supported targets (DeepSeek-V3, "
    "Qwen3-Next, GLM-4 MoE, ...): it has no generic MTP heads for other targets; deploy these heads as an engine "
    "(--backend engine) or with trtspec's reference runtime"
)
WEIGHTS_FILE = "heads.safetensors"
log = logging.getLogger("trtspec")


def declared_kind(meta: dict[str, Any] | None) -> str | None:
    """The kind a trtspec_heads.json declares (detection asks this)."""
    if not meta or meta.get("format") != "trtspec-heads":
        return None
    return meta.get("kind")


def load_trtspec_heads(
    path: Path,
    target: TargetSpec,
    kind: str,
    allow_pickle: bool,
    shapes: Callable[[dict[str, Any]], dict[str, tuple[int, ...]]],
    arch: Callable[[dict[str, Any], TargetSpec], LlamaArch | None] = lambda meta, target: None,
) -> DrafterSpec:
    """Read and validate heads of ``kind`` in this format: every tensor ``shapes(meta)`` implies must be
    there with that shape; the target fingerprint is compared (a warning: fine-tuned variants differ)."""
    directory = path if path.is_dir() else path.parent
    meta_path = directory / META_FILE
    meta = read_json(meta_path)
    if meta.get("format") != "trtspec-heads":
        raise CheckpointError("not a trtspec heads file (format != 'trtspec-heads')", meta_path)
    if meta.get("kind") != kind:
        raise CheckpointError(f"heads kind is {meta.get('kind')!r}, expected {kind!r}", meta_path)
    try:
        expected = shapes(meta)
        drafter_arch = arch(meta, target)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"metadata lacks or mistypes {exc}", meta_path) from None
    check_hidden(int(meta["hidden_size"]), target, meta_path)
    check_vocab(int(meta["vocab_size"]), target, meta_path)
    store = open_weights(directory, (WEIGHTS_FILE,), allow_pickle)
    for name, shape in expected.items():
        expect_shape(store, name, shape, directory / WEIGHTS_FILE, f"{kind} metadata")
    fp = (meta.get("target") or {}).get("fingerprint")
    if fp and fp != target.fingerprint:
        log.warning(
            "%s: heads were trained on a target with fingerprint %s, this target is %s "
            "(fine for a fine-tuned variant; expect lower acceptance otherwise)",
            meta_path,
            fp,
            target.fingerprint,
        )
    config = {k: v for k, v in meta.items() if k not in ("format", "version", "kind")}
    config.setdefault("rms_norm_eps", target.arch.rms_norm_eps)
    config.setdefault("num_layers", 1)
    return DrafterSpec(kind, directory, store, config, arch=drafter_arch, dtype=single_dtype(store, directory))


def save_trtspec_heads(out: Path, kind: str, tensors: dict, target: TargetSpec, **meta_fields: Any) -> Path:
    """Write heads in this format; atomic via a temp dir renamed at the end."""
    with atomic_directory(Path(out), overwrite=True) as tmp:
        meta = {
            "format": "trtspec-heads",
            "version": 1,
            "kind": kind,
            "hidden_size": target.arch.hidden_size,
            "vocab_size": target.arch.vocab_size,
            **meta_fields,
            "target": {
                "fingerprint": target.fingerprint,
                "model_type": target.arch.model_type,
                "path": str(target.path),
            },
        }
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp / WEIGHTS_FILE))
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return Path(out)
