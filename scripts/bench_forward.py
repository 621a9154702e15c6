#!/usr/bin/env python
"""What a tree costs the target: one forward over T new tokens (after a 200-token prefix) on SmolLM2-135M,
for float32 (plain nn.Linear, and the runtime's measured small-row linears, trtspec/models/small_rows.py),
plain bfloat16 and pre-packed bfloat16 (trtspec/models/packed.py), body and lm_head timed apart.
Speculative decoding pays off when T tokens cost about what 1 token does.

    python scripts/bench_forward.py [--tokens 1,5,9,17,33] [--repeat 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import torch

from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.models.llama import build_llama, causal_mask
from trtspec.models.packed import pack_module, packing_supported
from trtspec.models.small_rows import tune_small_rows

PREFIX = 200


@torch.no_grad()
def time_forward(model, T: int, repeat: int) -> tuple[float, float]:
    """Median ms of the body and of the lm_head for T new tokens on top of a committed prefix."""
    g = torch.Generator().manual_seed(0)
    cache = model.new_cache(1, PREFIX + T + 1)
    ids = torch.randint(0, 1000, (1, PREFIX), generator=g)
    model(ids, torch.arange(PREFIX)[None], cache, causal_mask(PREFIX))
    cache.commit([torch.arange(PREFIX)])
    x = torch.randint(0, 1000, (1, T), generator=g)
    pos = cache.lengths[:, None] + torch.arange(T)[None]
    mask = causal_mask(T)
    body, head = [], []
    for i in range(repeat + 3):
        t0 = time.perf_counter()
        h, _ = model(x, pos, cache, mask)
        t1 = time.perf_counter()
        model.logits(h)
        t2 = time.perf_counter()
        if i >= 3:
            body.append(t1 - t0)
            head.append(t2 - t1)
    return 1e3 * sorted(body)[len(body) // 2], 1e3 * sorted(head)[len(head) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, default=ROOT / ".cache" / "smollm2")
    ap.add_argument("--tokens", default="1,5,9,17,33")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not (args.target / "config.json").is_file():
        sys.exit(f"{args.target}: no model; run python scripts/prepare_smollm2.py first")
    target = load_hf_causal_lm(args.target)
    variants = [
        ("float32", torch.float32, None),
        ("float32-tuned", torch.float32, "small_rows"),
        ("bfloat16", torch.bfloat16, None),
    ]
    if packing_supported():
        variants.append(("bfloat16-packed", torch.bfloat16, "packed"))
    else:
        print("this CPU has no oneDNN bfloat16 kernels: packed variant skipped")
    tokens = [int(t) for t in args.tokens.split(",")]
    rows = []
    print(f"{'variant':<16} {'T':>3} {'body ms':>8} {'lm_head ms':>10} {'total ms':>9} {'vs T=1':>7}")
    for name, dtype, prepare in variants:
        model = build_llama(target.arch, target.tensors, dtype)
        if prepare == "small_rows":
            tune_small_rows(model, dtype)  # what the runtime runs in float32
        elif prepare == "packed":
            pack_module(model)
        base = None
        for T in tokens:
            body, head = time_forward(model, T, args.repeat)
            base = base or body + head
            rows.append({"variant": name, "tokens": T, "body_ms": body, "lm_head_ms": head})
            print(
                f"{name:<16} {T:>3} {body:>8.1f} {head:>10.1f} {body + head:>9.1f} {(body + head) / base:>6.2f}x",
                flush=True,
            )
        del model
    if args.json:
        args.json.write_text(json.dumps({"threads": torch.get_num_threads(), "rows": rows}, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
