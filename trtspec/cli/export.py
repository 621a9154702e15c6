"""`trtspec export`: write a drafter in a format another runtime loads (today: ONNX for TensorRT).

Which formats a kind can be written as is the kind's own declaration (``DrafterKind.export_formats``);
asking for another is one error line that lists the ones there are.
"""

from __future__ import annotations

from pathlib import Path

import click

from trtspec.cli.options import target_option, tree_option
from trtspec.drafters import registry
from trtspec.errors import UsageError

FORMATS = ("onnx",)


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
@click.option(
    "--format",
    "fmt",
    required=True,
    type=click.Choice(FORMATS),
    help="onnx: the heads and the verify step as an ONNX graph whose fused nodes are trtspec's TensorRT "
    "plugins (trtexec --onnx=OUT --dynamicPlugins=libtrtspec_plugins.so).",
)
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False, path_type=Path), help="File to write.")
@tree_option
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), default="float32", show_default=True)
def export_cmd(target, heads, heads_format, fmt, out, tree, dtype):
    """Export a drafter for another runtime; the kind decides which formats exist for it."""
    kind = registry.get(heads_format or registry.detect(heads))
    if fmt not in kind.export_formats:
        have = ", ".join(kind.export_formats) or "none yet"
        raise UsageError(f"{kind.name} heads cannot be exported as {fmt}; formats for {kind.name}: {have}")
    from trtspec.kernels.onnx_export import export_heads_onnx

    path = export_heads_onnx(heads, target, out, tree=tree, dtype=dtype)
    click.echo(f"wrote {path}")


COMMANDS = [export_cmd]
