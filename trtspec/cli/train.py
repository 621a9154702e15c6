"""CLI: ``trtspec train-heads`` and ``trtspec tune-tree``."""

from __future__ import annotations

import json
from pathlib import Path

import click

from trtspec.cli.options import AliasedOption, target_option
from trtspec.drafters import registry
from trtspec.dtypes import resolve_dtype
from trtspec.errors import UsageError


def _items(tok, samples, mode: str, chat: bool) -> tuple[list[list[int]], list[list[int]] | None]:
    """Token ids per sample, and (teacher mode) which of them the loss may predict: assistant turns."""
    from trtspec.train.data import encode_prompt, encode_text_with_mask

    if mode == "generate":
        return [encode_prompt(tok, s, chat) for s in samples], None
    pairs = [encode_text_with_mask(tok, s) for s in samples]
    masks = [p[1] for p in pairs]
    return [p[0] for p in pairs], masks if not all(all(m) for m in masks) else None  # text only: no mask


def _barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist

        dist.barrier()


def _kinds(pred, show=None) -> str:
    """The trainable kinds whose recipe matches ``pred`` (help texts name kinds from the registry), or
    ``show(recipe)`` of each, once per distinct value."""
    picked = [(n, k.training) for n, k in registry.KINDS.items() if k.training is not None and pred(k.training)]
    return " / ".join(dict.fromkeys(show(r) if show else n for n, r in picked))


