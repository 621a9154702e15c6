"""Seconds-long head training for demos and smoke tests: a real trtspec training run, just tiny.

Why: the embedded demo's target is random, so random heads accept nothing. Training on the target's own
greedy replies to a handful of prompts takes ~10 s on 2 cores and gives acceptance lengths > 1 on those
prompts -- enough to show the whole path (self-distillation cache -> trainer -> published format ->
loader -> runtime) working, with nothing downloaded.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.train.cache import HiddenCache, build_cache
from trtspec.train.heads import save_heads
from trtspec.train.trainer import TrainConfig, train


def demo_prompts(vocab_size: int, n: int = 32, seed: int = 0, low: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(low, vocab_size) for _ in range(rng.randrange(4, 12))] for _ in range(n)]


def quick_train_heads(
    target_dir: str | Path,
    kind: str,
    out: str | Path,
    prompts: list[list[int]] | None = None,
    steps: int = 60,
    gen_tokens: int = 32,
    seed: int = 0,
    cache_dir: str | Path | None = None,
) -> Path:
    """Train ``kind`` heads for the target at ``target_dir`` on its replies to ``prompts`` and write them."""
    target = load_hf_causal_lm(target_dir)
    prompts = prompts or demo_prompts(target.arch.vocab_size, seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        cdir = Path(cache_dir) if cache_dir else Path(tmp) / "cache"
        build_cache(target, prompts, cdir, gen_tokens=gen_tokens, batch_size=16, progress=False)
        cfg = TrainConfig(
            kind=kind, steps=steps, batch_tokens=256, lr=3e-3, lm_dtype="float32", warmup=5, seed=seed, ckpt_every=0
        )
        module, res = train(target, HiddenCache(cdir), cfg, progress=False)
    return save_heads(kind, module, target, out, {"steps": res.steps, "final_loss": res.final_loss, "quick": True})
