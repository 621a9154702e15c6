"""Load and validate a Hugging Face Llama-family checkpoint directory (the target, or a draft model).

Accepts one ``model.safetensors`` or shards listed in ``model.safetensors.index.json``; tied or untied
lm_head; Llama, Mistral, Qwen2 and Qwen3 style configs. Tensors stay memory-mapped (TensorStore).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from trtspec.checkpoint.heads.draft_vocab import DRAFT_VOCAB_FILE
from trtspec.checkpoint.tensors import TensorStore
from trtspec.dtypes import DTYPE_NAMES, DTYPES, DtypeError  # noqa: F401 (DTYPES re-exported)
from trtspec.dtypes import parse_dtype as parse_any_dtype
from trtspec.errors import CheckpointError
from trtspec.spec import LlamaArch, TargetSpec

#: model_type -> extra architecture flags. Anything else is refused with a clear message.
SUPPORTED_MODEL_TYPES = {
    "llama": {},
    "mistral": {},
    "qwen2": {"attention_bias": True},
    "qwen3": {"qk_norm": True},
}
SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON object, turning every failure into a CheckpointError that names the file."""
    if not path.is_file():
        raise CheckpointError("file not found", path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"not valid JSON ({exc})", path, "fix or re-download the file") from None
    if not isinstance(data, dict):
        raise CheckpointError("expected a JSON object", path)
    return data


def parse_dtype(name: str | None, where: Path | str) -> torch.dtype:
    if name is None:
        return torch.float32
    try:
        return parse_any_dtype(name)
    except DtypeError:
        raise CheckpointError(
            f"unsupported dtype {name!r}", where, f"use one of {', '.join(DTYPE_NAMES.values())}"
        ) from None


