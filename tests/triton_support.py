"""Shared pieces of the Triton tests: a tiny target + Medusa heads + tokenizer, and the offline oracle.

Kept out of conftest.py on purpose: only the Triton test modules import it.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

PROMPTS = [
    "Hello there, how are",
    "The quick brown fox",
    "Once upon a time",
    "abc def ghi",
    "1 + 1 = 2, 2 + 2 =",
    "Tell me a story",
    "What is the weather like",
    "zzz",
    "Triton serves",
    "speculative decoding is",
]


def make_model(root: Path) -> dict[str, Path]:
    """A real tiny HF Llama dir with a char tokenizer, and FasterDecoding-format Medusa heads next to it."""
    from trtspec.checkpoint.target import load_hf_causal_lm
    from trtspec.demo.build import DEMO_VOCAB
    from trtspec.demo.tiny import make_tiny_llama
    from trtspec.demo.tokenizer import write_char_tokenizer
    from trtspec.drafters.medusa import make_demo

    target = make_tiny_llama(root / "target", seed=0, vocab_size=DEMO_VOCAB, num_hidden_layers=2)
    write_char_tokenizer(target, DEMO_VOCAB)
    heads = make_demo(load_hf_causal_lm(target), root / "medusa", num_heads=3)
    return {"target": target, "heads": heads}


class Oracle:
    """Offline greedy decoding of the same prompt, in-process: what every server answer must equal."""

    def __init__(self, target: Path, heads: Path | None):
        from trtspec.load import load_spec_model, load_tokenizer
        from trtspec.runtime.generate import SpeculativeGenerator

        self.spec = load_spec_model(target, heads)
        self.tok = load_tokenizer(self.spec.target)
        self.gen = SpeculativeGenerator(self.spec)

    @cache
    def tokens(self, prompt: str, max_tokens: int, speculative: bool = False) -> tuple[int, ...]:
        import torch

        from trtspec.runtime.generate import GenerationConfig

        ids = self.tok.encode(prompt)
        cfg = GenerationConfig(
            max_new_tokens=max_tokens, temperature=0.0, eos_token_id=self.tok.eos_token_id, speculative=speculative
        )
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # a tiny model: one thread is fastest, and robust on a busy machine
        try:
            return tuple(self.gen.generate([ids], cfg).tokens[0])
        finally:
            torch.set_num_threads(threads)

    def text(self, prompt: str, max_tokens: int, speculative: bool = False) -> str:
        return self.tok.decode(list(self.tokens(prompt, max_tokens, speculative)), skip_special_tokens=True)