@click.command("train-heads")
@target_option
@click.option("--kind", "-k", required=True, type=click.Choice(registry.trainable()), help="Head kind to train.")
@click.option(
    "--data",
    "-d",
    multiple=True,
    default=("mix",),
    show_default=True,
    help="Training data: 'mix[:N]' (chat with the chat template, Python-docs prose and stdlib code continued raw; "
    "weights as mix:N:chat=0.5,prose=0.25,code=0.25), 'chat', 'prose', 'code', 'chat-turns[:N]' (every user turn "
    "of chat's training conversations: ~60k items), 'chitchat[:N]', or a file: .jsonl "
    "({text} / {messages} / {conversations}), .json, .txt. Repeatable. '<source>-eval' parts are never trained on.",
)
@click.option("--out", "-o", required=True, type=click.Path(path_type=Path), help="Output heads directory.")
@click.option(
    "--num-heads",
    default=3,
    show_default=True,
    type=click.IntRange(1, 16),
    help=f"Heads (tokens ahead) for {_kinds(lambda r: r.uses_num_heads)}.",
)
@click.option(
    "--draft-layers",
    default=None,
    type=click.IntRange(1, 32),
    help=f"Decoder layers of a fresh {_kinds(lambda r: r.draft_layers)} drafter (default "
    f"{_kinds(lambda r: r.draft_layers, lambda r: str(r.draft_layers))}; "
    "with --init-from, the heads' own). More layers cost more per step, in training and at every drafting "
    "step (SmolLM2 DSpark on CPU, 4 layers against 2: 1.8x the training step, 0.1 more tokens accepted per "
    "step, 1.82x against 1.90x plain); the public configs record it as num_hidden_layers.",
)
@click.option(
    "--rmsnorm/--no-rmsnorm",
    default=True,
    show_default=True,
    help=f"Keep the RMSNorm layers in {_kinds(lambda r: r.uses_rmsnorm_switch)} heads (the ablation switch).",
)
@click.option(
    "--cache",
    "cache_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Self-distillation cache directory (default: OUT.cache). Reused and resumed across runs.",
)
@click.option(
    "--distill",
    type=click.Choice(["generate", "teacher"]),
    default="generate",
    show_default=True,
    help="generate: the target writes the replies it is trained on; teacher: target labels on the data's tokens.",
)
@click.option("--gen-tokens", default=128, show_default=True, type=click.IntRange(2), help="Reply length (generate).")
@click.option(
    "--topk",
    default=0,
    show_default=True,
    type=click.IntRange(0, 64),
    help="Also cache the target's top-k logits (soft labels, see --soft-weight).",
)
@click.option(
    "--chat/--no-chat",
    default=True,
    show_default=True,
    help="Render data with the tokenizer's chat template, as the server will.",
)
@click.option("--max-samples", default=None, type=click.IntRange(1), help="Use only the first N samples.")
@click.option(
    "--cache-batch",
    default=64,
    show_default=True,
    type=click.IntRange(1),
    help="Sequences the target decodes at once while caching (rows are refilled as replies end). "
    "More rows make each decode step cheaper per token on a CPU (64 vs 16 rows: 1.5-2x per step, "
    "~5% end to end as measured on 1 AVX2 thread).",
)
@click.option(
    "--cache-dtype",
    type=click.Choice(["auto", "bfloat16", "float32"]),
    default="auto",
    show_default=True,
    help="Dtype the target runs in while caching. auto: bfloat16 where the CPU has native bfloat16 "
    "(AVX512-BF16/AMX: about 3x faster, and the labels are what a bfloat16 deployment says), "
    "float32 elsewhere (on AVX2-only CPUs bfloat16 is several times slower).",
)
@click.option(
    "--epochs",
    default=4.0,
    show_default=True,
    type=click.FloatRange(0.0, min_open=True),
    help="Passes over the cached replies. 4: on SmolLM2 with the default mix:400, 1 epoch left depth-1 "
    "acceptance at 0.09-0.23 on held-out text and 4 raised it to 0.32 (the steps are cheap once the loss "
    "runs over a draft vocabulary: the cache, not the training, is most of the time).",
)
@click.option("--steps", default=None, type=click.IntRange(1), help="Training steps (overrides --epochs).")
@click.option("--batch-tokens", default=2048, show_default=True, type=click.IntRange(1))
@click.option("--lr", default=1e-3, show_default=True, type=float)
@click.option(
    "--warmup",
    default=None,
    type=click.IntRange(0),
    help="Linear learning-rate warm-up steps (default: a tenth of the run, at most 20).",
)
@click.option(
    "--unroll",
    default=2,
    show_default=True,
    type=click.IntRange(1, 8),
    help=f"{_kinds(lambda r: r.style == 'recurrent')}: steps trained per position, feeding back the head's own output.",
)
@click.option(
    "--soft-weight",
    default=0.0,
    show_default=True,
    type=click.FloatRange(0.0, 1.0),
    help="Weight of the target's distribution in the loss (see --soft-labels); the hard label keeps the rest.",
)
@click.option(
    "--soft-labels",
    type=click.Choice(["topk", "full"]),
    default="topk",
    show_default=True,
    help="The target distribution --soft-weight distills. topk: its cached top-k logits (needs --topk). "
    "full: its whole softmax over the loss vocabulary (the draft vocabulary with --draft-vocab), "
    "recomputed from the cached hidden state, as SafeAILab's EAGLE/EAGLE-3 trainers distill; "
    f"{_kinds(lambda r: r.style == 'recurrent')} only, no --topk needed.",
)
@click.option(
    "--train-on",
    type=click.Choice(["generated", "all"]),
    default="generated",
    show_default=True,
    help="generated: loss only where the target wrote the text (what heads face when serving); with "
    "--distill teacher, only on the assistant turns of chat data (located with the chat template).",
)
@click.option(
    "--label-vocab",
    type=click.Choice(["auto", "full", "cache", "draft"]),
    default="auto",
    show_default=True,
    help="Vocabulary of the loss's softmax. draft: the --draft-vocab N tokens the runtime drafts over "
    "(a label outside them can never be drafted; the lm_head matmul, most of a CPU training step, shrinks "
    "by vocab/N); cache: every token the target used on the data; full: the whole vocabulary. auto: draft "
    "when --draft-vocab is given (kinds without their own vocabulary), else full.",
)
@click.option(
    "--lm-dtype",
    type=click.Choice(["auto", "bfloat16", "float32"]),
    default="auto",
    show_default=True,
    help="Dtype of the shared lm_head matmul in the loss. auto: bfloat16 where the CPU has native "
    "bfloat16 (~2x faster), float32 elsewhere (the bfloat16 backward is emulated there and slow).",
)
@click.option(
    "--draft-vocab",
    default=0,
    show_default=True,
    type=click.IntRange(0),
    help="Also write draft_vocab.safetensors: the N tokens the target writes most often on the data. "
    "The reference runtime then drafts over those N only (faster drafting, still lossless); "
    "0 = draft over the full vocabulary. For kinds with their own draft vocabulary "
    f"({_kinds(lambda r: r.prepare is not None)}): its size (0 = the kind's default).",
)
@click.option(
    "--eval-data",
    default=None,
    help="Held-out prompts (e.g. 'chat-eval:32'; any --data spec): after training, the target writes its replies "
    "to them and the drafter's top-1 acceptance per depth is measured there and on the training data, without "
    "decoding (a large gap means it memorised its data: train on more). Cached in OUT.eval-cache/.",
)
@click.option("--seed", default=0, show_default=True)
@click.option("--resume", is_flag=True, help="Continue from the checkpoint in OUT.train/ (same options).")
@click.option(
    "--init-from",
    type=click.Path(path_type=Path),
    default=None,
    help="Start from these trained heads (same kind and --num-heads) instead of a fresh drafter: goes on "
    "training a finished run for --steps more under a new learning-rate schedule (--resume only finishes "
    "an interrupted one). With the --seed they record, it takes the batches that follow theirs.",
)
@click.option("--ckpt-every", default=50, show_default=True, type=click.IntRange(0))
def train_heads_cmd(
    target,
    kind,
    data,
    out,
    num_heads,
    draft_layers,
    rmsnorm,
    cache_dir,
    distill,
    gen_tokens,
    topk,
    chat,
    max_samples,
    cache_batch,
    cache_dtype,
    epochs,
    steps,
    batch_tokens,
    lr,
    warmup,
    unroll,
    soft_weight,
    soft_labels,
    train_on,
    label_vocab,
    lm_dtype,
    draft_vocab,
    eval_data,
    seed,
    resume,
    init_from,
    ckpt_every,
):
    """Train draft heads on the target's own outputs (self-distillation) and write them for the loaders.

    The target runs once over the data and its final hidden states and greedy choices go to a
    memory-mapped, resumable cache; training then never runs the target. Ctrl-C checkpoints; --resume
    continues bit-identically (same --seed). Under torchrun the same command trains with
    DistributedDataParallel. Output: trtspec-heads (mtp-*), FasterDecoding Medusa, or SafeAILab EAGLE,
    with the target's fingerprint.
    """
    from trtspec.checkpoint.target import load_hf_causal_lm
    from trtspec.cpu import setup_compute
    from trtspec.load import load_tokenizer
    from trtspec.train.cache import HiddenCache, build_cache
    from trtspec.train.data import check_lengths, check_token_ids, load_samples
    from trtspec.train.heads import check_draft_layers, horizon, save_heads
    from trtspec.train.trainer import TrainConfig, check_soft_labels, dist_info, train

    cache_choice, lm_choice = resolve_dtype(cache_dtype), resolve_dtype(lm_dtype)
    record = registry.get(kind)
    label_vocab = _label_vocab(label_vocab, draft_vocab, record)
    check_soft_labels(kind, record.training.style, soft_labels, soft_weight)
    check_draft_layers(kind, draft_layers)
    if soft_weight > 0 and soft_labels == "topk" and topk == 0:
        raise UsageError("--soft-weight needs --topk > 0 (the cached target distribution) or --soft-labels full")
    tgt = load_hf_causal_lm(target)
    tok = load_tokenizer(tgt)
    init = _warm_start_heads(init_from, tgt, kind) if init_from is not None else None
    if init is not None and draft_layers is None and record.training.draft_layers:
        draft_layers = init.arch.num_hidden_layers  # go on training the heads' own depth
    first_batch = _trained_steps(init_from, seed) if init_from is not None else 0
    samples = load_samples(list(data), seed)
    if max_samples:
        samples = samples[:max_samples]
    items, loss_masks = _items(tok, samples, distill, chat)
    eval_items = _items(tok, load_samples([eval_data], seed), "generate", chat)[0] if eval_data else None
    check_token_ids(items, tgt.arch.vocab_size, tgt.tokenizer_path or tgt.path)
    hz = horizon(kind, num_heads, unroll)
    if distill == "teacher":
        check_lengths(items, hz)
    rank, world, _ = dist_info()
    cache_dir = cache_dir or out.with_name(out.name + ".cache")
    setup_compute(cache_dtype, echo=lambda line: click.echo(f"cache {line}", err=True))  # inputs are valid: announce
    click.echo(f"lm_head {lm_choice.describe()}", err=True)
    if label_vocab == "draft":
        click.echo(f"label vocab: the {draft_vocab} draft-vocabulary tokens (--label-vocab draft)", err=True)
    build_cache(
        tgt,
        items,
        cache_dir,
        mode=distill,
        gen_tokens=gen_tokens,
        topk=topk,
        batch_size=cache_batch,
        rank=rank,
        world=world,
        dtype=cache_choice.name,
        aux_layers=record.training.aux_layers(tgt) if record.training.aux_layers is not None else (),
        loss_masks=loss_masks if train_on == "generated" else None,
        aux_optional=True,  # a cache written without them (another kind's, an older one): a side file instead
    )
    _barrier(world)
    cache = HiddenCache(cache_dir, tgt.fingerprint, world=world)
    check_lengths([range(n) for _, _, n in cache.sequences], hz, f"{cache_dir} (cached sequences)")
    cfg = TrainConfig(
        kind=kind,
        num_heads=num_heads,
        draft_layers=draft_layers,
        rmsnorm=rmsnorm,
        unroll=unroll,
        batch_tokens=batch_tokens,
        epochs=epochs,
        steps=steps,
        lr=lr,
        warmup=warmup,
        soft_weight=soft_weight,
        soft_labels=soft_labels,
        train_on=train_on,
        label_vocab=label_vocab,
        lm_dtype=lm_choice.name,
        draft_vocab=draft_vocab if record.own_draft_vocab or label_vocab == "draft" else 0,
        seed=seed,
        ckpt_every=ckpt_every,
    )
    module, result = train(
        tgt, cache, cfg, ckpt_dir=out.with_name(out.name + ".train"), resume=resume, init=init, first_batch=first_batch
    )
    if rank == 0:
        info = {
            "steps": result.steps,
            "final_loss": result.final_loss,
            "step_losses": result.step_losses,
            "cache_tokens": cache.num_tokens,
            "distill": distill,
            "seed": seed,
        }
        save_heads(kind, module, tgt, out, info, rmsnorm=rmsnorm)
        click.echo(
            f"wrote {kind} heads to {out} (loss {result.final_loss:.4f}, {result.steps} steps, "
            f"{result.tokens_per_s:.0f} tok/s)"
        )
        if label_vocab == "cache" and not draft_vocab:
            click.echo(
                "note: --label-vocab cache trained only the lm_head rows the target used on the data; pass "
                "--draft-vocab N so the runtime drafts over those tokens (a freshly initialised drafter's "
                "other rows are untrained)",
                err=True,
            )
        if draft_vocab and not record.own_draft_vocab:
            from trtspec.checkpoint.heads.draft_vocab import save_draft_vocab
            from trtspec.train.draft_vocab import frequent_tokens

            dv = frequent_tokens(cache, tgt.arch.vocab_size, draft_vocab)
            f = save_draft_vocab(out, dv.ids)
            click.echo(
                f"wrote {f}: {dv.ids.numel()} of {tgt.arch.vocab_size} tokens, covering {dv.coverage:.1%} of "
                f"the target's choices on the data ({dv.distinct} distinct)"
            )
        if eval_items:
            _report_heldout(target, out, eval_items, eval_data, max(hz, 3), gen_tokens, cache_choice.name, cache)
    _barrier(world)


