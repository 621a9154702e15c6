"""What a drafter kind is: one frozen record per kind, and the runtime ``Drafter`` protocol.

A kind's module (``trtspec/drafters/<kind>.py``) fills one ``DrafterKind`` with everything the rest of
trtspec needs to know about that kind: how to recognise its files, load and save them, build the runtime
drafter, train it, and how it deploys (TensorRT-LLM engine layout, Triton decoding mode, export formats).
The CLI, loaders, trainer, demo, converter and emitter ask these records; none of them spells a kind's
name. A model-free drafter is a kind too, with no files to load.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:  # only for annotations: the records are data, the callables do the imports they need
    from torch import nn

    from trtspec.models.llama import LlamaModel
    from trtspec.spec import DrafterSpec, TargetSpec
    from trtspec.tree import TreeBuffers


class Drafter(Protocol):
    """What the oracle loop asks of every drafter (model heads, a draft model, or model-free).

    ``reset`` before a batch; ``observe`` what the target just committed (its hidden states at the kept
    positions, the aux layers' states if the kind asked for them, the tokens fed and the tokens that
    follow them); ``propose`` a tree of token ids [B, tree.size] (column 0 = the root) from that state.

    In-flight batching (runtime.inflight) resets once for every slot, ``forget``s the slots a new request
    takes, and passes ``rows`` (the slots the B sequences live in) to ``observe`` and ``propose``; None
    means rows 0..B-1, the oracle loop's batch.
    """

    aux_layers: tuple[int, ...]
    #: deepest tree the drafter can fill (None = any depth: it drafts autoregressively)
    max_depth: int | None

    def reset(self, batch: int, capacity: int) -> None: ...

    def forget(self, rows: list[int]) -> None: ...

    def observe(
        self,
        hidden: list[torch.Tensor],
        aux: list[torch.Tensor] | None,
        tokens_in: list[torch.Tensor],
        tokens_next: list[torch.Tensor],
        rows: list[int] | None = None,
    ) -> None: ...

    def propose(self, tree: TreeBuffers, root: torch.Tensor, rows: list[int] | None = None) -> torch.Tensor: ...

    def pack(self, target_projection: nn.Module) -> None: ...

    def tune_small_rows(self, target_projection: nn.Module, dtype: torch.dtype, device: str) -> None:
        """Unpacked CPU inference: run the drafter's matmuls as measured fastest here (models.small_rows)."""
        ...

    def drafted(self) -> torch.Tensor | None:
        """[B, tree.size] bool: the nodes of the last proposal the drafter stands behind (None = every
        node). A model-free drafter has nothing to say where its text does not match; the loop then
        verifies only the nodes some sequence drafted, down to a plain step when none did."""
        ...


@dataclass(frozen=True)
class DirFacts:
    """What detection may look at in a heads path, read once: no kind re-reads the files."""

    path: Path
    directory: Path
    trtspec_meta: dict[str, Any] | None  # trtspec_heads.json, if present
    config: dict[str, Any]  # config.json, or {}
    tensor_names: tuple[str, ...]  # names in the first weight file (safetensors header only)
    files: tuple[str, ...]  # file names in the directory


@dataclass(frozen=True)
class EngineRoute:
    """How a kind reaches a TensorRT-LLM 1.2.1 engine.

    ``layout`` names the TensorRT-LLM checkpoint layout convert/ writes (a TensorRT-LLM architecture, not a
    trtspec kind); ``mode`` is trtllm-build's ``--speculative_decoding_mode``; ``triton_decoding_mode`` the
    tensorrt_llm model's ``decoding_mode`` parameter; ``draft_len`` whether ``max_draft_len`` counts the
    tree's nodes or its depth (a chain drafter). ``refusal`` says why there is no engine, if there is none.
    """

    layout: str | None = None
    mode: str | None = None
    triton_decoding_mode: str | None = None
    draft_len: str = "nodes"  # "nodes" | "depth"
    refusal: str | None = None

    @property
    def supported(self) -> bool:
        return self.layout is not None


@dataclass(frozen=True)
class PyTorchRoute:
    """How a kind deploys on TensorRT-LLM's PyTorch backend (LLM API / trtllm-serve ``speculative_config``).

    ``decoding_type`` is the discriminator of the backend's speculative config union; ``draft_format`` the
    public layout its draft loader reads (the heads are copied when they are already in it, exported
    otherwise; None = the target itself drafts, no draft directory). ``refusal`` says why there is no route.
    """

    decoding_type: str | None = None
    draft_format: str | None = None
    refusal: str | None = None

    @property
    def supported(self) -> bool:
        return self.decoding_type is not None


