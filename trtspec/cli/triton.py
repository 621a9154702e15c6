"""`trtspec triton emit` (write a Triton model repository) and `trtspec serve` (run it on 127.0.0.1)."""

from __future__ import annotations

import json
import shlex
import signal
import time
from pathlib import Path

import click

from trtspec.cli.options import also_draft_option, tree_option
from trtspec.drafters import registry
from trtspec.errors import CheckpointError, UsageError
from trtspec.triton.launch import LAUNCH_SCRIPT, TRTLLM_IMAGE

#: the image that ships TensorRT-LLM 1.2.1, the version the engines are built with
DEFAULT_CONTAINER = TRTLLM_IMAGE


def _read_spec_file(path: Path) -> dict:
    """A spec file: JSON or YAML with target, heads, heads_format, tree, dtype (all but target optional)."""
    text = path.read_text()
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:
        raise CheckpointError(f"cannot parse spec file ({exc.__class__.__name__})", path) from None
    if not isinstance(data, dict) or "target" not in data:
        raise CheckpointError("a spec file needs at least a 'target' key", path)
    base = path.parent
    for k in ("target", "heads"):
        if data.get(k) and not Path(data[k]).is_absolute():
            data[k] = str(base / data[k])
    return data


@click.group("triton")
def triton_group() -> None:
    """NVIDIA Triton model repositories (TensorRT-LLM inflight_batcher_llm layout)."""


