"""The ``trtspec`` command line: one Click group; one module per command family in this package.

Each module in ``COMMAND_MODULES`` exports ``COMMANDS`` (a list of click commands/groups); shared option
groups live in ``trtspec.cli.options``. A module that fails to import is a bug and fails loudly. Errors the user
can fix (TrtspecError: CheckpointError, UsageError) print as one ``error:`` line with exit code 2, never a traceback.
"""

from __future__ import annotations

import importlib

import click

from trtspec import __version__
from trtspec.errors import TrtspecError

COMMAND_MODULES = (
    "trtspec.cli.generate",  # generate, demo, make-draft
    "trtspec.cli.train",  # train-heads, tune-tree
    "trtspec.cli.convert",  # convert, build
    "trtspec.cli.plugins",  # plugins build, plugins export-onnx
    "trtspec.cli.triton",  # triton emit, serve
    "trtspec.cli.client",  # client stream, client bench
    "trtspec.cli.export",  # export
)


class _Group(click.Group):
    """Turns user-fixable errors into one line and exit code 2."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except TrtspecError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(2)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="trtspec")
def main() -> None:
    """trtspec: speculative decoding from Hugging Face checkpoints to TensorRT-LLM engines and Triton.

    Typical flow: `trtspec generate` to check a target + heads with the PyTorch reference runtime,
    `trtspec train-heads` / `tune-tree` to get heads and a tree, `trtspec build` to produce the
    TensorRT-LLM checkpoint, engines (on a GPU machine) and a Triton model repository, then
    `trtspec serve` and `trtspec client`.
    """


def _register() -> None:
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)  # an ImportError here is a packaging bug: never skip it
        for cmd in module.COMMANDS:
            main.add_command(cmd)


_register()
