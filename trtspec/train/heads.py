"""What train-heads asks of a kind's training recipe: a fresh module, its horizon, and how to save it.

The modules are the runtime's own (trtspec.models.heads), so their parameter names are the canonical
tensor names; each kind's recipe (its module under trtspec/drafters/) writes its own published format.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from trtspec.drafters import registry
from trtspec.drafters.base import TrainingRecipe
from trtspec.drafters.proposers import module_state
from trtspec.drafters.weights import train_init
from trtspec.errors import UsageError
from trtspec.spec import DrafterSpec, TargetSpec


def recipe(kind: str) -> TrainingRecipe:
    """The kind's training recipe, or a usage error naming the kinds train-heads can train."""
    record = registry.get(kind)
    if record.training is None:
        raise UsageError(f"train-heads cannot train {kind!r}; choose one of {', '.join(registry.trainable())}")
    return record.training


def check_draft_layers(kind: str, draft_layers: int | None) -> None:
    """Refuse ``--draft-layers`` for a kind of fixed depth, naming the kinds that take it."""
    if draft_layers is not None and not recipe(kind).draft_layers:
        deep = [n for n in registry.trainable() if registry.get(n).training.draft_layers]
        raise UsageError(f"--draft-layers: {kind} has a fixed depth; only {', '.join(deep)} take a layer count")


def make_module(
    kind: str,
    target: TargetSpec,
    num_heads: int = 3,
    rmsnorm: bool = True,
    seed: int = 0,
    draft_layers: int | None = None,
) -> nn.Module:
    """A freshly initialised module. Heads-style kinds start as the identity (ResBlock weights 0), so
    before training every head proposes the target's own next token; recurrent kinds get a small normal
    init (std 0.02, norms 1), as Llama layers do. ``draft_layers``: decoder layers of a kind whose
    recipe has a ``draft_layers`` default (None: that default)."""
    r = recipe(kind)
    check_draft_layers(kind, draft_layers)
    extra = {"num_layers": draft_layers} if draft_layers is not None else {}
    module = r.new_module(target, num_heads=num_heads, rmsnorm=rmsnorm, **extra)
    return train_init(module, seed, identity=r.style == "heads")


def horizon(kind: str, num_heads: int, unroll: int) -> int:
    """How many tokens past the target's own next token the kind is trained to predict."""
    return num_heads if recipe(kind).style in ("heads", "block") else unroll


def save_heads(
    kind: str, module: nn.Module, target: TargetSpec, out: str | Path, info: dict | None = None, rmsnorm: bool = True
) -> Path:
    """Write trained heads in ``kind``'s published format, in the target's dtype."""
    return recipe(kind).save(module, target, out, info if info is not None else {}, rmsnorm=rmsnorm)


def warm_start(module: nn.Module, init: DrafterSpec) -> None:
    """Fill a fresh ``module`` with trained heads' weights, so a finished run can go on for more steps
    under a new learning-rate schedule (``--resume`` replays one run's schedule and refuses another step
    count). The heads must be the same kind and shape as the module this run would train: anything else
    is a usage error naming the heads, never a half-loaded module."""
    where = f"--init-from {init.path}"
    block = getattr(module, "block_size", None)
    if block is not None and int(init.config.get("block_size", block)) != block:
        raise UsageError(
            f"{where}: block_size {init.config['block_size']} but this run trains a block of {block}; "
            "pass the --num-heads those heads were trained with"
        )
    own = module.state_dict()  # views of the module's tensors (non-persistent buffers such as inv_freq left out)
    state = module_state(init)
    unexpected = sorted(n for n in state if n not in own)
    missing = sorted(n for n in own if n not in state)
    shapes = sorted(n for n in state if n in own and tuple(state[n].shape) != tuple(own[n].shape))
    if unexpected or missing or shapes:
        detail = "; ".join(
            f"{what} {names[:3]}"
            for what, names in (("unexpected", unexpected), ("missing", missing), ("other shape", shapes))
            if names
        )
        raise UsageError(
            f"{where}: not the {init.kind} module this run trains ({detail}); check --num-heads/--kind/--draft-layers"
        )
    with torch.no_grad():
        for name, tensor in state.items():
            if name.endswith("d2t") and not torch.equal(own[name].to(tensor.dtype), tensor):
                raise UsageError(
                    f"{where}: the heads draft over another vocabulary than this cache picks; "
                    "train on the data and --draft-vocab they were trained with"
                )
            own[name].copy_(tensor)
