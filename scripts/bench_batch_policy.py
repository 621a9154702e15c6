#!/usr/bin/env python3
"""Measure the draft-depth table (draft_len_schedule) for this machine: tokens/s per batch size and depth.

For each batch size B and each tree depth d (0 = plain decoding), B requests run through the in-flight
batcher (runtime.inflight) with the tree cut at depth d, in-process, EOS ignored; after warm-up steps the
script times ``--steps`` target steps and counts the tokens they committed. It prints tokens/s per (B, d),
the best depth per batch size, and that table in the form `trtspec triton emit --draft-len-schedule` takes.

    python scripts/bench_batch_policy.py [--target .cache/smollm2] [--heads DIR] [--tree chain:3] \
        [--batch 1 2 4 8 16 32] [--steps 8] [--json out.json]

Without --heads the drafter is an untrained draft model made of the target's first --draft-layers layers.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # shared cores: do not spin-wait (before torch loads)

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def measure(gen, prompts: list[list[int]], batch: int, depth: int, steps: int, warmup: int) -> dict:
    """Tokens/s of ``steps`` target steps over ``batch`` in-flight requests with the tree cut at ``depth``."""
    from trtspec.runtime.generate import GenerationConfig
    from trtspec.runtime.inflight import InflightBatcher

    b = InflightBatcher(gen, batch, speculative=depth > 0)
    b.policy.schedule = {1 << 20: depth} if depth > 0 else {}
    cfg = GenerationConfig(max_new_tokens=10_000, eos_token_id=None)
    b.admit([prompts[i % len(prompts)] for i in range(batch)], [cfg] * batch)
    for _ in range(warmup):
        b.step()
    tokens, t0 = 0, time.perf_counter()
    for _ in range(steps):
        tokens += sum(len(o.tokens) for o in b.step())
    wall = time.perf_counter() - t0
    return {
        "batch": batch,
        "depth": depth,
        "step_ms": 1e3 * wall / steps,
        "tokens_per_step": tokens / steps / batch,
        "tokens_per_s": tokens / wall,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, default=REPO / ".cache" / "smollm2")
    ap.add_argument("--heads", type=Path, default=None)
    ap.add_argument("--heads-format", default=None)
    ap.add_argument("--tree", default="chain:3")
    ap.add_argument("--draft-layers", type=int, default=8)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = every core this process may use)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if not (args.target / "config.json").is_file():
        sys.exit(f"error: {args.target}: no model (run scripts/prepare_smollm2.py first)")

    from trtspec.checkpoint.target import load_hf_causal_lm
    from trtspec.client.bench import DEFAULT_PROMPTS
    from trtspec.cpu import configure_threads, setup_compute
    from trtspec.load import load_spec_model, load_tokenizer
    from trtspec.runtime.batch_policy import parse_schedule
    from trtspec.runtime.generate import SpeculativeGenerator

    if args.threads:
        configure_threads(args.threads)
    choice = setup_compute("auto", "cpu")
    heads, fmt = args.heads, args.heads_format
    if heads is None:
        from trtspec.checkpoint.truncate import write_truncated_draft

        tmp = Path(tempfile.mkdtemp(prefix="bench_batch_policy-"))
        heads = write_truncated_draft(load_hf_causal_lm(args.target), args.draft_layers, tmp / "draft")
        fmt = "draft-model"
    spec = load_spec_model(args.target, heads, heads_format=fmt, tree=args.tree, dtype=choice.dtype)
    gen = SpeculativeGenerator(spec, dtype=choice.dtype)
    tok = load_tokenizer(spec.target)
    prompts = [tok.encode(p) for p in DEFAULT_PROMPTS]
    depth = gen.tree.max_depth
    print(f"spec: {spec.describe()}  load average {os.getloadavg()[0]:.1f} (other jobs share this CPU)")
    rows, table = [], {}
    for batch in args.batch:
        best = None
        for d in range(depth + 1):
            r = measure(gen, prompts, batch, d, args.steps, args.warmup)
            rows.append(r)
            print(
                f"batch {batch:3d} depth {d}: step {r['step_ms']:7.1f} ms  {r['tokens_per_step']:.2f} tok/step/request"
                f"  {r['tokens_per_s']:7.1f} tok/s",
                flush=True,
            )
            if best is None or r["tokens_per_s"] > best["tokens_per_s"]:
                best = r
        table[batch] = best["depth"]
        plain = next(r for r in rows if r["batch"] == batch and r["depth"] == 0)
        print(f"  -> best depth {best['depth']} ({best['tokens_per_s'] / plain['tokens_per_s']:.2f}x plain)")
    # a schedule in TensorRT-LLM's form: thresholds where the depth changes; full depth at the smallest
    schedule: dict[int, int] = {}
    sizes = sorted(table)
    for i, b in enumerate(sizes):
        d = depth if i == 0 else table[b]
        if i + 1 < len(sizes) and table[sizes[i + 1]] == d:
            continue
        schedule[b] = d
    schedule = {k: v for k, v in schedule.items() if v > 0 or k == sizes[0]}
    text = ",".join(f"{k}:{v}" for k, v in parse_schedule(schedule, depth).items())
    print(f"measured best depth per batch size: {table}")
    print(f"draft_len_schedule: {text}   (trtspec triton emit --draft-len-schedule {text})")
    if args.json:
        args.json.write_text(json.dumps({"spec": spec.describe(), "rows": rows, "schedule": text}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