@triton_group.command("emit")
@click.option(
    "--spec",
    "spec_path",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="A target model directory, or a JSON/YAML spec file with target, heads, heads_format, tree, dtype.",
)
@click.option(
    "--target",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Hugging Face target model directory (instead of --spec).",
)
@click.option(
    "--heads",
    "-H",
    type=click.Path(path_type=Path),
    default=None,
    help=f"Drafter: heads of any registered kind ({', '.join(registry.names())}), or a model-free kind by "
    f"name ({', '.join(registry.model_free())}; NAME:ARG).",
)
@click.option(
    "--heads-format",
    type=click.Choice(registry.names()),
    default=None,
    help="Drafter kind; detected from the files when omitted.",
)
@tree_option
@click.option(
    "--dtype",
    default="auto",
    show_default=True,
    help="Reference runtime dtype. auto: chosen where the server runs (bfloat16 on CPUs with native "
    "bfloat16 and on GPUs, float32 on other CPUs).",
)
@click.option(
    "--runtime",
    type=click.Choice(["trtllm", "reference"]),
    required=True,
    help="trtllm: engines on NVIDIA's Triton+TRT-LLM container; reference: trtspec's PyTorch runtime.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Repository directory to write (replaced atomically if it is a trtspec repository).",
)
@click.option(
    "--engine-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="trtllm: the engines' directory as the server will see it.",
)
@click.option(
    "--draft-engine-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="trtllm, draft-model heads: the draft engine's directory as the server will see it.",
)
@click.option(
    "--plugin-library",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="trtllm: the project's TensorRT plugin library (copied in, preloaded by the server).",
)
@also_draft_option
@click.option("--max-batch-size", type=int, default=8, show_default=True)
@click.option("--device", default="auto", show_default=True, help="reference: cpu, cuda, cuda:N or auto.")
@click.option("--no-speculative", is_flag=True, help="reference: plain decoding with the same model (baseline).")
@click.option(
    "--adaptive/--fixed-tree",
    default=False,
    show_default=True,
    help="reference: choose each step's tree (down to none) from measured step costs and acceptance, so "
    "speculation never runs slower than plain decoding (per-request draft counts then vary).",
)
@click.option(
    "--draft-len-schedule",
    default=None,
    help="reference: draft depth per batch size, TensorRT-LLM's draft_len_schedule, e.g. '1:3,4:2,16:1' "
    "(batch sizes above the largest key decode plainly). Default: a table measured on a small CPU.",
)
@click.option(
    "--decoupled/--no-decoupled",
    default=True,
    show_default=True,
    help="TensorRT-LLM's decoupled_mode: decoupled streams (gRPC, generate_stream); not decoupled "
    "serves plain unary requests (HTTP /infer and /generate on the ensemble).",
)
@click.option(
    "--max-seq-len",
    type=int,
    default=None,
    help="The engine's max_seq_len (trtllm-build --max_seq_len). Default: the engine's config.json; "
    "reference: the model's max_position_embeddings.",
)
def emit_cmd(
    spec_path,
    target,
    heads,
    heads_format,
    tree,
    dtype,
    runtime,
    out_dir,
    engine_dir,
    draft_engine_dir,
    plugin_library,
    max_batch_size,
    device,
    no_speculative,
    adaptive,
    draft_len_schedule,
    decoupled,
    max_seq_len,
    also_draft,
) -> None:
    """Fill the Triton templates for a target + heads, validate every config.pbtxt against Triton's
    ModelConfig schema, and write the repository (preprocessing, tensorrt_llm, postprocessing, ensemble,
    tensorrt_llm_bls)."""
    from trtspec.load import load_spec_model
    from trtspec.triton.emit import emit_repository

    fields: dict = {}
    if spec_path is not None:
        fields = {"target": str(spec_path)} if spec_path.is_dir() else _read_spec_file(spec_path)
    for k, v in (
        ("target", target),
        ("heads", heads),
        ("heads_format", heads_format),
        ("tree", tree),
        ("dtype", dtype),
    ):
        if v is not None:
            fields[k] = str(v)
    if "target" not in fields:
        raise UsageError("give the model: --spec DIR_OR_FILE or --target DIR")
    auto = fields.get("dtype") == "auto"  # resolved by the server on its own hardware, not here
    spec = load_spec_model(
        fields["target"],
        fields.get("heads"),
        heads_format=fields.get("heads_format"),
        tree=fields.get("tree"),
        dtype=fields.get("dtype") if runtime == "reference" and not auto else None,
        also_draft=also_draft,
    )
    options = {
        "triton_max_batch_size": max_batch_size,
        "speculative": not no_speculative,
        "decoupled_mode": decoupled,
        "trtspec_adaptive": adaptive,
    }
    if max_seq_len is not None:
        if max_seq_len < 1:
            raise UsageError("--max-seq-len must be >= 1")
        options["max_seq_len"] = max_seq_len
    if runtime == "reference":
        options["trtspec_device"] = device
        if draft_len_schedule:
            options["trtspec_draft_len_schedule"] = draft_len_schedule
        if auto:
            options["trtspec_dtype"] = "auto"
    repo = emit_repository(
        spec,
        runtime,
        out_dir,
        engine_dir=engine_dir,
        plugin_library=plugin_library,
        options=options,
        draft_engine_dir=draft_engine_dir,
    )
    click.echo(f"wrote {runtime} Triton repository {repo} ({spec.describe()})")
    click.echo(f"serve it with: trtspec serve {shlex.quote(str(repo))}")


def container_command(
    repo: Path, manifest: dict, http_port: int, grpc_port: int, metrics_port: int, image: str = DEFAULT_CONTAINER
) -> str:
    """The docker command that serves a trtllm repository: the 1.2.1 image runs the repository's
    launch.sh, which starts one tritonserver rank per GPU of the engine under mpirun (plugin library
    preloaded)."""
    repo = Path(repo).resolve()
    parts = [
        "docker",
        "run",
        "--rm",
        "-it",
        "--gpus",
        "all",
        "--shm-size=2g",
        "--ulimit",
        "memlock=-1",
        "--net",
        "host",
        "-e",
        "TRTSPEC_INSIDE=1",
        "-v",
        f"{repo}:/models",
    ]
    for key in ("engine_dir", "draft_engine_dir"):
        engine = manifest.get(key)
        if engine and Path(engine).is_absolute():
            parts += ["-v", f"{engine}:{engine}"]
    if manifest.get("plugin_library"):
        parts += ["-e", f"LD_PRELOAD=/models/{manifest['plugin_library']}"]
    parts += [
        image,
        "bash",
        f"/models/{LAUNCH_SCRIPT}",
        "--http-port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
        "--metrics-port",
        str(metrics_port),
    ]
    return " ".join(shlex.quote(p) for p in parts)