@dataclass(frozen=True)
class TrainingRecipe:
    """How train-heads trains a kind by self-distillation on the target's own outputs.

    ``style`` "heads": K heads read the target's last hidden state, head k predicts k+1 tokens past the
    target's own next one. "recurrent": one module applied autoregressively on (feature, next token)
    pairs, unrolled on its own outputs. "block": a block drafter (the module has ``block_size``,
    ``mask_token_id`` and ``aux_layers``) fills B-1 positions after random anchors at once, conditioned on
    the target's aux-layer states (trtspec/train/block.py). ``feature_regression``: also regress the target's next hidden
    state (EAGLE). ``new_module(target, num_heads, rmsnorm)`` builds an untrained module whose parameter
    names are the canonical tensor names; ``save(module, target, out, info, rmsnorm)`` writes it in the
    kind's published layout.

    Kinds whose first step reads several target layers, or that project onto their own vocabulary, add:
    ``aux_layers(target)``: the target layers whose *input* residual stream the self-distillation cache
    stores; step 0's feature is their concatenation, in that order (as ``Drafter.aux_layers`` at runtime).
    A block drafter's are its context layers. They are recorded while the cache is written; a cache
    written without them gets them from a second pass (``train.aux_cache.layer_states``).
    ``prepare(module, target, cache, size)``: called once on the fresh module before training; picks the
    module's own output vocabulary from the cache (``size`` tokens, 0 = the kind's default) and returns
    the label map [target vocab] -> the module's output id (-1 = not in its vocabulary): the loss is then
    a softmax over the module's own logits, and the module's projection is trained.
    """

    style: str  # "heads" | "recurrent" | "block"
    new_module: Callable[..., nn.Module]
    save: Callable[..., Path]
    feature_regression: bool = False
    uses_rmsnorm_switch: bool = False  # --rmsnorm/--no-rmsnorm means something for this kind
    uses_num_heads: bool = False  # --num-heads means something for this kind
    # the default depth of a kind whose depth --draft-layers sets (new_module takes num_layers=); 0: fixed
    draft_layers: int = 0
    aux_layers: Callable[[TargetSpec], tuple[int, ...]] | None = None
    prepare: Callable[..., torch.Tensor] | None = None


@dataclass(frozen=True)
class DrafterKind:
    """Everything about one drafter kind (see the module docstring)."""

    name: str
    summary: str
    #: does this heads path hold this kind? Asked in registry order; the first yes wins.
    detect: Callable[[DirFacts], bool]
    #: read and validate the files into a DrafterSpec with canonical tensor names
    load: Callable[[Path, TargetSpec, bool], DrafterSpec]
    #: the runtime drafter (shares the target's embedding / lm_head)
    build: Callable[[DrafterSpec, LlamaModel, torch.dtype], Drafter]
    #: write a small instance of this kind for the target (random or truncated weights), for the demo and tests
    make_demo: Callable[[TargetSpec, Path, int], Path]
    engine: EngineRoute = field(default_factory=EngineRoute)
    #: how it deploys on TensorRT-LLM's PyTorch backend (``trtspec build --backend pytorch``)
    pytorch: PyTorchRoute = field(default_factory=PyTorchRoute)
    training: TrainingRecipe | None = None
    #: public layouts ``load`` reads and ``make_demo``/``training.save`` write
    formats: tuple[str, ...] = ()
    #: what ``trtspec export --format`` can write for this kind (an exporter per format lives in cli/export.py)
    export_formats: tuple[str, ...] = ()
    #: the drafter's weights live inside the target checkpoint: a target that holds them drafts with them
    #: when no --heads is given (the heads path is then the target directory)
    inside_target: bool = False
    #: the kind brings its own draft vocabulary (EAGLE-3's d2t): refuse draft_vocab.safetensors
    own_draft_vocab: bool = False
    #: the deepest static tree the loaded drafter can fill (None = any depth)
    max_tree_depth: Callable[[DrafterSpec], int | None] = lambda spec: None
    #: model-free kinds only: a ``--heads`` address that selects the kind without files ("name" or
    #: "name:argument"). Returns the DrafterSpec, None when the text names another kind, or raises a
    #: UsageError/CheckpointError for this kind's name with a bad argument.
    address: Callable[[str, TargetSpec], DrafterSpec | None] | None = None
    #: what other serving runtimes call this drafter, for their exporters: {runtime: speculative config}
    #: (e.g. the TensorRT-LLM PyTorch backend's decoding_type and fields) given the spec and draft length
    serving_configs: Callable[[DrafterSpec, int], dict[str, dict[str, Any]]] | None = None

    @property
    def model_free(self) -> bool:
        """No weights: the kind drafts from text (selected by an address, its settings directory optional)."""
        return self.address is not None
