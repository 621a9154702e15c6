"""`trtspec demo`: build the tiny models, run every drafter kind, print one table."""

from __future__ import annotations

from pathlib import Path

import click
import torch

from trtspec.demo.build import build_demo
from trtspec.drafters import registry
from trtspec.load import load_spec_model, load_tokenizer
from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator
from trtspec.runtime.report import table

DEMO_PROMPTS = ("Hello there!", "Tell me about speculative decoding.", "2 + 2 =")


def demo_prompt_ids(target: Path) -> list[list[int]]:
    tok = load_tokenizer(load_spec_model(target).target)
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
        for p in DEMO_PROMPTS
    ]
    return [tok(p)["input_ids"] for p in prompts]


def train_demo_heads(paths: dict[str, Path], out: Path, ids: list[list[int]], max_new_tokens: int) -> dict[str, Path]:
    """Self-distil heads on the target's own replies to the demo prompts: a real, seconds-long run of
    the trainer, so the table shows accepted drafts (on the prompts it saw: the pipeline, not generalisation)."""
    from trtspec.train.quick import quick_train_heads

    trained = dict(paths)
    for kind in registry.trainable():  # seconds each; the other kinds keep their demo weights
        click.echo(f"training {kind} heads on the target's replies to the demo prompts")
        trained[kind] = quick_train_heads(
            paths["target"], kind, out / "trained" / kind, prompts=ids, gen_tokens=max_new_tokens, steps=60
        )
    return trained


def run_kinds(
    paths: dict[str, Path], max_new_tokens: int, trained: bool, dtype: torch.dtype | None = None
) -> tuple[list[list[object]], bool]:
    """Plain vs speculative greedy for every kind on the demo prompts (batch of 3), in ``dtype``
    (None: the runtime's CPU default, float32)."""
    rows, all_same = [], True
    ids = demo_prompt_ids(paths["target"])
    for kind in registry.names():
        spec = load_spec_model(paths["target"], paths[kind], dtype=dtype)
        gen = SpeculativeGenerator(spec, dtype=dtype)
        cfg = GenerationConfig(max_new_tokens=max_new_tokens)
        plain = gen.generate(ids, GenerationConfig(max_new_tokens=max_new_tokens, speculative=False))
        res = gen.generate(ids, cfg)
        same = res.tokens == plain.tokens
        all_same &= same
        m = res.metrics
        origin = "trained" if trained and kind in registry.trainable() else "untrained"
        rows.append(
            [
                kind,
                origin,
                spec.tree.num_nodes,
                "yes" if same else "NO",
                m.mean_acceptance_length,
                " ".join(f"{p:.2f}" for p in m.per_position_acceptance[:4]),
                m.target_steps,
                plain.metrics.target_steps,
                plain.metrics.wall_s / max(m.wall_s, 1e-9),
            ]
        )
    return rows, all_same


def run_build_step(paths: dict[str, Path], out: Path) -> int:
    """The main job on the demo: `trtspec build` (checkpoint, plan, build script, Triton repository)."""
    from trtspec.cli import main

    # the stock TensorRT-LLM Medusa layout: an engine without trtspec's plugin library
    kind = next(n for n, k in registry.KINDS.items() if k.engine.layout == "MedusaForCausalLM")
    args = [
        "build",
        "--target",
        str(paths["target"]),
        "--heads",
        str(paths[kind]),
        "--config",
        "demo",
        "--tree",
        "chain:3",
        "--out",
        str(out),
        "--allow-no-gpu",
        "--overwrite",
        "--no-progress",
    ]
    click.echo("\n$ trtspec " + " ".join(args))
    try:
        main.main(args, standalone_mode=False)
    except SystemExit as exc:  # click's ctx.exit for user errors
        return int(exc.code or 0)
    return 0


def run_demo(out: Path, max_new_tokens: int, train: bool = True, dtype: torch.dtype | None = None) -> int:
    click.echo(f"building the tiny demo target and heads of every kind in {out}")
    paths = build_demo(out)
    if train:
        paths = train_demo_heads(paths, out, demo_prompt_ids(paths["target"]), max_new_tokens)
    rows, same = run_kinds(paths, max_new_tokens, train, dtype)
    click.echo(
        table(
            [
                "drafter",
                "heads",
                "tree nodes",
                "== greedy",
                "accept len",
                "per-position",
                "steps",
                "plain steps",
                "speedup",
            ],
            rows,
        )
    )
    click.echo(
        "greedy speculative output is token-identical to plain greedy for every kind"
        if same
        else "MISMATCH: speculative output differs from plain greedy"
    )
    click.echo(
        "(speedup on this 4-layer toy target mostly measures Python overhead; real-model numbers come "
        "from scripts/bench_*.py)"
    )
    code = run_build_step(paths, out / "build")
    return code if same else 1
