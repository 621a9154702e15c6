"""Hugging Face -> TensorRT-LLM tensor names, with the TP rule of each tensor.

Sources (NVIDIA/TensorRT-LLM, the 1.2 legacy TensorRT path):
- Llama: ``tensorrt_llm/models/llama/convert.py::get_prefix_and_param_name_map`` and
  ``load_weights_from_hf_model``: ``mlp.fc`` <- **gate_proj**, ``mlp.gate`` <- **up_proj** (the names are
  swapped relative to HF), ``attention.qkv`` = per-rank cat(q, k, v), ``attention.dense`` <- o_proj,
  ``post_layernorm`` <- post_attention_layernorm, ``ln_f`` <- model.norm; per-rank files number their
  layers locally (``transformer.layers.{l - layers_range[0]}``).
- Medusa: ``tensorrt_llm/models/medusa/model.py`` (MedusaHead: ``medusa_layers.{l}.linear`` ColumnLinear
  with bias, ``lm_head`` ColumnLinear over the padded vocab).
- EAGLE: ``tensorrt_llm/models/eagle/model.py`` (EagleNet: ``drafter`` = LLaMAModel with fc_after_embed,
  no input_layernorm in layer 0, no ln_f; ``lm_head``) and ``models/eagle/weight.py::load_eagle_hf``
  (one copy of the drafter per EAGLE layer, lm_head duplicated from the base model, fc.bias always
  present because ``LLaMAModel.fc`` is built with bias=True).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from trtspec.checkpoint.tensors import TensorStore
from trtspec.convert.shard import COLUMN, LM_HEAD, QKV, REPLICATE, ROW, Rule, Source, Zeros
from trtspec.parallel import Mapping
from trtspec.spec import LlamaArch

#: HF decoder-layer suffix -> (TensorRT-LLM suffix, rule). q/k/v are handled together (fused qkv).
LAYER_MAP: dict[str, tuple[str, Rule]] = {
    "input_layernorm.weight": ("input_layernorm.weight", REPLICATE),
    "post_attention_layernorm.weight": ("post_layernorm.weight", REPLICATE),
    "self_attn.o_proj.weight": ("attention.dense.weight", ROW),
    "self_attn.o_proj.bias": ("attention.dense.bias", REPLICATE),  # RowLinear adds its bias after all-reduce
    "mlp.gate_proj.weight": ("mlp.fc.weight", COLUMN),
    "mlp.up_proj.weight": ("mlp.gate.weight", COLUMN),
    "mlp.down_proj.weight": ("mlp.proj.weight", ROW),
    "mlp.gate_proj.bias": ("mlp.fc.bias", COLUMN),
    "mlp.up_proj.bias": ("mlp.gate.bias", COLUMN),
    "mlp.down_proj.bias": ("mlp.proj.bias", REPLICATE),
}
QKV_PARTS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
QKV_NAME = "attention.qkv"


@dataclass
class Job:
    """One logical output tensor: read ``sources``, apply ``rule``, write shard tp_rank to each target.

    ``targets`` maps a global rank to the names that rank stores the shard under (EAGLE stores the same
    drafter once per EAGLE layer, so one read can feed several names).
    """

    sources: list[Source | Zeros]
    rule: Rule
    targets: dict[int, tuple[str, ...]]
    dtype: torch.dtype
    tp_size: int
    group: str = "target"

    @property
    def source_bytes(self) -> int:
        return sum(s.nbytes for s in self.sources)

    def shapes(self) -> list[tuple[int, ...]]:
        return self.rule.shapes([tuple(s.shape) for s in self.sources], self.tp_size)


@dataclass
class JobList:
    """Jobs in file order, plus helpers that keep the per-kind builders short."""

    mapping: Mapping
    dtype: torch.dtype
    jobs: list[Job] = field(default_factory=list)

    def add(
        self,
        sources,
        rule: Rule,
        targets: dict[int, tuple[str, ...]] | dict[int, str],
        group: str,
        dtype: torch.dtype | None = None,
    ) -> None:
        tg = {r: (n,) if isinstance(n, str) else tuple(n) for r, n in targets.items()}
        self.jobs.append(Job(list(sources), rule, tg, dtype or self.dtype, self.mapping.tp_size, group))

    def on_stage(self, pp_rank: int, names: str | tuple[str, ...]) -> dict[int, tuple[str, ...]]:
        names = (names,) if isinstance(names, str) else names
        return {r: names for r in self.mapping.stage_ranks(pp_rank)}

    def on_all(self, names: str | tuple[str, ...]) -> dict[int, tuple[str, ...]]:
        names = (names,) if isinstance(names, str) else names
        return {r: names for r in range(self.mapping.world_size)}


def decoder_layer_jobs(
    out: JobList,
    store: TensorStore,
    arch: LlamaArch,
    src_prefix: str,
    dst_prefixes: tuple[str, ...],
    targets_of,
    group: str,
    skip: tuple[str, ...] = (),
) -> None:
    """Jobs for one HF decoder layer at ``src_prefix`` written as ``{dst}{trt suffix}`` for each dst prefix.

    ``targets_of(names)`` returns the rank -> names dict (all ranks of one pp stage, or all ranks).
    """
    qkv_rule = QKV(arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim)
    for kind in ("weight", "bias"):
        names = [f"{src_prefix}{p}.{kind}" for p in QKV_PARTS]
        if all(n in store for n in names):
            out.add(
                [Source(store, n) for n in names],
                qkv_rule,
                targets_of(tuple(f"{d}{QKV_NAME}.{kind}" for d in dst_prefixes)),
                group,
            )
    for hf, (trt, rule) in LAYER_MAP.items():
        if hf in skip or f"{src_prefix}{hf}" not in store:
            continue
        out.add([Source(store, f"{src_prefix}{hf}")], rule, targets_of(tuple(f"{d}{trt}" for d in dst_prefixes)), group)


def llama_jobs(
    out: JobList,
    store: TensorStore,
    arch: LlamaArch,
    lm_head: str,
    embedding_rule: Rule,
    group: str = "target",
    lm_head_names: tuple[str, ...] = (),
    embedding_names: tuple[str, ...] = (),
) -> None:
    """A whole Llama-family causal LM (target, or a separate draft model) under TensorRT-LLM names.

    ``lm_head_names`` / ``embedding_names``: more names that get the same shard (Medusa heads and EAGLE
    nets carry copies of the target's lm_head / embedding), so the big tensor is read once.
    """
    m = out.mapping
    out.add(
        [Source(store, "model.embed_tokens.weight")],
        embedding_rule,
        out.on_stage(0, ("transformer.vocab_embedding.weight", *embedding_names)),
        group,
    )
    for pp in range(m.pp_size):
        for local, layer in enumerate(m.pp_layers(arch.num_hidden_layers, pp)):
            decoder_layer_jobs(
                out,
                store,
                arch,
                f"model.layers.{layer}.",
                (f"transformer.layers.{local}.",),
                lambda names, pp=pp: out.on_stage(pp, names),
                group,
            )
    last = m.pp_size - 1
    out.add([Source(store, "model.norm.weight")], REPLICATE, out.on_stage(last, "transformer.ln_f.weight"), group)
    out.add([Source(store, lm_head)], LM_HEAD, out.on_stage(last, ("lm_head.weight", *lm_head_names)), group)


# Head names ------------------------------------------------------------------------------------


def medusa_name(head: int, layer: int, part: str) -> str:
    return f"medusa_heads.{head}.medusa_layers.{layer}.linear.{part}"


def medusa_lm_head_name(head: int) -> str:
    return f"medusa_heads.{head}.lm_head.weight"


#: mtp-linear: the K per-head RMSNorm weights stacked [K, H], the layout the TrtspecRmsNormHeads plugin
#: (creator "TrtspecRmsNormHeads", version "1", namespace "trtspec") takes as its weight input.
RMSNORM_HEADS_NAME = "medusa_rmsnorm_heads.weight"
#: config.json keys trtspec's model classes read (PretrainedConfig keeps unknown keys as attributes)
RMSNORM_HEADS_EPS_KEY = "trtspec_rmsnorm_heads_eps"  # mtp-linear: the heads' RMSNorm epsilon
MTP_NORMS_KEY = "trtspec_mtp_norms"  # mtp-single: which of enorm / hnorm / final_norm exist


def eagle_prefix(i: int) -> str:
    return f"eagle_nets.{i}."


def zeros(shape: tuple[int, ...]) -> Zeros:
    return Zeros(tuple(shape))