def _report_heldout(target, out: Path, items, name: str, depth: int, gen_tokens: int, dtype: str, cache) -> None:
    """Print the trained heads' held-out and training-data acceptance (trtspec.train.heldout)."""
    from trtspec.train.heldout import evaluate_heads

    held, train = evaluate_heads(
        target, out, items, out.with_name(out.name + ".eval-cache"), depth, gen_tokens, dtype, cache
    )
    click.echo(f"held-out ({name}, {held.positions} positions): {held.describe()}")
    if train is not None:
        click.echo(f"training data ({train.positions} positions): {train.describe()}")
        if train.conditional[0] - held.conditional[0] > 0.1:
            click.echo(
                "note: the drafter hits far more often on its training data than on held-out text: it memorised "
                "its data; more data (not more steps) raises acceptance",
                err=True,
            )


def _warm_start_heads(path: Path, target, kind: str):
    """The heads --init-from names, read by ``kind``'s loader; heads of another kind are refused by name."""
    from trtspec.errors import CheckpointError
    from trtspec.load import load_drafter

    found = registry.detect_or_none(path) if path.is_dir() else kind
    if found != kind:
        raise CheckpointError(
            f"--init-from holds {found or 'no known'} heads, not {kind}",
            path,
            f"start from {kind} heads or pass --kind {found}",
        )
    return load_drafter(path, target, heads_format=kind, draft_vocab=0)


