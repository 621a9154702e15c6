"""tune-tree end to end: calibration cache -> ranks -> trees per budget -> measured acceptance and speed.

Speed is measured because on a CPU (and on small batches anywhere) every tree node costs target compute
and every depth a drafter step: the tree with the best expected acceptance length is not always the
fastest, so with several budgets the one with the best measured tokens/s wins.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trtspec.errors import UsageError
from trtspec.train.cache import HiddenCache, build_cache
from trtspec.train.ranks import check_measurable, drafter_aux, ranks_by_sequence, simulated_length
from trtspec.train.tune import build_tree, expected_length, path_probs_from_ranks, per_depth_topk
from trtspec.tree import build_tree as tree_buffers
from trtspec.tree import format_choices_json, format_choices_trtllm


def _default_depth(gen) -> int:
    d = gen.drafter
    if d is None:
        raise UsageError("tune-tree needs heads (--heads)")
    return d.max_depth if d.max_depth is not None else 5


def measure_decode(
    gen, items: list[list[int]], trees: dict[int, tuple], max_new_tokens: int, eos, speed: bool = True
) -> dict:
    """Batch-1 greedy decoding of every prompt: plain once, then speculative with each tree, interleaved
    per prompt so that load changes on a shared machine hit all variants alike."""
    from trtspec.runtime.generate import GenerationConfig

    cfg = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=eos)
    plain = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=eos, speculative=False)
    acc = {n: {"steps": 0, "accepted": 0, "hist": [], "tokens": 0, "wall": 0.0, "identical": True} for n in trees}
    base = {"tokens": 0, "wall": 0.0}
    buffers = {n: tree_buffers(c) for n, c in trees.items()}
    for p in items:
        ref = None
        if speed:
            r = gen.generate([p], plain)
            base["tokens"] += r.metrics.new_tokens
            base["wall"] += r.metrics.wall_s
            ref = r.tokens
        for n in trees:
            r = gen.generate([p], cfg, tree=buffers[n])
            m = r.metrics
            a = acc[n]
            a["steps"] += m.sequence_steps
            a["accepted"] += m.accepted_draft_tokens
            a["tokens"] += m.new_tokens
            a["wall"] += m.wall_s
            h = m.acceptance_histogram
            a["hist"] = [
                x + y for x, y in zip(a["hist"] + [0] * (len(h) - len(a["hist"])), h + [0] * (len(a["hist"]) - len(h)))
            ]
            if ref is not None and r.tokens != ref:
                a["identical"] = False
    out = {}
    plain_tps = base["tokens"] / base["wall"] if base["wall"] else None
    for n, a in acc.items():
        steps = max(a["steps"], 1)
        depth = max((len(c) for c in trees[n]), default=0)
        per_pos = [sum(a["hist"][d:]) / steps for d in range(1, depth + 1)]
        tps = a["tokens"] / a["wall"] if a["wall"] else 0.0
        out[n] = {
            "measured": (a["accepted"] + a["steps"]) / steps,
            "per_position": per_pos,
            "tokens_per_s": tps,
            "plain_tokens_per_s": plain_tps,
            "speedup": tps / plain_tps if plain_tps else None,
            "identical_to_plain": a["identical"] if speed else None,
        }
    return out


def tune_on_cache(
    gen,
    cache: HiddenCache,
    eval_items: list[list[int]],
    budgets: list[int],
    depth: int | None = None,
    topk: int = 8,
    max_new_tokens: int = 64,
    speed: bool = True,
    echo=print,
) -> dict:
    """The tuning core, on an already-built calibration cache and a loaded SpeculativeGenerator."""
    depth = depth or _default_depth(gen)
    if gen.drafter.max_depth is not None and depth > gen.drafter.max_depth:
        raise UsageError(f"--depth {depth} exceeds the {gen.drafter.max_depth} heads")
    sequences = ranks_by_sequence(gen.drafter, cache, depth, aux=drafter_aux(gen.drafter, cache, gen.spec.target))
    ranks = np.concatenate(sequences)
    probs = path_probs_from_ranks(ranks, topk)
    table = per_depth_topk(ranks, topk)
    echo(
        f"per-depth top-{topk} acceptance on {len(ranks)} calibration positions (P[rank r at depth d | ancestors hit]):"
    )
    for d, row in enumerate(table, 1):
        echo(f"  depth {d}: " + " ".join(f"{x:.3f}" for x in row[: min(topk, 8)]) + f"  (top-{topk} {sum(row):.3f})")
    trees = {n: build_tree(probs, n) for n in budgets}
    results = {}
    measured = (
        measure_decode(gen, eval_items, trees, max_new_tokens, gen.spec.target.arch.eos_token_id, speed)
        if eval_items
        else {}
    )
    for n, choices in trees.items():
        row = {
            "nodes": n,
            "depth": max((len(c) for c in choices), default=0),
            "choices": [list(c) for c in choices],
            "choices_json": format_choices_json(choices),
            "choices_trtllm": format_choices_trtllm(choices),
            "expected": simulated_length(sequences, choices),
            "position_mean": expected_length(probs, choices),
        }
        row.update(measured.get(n, {}))
        results[n] = row
        extra = ""
        if "measured" in row:
            extra = f", measured {row['measured']:.3f}"
            if row.get("speedup"):
                extra += f", {row['tokens_per_s']:.1f} tok/s = {row['speedup']:.2f}x plain"
        echo(f"  {n:3d} nodes (depth {row['depth']}): expected acceptance length {row['expected']:.3f}{extra}")
    key = (lambda r: r.get("speedup") or 0.0) if speed and eval_items else (lambda r: r.get("measured", r["expected"]))
    best = max(results.values(), key=key)
    timed = speed and bool(eval_items) and best.get("speedup") is not None
    pays = not timed or best["speedup"] > 1.0
    if not pays:
        echo(
            f"no tree beats plain decoding on this data: the best, {best['nodes']} nodes, runs at "
            f"{best['speedup']:.2f}x plain. Train on data closer to your traffic, or serve with adaptive "
            "speculation (it stops speculating where drafts do not pay)."
        )
    return {
        "per_depth_topk": table,
        "calibration_positions": int(len(ranks)),
        "budgets": list(results.values()),
        "best": best,
        "beats_plain": pays,
    }


def tune(
    target,
    heads,
    heads_format,
    calib_samples,
    eval_samples,
    budgets,
    depth=None,
    topk=8,
    cache_dir: Path | None = None,
    gen_tokens: int = 96,
    max_new_tokens: int = 64,
    speed: bool = True,
    echo=print,
    draft_vocab: int | None = None,
    dtype: str = "auto",
) -> dict:
    """CLI entry: load target + heads, cache the target's replies to the calibration prompts, tune. The
    cache and the timed decoding both run in ``dtype`` (``auto``: trtspec.dtypes' policy; bfloat16 uses
    pre-packed CPU kernels), announced in one line once the inputs loaded."""
    from trtspec.cpu import setup_compute
    from trtspec.load import load_spec_model, load_tokenizer
    from trtspec.runtime.generate import SpeculativeGenerator
    from trtspec.train.data import encode_prompt

    spec = load_spec_model(target, heads, heads_format, tree="chain:1", dtype="float32", draft_vocab=draft_vocab)
    tok = load_tokenizer(spec.target)
    choice = setup_compute(dtype, echo=echo)
    dtype = choice.name
    gen = SpeculativeGenerator(spec, dtype=choice.dtype)
    check_measurable(gen.drafter)
    calib = [encode_prompt(tok, s) for s in calib_samples]
    evals = [encode_prompt(tok, s) for s in eval_samples]
    build_cache(spec.target, calib, cache_dir, mode="generate", gen_tokens=gen_tokens, model=gen.target, dtype=dtype)
    cache = HiddenCache(cache_dir, spec.target.fingerprint)
    return tune_on_cache(gen, cache, evals, budgets, depth, topk, max_new_tokens, speed, echo)
