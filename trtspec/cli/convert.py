"""``trtspec convert`` and ``trtspec build``."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from trtspec.cli.options import dtype_option, heads_options, parallel_options, target_option, tree_option
from trtspec.errors import UsageError


def _load(target, heads, heads_format, tree, dtype, tp, pp, allow_pickle):
    from trtspec.load import load_spec_model

    return load_spec_model(
        target, heads, heads_format, tree=tree, dtype=dtype, tp_size=tp or 1, pp_size=pp or 1, allow_pickle=allow_pickle
    )


def _common(f):
    opts = [
        target_option,
        heads_options,
        tree_option,
        click.option("--out", required=True, type=click.Path(path_type=Path), help="Output directory."),
        parallel_options,
        click.option(
            "--draft-tp-size", type=int, default=None, help="Draft-model engine TP size (default: --tp-size)."
        ),
        dtype_option("Weight dtype (default: the checkpoint's).", ("float16", "bfloat16", "float32")),
        click.option("--max-draft-len", type=int, default=None, help="Draft tokens per step (default: tree size)."),
        click.option(
            "--parallel-embedding/--no-parallel-embedding",
            default=None,
            help="Vocab-parallel embedding (default: on when tp > 1).",
        ),
        click.option(
            "--embedding-sharding-dim",
            type=click.Choice(["0", "1"]),
            default=None,
            help="Shard the embedding on the vocab (0) or the hidden dim (1).",
        ),
        click.option("--overwrite", is_flag=True, help="Replace --out if it exists."),
        click.option("--no-progress", is_flag=True, help="No progress bar."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


@click.command("convert")
@_common
def convert_cmd(
    target,
    heads,
    heads_format,
    tree,
    out,
    tp_size,
    pp_size,
    draft_tp_size,
    dtype,
    max_draft_len,
    parallel_embedding,
    embedding_sharding_dim,
    overwrite,
    no_progress,
    allow_pickle,
):
    """Write a TensorRT-LLM 1.2 checkpoint (config.json + rank{r}.safetensors) for target + heads.

    The speculative mode follows the heads: Medusa and mtp-linear -> MedusaForCausalLM, EAGLE-1/2 and
    mtp-single -> EagleForCausalLM, a draft model -> OUT/target + OUT/draft. Tensors are streamed one at a
    time (memory stays near the largest tensor) into a temporary directory renamed at the end.
    """
    from trtspec.convert.core import convert, dtype_from_name, plan_conversion, planned_totals
    from trtspec.convert.modes import ConvertOptions
    from trtspec.convert.progress import ConvertProgress, summary_table

    spec = _load(target, heads, heads_format, tree, dtype, tp_size, pp_size, allow_pickle)
    opts = ConvertOptions(
        tp_size=tp_size or 1,
        pp_size=pp_size or 1,
        dtype=dtype_from_name(dtype),
        use_parallel_embedding=parallel_embedding,
        embedding_sharding_dim=int(embedding_sharding_dim or 0),
        max_draft_len=max_draft_len,
        draft_tp_size=draft_tp_size,
    )
    _, plans = plan_conversion(spec, opts)
    n, b = planned_totals(plans)
    with ConvertProgress(n, b, enabled=not no_progress) as bar:
        result = convert(spec, out, opts, overwrite=overwrite, on_tensor=bar)
    click.echo(summary_table(result))
    click.echo(f"wrote {out}")


@click.command("build")
@_common
@click.option(
    "--config",
    "preset",
    default=None,
    help="Build preset: a name in build_configs/ (demo, llama3-8b-mtp, llama3-70b-eagle-8gpu) or a YAML file.",
)
@click.option("--max-batch-size", type=int, default=None)
@click.option("--max-input-len", type=int, default=None)
@click.option("--max-seq-len", type=int, default=None)
@click.option("--max-num-tokens", type=int, default=None)
@click.option("--kv-cache-fraction", type=float, default=None, help="kv_cache_free_gpu_mem_fraction for Triton.")
@click.option(
    "--runtime",
    type=click.Choice(["trtllm", "reference"]),
    default=None,
    help="Triton repository runtime (default trtllm).",
)
@click.option(
    "--decoupled/--no-decoupled",
    default=None,
    help="Triton decoupled_mode of the emitted repository (default: decoupled, i.e. streaming).",
)
@click.option(
    "--allow-no-gpu",
    is_flag=True,
    help="Without TensorRT-LLM + GPU: stop after checkpoint, plan and build_engines.sh (exit 0).",
)
@click.option(
    "--backend",
    type=click.Choice(["engine", "pytorch"]),
    default="engine",
    show_default=True,
    help="engine: TensorRT-LLM 1.2.x engines (trtllm-build, plugins, the tensorrtllm Triton backend). pytorch: "
    "TensorRT-LLM's PyTorch backend: the draft in the layout its loader reads, a trtllm-serve options YAML "
    "with the speculative_config, a Triton llmapi repository and launch.sh (no GPU needed to write them).",
)
@click.option(
    "--draft-len-schedule",
    default=None,
    help="--backend pytorch: draft length by batch size, 'BATCH:LEN,...' (e.g. '1:4,8:2,32:0'); batch 1 must "
    "map to max_draft_len.",
)
@click.option(
    "--max-concurrency",
    type=int,
    default=None,
    help="--backend pytorch: no speculation above this many requests in a batch.",
)
def build_cmd(
    target,
    heads,
    heads_format,
    tree,
    out,
    tp_size,
    pp_size,
    draft_tp_size,
    dtype,
    max_draft_len,
    parallel_embedding,
    embedding_sharding_dim,
    overwrite,
    no_progress,
    allow_pickle,
    preset,
    max_batch_size,
    max_input_len,
    max_seq_len,
    max_num_tokens,
    kv_cache_fraction,
    runtime,
    decoupled,
    allow_no_gpu,
    backend,
    draft_len_schedule,
    max_concurrency,
):
    """Whole pipeline: validate -> convert -> plugin library -> engines -> Triton repository -> manifest.

    Options on the command line override the --config preset. With TensorRT-LLM 1.2.x and a GPU the
    engines are built here through TensorRT-LLM's build API; otherwise pass --allow-no-gpu to get the
    checkpoint, plan.json and build_engines.sh that runs exactly this build on a GPU machine.
    --backend pytorch instead writes a deployment for TensorRT-LLM's PyTorch backend (trtllm-serve,
    LLM API, Triton llmapi); each drafter kind says whether it has one.
    """
    if backend == "pytorch":
        from trtspec.deploy.pytorch_backend import parse_schedule, write_pytorch_deployment

        spec = _load(target, heads, heads_format, tree, dtype, tp_size, pp_size, allow_pickle)
        result = write_pytorch_deployment(
            spec,
            out,
            max_draft_len=max_draft_len,
            draft_len_schedule=parse_schedule(draft_len_schedule),
            max_concurrency=max_concurrency,
            max_batch_size=max_batch_size or 64,
            decoupled=decoupled if decoupled is not None else True,
            overwrite=overwrite,
            argv=["trtspec", *sys.argv[1:]],
        )
        for note in result.notes:
            click.echo(f"note: {note}")
        click.echo(result.message)
        return
    if draft_len_schedule or max_concurrency:
        raise UsageError(
            "--draft-len-schedule and --max-concurrency are PyTorch-backend options: add --backend pytorch"
        )
    from trtspec.convert.core import plan_conversion, planned_totals
    from trtspec.convert.progress import ConvertProgress, summary_table
    from trtspec.engine import presets
    from trtspec.engine.pipeline import check_can_build, convert_options, run_build

    preset_path, preset_values = presets.load_preset(preset) if preset else (None, {})
    options = presets.merge(
        preset_values,
        {
            "dtype": dtype,
            "max_batch_size": max_batch_size,
            "max_input_len": max_input_len,
            "max_seq_len": max_seq_len,
            "max_num_tokens": max_num_tokens,
            "max_draft_len": max_draft_len,
            "tree": tree,
            "tp_size": tp_size,
            "pp_size": pp_size,
            "draft_tp_size": draft_tp_size,
            "use_parallel_embedding": parallel_embedding,
            "embedding_sharding_dim": int(embedding_sharding_dim) if embedding_sharding_dim is not None else None,
            "kv_cache_free_gpu_mem_fraction": kv_cache_fraction,
            "runtime": runtime,
            "decoupled": decoupled,
        },
    )
    spec = _load(
        target,
        heads,
        heads_format,
        options["tree"],
        options["dtype"],
        options["tp_size"],
        options["pp_size"],
        allow_pickle,
    )
    _, plans = plan_conversion(spec, convert_options(options))
    check_can_build(allow_no_gpu)
    n, b = planned_totals(plans)
    with ConvertProgress(n, b, enabled=not no_progress) as bar:
        result = run_build(
            spec,
            out,
            options,
            allow_no_gpu=allow_no_gpu,
            overwrite=overwrite,
            on_tensor=bar,
            argv=["trtspec", *sys.argv[1:]],
            inputs={"preset": preset_path},
        )
    click.echo(summary_table(result.convert))
    for note in result.notes:
        click.echo(f"note: {note}")
    click.echo(result.message)


# Bad options raise UsageError / CheckpointError; the main group prints them as one line, exit 2.
COMMANDS = [convert_cmd, build_cmd]
