#!/usr/bin/env python
"""Acceptance benchmark: every drafter kind at one training budget, evaluated per text domain.

For each run (a drafter kind, the MTP kinds with and without RMSNorm): train on the self-distillation
cache of SmolLM2-135M (``--data``, default the offline mixture of chat, prose and code), tune a tree for a
few node budgets on held-out calibration prompts, then decode the held-out evaluation prompts of every
domain (chat, prose, code; never trained on) greedily with the reference runtime: plain, the fixed tree
and adaptive speculation in the same run. Reports the domain x kind matrix: mean acceptance length,
per-position acceptance, speedup over plain, adaptive's speedup, and whether the output equals plain
greedy. Prints the matrix and writes it as JSON (``<out>/results.json``).

Every stage is resumable: the cache resumes shard by shard, trained heads are reused when their
directory exists (``--retrain`` to redo). Prepare the model first: ``python scripts/prepare_smollm2.py``.

    python scripts/bench_acceptance.py                 # the full run (about an hour on 2 cores)
    python scripts/bench_acceptance.py --runs mtp-single --nodes 4,8 --samples 200
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import torch

from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.drafters import registry
from trtspec.load import load_spec_model, load_tokenizer
from trtspec.train.cache import HiddenCache, build_cache
from trtspec.train.corpora import SOURCES, corpus_samples, source_samples
from trtspec.train.data import encode_prompt

RUNS = {  # name -> (kind, rmsnorm)
    "mtp-linear": ("mtp-linear", True),
    "mtp-linear-no-norm": ("mtp-linear", False),
    "mtp-single": ("mtp-single", True),
    "mtp-single-no-norm": ("mtp-single", False),
    "medusa": ("medusa", False),
    "eagle": ("eagle", False),
    "eagle3": ("eagle3", False),
    "dflash": ("dflash", True),
    "dspark": ("dspark", True),
    "ngram": ("ngram", False),  # model-free: nothing trained, same prompts and timing
    "suffix": ("suffix", False),
}
#: a run "MODEL+FREE" (e.g. eagle+suffix) evaluates MODEL's heads with the model-free drafter FREE beside
#: them (``--also-draft``), on the heads MODEL's own run trained: no extra training
DEFAULT_COMBINED = ("eagle+suffix", "mtp-single+suffix")


def run_parts(name: str) -> tuple[str, str | None]:
    """(the run whose heads are used, the model-free drafter beside them or None)."""
    base, _, also = name.partition("+")
    return base, also or None


def check_run(name: str) -> str:
    base, also = run_parts(name)
    if base not in RUNS or (also is not None and (also not in RUNS or not registry.get(RUNS[also][0]).model_free)):
        raise argparse.ArgumentTypeError(
            f"unknown run {name!r}: one of {', '.join(RUNS)}, or MODEL+ngram / MODEL+suffix"
        )
    if also is not None and registry.get(RUNS[base][0]).model_free:
        raise argparse.ArgumentTypeError(f"run {name!r}: the part before '+' must be a model drafter")
    return name


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, default=ROOT / ".cache" / "smollm2")
    ap.add_argument("--out", type=Path, default=ROOT / ".cache" / "bench_acceptance")
    ap.add_argument(
        "--data",
        default="mix",
        help="training data: mix (chat + prose + code, the train-heads default) or one of " + ", ".join(SOURCES),
    )
    ap.add_argument("--samples", type=int, default=660, help="training samples drawn from --data")
    ap.add_argument("--domains", default=",".join(SOURCES), help="evaluation domains (their held-out parts)")
    ap.add_argument("--calib-prompts", type=int, default=10, help="held-out calibration prompts per domain")
    ap.add_argument("--gen-tokens", type=int, default=96, help="target reply length cached per prompt")
    ap.add_argument("--topk", type=int, default=8, help="target top-k logits cached (soft labels)")
    ap.add_argument("--cache-batch", type=int, default=32)
    ap.add_argument(
        "--runs",
        default=",".join([*RUNS, *DEFAULT_COMBINED]),
        help="comma list of " + ", ".join(RUNS) + "; MODEL+FREE (e.g. eagle+suffix) runs MODEL's heads with the "
        "model-free drafter FREE beside them",
    )
    ap.add_argument(
        "--also-depth",
        type=int,
        default=6,
        help="MODEL+FREE runs also try each tuned tree with its first chain deepened to this depth (a "
        "model-free match can be long)",
    )
    ap.add_argument("--epochs-linear", type=float, default=4.0, help="epochs for medusa / mtp-linear")
    ap.add_argument("--epochs-recurrent", type=float, default=2.0, help="epochs for eagle / mtp-single")
    ap.add_argument("--lr-linear", type=float, default=3e-3)
    ap.add_argument("--num-heads", type=int, default=3)
    ap.add_argument("--lr-recurrent", type=float, default=2e-3)
    ap.add_argument("--eagle3-vocab", type=int, default=8192, help="EAGLE-3's own draft vocabulary size")
    ap.add_argument("--block-drafts", type=int, default=7, help="block drafters: tokens drafted per block")
    ap.add_argument("--epochs-block", type=float, default=2.0, help="epochs for the block drafters")
    ap.add_argument("--lr-block", type=float, default=2e-3)
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--soft-weight", type=float, default=0.3)
    ap.add_argument("--unroll", type=int, default=2)
    ap.add_argument("--nodes", default="2,4,8", help="tree budgets tried per run (best measured speed reported)")
    ap.add_argument(
        "--draft-vocab",
        default="0,8192",
        help="draft vocabularies tried per run (0 = full; N = the N tokens the target writes most)",
    )
    ap.add_argument("--eval-prompts", type=int, default=6, help="held-out evaluation prompts per domain")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--only", choices=["cache", "train", "all"], default="all")
    ap.add_argument("--retrain", action="store_true")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    ap.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16"],
        default="auto",
        help="dtype of the cache and of both plain and speculative decoding (auto: bfloat16 with "
        "pre-packed oneDNN kernels where the CPU has AVX512-BF16/AMX, else float32)",
    )
    args = ap.parse_args()
    for name in [r for r in args.runs.split(",") if r]:
        try:
            check_run(name)
        except argparse.ArgumentTypeError as exc:
            ap.error(str(exc))
    from trtspec.dtypes import resolve_dtype

    args.dtype = resolve_dtype(args.dtype).name
    return args


def prepare(args):
    """Training items from ``--data``; per domain, calibration and evaluation items from its held-out part
    (disjoint: the first ``--eval-prompts`` evaluate, the next ``--calib-prompts`` calibrate)."""
    target = load_hf_causal_lm(args.target)
    tok = load_tokenizer(target)
    train_items = [encode_prompt(tok, s) for s in corpus_samples(f"{args.data}:{args.samples}", seed=0)]
    calib_items, eval_by_domain = [], {}
    for domain in [d for d in args.domains.split(",") if d]:
        held = source_samples(domain, evaluation=True, seed=0)
        eval_by_domain[domain] = [encode_prompt(tok, s) for s in held[: args.eval_prompts]]
        calib_items += [encode_prompt(tok, s) for s in held[args.eval_prompts : args.eval_prompts + args.calib_prompts]]
    return target, tok, train_items, calib_items, eval_by_domain


def main() -> None:
    args = parse()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not (args.target / "config.json").is_file():
        sys.exit(f"{args.target}: no model; run python scripts/prepare_smollm2.py first")
    args.out.mkdir(parents=True, exist_ok=True)
    target, tok, train_items, calib_items, eval_by_domain = prepare(args)
    t0 = time.perf_counter()
    cache_dir = args.out / "cache"
    aux = aux_layers_of(args, target)
    build_cache(
        target,
        train_items,
        cache_dir,
        mode="generate",
        gen_tokens=args.gen_tokens,
        topk=args.topk,
        batch_size=args.cache_batch,
        dtype=args.dtype,
        aux_layers=aux,
    )
    cache = HiddenCache(cache_dir, target.fingerprint)
    print(
        f"cache: {len(cache.sequences)} sequences, {cache.num_tokens} tokens ({time.perf_counter() - t0:.0f} s)",
        flush=True,
    )
    if args.only == "cache":
        return
    calib_dir = args.out / "calib"
    build_cache(
        target,
        calib_items,
        calib_dir,
        mode="generate",
        gen_tokens=args.gen_tokens,
        batch_size=args.cache_batch,
        dtype=args.dtype,
    )
    calib = HiddenCache(calib_dir, target.fingerprint)
    budgets = [int(x) for x in args.nodes.split(",")]
    vocabs = [int(x) for x in args.draft_vocab.split(",")]
    dv = None
    if max(vocabs) > 0:
        from trtspec.train.draft_vocab import frequent_tokens

        dv = frequent_tokens(cache, target.arch.vocab_size, max(vocabs))
        for n in sorted(v for v in vocabs if v):
            print(
                f"draft vocabulary {n}: covers {dv.coverage_of(n):.2%} of the target's "
                f"choices on the training data ({dv.distinct} distinct tokens)",
                flush=True,
            )
    results = {
        "target": str(args.target),
        "cache_tokens": cache.num_tokens,
        "cache_sequences": len(cache.sequences),
        "calibration_tokens": calib.num_tokens,
        "data": f"{args.data}:{args.samples}",
        "eval_prompts_per_domain": {d: len(v) for d, v in eval_by_domain.items()},
        "max_new_tokens": args.max_new_tokens,
        "threads": torch.get_num_threads(),
        "dtype": args.dtype,
        "runs": {},
    }
    results_path = args.out / "results.json"
    mine: set[str] = set()  # rows this process produced; other rows come from the file
    merge_runs(results_path, results, mine)
    for name in [r for r in args.runs.split(",") if r]:
        base, also = run_parts(name)
        kind, rms = RUNS[base]
        heads_dir = args.out / "heads" / base
        info = train_run(args, target, cache, base, kind, rms, heads_dir)
        own_vocab = registry.get(kind).own_draft_vocab or registry.get(kind).model_free
        if dv is not None and not own_vocab:  # written after training so reused heads get the current vocabulary too
            from trtspec.checkpoint.heads.draft_vocab import save_draft_vocab

            save_draft_vocab(heads_dir, dv.ids)
        if args.only == "train":
            continue
        by_vocab = {}
        for size in [0] if own_vocab else vocabs:  # a kind with its own vocabulary drafts over that one
            print(
                f"{name}: evaluating with {'the full vocabulary' if not size else f'a {size}-token draft vocabulary'}",
                flush=True,
            )
            by_vocab[size] = evaluate(args, heads_dir, calib, eval_by_domain, budgets, size, also)
        best_size = max(by_vocab, key=lambda n: by_vocab[n]["speedup"] or 0.0)
        row = dict(by_vocab[best_size])
        row.update(
            kind=kind,
            also_draft=also,
            rmsnorm=rms,
            training=info,
            draft_vocab=best_size,
            by_draft_vocab={
                str(n): {
                    k: r[k]
                    for k in (
                        "best_nodes",
                        "mean_acceptance_length",
                        "tokens_per_s",
                        "plain_tokens_per_s",
                        "speedup",
                        "worst_domain_speedup",
                        "identical_to_plain",
                    )
                }
                for n, r in by_vocab.items()
            },
        )
        merge_runs(results_path, results, mine)  # keep rows another bench process wrote meanwhile
        results["runs"][name] = row
        mine.add(name)
        write_json(results_path, results)
        print_table(results)
    results["wall_s"] = time.perf_counter() - t0
    merge_runs(results_path, results, mine)
    write_json(results_path, results)
    print_table(results)
    print(f"wrote {results_path}")


def merge_runs(path: Path, results: dict, mine: set[str]) -> None:
    """Add the rows already in ``path`` that this process has not produced itself (runs of one bench
    directory may be evaluated by several processes, one run each)."""
    if path.is_file():
        for name, row in json.loads(path.read_text()).get("runs", {}).items():
            if name not in mine:
                results["runs"][name] = row


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def train_run(args, target, cache, name, kind, rms, heads_dir: Path) -> dict:
    from trtspec.train.heads import save_heads
    from trtspec.train.trainer import TrainConfig, train

    info_path = heads_dir.with_name(name + ".train.json")
    if heads_dir.exists() and info_path.is_file() and not args.retrain:
        return json.loads(info_path.read_text())
    if registry.get(kind).model_free:  # drafts from the text itself: its settings directory, defaults kept
        from trtspec.drafters.matching import write_settings_dir

        write_settings_dir(heads_dir, kind, {})
        info = {"steps": 0, "final_loss": None, "train_s": 0.0, "model_free": True}
        info_path.write_text(json.dumps(info, indent=2) + "\n")
        return info
    from trtspec.train.heads import recipe

    linear = kind in ("medusa", "mtp-linear")
    block = is_block(kind)
    own_vocab = recipe(kind).prepare is not None  # trains its own output vocabulary (EAGLE-3's d2t)
    cfg = TrainConfig(
        kind=kind,
        num_heads=args.block_drafts if block else args.num_heads,
        rmsnorm=rms,
        epochs=args.epochs_block if block else args.epochs_linear if linear else args.epochs_recurrent,
        lr=args.lr_block if block else args.lr_linear if linear else args.lr_recurrent,
        batch_tokens=args.batch_tokens,
        soft_weight=args.soft_weight if cache.has_topk and not block else 0.0,
        label_vocab="full" if own_vocab else "cache",
        draft_vocab=args.eagle3_vocab if own_vocab else 0,
        unroll=args.unroll,
        seed=0,
        ckpt_every=0,
    )
    module, res = train(target, cache, cfg, ckpt_dir=None, progress=True)
    info = {
        "epochs": cfg.epochs,
        "lr": cfg.lr,
        "unroll": cfg.unroll,
        "soft_weight": cfg.soft_weight,
        "train_on": cfg.train_on,
        "steps": res.steps,
        "first_loss": res.losses[0] if res.losses else None,
        "final_loss": res.final_loss,
        "per_step_or_head_ce": res.step_losses,
        "train_s": res.wall_s,
        "train_tokens_per_s": res.tokens_per_s,
    }
    save_heads(kind, module, target, heads_dir, info, rmsnorm=rms)
    info_path.write_text(json.dumps(info, indent=2) + "\n")
    print(f"{name}: loss {info['first_loss']:.3f} -> {info['final_loss']:.3f} in {res.wall_s:.0f} s", flush=True)
    return info


def aux_layers_of(args, target) -> tuple[int, ...]:
    """The target layers the selected runs read besides the last (cached once, for all of them)."""
    from trtspec.train.heads import recipe

    layers: set[int] = set()
    for name in [r for r in args.runs.split(",") if r]:
        kind = RUNS[run_parts(name)[0]][0]
        if registry.get(kind).training is None:  # model-free: reads no layers
            continue
        hook = recipe(kind).aux_layers
        if hook is not None:
            layers.update(hook(target))
    return tuple(sorted(layers))


def is_block(kind: str) -> bool:
    """A block drafter (one forward drafts the whole block): trained with the block settings."""
    from trtspec.train.heads import recipe

    return recipe(kind).style == "block"


def chain_report(spec, budgets) -> dict:
    """Chains of the budgets' lengths (clipped to the drafter's depth) in tune_on_cache's report shape."""
    depth = max(len(c) for c in spec.tree.choices)
    lengths = sorted({min(b, depth) for b in budgets} | {depth})
    rows = [{"nodes": n, "choices": [[0] * d for d in range(1, n + 1)], "expected": None} for n in lengths]
    for r in rows:
        r["choices_json"] = json.dumps(r["choices"])
    return {"budgets": rows, "per_depth_topk": None}


