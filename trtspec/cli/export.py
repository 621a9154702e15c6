"""`trtspec export`: write a drafter in a format another runtime loads (vLLM, SGLang, TensorRT-LLM,
speculators, ONNX for TensorRT).

Which formats a kind can be written as is the kind's own declaration (``DrafterKind.export_formats``);
asking for another is one error line that lists the ones there are. The writers live in trtspec/export/.
"""

from __future__ import annotations

from pathlib import Path

import click

from trtspec.cli.options import target_option, tree_option
from trtspec.drafters import registry
from trtspec.export import export_draft
from trtspec.export.registry import EXPORTERS

FORMAT_HELP = "; ".join(f"{e.name}: {e.summary}, read by {e.loaders}" for e in EXPORTERS.values())


@click.command("export")
@target_option
@click.option(
    "--heads",
    "-H",
    required=True,
    type=click.Path(exists=True, path_type=Path),
    help="The drafter to export (any registered kind).",
)
@click.option(
    "--heads-format",
    type=click.Choice(registry.names()),
    default=None,
    help="Drafter kind; detected from the files when omitted.",
)
@click.option("--format", "fmt", required=True, type=click.Choice(list(EXPORTERS)), help=FORMAT_HELP)
@click.option(
    "--out",
    "-o",
    required=True,
    type=click.Path(path_type=Path),
    help="Directory to write (a file for onnx); written to a temporary name and renamed when complete.",
)
@tree_option
@click.option(
    "--dtype",
    type=click.Choice(["float32", "float16", "bfloat16"]),
    default=None,
    help="Weights dtype to write (default: the heads' own; onnx: float32).",
)
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
def export_cmd(target, heads, heads_format, fmt, out, tree, dtype, overwrite):
    """Export a drafter for another runtime; the kind decides which formats exist for it."""
    path = export_draft(heads, target, fmt, out, heads_format=heads_format, tree=tree, dtype=dtype, overwrite=overwrite)
    click.echo(f"wrote {path}")


COMMANDS = [export_cmd]
