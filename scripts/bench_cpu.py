#!/usr/bin/env python
"""What each dtype costs on THIS CPU, stage by stage, so a table says which machine class it came from.

Header: the CPU model, its SIMD/bfloat16 flags, torch's capability, the cores this process may use, the
load average and what the ``auto`` dtype policy picks here. Then, per dtype:
  1. matmul GFLOP/s (the lm_head shape of SmolLM2: M x 576 by 576 x 49152, and a decode-sized body matmul),
  2. self-distillation cache tokens/s (train/cache.py, continuous batching; prompt + reply tokens / wall),
  3. head training s/step (mtp-single, the lm_head loss in that dtype),
  4. plain and speculative decoding tokens/s (reference runtime; the heads of step 3, so speculative
     figures reflect a few training steps unless --heads points at trained heads).

    python scripts/bench_cpu.py                         # this CPU as it is
    python scripts/bench_cpu.py --mimic-avx2            # the same, with every library capped at AVX2
                                                        # (what an AVX2-only CPU such as an AMD EPYC runs)

``--mimic-avx2`` re-runs this script with ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2,
MKL_ENABLE_INSTRUCTIONS=AVX2 and TRTSPEC_CPU_BF16=0: torch's, oneDNN's and MKL's kernels then use AVX2
code paths only (bfloat16 is emulated, as on such a CPU); clock speed and caches stay this machine's.
Timings on a shared machine are noisy: the header prints the load average; compare runs at similar load.
Speed targets are read off the printed numbers (e.g. cache >= 150 tokens/s float32 on 2 AVX2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

AVX2_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "TRTSPEC_CPU_BF16": "0",
}
FLAGS_SHOWN = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def cpu_header() -> dict:
    """The facts a reader needs to place the numbers: CPU, flags, capability, cores, load, auto's pick."""
    import torch

    from trtspec.cpu import configure_threads, usable_cores
    from trtspec.dtypes import _cpuinfo_flags, resolve_dtype

    model = platform.processor() or platform.machine()
    try:
        model = next(
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    flags = _cpuinfo_flags() or set()
    cores, why = usable_cores()
    threads, twhy = configure_threads()
    return {
        "cpu": model,
        "flags": [f for f in FLAGS_SHOWN if f in flags],
        "torch": torch.__version__,
        "capability": torch.backends.cpu.get_cpu_capability(),
        "usable_cores": f"{cores} ({why})",
        "threads": f"{threads} ({twhy})",
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "auto": resolve_dtype("auto").describe(),
        "env": {k: os.environ[k] for k in AVX2_ENV if k in os.environ},
    }


def _rate(fn, min_s: float) -> float:
    """Calls per second of ``fn`` (warmed up once), measured for at least ``min_s``."""
    fn()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= min_s:
            return n / dt


def bench_matmul(dtypes: list[str], m: int, min_s: float) -> list[dict]:
    import torch

    from trtspec.models.packed import pack_projection, packing_supported

    rows = []
    for name, (M, K, N) in (("lm_head", (m, 576, 49152)), ("decode body", (16, 576, 1536))):
        a32, w32 = torch.randn(M, K), torch.randn(N, K)
        for dt in dtypes:
            d = getattr(torch, dt)
            a, w = a32.to(d), w32.to(d)
            r = _rate(lambda a=a, w=w: torch.nn.functional.linear(a, w), min_s)
            rows.append({"matmul": name, "shape": f"{M}x{K} @ {K}x{N}", "dtype": dt, "gflops": 2 * M * K * N * r / 1e9})
            if dt == "bfloat16" and packing_supported():
                p = pack_projection(w)
                r = _rate(lambda p=p, a=a: p(a), min_s)
                rows.append(
                    {
                        "matmul": name,
                        "shape": f"{M}x{K} @ {K}x{N}",
                        "dtype": "bfloat16-packed",
                        "gflops": 2 * M * K * N * r / 1e9,
                    }
                )
    return rows


def bench_model(args, dtypes: list[str]) -> list[dict]:
    """Cache, training and decoding per dtype on the real target."""
    import torch

    from trtspec.checkpoint.target import load_hf_causal_lm
    from trtspec.load import load_spec_model, load_tokenizer
    from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator
    from trtspec.train.cache import HiddenCache, build_cache
    from trtspec.train.data import encode_prompt, load_samples
    from trtspec.train.heads import save_heads
    from trtspec.train.trainer import TrainConfig, train

    target = load_hf_causal_lm(args.target)
    tok = load_tokenizer(target)
    samples = load_samples([f"chitchat:{args.prompts + args.decode_prompts}"], 0)
    items = [encode_prompt(tok, s) for s in samples[: args.prompts]]
    prompts = [encode_prompt(tok, s) for s in samples[args.prompts : args.prompts + args.decode_prompts]]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-cpu-") as tmp:
        for dt in dtypes:
            row: dict = {"dtype": dt}
            cdir = Path(tmp) / f"cache-{dt}"
            t0 = time.perf_counter()
            build_cache(target, items, cdir, gen_tokens=args.gen_tokens, batch_size=args.rows, progress=False, dtype=dt)
            wall = time.perf_counter() - t0
            cache = HiddenCache(cdir)
            generated = sum(n - p for (_, _, n), p in zip(cache.sequences, cache.prompt_lengths))
            row.update(
                cache_tok_s=cache.num_tokens / wall,
                cache_generated_tok_s=generated / wall,
                cache_tokens=cache.num_tokens,
                cache_s=wall,
            )
            cfg = TrainConfig(
                kind="mtp-single", steps=1, batch_tokens=args.batch_tokens, lm_dtype=dt, ckpt_every=0, warmup=1
            )
            train(target, cache, cfg, progress=False)  # warm-up: allocation and kernel set-up are one-off costs
            cfg.steps = args.train_steps
            module, res = train(target, cache, cfg, progress=False)
            row["train_s_per_step"] = res.wall_s / max(res.steps, 1)
            heads = args.heads or save_heads("mtp-single", module, target, Path(tmp) / f"heads-{dt}", {"bench": True})
            spec = load_spec_model(args.target, heads, dtype=dt)
            gen = SpeculativeGenerator(spec, dtype=getattr(torch, dt))
            gcfg = GenerationConfig(max_new_tokens=args.decode_tokens, eos_token_id=None)
            gen.generate(prompts[:1], GenerationConfig(max_new_tokens=4, speculative=False))  # warm-up
            plain = gen.generate(prompts, GenerationConfig(**{**gcfg.__dict__, "speculative": False}))
            spec_res = gen.generate(prompts, gcfg)
            row.update(
                plain_tok_s=plain.metrics.tokens_per_s,
                spec_tok_s=spec_res.metrics.tokens_per_s,
                accept_len=spec_res.metrics.mean_acceptance_length,
                identical=plain.tokens == spec_res.tokens,
                heads="given" if args.heads else f"{args.train_steps} steps on the bench cache",
            )
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def fmt(v) -> str:
    return f"{v:.1f}" if isinstance(v, float) else str(v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, default=ROOT / ".cache" / "smollm2")
    ap.add_argument(
        "--heads",
        type=Path,
        default=None,
        help="trained heads for the speculative row (default: the few-step heads trained here)",
    )
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--matmul-m", type=int, default=1024, help="rows of the lm_head-shaped matmul")
    ap.add_argument("--min-s", type=float, default=1.0, help="seconds per matmul measurement")
    ap.add_argument("--prompts", type=int, default=32, help="chitchat prompts cached")
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--rows", type=int, default=64, help="cache rows in flight (train-heads --cache-batch)")
    ap.add_argument("--train-steps", type=int, default=3)
    ap.add_argument("--batch-tokens", type=int, default=2048, help="train-heads --batch-tokens")
    ap.add_argument("--decode-prompts", type=int, default=2)
    ap.add_argument("--decode-tokens", type=int, default=48)
    ap.add_argument("--matmul-only", action="store_true")
    ap.add_argument("--mimic-avx2", action="store_true", help="re-run capped at AVX2 (see the module docstring)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.mimic_avx2 and os.environ.get("ONEDNN_MAX_CPU_ISA") != "AVX2":
        argv = [a for a in sys.argv[1:] if a != "--mimic-avx2"]
        sys.exit(subprocess.call([sys.executable, __file__, *argv], env={**os.environ, **AVX2_ENV}))
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    head = cpu_header()
    print("# bench_cpu")
    for k, v in head.items():
        print(f"# {k}: {v if not isinstance(v, list) else ' '.join(map(str, v))}")
    mm = bench_matmul(dtypes, args.matmul_m, args.min_s)
    print("\n| matmul | shape | dtype | GFLOP/s |\n|---|---|---|---|")
    for r in mm:
        print(f"| {r['matmul']} | {r['shape']} | {r['dtype']} | {r['gflops']:.1f} |")
    out = {"header": head, "matmul": mm}
    if not args.matmul_only:
        if not (args.target / "config.json").is_file():
            sys.exit(f"{args.target}: no model; run python scripts/prepare_smollm2.py first")
        rows = bench_model(args, dtypes)
        out["stages"] = rows
        print(
            f"\n{args.prompts} prompts x <= {args.gen_tokens} reply tokens cached ({args.rows} rows); training "
            f"{args.batch_tokens} tokens/step; decoding {args.decode_prompts} prompts x {args.decode_tokens} tokens"
        )
        print(
            "| dtype | cache tok/s (all) | cache generated tok/s | train s/step | plain tok/s | spec tok/s | "
            "accept len | identical |\n|---|---|---|---|---|---|---|---|"
        )
        for r in rows:
            print(
                f"| {r['dtype']} | {fmt(r['cache_tok_s'])} | {fmt(r['cache_generated_tok_s'])} | "
                f"{r['train_s_per_step']:.2f} | {fmt(r['plain_tok_s'])} | {fmt(r['spec_tok_s'])} | "
                f"{r['accept_len']:.2f} | {r['identical']} |"
            )
    print(f"# load_avg at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
