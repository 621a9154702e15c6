"""trtspec's own MTP heads: ``trtspec_heads.json`` + ``heads.safetensors`` (names = canonical names).

``trtspec_heads.json``: {"format": "trtspec-heads", "version": 1, "kind": "mtp-linear"|"mtp-single",
"num_heads", "num_layers", "hidden_size", "vocab_size", "has_rmsnorm", "rms_norm_eps", and for
mtp-single the decoder layer's "intermediate_size", "num_attention_heads", "num_key_value_heads",
"head_dim"; "target": {"fingerprint", "model_type", "path"}}.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from trtspec.checkpoint.errors import CheckpointError
from trtspec.checkpoint.heads.common import check_hidden, check_vocab, expect_shape, open_weights, single_dtype
from trtspec.checkpoint.target import read_json
from trtspec.models.heads import layer_arch
from trtspec.spec import DrafterSpec, TargetSpec

META_FILE = "trtspec_heads.json"
WEIGHTS_FILE = "heads.safetensors"
MTP_KINDS = ("mtp-linear", "mtp-single")
log = logging.getLogger("trtspec")


def mtp_shapes(meta: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor the metadata implies, with its shape (used to validate and by the trainer)."""
    H, K, L = int(meta["hidden_size"]), int(meta["num_heads"]), int(meta.get("num_layers", 1))
    norm = bool(meta.get("has_rmsnorm", True))
    out: dict[str, tuple[int, ...]] = {}
    if meta["kind"] == "mtp-linear":
        for k in range(K):
            if norm:
                out[f"heads.{k}.norm.weight"] = (H,)
            for l in range(L):
                out[f"heads.{k}.res.{l}.weight"] = (H, H)
                out[f"heads.{k}.res.{l}.bias"] = (H,)
        return out
    I, d = int(meta["intermediate_size"]), int(meta["head_dim"])
    q, kv = int(meta["num_attention_heads"]) * d, int(meta["num_key_value_heads"]) * d
    out.update({"eh_proj.weight": (H, 2 * H), "layer.input_layernorm.weight": (H,),
                "layer.post_attention_layernorm.weight": (H,), "layer.self_attn.q_proj.weight": (q, H),
                "layer.self_attn.k_proj.weight": (kv, H), "layer.self_attn.v_proj.weight": (kv, H),
                "layer.self_attn.o_proj.weight": (H, q), "layer.mlp.gate_proj.weight": (I, H),
                "layer.mlp.up_proj.weight": (I, H), "layer.mlp.down_proj.weight": (H, I)})
    if norm:
        out.update({"enorm.weight": (H,), "hnorm.weight": (H,), "norm.weight": (H,)})
    return out


def load_mtp(path: Path, target: TargetSpec, allow_pickle: bool = False, ignore_fingerprint: bool = False) -> DrafterSpec:
    directory = path if path.is_dir() else path.parent
    meta_path = directory / META_FILE
    meta = read_json(meta_path)
    if meta.get("format") != "trtspec-heads":
        raise CheckpointError("not a trtspec heads file (format != 'trtspec-heads')", meta_path)
    kind = meta.get("kind")
    if kind not in MTP_KINDS:
        raise CheckpointError(f"unknown heads kind {kind!r}", meta_path, f"expected one of {', '.join(MTP_KINDS)}")
    try:
        shapes = mtp_shapes(meta)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"metadata lacks or mistypes {exc}", meta_path) from None
    check_hidden(int(meta["hidden_size"]), target, meta_path)
    check_vocab(int(meta["vocab_size"]), target, meta_path)
    store = open_weights(directory, (WEIGHTS_FILE,), allow_pickle)
    for name, shape in shapes.items():
        expect_shape(store, name, shape, directory / WEIGHTS_FILE, f"{kind} metadata")
    fp = (meta.get("target") or {}).get("fingerprint")
    if fp and fp != target.fingerprint and not ignore_fingerprint:
        log.warning("%s: heads were trained on a target with fingerprint %s, this target is %s "
                    "(fine for a fine-tuned variant; expect lower acceptance otherwise)", meta_path, fp, target.fingerprint)
    arch = None
    if kind == "mtp-single":
        arch = layer_arch(target.arch, intermediate_size=int(meta["intermediate_size"]),
                          num_attention_heads=int(meta["num_attention_heads"]),
                          num_key_value_heads=int(meta["num_key_value_heads"]), head_dim=int(meta["head_dim"]),
                          rms_norm_eps=float(meta.get("rms_norm_eps", target.arch.rms_norm_eps)))
    config = {k: v for k, v in meta.items() if k not in ("format", "version", "kind")}
    config.setdefault("rms_norm_eps", target.arch.rms_norm_eps)
    config.setdefault("num_layers", 1)
    return DrafterSpec(kind, directory, store, config, arch=arch, dtype=single_dtype(store, directory))


def save_mtp(out: Path, kind: str, tensors: dict, target: TargetSpec, **meta_fields: Any) -> Path:
    """Write heads in this format (used by the trainer and the demo); atomic via a temp dir."""
    from trtspec.fsutil import atomic_directory

    with atomic_directory(Path(out), overwrite=True) as tmp:
        meta = {"format": "trtspec-heads", "version": 1, "kind": kind,
                "hidden_size": target.arch.hidden_size, "vocab_size": target.arch.vocab_size,
                **meta_fields,
                "target": {"fingerprint": target.fingerprint, "model_type": target.arch.model_type,
                           "path": str(target.path)}}
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp / WEIGHTS_FILE))
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return Path(out)
