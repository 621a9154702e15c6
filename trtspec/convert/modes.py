"""One small export class per speculative mode: which checkpoints, which tensors, which config.json.

Each class answers the same questions for its drafter kind (in the style of optimum's exporter
configs rather than one near-copy script per model): the TensorRT-LLM architecture, the
``trtllm-build --speculative_decoding_mode``, whether pipeline parallelism is allowed, whether the engine
needs trtspec's plugin library / model class, and the list of (checkpoint dir, config, jobs).

Mapping decisions (ARCHITECTURE.md):
- medusa      -> MedusaForCausalLM, mode ``medusa``.
- mtp-linear  -> MedusaForCausalLM + ``medusa_rmsnorm_heads.weight`` [K, H] (the per-head RMSNorm weights,
                 stacked as the TrtspecRmsNormHeads plugin takes them); mode ``medusa``; the engine must be
                 built with trtspec's model class (``TrtspecMtpLinearForCausalLM``), which applies the norms
                 through the plugin before each head. A stock MedusaForCausalLM would ignore the norms
                 ("Provided but not required tensors") and draft worse -- never wrong, the target verifies.
- eagle       -> EagleForCausalLM with eagle_net_config, mode ``eagle``; one drafter copy per tree level.
- mtp-single  -> EagleForCausalLM layout (the MTP module is "fc(cat[emb, hidden]) -> one decoder layer ->
                 shared lm_head", i.e. EAGLE-shaped): ``fc`` <- eh_proj (zero bias), plus the tensors EAGLE
                 lacks -- ``eagle_nets.{i}.enorm.weight`` / ``hnorm.weight`` (RMSNorm of the embedding / the
                 hidden state before the concat), ``drafter.layers.0.input_layernorm.weight`` and
                 ``eagle_nets.{i}.final_norm.weight`` (the shared head's norm; the pre-norm state is fed back).
                 Mode ``eagle`` with trtspec's model class ``TrtspecMtpSingleForCausalLM`` (TensorRT-LLM's own
                 RmsNorm layers; no trtspec plugin needed); the stock class cannot use them.
- draft-model -> two checkpoints, ``target/`` (LlamaForCausalLM, built with draft_tokens_external) and
                 ``draft/`` (LlamaForCausalLM, a plain engine).
- eagle3      -> refused: the TensorRT engine backend has no EAGLE-3 mode.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from trtspec.convert import names as N
from trtspec.convert.config import EAGLE_MAX_DRAFT_LEN, HF_ARCH_NAMES, llama_config
from trtspec.convert.shard import COLUMN, LM_HEAD, REPLICATE, STACK, Source, embedding_rule
from trtspec.drafters import registry
from trtspec.errors import UsageError
from trtspec.spec import LlamaArch, SpecModel
from trtspec.tree import build_tree


@dataclass
class ConvertOptions:
    """What the user chose; everything else comes from the SpecModel."""

    tp_size: int = 1
    pp_size: int = 1
    dtype: torch.dtype | None = None
    use_parallel_embedding: bool | None = None  # None: on when tp_size > 1
    embedding_sharding_dim: int = 0
    max_draft_len: int | None = None  # None: from the tree
    draft_tp_size: int | None = None  # draft-model only; None: same as tp_size

    def parallel_embedding(self) -> bool:
        return self.tp_size > 1 if self.use_parallel_embedding is None else bool(self.use_parallel_embedding)


@dataclass
class CheckpointPlan:
    """One TensorRT-LLM checkpoint directory: ``config.json`` + ``rank{r}.safetensors``."""

    subdir: str  # "" = the output directory itself
    role: str  # "target" | "draft"
    config: dict[str, Any]
    jobs: N.JobList
    engine_mode: str | None
    max_draft_len: int = 0
    model_cls: str | None = None  # trtspec model class for trtllm-build --model_cls_name, if needed

    @property
    def world_size(self) -> int:
        return self.jobs.mapping.world_size


@dataclass
class ExportMode:
    kind: str
    architecture: str = "LlamaForCausalLM"
    engine_mode: str | None = None
    allows_pp: bool = True
    #: why pp > 1 is refused (shown in the error): a per-kind fact, kept on the kind's class
    pp_refusal: str = ""
    needs_plugin: bool = False
    #: the drafter is its own engine served next to the target (Triton: a tensorrt_llm_draft model that
    #: tensorrt_llm_bls drives), not heads inside the target engine
    separate_draft_model: bool = False
    model_cls: str | None = None
    notes: list[str] = field(default_factory=list)

    # Shared helpers -------------------------------------------------------------------------------
    def validate(self, spec: SpecModel, opts: ConvertOptions) -> None:
        arch = spec.target.arch
        if arch.model_type not in HF_ARCH_NAMES:
            raise UsageError(
                f"convert writes Llama-family checkpoints (llama, mistral); {arch.model_type} maps to "
                "TensorRT-LLM's QWenForCausalLM, which trtspec does not write yet -- use the "
                "reference runtime (trtspec serve) for this target"
            )
        if opts.tp_size < 1 or opts.pp_size < 1:
            raise UsageError("--tp-size and --pp-size must be >= 1")
        if opts.pp_size > 1 and not self.allows_pp:
            raise UsageError(
                f"pipeline parallelism is not available for {self.kind} engines "
                f"({self.pp_refusal}); use --pp-size 1 (and --tp-size for more GPUs)"
            )
        if opts.pp_size > arch.num_hidden_layers:
            raise UsageError(f"--pp-size {opts.pp_size} exceeds the {arch.num_hidden_layers} target layers")
        if opts.tp_size > 1 and arch.num_attention_heads % opts.tp_size:
            raise UsageError(
                f"num_attention_heads {arch.num_attention_heads} is not divisible by tp_size {opts.tp_size}"
            )

    def dtype(self, spec: SpecModel, opts: ConvertOptions) -> torch.dtype:
        dt = opts.dtype or spec.dtype
        if dt not in (torch.float32, torch.float16, torch.bfloat16):
            raise UsageError(f"unsupported dtype {dt}; use float16, bfloat16 or float32")
        return dt

    def mapping(self, opts: ConvertOptions) -> N.Mapping:
        return N.Mapping(opts.tp_size, opts.pp_size)

    def target_config(self, spec: SpecModel, opts: ConvertOptions, mapping: N.Mapping, architecture: str):
        return llama_config(
            spec.target.arch,
            self.dtype(spec, opts),
            mapping,
            architecture,
            opts.parallel_embedding(),
            opts.embedding_sharding_dim,
        )

    def target_jobs(
        self,
        spec: SpecModel,
        opts: ConvertOptions,
        mapping: N.Mapping,
        lm_head_names: tuple[str, ...] = (),
        embedding_names: tuple[str, ...] = (),
    ) -> N.JobList:
        """The target's jobs; extra names get the same shard (heads that share the lm_head / embedding)."""
        out = N.JobList(mapping, self.dtype(spec, opts))
        t = spec.target
        N.llama_jobs(
            out,
            t.tensors,
            t.arch,
            t.lm_head_name,
            embedding_rule(opts.parallel_embedding(), opts.embedding_sharding_dim),
            "target",
            lm_head_names,
            embedding_names,
        )
        return out

    def draft_len(self, spec: SpecModel, opts: ConvertOptions) -> int:
        n = opts.max_draft_len if opts.max_draft_len is not None else spec.tree.num_nodes
        if n < 1:
            raise UsageError("max_draft_len must be >= 1 (the tree has no nodes; pass --tree or max_draft_len)")
        return int(n)

    def chain_len(self, spec: SpecModel, opts: ConvertOptions) -> int:
        """Draft tokens per step of an autoregressive drafter (a chain): the tree's depth."""
        n = opts.max_draft_len if opts.max_draft_len is not None else spec.tree.depth
        if n < 1:
            raise UsageError("max_draft_len must be >= 1 (pass --tree chain:N or max_draft_len)")
        return int(n)

    # The one method each mode implements ----------------------------------------------------------
    def checkpoints(self, spec: SpecModel, opts: ConvertOptions) -> list[CheckpointPlan]:
        raise NotImplementedError


