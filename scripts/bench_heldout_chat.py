#!/usr/bin/env python
"""Held-out chat acceptance: several trained heads on the same prompts, greedy, one tree.

Decodes the first ``--prompts`` held-out chat prompts (``chat-eval``: chitchat conversations never in
``chat`` / ``chitchat:N`` training data) with each heads directory and reports the mean acceptance
length (bonus token included), per-position acceptance, and whether the output equals plain greedy.
Use it to compare kinds trained at one budget (same data, steps, seed):

    python scripts/bench_heldout_chat.py --heads eagle=/tmp/h/eagle --heads eagle3=/tmp/h/eagle3
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import torch

from trtspec.dtypes import resolve_dtype
from trtspec.load import load_spec_model, load_tokenizer
from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator
from trtspec.train.corpora import corpus_samples
from trtspec.train.data import encode_prompt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, default=ROOT / ".cache" / "smollm2")
    ap.add_argument("--heads", action="append", required=True, help="NAME=DIR, repeatable")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--tree", default="chain:3", help="draft tree (chain:N or a choices list)")
    ap.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16"],
        default="auto",
        help="decoding dtype of target and drafter (auto: bfloat16 where the CPU has it natively, as the cache)",
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    dtype = resolve_dtype(args.dtype).dtype
    samples = corpus_samples(f"chat-eval:{args.prompts}")
    results, plain = {}, None
    for item in args.heads:
        name, _, path = item.partition("=")
        spec = load_spec_model(args.target, path, tree=args.tree, dtype=dtype)
        tok = load_tokenizer(spec.target)
        prompts = [encode_prompt(tok, s) for s in samples]
        gen = SpeculativeGenerator(spec, dtype=dtype)
        eos = spec.target.arch.eos_token_id
        cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, eos_token_id=eos)
        if plain is None:
            plain = gen.generate(
                prompts, GenerationConfig(max_new_tokens=args.max_new_tokens, speculative=False, eos_token_id=eos)
            ).tokens
        t0 = time.perf_counter()
        with torch.inference_mode():
            res = gen.generate(prompts, cfg)
        m = res.metrics
        results[name] = {
            "kind": spec.drafter.kind,
            "mean_acceptance_length": round(m.mean_acceptance_length, 3),
            "per_position_acceptance": [round(x, 3) for x in m.per_position_acceptance],
            "identical_to_plain_greedy": res.tokens == plain,
            "new_tokens": m.new_tokens,
            "tokens_per_s": round(m.new_tokens / (time.perf_counter() - t0), 1),
        }
        print(f"{name:<10} {json.dumps(results[name])}", flush=True)
    print(f"tree {args.tree}, {len(samples)} held-out chat prompts, {args.max_new_tokens} new tokens, {dtype}")
    if args.json:
        args.json.write_text(json.dumps({"tree": args.tree, "prompts": args.prompts, "runs": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
