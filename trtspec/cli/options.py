"""Option groups every command shares, so each option has one name, one help text and one default.

``--target``/``-t``, the heads group, ``--tree``, ``--dtype``, the parallelism group and ``--max-tokens``
(the name TensorRT-LLM, Triton and vLLM clients use; ``--max-new-tokens`` stays as a hidden alias).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from trtspec.drafters import registry

TREE_HELP = (
    "Static draft tree as choices, e.g. '[[0],[0,0],[1]]' (Medusa/EAGLE notation), "
    "TensorRT-LLM's '{0}, {0, 0}, {1}', or 'chain:N'. Default: the heads' tuned tree if recorded, "
    "else a 24-node depth-6 tree."
)
DRAFT_VOCAB_HELP = (
    "Draft over the N most frequent tokens of the heads' draft_vocab.safetensors (0 = the full "
    "vocabulary). Default: the whole file when the heads carry one."
)


class AliasedOption(click.Option):
    """An option that also accepts older names without listing them in --help (renamed options keep
    working in users' scripts)."""

    def __init__(self, *args, hidden_aliases: tuple[str, ...] = (), **kwargs):
        decls = list(args[0]) + list(hidden_aliases)
        super().__init__(decls, *args[1:], **kwargs)
        self.hidden_aliases = tuple(hidden_aliases)

    def get_help_record(self, ctx: click.Context):
        shown, self.opts = self.opts, [o for o in self.opts if o not in self.hidden_aliases]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = shown


def _apply(f: Callable, opts: list) -> Callable:
    for opt in reversed(opts):
        f = opt(f)
    return f


def target_option(f: Callable) -> Callable:
    return click.option(
        "--target",
        "-t",
        required=True,
        type=click.Path(path_type=Path),
        help="Hugging Face target model directory (config.json + *.safetensors).",
    )(f)


def heads_options(f: Callable) -> Callable:
    """--heads, --heads-format (every registered kind), --allow-pickle."""
    return _apply(
        f,
        [
            click.option(
                "--heads",
                "-H",
                type=click.Path(path_type=Path),
                default=None,
                help="Drafter: heads of any registered kind, or a draft model directory "
                f"({', '.join(registry.names())}); a model-free kind by name, no files "
                f"({', '.join(registry.model_free())}; NAME:ARG, e.g. a corpus file). Omit for the target alone.",
            ),
            click.option(
                "--heads-format",
                type=click.Choice(registry.names()),
                default=None,
                help="Drafter kind; detected from the files when omitted.",
            ),
            click.option(
                "--allow-pickle",
                is_flag=True,
                help="Allow .bin/.pt weights (loaded with torch.load(weights_only=True)).",
            ),
        ],
    )


def also_draft_option(f: Callable) -> Callable:
    return click.option(
        "--also-draft",
        default=None,
        metavar="MODEL_FREE",
        help=f"A model-free drafter ({', '.join(registry.model_free())}, or NAME:ARG) beside --heads: per step "
        "and sequence the proposal expected to get more tokens accepted is drafted, and with --adaptive the "
        "heads are switched off while they do not pay for themselves.",
    )(f)


def tree_option(f: Callable) -> Callable:
    return click.option("--tree", default=None, help=TREE_HELP)(f)


def draft_vocab_option(f: Callable) -> Callable:
    return click.option("--draft-vocab", default=None, type=click.IntRange(0), help=DRAFT_VOCAB_HELP)(f)


def dtype_option(
    help: str, choices: tuple[str, ...] = ("float32", "float16", "bfloat16"), default: str | None = None
) -> Callable[[Callable], Callable]:
    return click.option(
        "--dtype", type=click.Choice(list(choices)), default=default, show_default=default is not None, help=help
    )


def parallel_options(f: Callable) -> Callable:
    """--tp-size / --pp-size (TensorRT-LLM's names)."""
    return _apply(
        f,
        [
            click.option("--tp-size", type=click.IntRange(1), default=None, help="Tensor parallel size (default 1)."),
            click.option(
                "--pp-size",
                type=click.IntRange(1),
                default=None,
                help="Pipeline parallel size (default 1; not every drafter's engine layout allows it).",
            ),
        ],
    )


def max_tokens_option(default: int) -> Callable[[Callable], Callable]:
    return click.option(
        "--max-tokens",
        "-n",
        "max_tokens",
        cls=AliasedOption,
        hidden_aliases=("--max-new-tokens",),
        default=default,
        show_default=True,
        type=click.IntRange(1),
        help="Tokens to generate per prompt.",
    )


def model_options(
    dtype_help: str,
    dtype_choices: tuple[str, ...] = ("float32", "float16", "bfloat16"),
    dtype_default: str | None = None,
) -> Callable[[Callable], Callable]:
    """Target + heads + tree + dtype: what every command that loads a SpecModel takes."""

    def wrap(f: Callable) -> Callable:
        return _apply(
            f, [target_option, heads_options, tree_option, dtype_option(dtype_help, dtype_choices, dtype_default)]
        )

    return wrap