def evaluate(
    args, heads_dir: Path, calib, eval_by_domain: dict, budgets, draft_vocab: int = 0, also: str | None = None
) -> dict:
    """Tune trees on the calibration cache, measure every tree on every domain (plain interleaved), keep
    the tree with the best mean speedup over the domains, and time adaptive speculation with it. Model-free
    drafters are measured on chains instead (they have no logits to rank). ``also``: a model-free drafter
    beside the heads; the tuned trees are then also tried with their first chain deepened."""
    from trtspec.runtime.generate import SpeculativeGenerator
    from trtspec.train.tune_run import measure_decode, tune_on_cache

    kind = registry.detect(heads_dir)
    chains = registry.get(kind).model_free  # no logits to rank: measured on chains, no tree tuning

    def generator(also_draft: str | None):
        spec = load_spec_model(
            args.target,
            heads_dir,
            tree=None if chains else "chain:1",
            dtype="float32",
            draft_vocab=draft_vocab,
            also_draft=also_draft,
        )
        return spec, SpeculativeGenerator(spec, dtype=getattr(torch, args.dtype))

    spec, gen = generator(None)  # trees are tuned for the heads alone (tune-tree measures one drafter)
    eos = spec.target.arch.eos_token_id
    t0 = time.perf_counter()
    if chains:
        rep = chain_report(spec, budgets)
    else:
        rep = tune_on_cache(gen, calib, [], budgets, topk=8, speed=False, echo=lambda s: print(s, flush=True))
    if also is not None:
        spec, gen = generator(also)
        rep["budgets"] += deepened(rep["budgets"], args.also_depth, spec_depth(gen))
    trees = {r["nodes"]: tuple(tuple(c) for c in r["choices"]) for r in rep["budgets"]}
    by_domain = {}
    for domain, items in eval_by_domain.items():
        by_domain[domain] = measure_decode(gen, items, trees, args.max_new_tokens, eos)
        for n, row in by_domain[domain].items():
            print(
                f"  {domain:<6} {n:3d} nodes: acceptance length {row['measured']:.2f}, {row['speedup']:.2f}x plain",
                flush=True,
            )

    def mean_speedup(n: int) -> float:
        return sum(by_domain[d][n]["speedup"] or 0.0 for d in by_domain) / len(by_domain)

    best_n = max(trees, key=mean_speedup)
    best = next(r for r in rep["budgets"] if r["nodes"] == best_n)
    domains = {}
    for domain, items in eval_by_domain.items():
        row = dict(by_domain[domain][best_n])
        row["adaptive_speedup"] = adaptive_speedup(gen, items, trees[best_n], args.max_new_tokens, eos)
        domains[domain] = row
    rows = list(domains.values())
    return {
        "best_nodes": best_n,
        "choices": best["choices_json"],
        "expected_acceptance": best["expected"],
        "mean_acceptance_length": sum(r["measured"] for r in rows) / len(rows),
        "per_position_acceptance": [sum(x) / len(rows) for x in zip(*(r["per_position"] for r in rows))],
        "tokens_per_s": sum(r["tokens_per_s"] for r in rows) / len(rows),
        "plain_tokens_per_s": sum(r["plain_tokens_per_s"] for r in rows) / len(rows),
        "speedup": mean_speedup(best_n),
        "worst_domain_speedup": min(r["speedup"] for r in rows),
        "identical_to_plain": all(r["identical_to_plain"] for r in rows),
        "domains": domains,
        "per_depth_topk": rep["per_depth_topk"],
        "eval_s": time.perf_counter() - t0,
    }


