"""eagle3: EAGLE-3 heads, fused low/mid/high target features and an own draft vocabulary (d2t).

Layout (SafeAILab / the Llama-draft layout vLLM and SGLang load): ``config.json``
(``LlamaForCausalLMEagle3``, ``draft_vocab_size``) + weights with ``fc.weight`` [H, 3H_t], ``midlayer.*``
(hidden_norm, input_layernorm, 2H-input attention), ``norm.weight``, ``lm_head.weight`` [V_d, H], ``d2t``
[V_d] (draft id + d2t = target id), ``t2d`` [V] (training only). Canonical: ``fc``, ``layer.*``, ``norm``,
``lm_head``, ``d2t``. Also read: the speculators format (``speculators_model_type: eagle3``), whose layer
config sits in ``transformer_layer_config`` and whose layer tensors are ``layers.0.*``.

Training (train-heads, the recurrent recipe): step 0 reads fc(cat[low, mid, high]) of the cached target
layer inputs, later steps feed the layer's own output back (the training-time test, ``--unroll`` steps).
The loss is a softmax over the draft vocabulary only, towards the target's choice where the draft
vocabulary holds it; there is no feature regression (EAGLE-3 drops it). The draft vocabulary is the
``--draft-vocab`` tokens the target chooses most often on the data, sorted by id (d2t[i] = used[i] - i,
as SafeAILab's trainer); its lm_head rows and final norm start as the target's own (why: at a small
budget the draft then starts from the target's vocabulary projection, as EAGLE-1 heads, which share it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from trtspec.checkpoint.heads.common import expect_shape, open_weights, single_dtype
from trtspec.checkpoint.target import read_json
from trtspec.drafters.base import DirFacts, DrafterKind, EngineRoute, PyTorchRoute, TrainingRecipe
from trtspec.drafters.eagle_layout import WEIGHT_FILES, eagle_config, layer_shapes, read_arch, save_layout
from trtspec.drafters.proposers import build_pair_drafter
from trtspec.drafters.weights import demo_init, module_state
from trtspec.errors import CheckpointError
from trtspec.models.heads import Eagle3Head, layer_arch
from trtspec.spec import DrafterSpec, TargetSpec

NAME = "eagle3"
DEMO_DRAFT_VOCAB = 64
#: the draft vocabulary train-heads picks when --draft-vocab is 0 (the size of SafeAILab's and SpecForge's
#: Llama-3 releases), capped at the target's vocabulary
DEFAULT_DRAFT_VOCAB = 32000


def detect(facts: DirFacts) -> bool:
    archs = " ".join(facts.config.get("architectures") or [])
    return (
        "Eagle3" in archs
        or "draft_vocab_size" in facts.config
        or any(k.startswith("midlayer.") for k in facts.tensor_names)
    )


def default_aux_layers(num_target_layers: int) -> tuple[int, int, int]:
    """(2, L//2, L-3), the layers SafeAILab and vLLM capture (input-of-layer indexing). Below 7 target
    layers (tiny test models) those repeat a layer, which exporters must refuse (vLLM and TensorRT-LLM
    capture each layer once): (1, L//2, L-1) instead (not 0: TensorRT-LLM captures layer outputs, and the
    input of layer 0 is no layer's output), clamped into 0..L-1."""
    L = num_target_layers
    ids = (2, L // 2, L - 3) if L >= 7 else (1, L // 2, L - 1)
    return tuple(min(max(i, 0), L - 1) for i in ids)  # type: ignore[return-value]


def aux_layers(cfg: dict, num_target_layers: int) -> tuple[int, int, int]:
    """Target layers whose *input* residual stream feeds fc: the config's, else ``default_aux_layers``."""
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or cfg.get(
        "eagle_aux_hidden_state_layer_ids"
    )
    if ids:
        if len(ids) != 3:
            raise CheckpointError(f"eagle_aux_hidden_state_layer_ids must list 3 layers, got {ids}")
        return tuple(int(i) for i in ids)  # type: ignore[return-value]
    return default_aux_layers(num_target_layers)


SPECULATORS_LAYER = "transformer_layer_config"
#: speculators config switches for computations trtspec's Eagle3Head does not have (vLLM's reader
#: defaults norm_before_residual to true when the key is absent)
_SPECULATORS_SWITCHES = {"norm_before_residual": True, "norm_before_fc": False, "fc_norm": False, "norm_output": False}


def layout(path: Path) -> tuple[str | None, str]:
    """(config section holding the layer config, tensor prefix of the layer): the Llama-draft layout keeps
    both at the top / under ``midlayer.``; the speculators format under ``transformer_layer_config`` /
    ``layers.0.``."""
    cfg_path = path / "config.json" if path.is_dir() else path.parent / "config.json"
    cfg = read_json(cfg_path) if cfg_path.is_file() else {}
    if "speculators_model_type" not in cfg:
        return None, "midlayer."
    if cfg["speculators_model_type"] != NAME:
        raise CheckpointError(f"speculators_model_type is {cfg['speculators_model_type']!r}, not {NAME!r}", cfg_path)
    for key, default in _SPECULATORS_SWITCHES.items():
        if cfg.get(key, default):
            raise CheckpointError(f"speculators {key}=true is not supported", cfg_path, "export with it false")
    return SPECULATORS_LAYER, "layers.0."


def load(path: Path, target: TargetSpec, allow_pickle: bool = False) -> DrafterSpec:
    section, prefix = layout(path)
    arch, cfg = read_arch(path, target, section)
    store = open_weights(path, WEIGHT_FILES, allow_pickle)
    H, Ht = arch.hidden_size, target.arch.hidden_size
    if "lm_head.weight" not in store:
        raise CheckpointError("EAGLE-3 heads have no lm_head.weight", path, "export the draft lm_head with the heads")
    Vd = int(cfg.get("draft_vocab_size") or store.shape("lm_head.weight")[0])
    expect_shape(store, "fc.weight", (H, 3 * Ht), path, "EAGLE-3 fc (low, mid, high target features)")
    expect_shape(store, "lm_head.weight", (Vd, H), path, "EAGLE-3 draft lm_head")
    if H != Ht and "embed_tokens.weight" not in store:
        raise CheckpointError(
            f"draft hidden {H} != target hidden {Ht} and no embed_tokens.weight",
            path,
            "export the draft embedding with the heads",
        )
    mapping = {"fc.weight": "fc.weight", "lm_head.weight": "lm_head.weight", "norm.weight": "norm.weight"}
    expect_shape(store, "norm.weight", (H,), path, "EAGLE-3 final norm")
    for part, shape in {
        **layer_shapes(arch, 2 * H),
        "hidden_norm.weight": (H,),
        "input_layernorm.weight": (H,),
    }.items():
        expect_shape(store, f"{prefix}{part}", shape, path, "the EAGLE-3 midlayer")
        mapping[f"layer.{part}"] = f"{prefix}{part}"
    if Vd != target.arch.vocab_size and "d2t" not in store:
        raise CheckpointError(
            f"draft vocab {Vd} != target vocab {target.arch.vocab_size} and no d2t map",
            path,
            "export d2t with the heads",
        )
    if "d2t" in store:
        expect_shape(store, "d2t", (Vd,), path, "the draft-to-target vocab map")
        mapping["d2t"] = "d2t"
    if "embed_tokens.weight" in store:
        mapping["embed_tokens.weight"] = "embed_tokens.weight"
    config = {
        "num_heads": 1,
        "hidden_size": H,
        "target_hidden_size": Ht,
        "draft_vocab_size": Vd,
        "vocab_size": target.arch.vocab_size,
        "aux_layers": list(aux_layers(cfg, target.arch.num_hidden_layers)),
        "rms_norm_eps": arch.rms_norm_eps,
    }
    renamed = store.renamed(mapping)
    return DrafterSpec(NAME, path, renamed, config, arch=arch, dtype=single_dtype(renamed, path))


def build(spec: DrafterSpec, target, dtype: torch.dtype):
    cfg = spec.config
    module = Eagle3Head(spec.arch, int(cfg["target_hidden_size"]), int(cfg["draft_vocab_size"]))
    return build_pair_drafter(
        spec, target, dtype, module, aux_layers=tuple(cfg.get("aux_layers", ())), id_map=lambda m: m.to_target_ids
    )


# Training -----------------------------------------------------------------------------------------------


def new_module(target: TargetSpec, num_heads: int = 1, rmsnorm: bool = True) -> Eagle3Head:
    """An untrained head over the full vocabulary; ``prepare`` narrows it to the draft vocabulary."""
    return Eagle3Head(layer_arch(target.arch), target.arch.hidden_size, target.arch.vocab_size)


def train_aux_layers(target: TargetSpec) -> tuple[int, ...]:
    return default_aux_layers(target.arch.num_hidden_layers)


def prepare(module: Eagle3Head, target: TargetSpec, ranking: np.ndarray, size: int = 0) -> torch.Tensor:
    """Narrow the head to the first ``size`` tokens of ``ranking`` (the target's ids, most chosen first),
    sorted by id: d2t[i] = used[i] - i. lm_head rows and the final norm start as the target's own. Returns
    t2d as a label map: target id -> draft id, -1 outside the draft vocabulary."""
    V = target.arch.vocab_size
    n = min(size or DEFAULT_DRAFT_VOCAB, V)
    used = torch.from_numpy(np.sort(np.asarray(ranking[:n], dtype=np.int64)))
    with torch.no_grad():
        rows = target.tensors.load(target.lm_head_name).float()[used]
        module.lm_head = nn.Linear(module.arch.hidden_size, n, bias=False)
        module.lm_head.weight.copy_(rows)
        if "model.norm.weight" in target.tensors:
            module.norm.weight.copy_(target.tensors.load("model.norm.weight").float())
        module.d2t = used - torch.arange(n)
    label_map = torch.full((V,), -1, dtype=torch.long)
    label_map[used] = torch.arange(n)
    return label_map


def save(
    module: Eagle3Head,
    target: TargetSpec,
    out: str | Path,
    info: dict | None = None,
    rmsnorm: bool = True,
    dtype: torch.dtype | None = None,
) -> Path:
    """SafeAILab's layout (``midlayer.*``, ``d2t`` int64, ``t2d`` bool) with the capture layers spelled out
    in config.json (``eagle_aux_hidden_state_layer_ids``, vLLM's input-of-layer ids)."""
    dtype = dtype or target.dtype
    a = target.arch
    state = module_state(module, dtype)
    n = int(state["lm_head.weight"].shape[0])
    t2d = torch.zeros(a.vocab_size, dtype=torch.bool)
    t2d[state["d2t"] + torch.arange(n)] = True
    state["t2d"] = t2d
    extra = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "draft_vocab_size": n,
        "target_hidden_size": a.hidden_size,
        "tie_word_embeddings": False,
        "eagle_aux_hidden_state_layer_ids": list(train_aux_layers(target)),
        "torch_dtype": str(dtype).removeprefix("torch."),
        "trtspec_target": {"fingerprint": target.fingerprint, "model_type": a.model_type, "path": str(target.path)},
    }
    if info is not None:
        extra["trtspec_training"] = info
    return save_layout(Path(out), state, "midlayer.", eagle_config(target, **extra))


def make_demo(target: TargetSpec, out: Path) -> Path:
    """Random EAGLE-3 heads whose draft vocabulary is the target's first ids (the demo's "most frequent")."""
    n = min(DEMO_DRAFT_VOCAB, max(2, target.arch.vocab_size // 2))
    head = demo_init(Eagle3Head(layer_arch(target.arch), target.arch.hidden_size, n), 3)
    used = torch.arange(target.arch.vocab_size)[:n]
    state = module_state(head)
    state["d2t"] = used - torch.arange(n)
    t2d = torch.zeros(target.arch.vocab_size, dtype=torch.bool)
    t2d[used] = True
    state["t2d"] = t2d
    cfg = eagle_config(target, architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=n)
    return save_layout(out, state, "midlayer.", cfg)


KIND = DrafterKind(
    name=NAME,
    summary="EAGLE-3: fused low/mid/high target features, own draft vocabulary (d2t)",
    detect=detect,
    load=load,
    build=build,
    make_demo=make_demo,
    engine=EngineRoute(
        refusal=(
            "EAGLE-3 heads have no TensorRT engine mode: TensorRT-LLM 1.2's trtllm-build offers "
            "--speculative_decoding_mode {draft_tokens_external, lookahead_decoding, medusa, explicit_draft_tokens, "
            "eagle} and its 'eagle' mode is EAGLE-1/2 only. Serve EAGLE-3 with TensorRT-LLM's PyTorch backend "
            "(trtllm-serve / LLM API with an Eagle3 speculative config) or with trtspec's reference runtime "
            "(trtspec serve), or use EAGLE-1/2, Medusa or mtp heads for an engine build"
        )
    ),
    training=TrainingRecipe("recurrent", new_module, save, aux_layers=train_aux_layers, prepare=prepare),
    pytorch=PyTorchRoute(decoding_type="Eagle3", draft_format="eagle3"),
    formats=("eagle3", "speculators"),
    export_formats=("eagle3", "speculators"),
    own_draft_vocab=True,
)