def _trained_steps(path: Path, seed: int) -> int:
    """How many steps the heads at ``path`` record training with ``seed`` (0 when they record none, or
    another seed): a warm start then takes the batches that follow theirs in the data order."""
    for name, key in (("config.json", "trtspec_training"), ("trtspec_heads.json", "training")):
        try:
            info = json.loads((path / name).read_text()).get(key) or {}
        except (OSError, ValueError, AttributeError):
            continue
        if info.get("seed", 0) == seed and isinstance(info.get("steps"), int):
            click.echo(
                f"warm start from {path} ({info['steps']} steps): this run takes the batches after theirs", err=True
            )
            return int(info["steps"])
    return 0


def _label_vocab(choice: str, draft_vocab: int, record) -> str:
    """Resolve --label-vocab auto (checked before any work: draft needs --draft-vocab)."""
    if choice == "auto":
        choice = "draft" if draft_vocab and not record.own_draft_vocab else "full"
    if choice == "draft" and not draft_vocab:
        raise UsageError("--label-vocab draft needs --draft-vocab N: the tokens the runtime drafts over")
    return choice


@click.command("tune-tree")
@target_option
@click.option("--heads", "-H", required=True, type=click.Path(path_type=Path), help="Trained heads (any kind).")
@click.option(
    "--heads-format",
    type=click.Choice(registry.names()),
    default=None,
    help="Drafter kind; detected from the files when omitted.",
)
@click.option("--data", "-d", multiple=True, required=True, help="Calibration data (as for train-heads).")
@click.option(
    "--nodes",
    "-n",
    default="8",
    show_default=True,
    help="Node budget(s): N or a comma list; with several, the best measured speed wins.",
)
@click.option("--depth", default=None, type=click.IntRange(1, 16), help="Max tree depth (default: heads, or 5).")
@click.option("--topk", default=8, show_default=True, type=click.IntRange(1, 64), help="Ranks considered per depth.")
@click.option(
    "--skip",
    default=0,
    show_default=True,
    type=click.IntRange(0),
    help="Skip the first N samples (e.g. the ones the heads were trained on).",
)
@click.option("--calib-samples", default=32, show_default=True, type=click.IntRange(1))
@click.option(
    "--eval-samples",
    default=8,
    show_default=True,
    type=click.IntRange(0),
    help="Prompts decoded to measure the acceptance length (0 = skip).",
)
@click.option(
    "--max-tokens",
    "max_tokens",
    cls=AliasedOption,
    hidden_aliases=("--max-new-tokens",),
    default=64,
    show_default=True,
    type=click.IntRange(1),
    help="Tokens generated per evaluation prompt.",
)
@click.option("--gen-tokens", default=96, show_default=True, type=click.IntRange(2))
@click.option(
    "--cache",
    "cache_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Calibration cache directory (default: HEADS.calib).",
)
@click.option("--speed/--no-speed", default=True, show_default=True, help="Also time plain vs speculative decoding.")
@click.option("--out", "-o", type=click.Path(path_type=Path), default=None, help="Write the choices as JSON here.")
@click.option(
    "--write-heads",
    is_flag=True,
    help="Record the best tree beside the heads (trtspec_tree.json, any format) when it beats plain decoding: "
    "generate, convert, build and triton emit then use it unless --tree is given.",
)
@click.option(
    "--draft-vocab",
    default=None,
    type=click.IntRange(0),
    help="Tune with the N most frequent tokens of the heads' draft vocabulary (0 = full vocabulary).",
)
@click.option(
    "--dtype",
    type=click.Choice(["auto", "bfloat16", "float32"]),
    default="auto",
    show_default=True,
    help="Dtype of the calibration cache and of the timed decoding (auto: bfloat16 where the CPU has "
    "native bfloat16, else float32). Time in the dtype you will serve in.",
)
@click.option("--seed", default=0, show_default=True)
def tune_tree_cmd(
    target,
    heads,
    heads_format,
    data,
    nodes,
    depth,
    topk,
    skip,
    calib_samples,
    eval_samples,
    max_tokens,
    gen_tokens,
    cache_dir,
    speed,
    out,
    write_heads,
    draft_vocab,
    dtype,
    seed,
):
    """Measure per-depth top-k acceptance on calibration data and build the static tree that maximises the
    expected acceptance length for N nodes; print the expected and the measured acceptance length and the
    choices in Medusa/EAGLE and TensorRT-LLM notation (for --tree, build and the Triton parameters)."""
    from trtspec.train.data import load_samples
    from trtspec.train.tune_run import tune

    budgets = _budgets(nodes)
    samples = load_samples(list(data), seed)[skip:]
    if not samples:
        raise UsageError(f"--skip {skip} leaves no calibration samples")
    calib = samples[:calib_samples]
    evals = samples[calib_samples : calib_samples + eval_samples] or samples[:eval_samples]
    report = tune(
        target,
        heads,
        heads_format,
        calib,
        evals,
        budgets,
        depth=depth,
        topk=topk,
        cache_dir=cache_dir or heads.with_name(heads.name + ".calib"),
        gen_tokens=gen_tokens,
        max_new_tokens=max_tokens,
        speed=speed,
        echo=click.echo,
        draft_vocab=draft_vocab,
        dtype=dtype,
    )
    best = report["best"]
    click.echo(
        f"best: {best['nodes']} nodes, expected {best['expected']:.3f}, measured "
        f"{best.get('measured', float('nan')):.3f}"
    )
    click.echo(f"choices: {best['choices_json']}")
    click.echo(f"trtllm:  {best['choices_trtllm']}")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        click.echo(f"wrote {out}")
    if write_heads and not report["beats_plain"]:
        click.echo(f"not recording a tree in {heads}: it would make decoding slower than plain", err=True)
    elif write_heads:
        from trtspec.tree import write_recorded_tree

        click.echo(f"recorded the tree in {write_recorded_tree(heads, best['choices'], 'trtspec tune-tree')}")


def _budgets(text: str) -> list[int]:
    try:
        vals = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--nodes must be an int or a comma list of ints, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise UsageError("--nodes must be >= 1")
    return vals


COMMANDS = [train_heads_cmd, tune_tree_cmd]