def spec_depth(gen) -> int | None:
    """The deepest tree the model drafter can fill (None: any depth, a recurrent drafter)."""
    return gen.drafter.max_depth


def deepened(rows: list[dict], depth: int, limit: int | None) -> list[dict]:
    """Each tuned tree with its first chain (0, 0, ...) extended to ``depth`` (capped by the drafter),
    as extra rows keyed by their node count; trees whose count is taken already are skipped."""
    depth = min(depth, limit) if limit is not None else depth
    taken, extra = {r["nodes"] for r in rows}, []
    for r in rows:
        choices = [list(c) for c in r["choices"]]
        choices += [[0] * d for d in range(1, depth + 1) if [0] * d not in choices]
        if len(choices) in taken:
            continue
        taken.add(len(choices))
        extra.append({"nodes": len(choices), "choices": choices, "choices_json": json.dumps(choices), "expected": None})
    return extra


def adaptive_speedup(gen, items, choices, max_new_tokens: int, eos) -> float:
    """Adaptive speculation with the tuned tree against plain decoding, interleaved per prompt; asserts the
    text is unchanged (adaptive only chooses which drafts are verified)."""
    from trtspec.runtime.generate import GenerationConfig
    from trtspec.tree import build_tree

    tree = build_tree(choices)
    plain = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=eos, speculative=False)
    adaptive = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=eos, adaptive=True)
    walls = {"plain": 0.0, "adaptive": 0.0}
    tokens = {"plain": 0, "adaptive": 0}
    for p in items:
        ref = gen.generate([p], plain)
        got = gen.generate([p], adaptive, tree=tree)
        if got.tokens != ref.tokens:
            raise SystemExit("adaptive speculation changed the output: a runtime bug")
        for name, r in (("plain", ref), ("adaptive", got)):
            walls[name] += r.metrics.wall_s
            tokens[name] += r.metrics.new_tokens
    return (tokens["adaptive"] / walls["adaptive"]) / (tokens["plain"] / walls["plain"])


def print_table(results: dict) -> None:
    """The domain x kind matrix: one line per run and domain."""
    print()
    print(
        f"{'run':<20} {'domain':<6} {'loss':>7} {'vocab':>6} {'nodes':>5} {'AL':>6} {'per-position acceptance':<26} "
        f"{'spec t/s':>8} {'plain t/s':>9} {'fixed':>6} {'adaptive':>8} {'same':>5}"
    )
    for name, r in results["runs"].items():
        vocab = r.get("draft_vocab") or "full"
        for domain, d in r.get("domains", {}).items():
            pp = " ".join(f"{x:.2f}" for x in d["per_position"])
            print(
                f"{name:<20} {domain:<6} {loss_text(r['training']['final_loss']):>7} {vocab:>6} {r['best_nodes']:>5} "
                f"{d['measured']:>6.2f} {pp:<26} {d['tokens_per_s']:>8.1f} {d['plain_tokens_per_s']:>9.1f} "
                f"{d['speedup']:>5.2f}x {d['adaptive_speedup']:>7.2f}x {str(d['identical_to_plain']):>5}"
            )
    print(flush=True)


def loss_text(loss: float | None) -> str:
    return "-" if loss is None else f"{loss:.3f}"


if __name__ == "__main__":
    main()