@click.command("serve")
@click.argument("repo", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--http-port", type=int, default=8000, show_default=True, help="0 = any free port.")
@click.option("--grpc-port", type=int, default=8001, show_default=True, help="0 = any free port.")
@click.option("--metrics-port", type=int, default=8002, show_default=True, help="0 = any free port.")
@click.option("--install", is_flag=True, help="Install nvidia-pytriton (the server) first if it is missing.")
@click.option(
    "--log-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Server log (default: a temporary file).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=300.0,
    show_default=True,
    help="Seconds to wait for every model to be ready.",
)
@click.option(
    "--image",
    default=DEFAULT_CONTAINER,
    show_default=True,
    help="trtllm runtime: the NVIDIA container image to print the command for.",
)
def serve_cmd(repo, http_port, grpc_port, metrics_port, install, log_file, timeout_s, image) -> None:
    """Serve a trtspec Triton repository on 127.0.0.1 until Ctrl-C.

    The `reference` runtime runs here, in the real Triton server from the nvidia-pytriton wheel. The
    `trtllm` runtime needs NVIDIA's Triton+TensorRT-LLM container on a GPU: the command is printed.
    """
    from trtspec.triton.emit import read_manifest
    from trtspec.triton.server import TritonServer
    from trtspec.triton.validate import validate_repository

    manifest = read_manifest(repo)
    validate_repository(repo)
    if manifest.get("runtime") == "trtllm":
        click.echo(
            "this repository uses the tensorrtllm backend, which exists only in NVIDIA's GPU containers; "
            "on a machine with a GPU and the engines run:"
        )
        click.echo(container_command(repo, manifest, http_port or 8000, grpc_port or 8001, metrics_port or 8002, image))
        click.echo(
            f"(or run {repo / LAUNCH_SCRIPT} there; it starts {image} itself. The image ships "
            f"TensorRT-LLM 1.2.1, the version of the engines; launch.sh runs one MPI rank per GPU of the "
            f"engine)"
        )
        lib = manifest.get("plugin_library")
        if lib and not (repo / lib).is_file():
            click.echo(
                f"warning: {repo / lib} is missing: copy the plugin library there first (the engines "
                f"need it inside the server process)",
                err=True,
            )
        return

    def _stop(signum, frame):  # SIGINT and SIGTERM both stop the server cleanly
        raise KeyboardInterrupt

    # Installed explicitly, SIGINT included: a shell starts a background job (`trtspec serve repo &` in a
    # script, a CI step) with SIGINT ignored, Python then never raises KeyboardInterrupt, and
    # `kill -INT` would not stop the server this command says Ctrl-C stops.
    old = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    server = TritonServer(
        repo,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        log_path=log_file,
        startup_timeout_s=timeout_s,
        install=install,
    )
    try:
        click.echo(f"starting tritonserver for {repo} (log: {log_file or 'temporary file'}) ...", err=True)
        with server:
            click.echo(f"ready: HTTP http://{server.http_url}  gRPC {server.grpc_url}  metrics {server.metrics_url}")
            verb = "stream" if manifest.get("decoupled", True) else "generate"  # unary only when not decoupled
            click.echo(f'  try: trtspec client {verb} --url {server.http_url} "Hello"')
            click.echo("  Ctrl-C stops the server", err=True)
            while server.is_alive():
                time.sleep(0.5)
            why = server.failure or "tritonserver exited unexpectedly"
            raise UsageError(f"{why}; log {server.log_path}:\n{server.log_tail()}")
    except KeyboardInterrupt:
        click.echo("stopped", err=True)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


COMMANDS = [triton_group, serve_cmd]
