#!/usr/bin/env python3
"""Reference-runtime numbers on SmolLM2-135M (prepare it with scripts/prepare_smollm2.py):

1. loader: wall time and peak RSS of load_spec_model (validation only, tensors memory-mapped), in a fresh
   subprocess, compared with the largest tensor and the whole checkpoint;
2. speculative vs plain greedy with untrained drafters (draft models made of the target's first N layers):
   mean acceptance length, per-position acceptance, wall-clock speedup, output identity.

    python scripts/bench_runtime.py [--target .cache/smollm2] [--max-new-tokens 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain what a neural network is in two sentences.",
    "List three fruits that are red.",
]

LOADER_PROBE = r"""
import resource, sys, time, json
t0 = time.perf_counter()
import trtspec.load as L
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t1 = time.perf_counter()
spec = L.load_spec_model(sys.argv[1])
t2 = time.perf_counter()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ts = spec.target.tensors
print(json.dumps({"load_s": t2 - t1, "import_s": t1 - t0, "rss_after_import_mb": base / 1024,
                  "peak_rss_mb": peak / 1024, "loader_delta_mb": (peak - base) / 1024,
                  "largest_tensor_mb": max(ts[n].nbytes for n in ts) / 2**20,
                  "model_mb": ts.total_bytes() / 2**20, "tensors": len(ts)}))
"""


def bench_loader(target: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", LOADER_PROBE, str(target)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_decoding(target: Path, max_new: int, configs: list[tuple[int, str]]) -> list[dict]:
    from trtspec.checkpoint.target import load_hf_causal_lm
    from trtspec.checkpoint.truncate import write_truncated_draft
    from trtspec.load import load_spec_model, load_tokenizer
    from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator
    from trtspec.train.data import Sample, encode_prompt

    tgt = load_hf_causal_lm(target)
    tok = load_tokenizer(tgt)
    prompts = [encode_prompt(tok, Sample(text=p), chat=True) for p in PROMPTS]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        plain_gen = SpeculativeGenerator(load_spec_model(target))
        cfg = GenerationConfig(max_new_tokens=max_new, eos_token_id=None)
        plain_gen.generate([prompts[0]], GenerationConfig(max_new_tokens=4))  # warm-up
        t = time.perf_counter()
        plain = [plain_gen.generate([p], cfg).tokens[0] for p in prompts]
        plain_s = time.perf_counter() - t
        n_tokens = sum(len(p) for p in plain)
        rows.append(
            {
                "drafter": "plain",
                "tree": "-",
                "accept_len": 1.0,
                "tok_s": n_tokens / plain_s,
                "speedup": 1.0,
                "identical": True,
            }
        )
        for layers, tree in configs:
            draft = Path(tmp) / f"draft{layers}"
            if not draft.exists():
                write_truncated_draft(tgt, layers, draft)
            gen = SpeculativeGenerator(load_spec_model(target, draft, tree=tree))
            t = time.perf_counter()
            results = [gen.generate([p], cfg) for p in prompts]
            spec_s = time.perf_counter() - t
            steps = sum(r.metrics.sequence_steps for r in results)
            acc = sum(r.metrics.accepted_draft_tokens for r in results)
            depth = max(len(r.metrics.per_position_acceptance) for r in results)
            per_pos = [
                sum(r.metrics.per_position_acceptance[d] * r.metrics.sequence_steps for r in results) / steps
                for d in range(depth)
            ]
            rows.append(
                {
                    "drafter": f"first {layers} layers",
                    "tree": tree,
                    "accept_len": (acc + steps) / steps,
                    "per_position": [round(p, 3) for p in per_pos],
                    "tok_s": n_tokens / spec_s,
                    "speedup": plain_s / spec_s,
                    "identical": [r.tokens[0] for r in results] == plain,
                }
            )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, default=REPO / ".cache" / "smollm2")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if not (args.target / "config.json").is_file():
        print(f"error: {args.target}: no model; run scripts/prepare_smollm2.py", file=sys.stderr)
        return 2
    from trtspec.runtime.report import table

    loader = bench_loader(args.target)
    print("loader (validation, memory-mapped tensors):")
    print(
        table(
            ["load s", "peak RSS MB", "RSS after import MB", "loader delta MB", "largest tensor MB", "model MB"],
            [
                [
                    loader["load_s"],
                    loader["peak_rss_mb"],
                    loader["rss_after_import_mb"],
                    loader["loader_delta_mb"],
                    loader["largest_tensor_mb"],
                    loader["model_mb"],
                ]
            ],
        )
    )
    rows = bench_decoding(
        args.target,
        args.max_new_tokens,
        [(4, "chain:2"), (4, "chain:3"), (6, "chain:3"), (4, "[[0],[1],[0,0],[0,0,0]]")],
    )
    print(f"\ngreedy decoding, {len(PROMPTS)} chat prompts x {args.max_new_tokens} new tokens, batch 1:")
    print(
        table(
            ["drafter", "tree", "accept len", "per-position", "tokens/s", "speedup", "== plain"],
            [
                [
                    r["drafter"],
                    r["tree"],
                    r["accept_len"],
                    " ".join(map(str, r.get("per_position", []))),
                    r["tok_s"],
                    r["speedup"],
                    r["identical"],
                ]
                for r in rows
            ],
        )
    )
    if args.json:
        args.json.write_text(json.dumps({"loader": loader, "decoding": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
