"""`trtspec client generate | stream | bench`: talk to a running Triton server."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from trtspec.client.common import GenerateParams
from trtspec.errors import UsageError


def _params(max_tokens, temperature, top_k, top_p, seed) -> GenerateParams:
    return GenerateParams(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)


def _client(protocol: str, url: str | None, model: str):
    from trtspec.client.bench import make_client

    url = url or ("127.0.0.1:8001" if protocol == "grpc" else "127.0.0.1:8000")
    return make_client(protocol, url, model)


def _close(client) -> None:
    if hasattr(client, "close"):
        client.close()


def _common(f):
    f = click.option("--seed", type=int, default=None, help="Sampling seed.")(f)
    f = click.option("--top-p", type=float, default=None, help="Nucleus sampling threshold.")(f)
    f = click.option("--top-k", type=int, default=None, help="Top-k sampling (1 = greedy).")(f)
    f = click.option("--temperature", type=float, default=None, help="0 or unset = greedy.")(f)
    f = click.option("--max-tokens", type=int, default=64, show_default=True, help="New tokens at most.")(f)
    f = click.option(
        "--model",
        default="ensemble",
        show_default=True,
        help="ensemble, or tensorrt_llm_bls (streams text decoded over all tokens so far).",
    )(f)
    f = click.option("--url", default=None, help="host:port (default 127.0.0.1:8000 http, :8001 grpc).")(f)
    f = click.option("--protocol", type=click.Choice(["http", "grpc"]), default="http", show_default=True)(f)
    return f


def _print_metrics(result, client) -> None:
    m = result.metrics
    if not m:
        return
    mal = result.mean_acceptance_length()
    parts = [f"{result.num_output_tokens} tokens in {result.latency_s:.2f} s", f"TTFT {1e3 * result.ttft_s:.0f} ms"]
    if "acceptance_rate" in m:
        parts.append(
            f"acceptance rate {m['acceptance_rate']:.3f} "
            f"({m.get('total_accepted_draft_tokens', 0)}/{m.get('total_draft_tokens', 0)} drafts)"
        )
    if mal is not None:
        parts.append(f"mean acceptance length {mal:.2f}")
    hist = m.get("trtspec_acceptance_histogram")
    if isinstance(hist, list) and len(hist) > 1:
        from trtspec.client.common import per_position_acceptance

        pos = " ".join(f"{a:.2f}" for a in per_position_acceptance(hist))
        parts.append(f"{m.get('trtspec_target_steps', sum(hist))} steps, per-position acceptance {pos}")
    click.echo("[" + ", ".join(parts) + "]", err=True)


@click.group("client")
def client_group() -> None:
    """Clients for a running trtspec / TensorRT-LLM Triton server (HTTP generate, gRPC streaming)."""


@client_group.command("generate")
@click.argument("text")
@_common
def generate_cmd(text, protocol, url, model, max_tokens, temperature, top_k, top_p, seed) -> None:
    """Send TEXT, print the whole generated text, then the acceptance metrics (on stderr)."""
    c = _client(protocol, url, model)
    try:
        r = c.generate(text, _params(max_tokens, temperature, top_k, top_p, seed))
        click.echo(r.text)
        _print_metrics(r, c)
    finally:
        _close(c)


@client_group.command("stream")
@click.argument("text")
@_common
def stream_cmd(text, protocol, url, model, max_tokens, temperature, top_k, top_p, seed) -> None:
    """Send TEXT and print the text as it streams in (one piece per target step), metrics at the end."""
    c = _client(protocol, url, model)

    def show(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    try:
        r = c.generate_stream(text, _params(max_tokens, temperature, top_k, top_p, seed), on_piece=show)
        click.echo()
        _print_metrics(r, c)
    finally:
        _close(c)


@client_group.command("bench")
@_common
@click.option(
    "--concurrency",
    "-c",
    type=int,
    multiple=True,
    default=(1,),
    show_default=True,
    help="Concurrent streams; repeat for several runs (-c 1 -c 8).",
)
@click.option(
    "--requests", "-n", "num_requests", type=int, default=16, show_default=True, help="Requests per concurrency level."
)
@click.option(
    "--prompts",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Text file, one prompt per line (default: a few built-in prompts).",
)
@click.option("--warmup", type=int, default=1, show_default=True)
@click.option(
    "--json-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the summaries as JSON.",
)
@click.option(
    "--sweep",
    is_flag=True,
    help="Concurrency 1, 2, 4, 8, 16, 32 (instead of -c); each level sends at least 2 requests per stream.",
)
@click.option(
    "--plain-url",
    default=None,
    help="A second server with the same model decoding plainly (triton emit --no-speculative): each "
    "concurrency runs against --url (speculative) and then this one, and prints the tokens/s ratio.",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write a PNG: tokens/s, TTFT p50 and ITL p50 against concurrency, one line per server.",
)
def bench_cmd(
    protocol,
    url,
    model,
    max_tokens,
    temperature,
    top_k,
    top_p,
    seed,
    concurrency,
    num_requests,
    prompts,
    warmup,
    json_out,
    sweep,
    plain_url,
    plot,
) -> None:
    """Closed-loop load: requests/s, TTFT and ITL p50/p99, mean acceptance length per concurrency."""
    from trtspec.client.bench import format_summary, run_bench

    if sweep:
        from trtspec.client.sweep import SWEEP

        concurrency = SWEEP
    if any(c < 1 for c in concurrency) or num_requests < 1:
        raise UsageError("--concurrency and --requests must be >= 1")
    texts = None
    if prompts is not None:
        texts = [ln.strip() for ln in prompts.read_text().splitlines() if ln.strip()]
        if not texts:
            raise UsageError("no prompts in the file", fix="one prompt per line")
    url = url or ("127.0.0.1:8001" if protocol == "grpc" else "127.0.0.1:8000")
    if plain_url or sweep or plot:
        from trtspec.client.sweep import run_sweep

        targets = {"speculative": url, "plain": plain_url} if plain_url else {"": url}
        params = _params(max_tokens, temperature, top_k, top_p, seed)
        rows = run_sweep(targets, protocol, model, texts, tuple(concurrency), num_requests, params, warmup, click.echo)
        if json_out:
            json_out.write_text(json.dumps(rows, indent=2))
        if plot:
            from trtspec.client.plot import write_sweep_plot

            click.echo(f"plot: {write_sweep_plot(plot, rows)}")
        return
    summaries = []
    for i, c in enumerate(concurrency):
        res = run_bench(
            url,
            protocol,
            model,
            texts,
            num_requests,
            c,
            _params(max_tokens, temperature, top_k, top_p, seed),
            warmup if i == 0 else 0,
        )
        s = res.summary()
        summaries.append(s)
        click.echo(format_summary(s))
        for e in res.errors[:3]:
            click.echo(f"  error: {e}", err=True)
    if json_out:
        json_out.write_text(json.dumps(summaries, indent=2))


COMMANDS = [client_group]
