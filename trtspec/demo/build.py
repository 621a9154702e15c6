"""The embedded demo: a tiny Llama target with a tokenizer, and heads of every registered kind in its
published layout (each kind's ``make_demo``: random or truncated weights).

Everything is written as real files and then read back through the same loaders a user's checkpoint
goes through, so the demo exercises the whole load -> runtime path with nothing downloaded.
"""

from __future__ import annotations

from pathlib import Path

from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.demo.tiny import make_tiny_llama
from trtspec.demo.tokenizer import write_char_tokenizer
from trtspec.drafters import registry

DEMO_VOCAB = 128


def build_demo(out: str | Path, seed: int = 0) -> dict[str, Path]:
    """Write the demo target and heads of every kind under ``out``; returns {kind: heads path},
    plus "target"."""
    out = Path(out)
    target_dir = make_tiny_llama(out / "target", seed=seed, vocab_size=DEMO_VOCAB, num_hidden_layers=4)
    write_char_tokenizer(target_dir, DEMO_VOCAB)
    target = load_hf_causal_lm(target_dir)
    paths: dict[str, Path] = {"target": target_dir}
    for name, kind in registry.KINDS.items():
        paths[name] = kind.make_demo(target, out / "heads" / name)
    return paths
