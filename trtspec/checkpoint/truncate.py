"""Make a draft model from a target by keeping its first N layers (the untrained-drafter baseline).

Tensors are streamed one at a time from the target's memory map into the new safetensors file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import save_file

from trtspec.errors import UsageError
from trtspec.fsutil import atomic_directory
from trtspec.spec import TargetSpec

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
)


def write_truncated_draft(target: TargetSpec, num_layers: int, out: str | Path) -> Path:
    L = target.arch.num_hidden_layers
    if not 1 <= num_layers < L:
        raise UsageError(f"--layers must be between 1 and {L - 1} for a {L}-layer target")
    out = Path(out)
    with atomic_directory(out, overwrite=True) as tmp:
        keep = {}
        for name in target.tensors:
            if name.startswith("model.layers."):
                if int(name.split(".")[2]) >= num_layers:
                    continue
            keep[name] = target.tensors.load(name).contiguous()
        save_file(keep, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        cfg = dict(target.config)
        cfg["num_hidden_layers"] = num_layers
        for k in ("layer_types",):
            if isinstance(cfg.get(k), list):
                cfg[k] = cfg[k][:num_layers]
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        for f in TOKENIZER_FILES:
            if (target.path / f).exists():
                shutil.copy2(target.path / f, tmp / f)
    return out