def arch_from_config(cfg: dict[str, Any], path: Path, allow_types: bool = True) -> LlamaArch:
    """Build a LlamaArch from a config.json dict; refuses architectures we cannot run or convert."""
    model_type = cfg.get("model_type", "llama")
    if allow_types and model_type not in SUPPORTED_MODEL_TYPES:
        archs = cfg.get("architectures")
        raise CheckpointError(
            f"unknown architecture model_type={model_type!r} ({archs})",
            path,
            f"trtspec supports {', '.join(SUPPORTED_MODEL_TYPES)}",
        )
    flags = dict(SUPPORTED_MODEL_TYPES.get(model_type, {}))
    required = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    missing = [k for k in required if k not in cfg]
    if missing:
        raise CheckpointError(f"config lacks {', '.join(missing)}", path, "is this a causal LM config.json?")
    rope_scaling = cfg.get("rope_scaling")
    if isinstance(rope_scaling, dict):
        rtype = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
        if rtype not in SUPPORTED_ROPE_TYPES:
            raise CheckpointError(
                f"unsupported rope_scaling type {rtype!r}", path, f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
            )
    rope_theta = cfg.get("rope_theta")
    if rope_theta is None and isinstance(cfg.get("rope_parameters"), dict):  # transformers 5 layout
        rope_theta = cfg["rope_parameters"].get("rope_theta")
        if cfg["rope_parameters"].get("rope_type", "default") != "default" and rope_scaling is None:
            rope_scaling = cfg["rope_parameters"]
    if "attention_bias" in cfg:
        flags["attention_bias"] = bool(cfg["attention_bias"])
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"unsupported hidden_act {act!r}", path, "Llama-family models use silu")
    heads = int(cfg["num_attention_heads"])
    return LlamaArch(
        model_type=model_type,
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        num_hidden_layers=int(cfg["num_hidden_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
        vocab_size=int(cfg["vocab_size"]),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope_theta if rope_theta is not None else 10000.0),
        rope_scaling=rope_scaling if isinstance(rope_scaling, dict) else None,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(flags.get("attention_bias", False)),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=bool(flags.get("qk_norm", False)),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_id=cfg.get("eos_token_id"),
    )


def find_safetensors(directory: Path, allow_pickle: bool = False) -> tuple[list[Path], dict[str, torch.Tensor]]:
    """The weight files of an HF directory: index shards, a single file, or (opt-in) pickles."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        data = read_json(index)
        weight_map = data.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError("index has no weight_map", index, "re-download the index file")
        root = directory.resolve()
        files = []
        for name in sorted(set(weight_map.values())):
            shard = (directory / name).resolve()
            if root not in shard.parents:
                raise CheckpointError(
                    f"index points outside the checkpoint directory: {name!r}",
                    index,
                    "shard names must be plain file names inside the directory",
                )
            if not shard.is_file():
                raise CheckpointError(
                    f"shard {name!r} listed in the index is missing",
                    directory / name,
                    "download every shard the index lists",
                )
            files.append(shard)
        return files, {}
    files = sorted(f for f in directory.glob("*.safetensors") if f.name != DRAFT_VOCAB_FILE)  # a side file, not weights
    if files:
        return files, {}
    pickles = sorted(p for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles and not allow_pickle:
        raise CheckpointError(
            f"only pickle weights found ({pickles[0].name}); pickles can run code",
            pickles[0],
            "convert to safetensors, or pass --allow-pickle to load with weights_only=True",
        )
    if pickles:
        return [], load_pickle_tensors(pickles)
    raise CheckpointError(
        "no *.safetensors weights found", directory, "point --target at a Hugging Face model directory"
    )


def load_pickle_tensors(files: list[Path]) -> dict[str, torch.Tensor]:
    """Opt-in only: torch.load with weights_only=True (no arbitrary code), merged into one dict."""
    out: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            obj = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:  # torch raises many types for bad pickles
            raise CheckpointError(
                f"cannot load pickle with weights_only=True ({exc.__class__.__name__})",
                f,
                "the file is corrupt or holds non-tensor objects",
            ) from None
        if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
            raise CheckpointError("pickle is not a flat state_dict of tensors", f)
        out.update(obj)
    return out


def fingerprint(arch: LlamaArch, tensors: TensorStore) -> str:
    """A short stable id of a target: architecture + the first embedding rows (heads record it)."""
    h = hashlib.sha256(json.dumps(arch.to_hf_dict(), sort_keys=True, default=str).encode())
    emb = "model.embed_tokens.weight"
    if emb in tensors:
        h.update(tensors.load_rows(emb, 4).to(torch.float32).numpy().tobytes())
    return h.hexdigest()[:16]


def expected_shapes(arch: LlamaArch, prefix: str = "model.") -> dict[str, tuple[int, ...]]:
    """Every tensor a Llama-family checkpoint must hold, with its shape (HF names)."""
    H, I, d = arch.hidden_size, arch.intermediate_size, arch.head_dim
    q, kv = arch.num_attention_heads * d, arch.num_key_value_heads * d
    out = {f"{prefix}embed_tokens.weight": (arch.vocab_size, H), f"{prefix}norm.weight": (H,)}
    for i in range(arch.num_hidden_layers):
        p = f"{prefix}layers.{i}."
        out.update(
            {
                p + "input_layernorm.weight": (H,),
                p + "post_attention_layernorm.weight": (H,),
                p + "self_attn.q_proj.weight": (q, H),
                p + "self_attn.k_proj.weight": (kv, H),
                p + "self_attn.v_proj.weight": (kv, H),
                p + "self_attn.o_proj.weight": (H, q),
                p + "mlp.gate_proj.weight": (I, H),
                p + "mlp.up_proj.weight": (I, H),
                p + "mlp.down_proj.weight": (H, I),
            }
        )
        if arch.attention_bias:
            out.update(
                {
                    p + "self_attn.q_proj.bias": (q,),
                    p + "self_attn.k_proj.bias": (kv,),
                    p + "self_attn.v_proj.bias": (kv,),
                }
            )
        if arch.qk_norm:
            out.update({p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)})
    return out


def check_shapes(tensors: TensorStore, shapes: dict[str, tuple[int, ...]], where: Path) -> None:
    for name, shape in shapes.items():
        if name not in tensors:
            raise CheckpointError(f"missing tensor {name!r}", where, "the checkpoint is incomplete")
        got = tensors.shape(name)
        if got != shape:
            raise CheckpointError(
                f"tensor {name!r} has shape {list(got)}, config implies {list(shape)}",
                where,
                "config.json and weights disagree",
            )


def load_hf_causal_lm(path: str | Path, allow_pickle: bool = False, role: str = "target") -> TargetSpec:
    """Load and validate an HF Llama-family directory into a TargetSpec (lazy tensors)."""
    directory = Path(path)
    if not directory.exists():
        raise CheckpointError(f"{role} checkpoint not found", directory)
    if not directory.is_dir():
        raise CheckpointError(f"{role} must be a Hugging Face model directory", directory)
    cfg = read_json(directory / "config.json")
    arch = arch_from_config(cfg, directory / "config.json")
    files, extra = find_safetensors(directory, allow_pickle)
    tensors = TensorStore.from_files(files) if files else TensorStore.from_tensors(extra)
    # Some exports prefix nothing, some "model."; we accept the standard HF layout only.
    shapes = expected_shapes(arch)
    check_shapes(tensors, shapes, directory)
    if "lm_head.weight" in tensors:
        if tensors.shape("lm_head.weight") != (arch.vocab_size, arch.hidden_size):
            raise CheckpointError(
                f"lm_head.weight has shape {list(tensors.shape('lm_head.weight'))}",
                directory,
                f"expected [{arch.vocab_size}, {arch.hidden_size}]",
            )
    elif not arch.tie_word_embeddings:
        raise CheckpointError(
            "no lm_head.weight and tie_word_embeddings is false",
            directory,
            "set tie_word_embeddings: true in config.json or add lm_head.weight",
        )
    dtypes = {tensors[n].dtype for n in shapes}
    if len(dtypes) > 1:
        raise CheckpointError(
            f"mixed tensor dtypes {sorted(str(d) for d in dtypes)}", directory, "re-export the checkpoint in one dtype"
        )
    stored = dtypes.pop()
    if not stored.is_floating_point:
        raise CheckpointError(
            f"weights are {stored}, not floating point (quantized checkpoints are not supported)",
            directory,
            "use an fp32/fp16/bf16 checkpoint",
        )
    tok = (
        directory
        if any((directory / n).exists() for n in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"))
        else None
    )
    return TargetSpec(
        path=directory,
        arch=arch,
        tensors=tensors,
        dtype=stored,
        tokenizer_path=tok,
        config=cfg,
        fingerprint=fingerprint(arch, tensors),
    )


def load_tokenizer(target: TargetSpec):
    """The target's tokenizer (transformers AutoTokenizer), or a clear error when the dir has none."""
    if target.tokenizer_path is None:
        raise CheckpointError(
            "no tokenizer files (tokenizer.json / tokenizer.model)",
            target.path,
            "copy the tokenizer into the target directory or pass token ids",
        )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(target.tokenizer_path))
    except Exception as exc:  # transformers raises many types for broken tokenizer files
        raise CheckpointError(
            f"cannot load tokenizer ({exc.__class__.__name__}: {str(exc)[:120]})", target.tokenizer_path
        ) from None