class TargetOnly(ExportMode):
    def __init__(self):
        super().__init__("none")

    def checkpoints(self, spec, opts):
        self.validate(spec, opts)
        m = self.mapping(opts)
        arch_name = HF_ARCH_NAMES[spec.target.arch.model_type]
        return [
            CheckpointPlan(
                "", "target", self.target_config(spec, opts, m, arch_name), self.target_jobs(spec, opts, m), None
            )
        ]


class Medusa(ExportMode):
    def __init__(self, kind: str):
        super().__init__(
            kind,
            "MedusaForCausalLM",
            "medusa",
            allows_pp=False,
            pp_refusal="TensorRT-LLM 1.2's MedusaForCausalLM creates the Medusa heads on every "
            "pipeline stage, but their weights exist only on the last one, so the "
            "engine of every other stage cannot load",
        )

    def extra_jobs(self, spec: SpecModel, out: N.JobList) -> None:
        """Hook for mtp-linear's norms."""

    def extra_config(self, spec: SpecModel) -> dict[str, Any]:
        """Hook for mtp-linear's config keys."""
        return {}

    def checkpoints(self, spec, opts):
        self.validate(spec, opts)
        d = spec.drafter
        K, L = d.num_heads, int(d.config.get("num_layers", 1))
        own = [f"heads.{k}.lm_head.weight" in d.tensors for k in range(K)]
        if any(own) and not all(own):
            raise UsageError(f"{d.path}: some {d.kind} heads have their own lm_head and some do not")
        m = self.mapping(opts)
        shared = () if all(own) else tuple(N.medusa_lm_head_name(k) for k in range(K))
        out = self.target_jobs(spec, opts, m, lm_head_names=shared)
        last = m.pp_size - 1
        self.extra_jobs(spec, out)
        for k in range(K):
            for l in range(L):
                for part in ("weight", "bias"):
                    out.add(
                        [Source(d.tensors, f"heads.{k}.res.{l}.{part}")],
                        COLUMN,
                        out.on_stage(last, N.medusa_name(k, l, part)),
                        "heads",
                    )
            if all(own):
                out.add(
                    [Source(d.tensors, f"heads.{k}.lm_head.weight")],
                    LM_HEAD,
                    out.on_stage(last, N.medusa_lm_head_name(k)),
                    "heads",
                )
        cfg = self.target_config(spec, opts, m, "MedusaForCausalLM")
        draft_len = self.draft_len(spec, opts)
        cfg.update(num_medusa_heads=K, num_medusa_layers=L, max_draft_len=draft_len, **self.extra_config(spec))
        return [CheckpointPlan("", "target", cfg, out, "medusa", draft_len, self.model_cls)]


