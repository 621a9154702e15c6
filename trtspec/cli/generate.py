"""The reference runtime's commands: generate, demo, make-draft."""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import click

from trtspec.cli.options import also_draft_option, draft_vocab_option, max_tokens_option, model_options, target_option
from trtspec.dtypes import COMPUTE_DTYPES
from trtspec.errors import UsageError
from trtspec.load import load_spec_model, load_tokenizer
from trtspec.train.data import Sample, encode_prompt

DTYPE_HELP = (
    "Run dtype. auto: bfloat16 (pre-packed oneDNN kernels) where the CPU has native bfloat16 "
    "(AVX512-BF16/AMX), float32 on other CPUs (bfloat16 is several times slower there); "
    "bfloat16/float16 on GPUs. An explicit dtype is obeyed."
)


@click.command("generate")
@model_options(DTYPE_HELP, COMPUTE_DTYPES, "auto")
@click.option("--prompt", "-p", multiple=True, required=True, help="Prompt text; repeat for a batch.")
@click.option("--chat/--no-chat", default=True, show_default=True, help="Apply the tokenizer's chat template.")
@max_tokens_option(64)
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0.0), help="0 = greedy.")
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(0))
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0.0, 1.0, min_open=True))
@click.option("--seed", default=0, show_default=True)
@click.option("--compare", is_flag=True, help="Also run plain decoding and report the speedup.")
@click.option(
    "--adaptive/--fixed-tree",
    default=True,
    show_default=True,
    help="Adaptive: each step's tree (down to none) is the one with the best measured tokens/s on this "
    "machine and text, so speculation never runs slower than plain. Fixed: always the whole tree.",
)
@draft_vocab_option
@also_draft_option
@click.option("--json", "as_json", is_flag=True, help="Print metrics as JSON.")
def generate_cmd(
    target,
    heads,
    heads_format,
    allow_pickle,
    tree,
    dtype,
    prompt,
    chat,
    max_tokens,
    temperature,
    top_k,
    top_p,
    seed,
    compare,
    adaptive,
    draft_vocab,
    also_draft,
    as_json,
):
    """Generate with the PyTorch reference runtime (CPU) and print the text and acceptance metrics.

    Greedy speculative output is token-identical to plain greedy decoding; with --temperature > 0 the
    lossless rejection sampler keeps the target's distribution. --compare checks both claims' cost:
    it runs plain decoding too and prints the wall-clock speedup.
    """
    from trtspec.cpu import setup_compute
    from trtspec.dtypes import resolve_dtype
    from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator
    from trtspec.runtime.report import metrics_lines

    spec = load_spec_model(
        target,
        heads,
        heads_format,
        tree,
        resolve_dtype(dtype).dtype,
        allow_pickle=allow_pickle,
        draft_vocab=draft_vocab,
        also_draft=also_draft,
    )
    tok = load_tokenizer(spec.target)
    prompts = [encode_prompt(tok, Sample(text=p), chat) for p in prompt]
    if not all(prompts):
        raise UsageError("the prompt encodes to zero tokens")
    choice = setup_compute(dtype, echo=lambda line: click.echo(line, err=True))  # inputs are valid: announce
    gen = SpeculativeGenerator(spec, dtype=choice.dtype)
    eos = spec.target.arch.eos_token_id
    cfg = GenerationConfig(
        max_new_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        eos_token_id=eos,
        adaptive=adaptive,
    )
    click.echo(spec.describe(), err=True)
    res = gen.generate(prompts, cfg)
    for p, toks in zip(prompt, res.tokens):
        click.echo(f"--- {p}\n{tok.decode(toks, skip_special_tokens=True)}")
    out = {"speculative": res.metrics.to_dict()}
    if compare:
        plain = gen.generate(prompts, replace(cfg, speculative=False))
        out["plain"] = plain.metrics.to_dict()
        out["speedup"] = plain.metrics.wall_s / max(res.metrics.wall_s, 1e-9)
        out["identical"] = plain.tokens == res.tokens
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    click.echo("--- metrics")
    for line in metrics_lines(res.metrics):
        click.echo(line)
    if compare:
        same = "identical" if out["identical"] else ("differs (sampling)" if temperature > 0 else "DIFFERS")
        click.echo(f"plain: {out['plain']['tokens_per_s']:.1f} tokens/s; speedup {out['speedup']:.2f}x; output {same}")


@click.command("make-draft")
@target_option
@click.option("--layers", required=True, type=int, help="How many of the target's first layers to keep.")
@click.option("--out", "-o", required=True, type=click.Path(path_type=Path), help="Output HF directory.")
def make_draft_cmd(target, layers, out):
    """Write a draft model made of the target's first N layers (+ embedding, norm, lm_head).

    The untrained baseline drafter: it shares the tokenizer and needs no training.
    """
    from trtspec.checkpoint.target import load_hf_causal_lm
    from trtspec.checkpoint.truncate import write_truncated_draft

    path = write_truncated_draft(load_hf_causal_lm(target), layers, out)
    click.echo(f"wrote {path}")


@click.command("demo")
@click.option(
    "--out",
    "-o",
    type=click.Path(path_type=Path),
    default=None,
    help="Where to write the demo models (default: a temporary directory).",
)
@max_tokens_option(48)
@click.option(
    "--train/--no-train",
    default=True,
    show_default=True,
    help="Self-distil every trainable kind's heads for a few seconds first (else all heads are random).",
)
@click.option(
    "--dtype",
    type=click.Choice(COMPUTE_DTYPES),
    default="auto",
    show_default=True,
    help="Dtype of the reference runtime (auto: bfloat16 where the CPU has native bfloat16, else float32).",
)
def demo_cmd(out, max_tokens, train, dtype):
    """The embedded demo: tiny target + heads of every kind, reference runtime, then `trtspec build`.

    Builds a tiny random Llama (with a tokenizer) and heads in every published format, self-distils
    Medusa/MTP/EAGLE heads on the target's replies for a few seconds, checks each drafter's greedy output
    is token-identical to plain greedy, prints acceptance metrics, and ends with the main job, `trtspec
    build --allow-no-gpu` (TensorRT-LLM checkpoint, build plan/script, Triton repository). Nothing is
    downloaded.
    """
    from trtspec.cpu import setup_compute
    from trtspec.demo.run import run_demo

    choice = setup_compute(dtype, echo=click.echo)
    if out is None:
        with tempfile.TemporaryDirectory(prefix="trtspec-demo-") as tmp:
            sys.exit(run_demo(Path(tmp), max_tokens, train, dtype=choice.dtype))
    sys.exit(run_demo(out, max_tokens, train, dtype=choice.dtype))


COMMANDS = [generate_cmd, demo_cmd, make_draft_cmd]
