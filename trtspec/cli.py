"""The ``trtspec`` command line: one Click group; each package contributes its own commands.

Each ``trtspec.<pkg>.cli`` module exports ``COMMANDS`` (a list of click commands/groups). Errors the user
can fix (CheckpointError and subclasses) print as one ``error:`` line with exit code 2, never a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import click

from trtspec import __version__
from trtspec.checkpoint.errors import CheckpointError

COMMAND_MODULES = (
    "trtspec.runtime.cli",   # generate, demo
    "trtspec.train.cli",     # train-heads, tune-tree
    "trtspec.convert.cli",   # convert, build
    "trtspec.kernels.cli",   # plugins build
    "trtspec.triton.cli",    # triton emit, serve
    "trtspec.client.cli",    # client ...
)


class _Group(click.Group):
    """Turns user-fixable errors into one line and exit code 2."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except CheckpointError as exc:
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
        try:
            if importlib.util.find_spec(name) is None:
                continue
        except ModuleNotFoundError:  # the package itself is not there (yet)
            continue
        module = importlib.import_module(name)
        for cmd in getattr(module, "COMMANDS", []):
            main.add_command(cmd)


_register()

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