class MtpLinear(Medusa):
    def __init__(self, kind: str):
        super().__init__(kind)
        self.needs_plugin = True
        self.model_cls = "TrtspecMtpLinearForCausalLM"

    def extra_jobs(self, spec, out):
        d = spec.drafter
        K = d.num_heads
        norms = [f"heads.{k}.norm.weight" for k in range(K)]
        if not all(n in d.tensors for n in norms):  # has_rmsnorm false: plain Medusa semantics
            self.needs_plugin, self.model_cls = False, None
            return
        out.add(
            [Source(d.tensors, n) for n in norms],
            STACK,
            out.on_stage(out.mapping.pp_size - 1, N.RMSNORM_HEADS_NAME),
            "heads",
        )

    def extra_config(self, spec: SpecModel) -> dict[str, Any]:
        """The heads' own RMSNorm epsilon (not the target's norm_epsilon, which the model class would
        otherwise read): the heads were trained with it."""
        if not self.needs_plugin:
            return {}
        return {N.RMSNORM_HEADS_EPS_KEY: float(spec.drafter.config.get("rms_norm_eps", spec.target.arch.rms_norm_eps))}


class Eagle(ExportMode):
    def __init__(self, kind: str):
        super().__init__(
            kind,
            "EagleForCausalLM",
            "eagle",
            allows_pp=False,
            pp_refusal="TensorRT-LLM builds its drafter with tp = world size, pp = 1",
        )

    def drafter_arch(self, spec: SpecModel) -> LlamaArch:
        a = spec.drafter.arch
        if a is None:
            raise UsageError(f"{spec.drafter.path}: {self.kind} heads carry no decoder-layer architecture")
        return dataclasses.replace(a, num_hidden_layers=1, vocab_size=spec.target.arch.vocab_size)

    def fc_sources(self, spec: SpecModel):
        d = spec.drafter
        H = self.drafter_arch(spec).hidden_size
        bias = Source(d.tensors, "fc.bias") if "fc.bias" in d.tensors else N.zeros((H,))
        return Source(d.tensors, "fc.weight"), bias

    def extra_drafter_jobs(self, spec, out: N.JobList, prefixes: tuple[str, ...]) -> None:
        """Hook for mtp-single's norms."""

    def extra_config(self, spec: SpecModel) -> dict[str, Any]:
        """Hook for mtp-single's config keys."""
        return {}

    def tree_shape(self, spec: SpecModel) -> tuple[int, int]:
        """(num_eagle_layers = tree depth, max_non_leaves_per_layer)."""
        if not spec.tree.choices:
            raise UsageError(f"{self.kind} needs a draft tree (pass --tree)")
        tb = build_tree(spec.tree.choices)
        depth = tb.max_depth
        non_leaves = [0] * (depth + 1)
        for node in range(tb.size):
            if tb.children(node):
                non_leaves[int(tb.depths[node])] += 1
        return depth, max(1, max(non_leaves))

    def checkpoints(self, spec, opts):
        self.validate(spec, opts)
        m = self.mapping(opts)
        layers, non_leaves = self.tree_shape(spec)
        prefixes = tuple(N.eagle_prefix(i) for i in range(layers))
        out = self.target_jobs(
            spec,
            opts,
            m,
            lm_head_names=tuple(f"{p}lm_head.weight" for p in prefixes),
            embedding_names=tuple(f"{p}drafter.vocab_embedding.weight" for p in prefixes),
        )
        d, da = spec.drafter, self.drafter_arch(spec)
        fc_w, fc_b = self.fc_sources(spec)
        out.add([fc_w], COLUMN, out.on_all(tuple(f"{p}drafter.fc.weight" for p in prefixes)), "heads")
        out.add([fc_b], COLUMN, out.on_all(tuple(f"{p}drafter.fc.bias" for p in prefixes)), "heads")
        N.decoder_layer_jobs(
            out,
            d.tensors,
            da,
            "layer.",
            tuple(f"{p}drafter.layers.0." for p in prefixes),
            out.on_all,
            "heads",
            skip=self.skip_layer_parts(),
        )
        self.extra_drafter_jobs(spec, out, prefixes)
        draft_len = self.draft_len(spec, opts)
        if draft_len > EAGLE_MAX_DRAFT_LEN:
            raise UsageError(
                f"EAGLE engines allow at most {EAGLE_MAX_DRAFT_LEN} draft tokens, the tree has "
                f"{draft_len}; use a smaller tree"
            )
        dtype = self.dtype(spec, opts)
        net_mapping = N.Mapping(m.world_size, 1)  # EagleForCausalLM builds its nets with tp = world size
        net = llama_config(
            da, dtype, net_mapping, "LlamaForCausalLM", opts.parallel_embedding(), opts.embedding_sharding_dim
        )
        cfg = self.target_config(spec, opts, m, "EagleForCausalLM")
        cfg.update(
            num_eagle_layers=layers,
            max_non_leaves_per_layer=non_leaves,
            max_draft_len=draft_len,
            eagle_net_config=net,
            **self.extra_config(spec),
        )
        return [CheckpointPlan("", "target", cfg, out, "eagle", draft_len, self.model_cls)]

    def skip_layer_parts(self) -> tuple[str, ...]:
        return ("input_layernorm.weight",)  # EAGLE-1 layer 0 has none (use_input_layernorm_in_first_layer=False)


