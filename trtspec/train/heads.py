"""What train-heads asks of a kind's training recipe: a fresh module, its horizon, and how to save it.

The modules are the runtime's own (trtspec.models.heads), so their parameter names are the canonical
tensor names; each kind's recipe (its module under trtspec/drafters/) writes its own published format.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from trtspec.drafters import registry
from trtspec.drafters.base import TrainingRecipe
from trtspec.drafters.weights import train_init
from trtspec.errors import UsageError
from trtspec.spec import TargetSpec


def recipe(kind: str) -> TrainingRecipe:
    """The kind's training recipe, or a usage error naming the kinds train-heads can train."""
    record = registry.get(kind)
    if record.training is None:
        raise UsageError(f"train-heads cannot train {kind!r}; choose one of {', '.join(registry.trainable())}")
    return record.training


def make_module(kind: str, target: TargetSpec, num_heads: int = 3, rmsnorm: bool = True, seed: int = 0) -> nn.Module:
    """A freshly initialised module. Heads-style kinds start as the identity (ResBlock weights 0), so
    before training every head proposes the target's own next token; recurrent kinds get a small normal
    init (std 0.02, norms 1), as Llama layers do."""
    r = recipe(kind)
    return train_init(r.new_module(target, num_heads=num_heads, rmsnorm=rmsnorm), seed, identity=r.style == "heads")


def horizon(kind: str, num_heads: int, unroll: int) -> int:
    """How many tokens past the target's own next token the kind is trained to predict."""
    return num_heads if recipe(kind).style in ("heads", "block") else unroll


def save_heads(
    kind: str, module: nn.Module, target: TargetSpec, out: str | Path, info: dict | None = None, rmsnorm: bool = True
) -> Path:
    """Write trained heads in ``kind``'s published format, in the target's dtype."""
    return recipe(kind).save(module, target, out, info if info is not None else {}, rmsnorm=rmsnorm)
