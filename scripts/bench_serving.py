#!/usr/bin/env python3
"""Serving numbers through the real Triton server (CPU, `reference` runtime) vs the offline runtime.

For one target + drafter, in one run: emit two repositories from the same SpecModel (speculative, and
plain decoding with the same model code), serve each with `TritonServer` on 127.0.0.1, and run the
closed-loop load generator (`trtspec client bench`) at each concurrency; then time the offline reference
runtime on the same prompts, batch 1, to get the overhead of the Triton path.

    python scripts/prepare_smollm2.py
    python scripts/bench_serving.py [--target .cache/smollm2] [--heads DIR] [--tree chain:4] \
        [--concurrency 1 8 | --sweep] [--requests 8] [--max-tokens 32] [--protocol grpc] [--json out.json] \
        [--adaptive] [--draft-len-schedule 1:3,4:2] [--plot out.png]

Both servers run at once and each concurrency level runs speculative, then plain, back to back (`trtspec
client bench --plain-url`), so a shared machine's drifting load hits both alike.

Without --heads the drafter is an untrained draft model made of the target's first --draft-layers layers.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # shared cores: do not spin-wait (before torch loads)

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def offline(spec, tok, prompts, max_tokens, speculative, dtype=None) -> dict:
    """Batch-1 offline generation of every prompt (EOS ignored): mean latency, tokens/s, acceptance length."""
    from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator

    gen = SpeculativeGenerator(spec, dtype=dtype)
    cfg = GenerationConfig(max_new_tokens=max_tokens, eos_token_id=None, speculative=speculative)
    gen.generate([tok.encode(prompts[0])], cfg)  # warm-up
    lat, toks, acc, steps = [], 0, 0, 0
    for p in prompts:
        t0 = time.perf_counter()
        r = gen.generate([tok.encode(p)], cfg)
        lat.append(time.perf_counter() - t0)
        toks += len(r.tokens[0])
        acc += r.metrics.accepted_draft_tokens
        steps += r.metrics.sequence_steps
    return {
        "e2e_mean_ms": 1e3 * statistics.fmean(lat),
        "tokens_per_s": toks / sum(lat),
        "mean_acceptance_length": (acc + steps) / max(steps, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, default=REPO / ".cache" / "smollm2")
    ap.add_argument("--heads", type=Path, default=None)
    ap.add_argument("--heads-format", default=None)
    ap.add_argument("--tree", default=None)
    ap.add_argument("--draft-layers", type=int, default=8)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--protocol", choices=["http", "grpc"], default="grpc")
    ap.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch threads, offline and in the server alike (0 = torch's default); 1 is the robust "
        "choice on a small shared machine",
    )
    ap.add_argument(
        "--chitchat",
        action="store_true",
        help="prompts = the held-out chitchat conversations bench_acceptance.py evaluates on",
    )
    ap.add_argument(
        "--domain",
        default=None,
        help="prompts = the held-out part of one training source (chat, prose, code), as bench_acceptance.py",
    )
    ap.add_argument("--also-draft", default=None, help="a model-free drafter beside --heads (e.g. suffix)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--sweep", action="store_true", help="concurrency 1, 2, 4, 8, 16, 32")
    ap.add_argument("--max-batch-size", type=int, default=32, help="requests in flight per server")
    ap.add_argument("--adaptive", action="store_true", help="served adaptive speculation (triton emit --adaptive)")
    ap.add_argument("--draft-len-schedule", default=None, help="draft depth per batch size, e.g. 1:3,4:2")
    ap.add_argument("--plot", type=Path, default=None, help="PNG of tokens/s, TTFT and ITL against concurrency")
    ap.add_argument(
        "--dtype", default="auto", help="served dtype (auto: bfloat16 where the CPU has it natively, as serve does)"
    )
    args = ap.parse_args()
    if not (args.target / "config.json").is_file():
        sys.exit(f"error: {args.target}: no model (run scripts/prepare_smollm2.py first)")

    from trtspec.checkpoint.target import load_hf_causal_lm
    from trtspec.client.bench import DEFAULT_PROMPTS
    from trtspec.client.common import GenerateParams
    from trtspec.load import load_spec_model, load_tokenizer
    from trtspec.triton.emit import emit_repository
    from trtspec.triton.server import TritonServer

    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)

    tmp = Path(tempfile.mkdtemp(prefix="bench_serving-"))
    heads, fmt = args.heads, args.heads_format
    if heads is None:
        from trtspec.checkpoint.truncate import write_truncated_draft

        heads = write_truncated_draft(load_hf_causal_lm(args.target), args.draft_layers, tmp / "draft")
        fmt = "draft-model"
    spec = load_spec_model(args.target, heads, heads_format=fmt, tree=args.tree, also_draft=args.also_draft)
    tok = load_tokenizer(spec.target)
    print(f"spec: {spec.describe()}")
    prompts = list(DEFAULT_PROMPTS)[: args.requests] or list(DEFAULT_PROMPTS)
    if args.chitchat:
        from trtspec.train.data import chitchat_samples, encode_prompt, split_holdout

        _, held = split_holdout(chitchat_samples(700, seed=0), 40)
        prompts = [tok.decode(encode_prompt(tok, s)) for s in held[-args.requests :]]
        bad = sum(tok.encode(p) != encode_prompt(tok, s) for p, s in zip(prompts, held[-args.requests :]))
        if bad:
            print(f"warning: {bad} chat prompts do not re-tokenize to the same ids")
    if args.domain:
        from trtspec.train.corpora import source_samples
        from trtspec.train.data import encode_prompt

        held = source_samples(args.domain, evaluation=True, seed=0)[: args.requests]
        prompts = [tok.decode(encode_prompt(tok, s)) for s in held]
    params = GenerateParams(max_tokens=args.max_tokens, end_id=-1)  # fixed length: ignore EOS, fair timing
    from trtspec.client.sweep import SWEEP, ratios, run_sweep

    concurrency = SWEEP if args.sweep else tuple(args.concurrency)
    from trtspec.dtypes import resolve_dtype

    served_dtype = resolve_dtype(args.dtype, "cpu").dtype  # what the servers will run in (auto: this CPU's)
    print(f"served dtype: {served_dtype}")
    off: dict[str, dict] = {}
    servers: dict = {}
    repos = {}
    for label, speculative in (("speculative", True), ("plain", False)):
        opts = {"speculative": speculative, "device": "cpu", "max_batch_size": args.max_batch_size, "dtype": args.dtype}
        if args.torch_threads:
            opts["torch_threads"] = args.torch_threads
        if speculative and args.adaptive:
            opts["trtspec_adaptive"] = True
        if speculative and args.draft_len_schedule:
            opts["draft_len_schedule"] = args.draft_len_schedule
        repos[label] = emit_repository(spec, "reference", tmp / f"repo-{label}", options=opts)
    try:  # every server started is stopped, also when a later one fails to start or the run is interrupted
        for label, repo in repos.items():
            t0 = time.perf_counter()
            servers[label] = TritonServer(repo, log_path=tmp / f"{label}.log", startup_timeout_s=600)
            servers[label].start()
            print(f"[{label}] server ready in {time.perf_counter() - t0:.1f} s")
        for label in servers:
            # the offline reference runtime on the same prompts, batch 1, EOS ignored like the served runs;
            # measured now, while the idle servers only hold memory, so that all see the same machine load
            off[label] = offline(spec, tok, prompts, args.max_tokens, label == "speculative", served_dtype)
        urls = {lb: (srv.grpc_url if args.protocol == "grpc" else srv.http_url) for lb, srv in servers.items()}
        print(f"load average before the sweep: {os.getloadavg()[0]:.1f} (other jobs share this CPU)")
        rows = run_sweep(urls, args.protocol, "ensemble", prompts, concurrency, args.requests, params, 1)
        print(f"load average after the sweep: {os.getloadavg()[0]:.1f}")
    finally:
        for srv in servers.values():
            srv.stop()
    print("speculative / plain tokens/s: " + ", ".join(f"c={c}: {r:.2f}x" for c, r in ratios(rows).items()))
    if args.plot:
        from trtspec.client.plot import write_sweep_plot

        print(f"plot: {write_sweep_plot(args.plot, rows)}")
    for lbl in ("speculative", "plain"):
        line = (
            f"offline {lbl}: e2e mean {off[lbl]['e2e_mean_ms']:.0f} ms, {off[lbl]['tokens_per_s']:.1f} tok/s, "
            f"mean acceptance length {off[lbl]['mean_acceptance_length']:.2f}"
        )
        served = [r for r in rows if r["label"] == lbl and r["concurrency"] == 1]
        if served:
            e2e = served[0]["e2e_mean_ms"]
            line += (
                f"; Triton c=1 e2e mean {e2e:.0f} ms -> overhead {e2e - off[lbl]['e2e_mean_ms']:+.0f} ms "
                f"({100 * (e2e / off[lbl]['e2e_mean_ms'] - 1):+.1f}%)"
            )
        print(line)
    if args.json:
        out = {"spec": spec.describe(), "served": rows, "offline": off, "ratios": ratios(rows)}
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