class MtpSingle(Eagle):
    def __init__(self, kind: str):
        super().__init__(kind)
        self.needs_plugin = False  # its extra norms are TensorRT-LLM RmsNorm layers inside trtspec's model class
        self.model_cls = "TrtspecMtpSingleForCausalLM"

    def fc_sources(self, spec):
        d = spec.drafter
        return Source(d.tensors, "eh_proj.weight"), N.zeros((self.drafter_arch(spec).hidden_size,))

    def skip_layer_parts(self):
        return ()  # the MTP decoder layer keeps its input_layernorm

    #: heads tensor -> the MtpNet RmsNorm it fills (absent when the heads were trained without RMSNorm)
    NORMS = (("enorm.weight", "enorm"), ("hnorm.weight", "hnorm"), ("norm.weight", "final_norm"))

    def present_norms(self, spec: SpecModel) -> list[str]:
        return [dst for src, dst in self.NORMS if src in spec.drafter.tensors]

    def extra_config(self, spec):
        """Which norms the model class must create: only those with weights (a norm it creates but the
        checkpoint lacks is a required parameter left unset, and the engine refuses to load)."""
        return {N.MTP_NORMS_KEY: self.present_norms(spec)}

    def extra_drafter_jobs(self, spec, out, prefixes):
        d = spec.drafter
        for src, dst in ((src, f"{dst}.weight") for src, dst in self.NORMS):
            if src in d.tensors:
                out.add([Source(d.tensors, src)], REPLICATE, out.on_all(tuple(f"{p}{dst}" for p in prefixes)), "heads")


class DraftModel(ExportMode):
    def __init__(self, kind: str):
        super().__init__(kind, "LlamaForCausalLM", "draft_tokens_external", separate_draft_model=True)

    def checkpoints(self, spec, opts):
        self.validate(spec, opts)
        d = spec.drafter
        if d.arch is None or d.arch.model_type not in HF_ARCH_NAMES:
            raise UsageError(f"{d.path}: the draft model must be Llama-family (llama, mistral)")
        m = self.mapping(opts)
        tgt_arch = HF_ARCH_NAMES[spec.target.arch.model_type]
        target = CheckpointPlan(
            "target",
            "target",
            self.target_config(spec, opts, m, tgt_arch),
            self.target_jobs(spec, opts, m),
            "draft_tokens_external",
            self.chain_len(spec, opts),
        )
        dm = N.Mapping(opts.draft_tp_size or opts.tp_size, 1)
        dt = self.dtype(spec, opts)
        jobs = N.JobList(dm, dt)
        lm = "lm_head.weight" if "lm_head.weight" in d.tensors else "model.embed_tokens.weight"
        N.llama_jobs(
            jobs, d.tensors, d.arch, lm, embedding_rule(opts.parallel_embedding(), opts.embedding_sharding_dim), "draft"
        )
        dcfg = llama_config(
            d.arch, dt, dm, HF_ARCH_NAMES[d.arch.model_type], opts.parallel_embedding(), opts.embedding_sharding_dim
        )
        return [target, CheckpointPlan("draft", "draft", dcfg, jobs, None)]


#: TensorRT-LLM checkpoint layouts (a kind's ``EngineRoute.layout``) -> the writer for it
LAYOUTS = {
    "MedusaForCausalLM": Medusa,
    "MedusaForCausalLM+RmsNormHeads": MtpLinear,
    "EagleForCausalLM": Eagle,
    "EagleForCausalLM+MtpNorms": MtpSingle,
    "draft_tokens_external": DraftModel,
}


def select_mode(spec: SpecModel) -> ExportMode:
    """The writer for the drafter's engine layout (the target alone without a drafter)."""
    if spec.drafter is None:
        return TargetOnly()
    route = registry.get(spec.drafter.kind).engine
    if not route.supported:
        raise UsageError(route.refusal or f"no TensorRT-LLM engine layout for {spec.drafter.kind} heads")
    if route.layout not in LAYOUTS:
        raise UsageError(f"no checkpoint writer for TensorRT-LLM layout {route.layout!r}")
    return LAYOUTS[route.layout](spec.drafter.kind)
