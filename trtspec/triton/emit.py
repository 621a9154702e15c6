"""Fill the triton_repo/ templates from a SpecModel: the Triton model repository `trtspec build` ends with.

Two runtimes, one contract: `trtllm` (tensorrtllm backend on the built engines, NVIDIA's container) and
`reference` (python backend running trtspec's reference runtime, CPU or GPU). Model names, tensor names,
types and parameter keys are TensorRT-LLM's inflight_batcher_llm ones in both, so a client written for
one works against the other.

The repository is written to a temporary directory next to ``out_dir``, validated against Triton's own
ModelConfig schema (every placeholder filled, ensemble wiring checked), and only then renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from trtspec.drafters import registry
from trtspec.errors import CheckpointError, UsageError
from trtspec.spec import DrafterSpec, SpecModel
from trtspec.triton.validate import PLACEHOLDER, validate_repository

RUNTIMES = ("trtllm", "reference")
MODELS = ("preprocessing", "tensorrt_llm", "postprocessing", "ensemble", "tensorrt_llm_bls")
MANIFEST = "trtspec_repo.json"


def _template_dir() -> Path:
    """$TRTSPEC_TRITON_TEMPLATES, else the checkout's triton_repo/, else the copy a wheel installs."""
    if os.environ.get("TRTSPEC_TRITON_TEMPLATES"):
        return Path(os.environ["TRTSPEC_TRITON_TEMPLATES"])
    checkout = Path(__file__).resolve().parents[2] / "triton_repo"
    return checkout if checkout.is_dir() else Path(sys.prefix) / "share" / "trtspec" / "triton_repo"


TEMPLATE_DIR = _template_dir()
#: friendlier option names accepted by emit_repository / the CLI
ALIASES = {
    "max_batch_size": "triton_max_batch_size",
    "device": "trtspec_device",
    "dtype": "trtspec_dtype",
    "decoupled": "decoupled_mode",
    "torch_threads": "trtspec_torch_threads",
    "batch_window_ms": "trtspec_batch_window_ms",
    "draft_len_schedule": "trtspec_draft_len_schedule",
}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "vocab.txt",
)
#: where the tokenizer goes inside the repository (a model's version dir: Triton ignores its contents)
TOKENIZER_SUBDIR = "preprocessing/1/tokenizer"
PLUGIN_SUBDIR = "tensorrt_llm/1/plugins"

#: Every template value. None = "not set": on a ``parameters`` line the ``${name}`` text stays, exactly as
#: TensorRT-LLM's fill_template.py leaves an unfilled key (its C++ backend reads every key of its config,
#: several unconditionally, and treats that text as unset); anywhere else None is an error.
DEFAULTS: dict[str, Any] = {
    "triton_max_batch_size": 8,
    "max_queue_delay_microseconds": 0,
    "max_queue_size": 0,
    # TensorRT-LLM's decoupled_mode: True streams (gRPC ModelStreamInfer, generate_stream); False serves
    # plain unary infer (HTTP /infer, /generate). Chosen per deployment.
    "decoupled_mode": True,
    "logits_datatype": "TYPE_FP32",
    "encoder_input_features_data_type": "TYPE_FP16",
    "prompt_embedding_table_data_type": "TYPE_FP16",
    "preprocessing_instance_count": 1,
    "postprocessing_instance_count": 1,
    "bls_instance_count": 1,
    "add_special_tokens": True,
    "skip_special_tokens": True,
    "accumulate_tokens": True,
    "tensorrt_llm_model_name": "tensorrt_llm",
    "tensorrt_llm_draft_model_name": None,
    "multimodal_encoders_name": None,
    "max_beam_width": 1,
    "batching_strategy": "inflight_fused_batching",
    "batch_scheduler_policy": "guaranteed_no_evict",
    "kv_cache_free_gpu_mem_fraction": 0.9,
    "max_tokens_in_paged_kv_cache": None,
    "max_attention_window_size": None,
    "sink_token_length": None,
    "cross_kv_cache_fraction": None,
    "kv_cache_host_memory_bytes": None,
    "kv_cache_onboard_blocks": None,
    "enable_trt_overlap": None,
    "enable_kv_cache_reuse": False,
    "enable_chunked_context": False,
    "exclude_input_in_output": True,
    "cancellation_check_period_ms": None,
    "stats_check_period_ms": None,
    "iter_stats_max_iterations": None,
    "request_stats_max_iterations": None,
    "normalize_log_probs": None,
    "gpu_device_ids": None,
    "participant_ids": None,
    "num_nodes": None,
    "lora_cache_optimal_adapter_size": None,
    "lora_cache_max_adapter_size": None,
    "lora_cache_gpu_memory_fraction": None,
    "lora_cache_host_memory_bytes": None,
    "lora_prefetch_dir": None,
    "lookahead_window_size": None,
    "lookahead_ngram_size": None,
    "lookahead_verification_set_size": None,
    "gpu_weights_percent": None,
    "enable_context_fmha_fp32_acc": None,
    "multi_block_mode": None,
    "cuda_graph_mode": None,
    "cuda_graph_cache_size": None,
    "speculative_decoding_fast_logits": None,
    "guided_decoding_backend": None,
    "xgrammar_tokenizer_info_path": None,
    "encoder_engine_dir": None,
    "hf_model_path": None,
    "max_num_images": None,
    "multimodal_model_path": None,
    "trtspec_device": "auto",
    "trtspec_torch_threads": None,  # reference: torch intra-op threads (None = torch's default)
    # reference: when idle, wait this long after a request for others to prefill with it (in-flight batching
    # admits later ones between steps anyway)
    "trtspec_batch_window_ms": 5,
    # reference: draft depth per batch size, TensorRT-LLM's draft_len_schedule ("1:3,4:2,16:1"); None = the
    # default table of runtime.batch_policy for the tree's depth. Written to the manifest as a dict.
    "trtspec_draft_len_schedule": None,
    "speculative": True,
    "trtspec_adaptive": False,  # reference: each step's tree (down to none) from measured costs (runtime.adaptive)
    # the engine's max_seq_len (trtllm-build --max_seq_len); None: the engine dir's config.json, else (reference
    # runtime only) the model's max_position_embeddings
    "max_seq_len": None,
    # trtllm: the plugin library's file name when the library itself is not at hand yet (built on the GPU
    # machine): the server is still told to preload tensorrt_llm/1/plugins/<name>; copy it there before serving
    "plugin_library_name": None,
}
#: parameters the tensorrtllm backend cannot run without (a None here is an error, not "unset")
REQUIRED_TRTLLM = ("engine_dir", "batching_strategy", "tokenizer_dir", "max_seq_len")


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def fill_template(text: str, values: dict[str, Any], path: str | Path = "config.pbtxt") -> str:
    """Substitute ``${name}``; on a ``parameters`` line a None value keeps its ``${name}`` text (the key
    stays, unset, as upstream's fill_template leaves it: dropping it makes the tensorrtllm backend fail).

    Every placeholder must have a key in ``values`` (None counts): a template key nobody fills is a bug
    here, not something to ship to the server.
    """
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        names = PLACEHOLDER.findall(line.split("#", 1)[0])
        missing = [n for n in names if n not in values]
        if missing:
            raise UsageError(f"{path}:{lineno}: no value for placeholder(s) {', '.join(missing)}")
        if any(values[n] is None for n in names):
            if line.lstrip().startswith("parameters"):
                out.append(
                    PLACEHOLDER.sub(
                        lambda m: m.group(0) if values[m.group(1)] is None else _fmt(values[m.group(1)]), line
                    )
                )
                continue
            raise UsageError(
                f"{path}:{lineno}: placeholder(s) {', '.join(n for n in names if values[n] is None)} must have a value"
            )
        out.append(PLACEHOLDER.sub(lambda m: _fmt(values[m.group(1)]), line))
    return "\n".join(out) + "\n"


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def speculative_values(spec: SpecModel, runtime: str) -> dict[str, Any]:
    """decoding_mode, medusa_choices / eagle_choices and max_draft_len from the spec's drafter and tree."""
    from trtspec.tree import format_choices_json, format_choices_trtllm

    d = spec.drafter
    vals: dict[str, Any] = {
        "decoding_mode": None,
        "medusa_choices": None,
        "eagle_choices": None,
        "max_draft_len": None,
        "trtspec_drafter_kind": None,
        "trtspec_tree_choices": None,
    }
    if d is None or not spec.tree.choices:
        return vals
    route = registry.get(d.kind).engine
    if runtime == "trtllm" and not route.supported:
        raise UsageError(f"{d.kind} heads have no TensorRT engine: {route.refusal}", fix="emit --runtime reference")
    mode = route.triton_decoding_mode
    vals.update(
        decoding_mode=mode,
        trtspec_drafter_kind=d.kind,
        trtspec_tree_choices=format_choices_json(spec.tree.choices),
        max_draft_len=spec.tree.depth if route.draft_len == "depth" else spec.tree.num_nodes,
    )
    if mode == "medusa":
        vals["medusa_choices"] = format_choices_trtllm(spec.tree.choices)
    elif mode == "eagle":
        vals["eagle_choices"] = format_choices_trtllm(spec.tree.choices)
    return vals


def template_values(
    spec: SpecModel, runtime: str, engine_dir: Path | None, plugin_rel: str | None, options: dict[str, Any]
) -> dict[str, Any]:
    options = {ALIASES.get(k, k): v for k, v in options.items()}
    unknown = set(options) - set(DEFAULTS) - {"trtspec_dtype"}
    if unknown:
        raise UsageError(f"unknown Triton option(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(DEFAULTS))}")
    o = {**DEFAULTS, **options}
    if int(o["triton_max_batch_size"]) < 1:
        raise UsageError("triton_max_batch_size must be >= 1")
    max_seq_len = o.pop("max_seq_len") or engine_max_seq_len(engine_dir)
    if max_seq_len is None and runtime == "reference":
        max_seq_len = spec.target.arch.max_position_embeddings  # no engine: the model's own limit
    o.pop("plugin_library_name")
    speculative = o.pop("speculative")
    v = dict(o)
    v.update(speculative_values(spec, runtime))
    v.update(
        triton_backend="tensorrtllm" if runtime == "trtllm" else "python",
        max_seq_len=max_seq_len,
        tokenizer_dir=TOKENIZER_SUBDIR,
        trtspec_runtime=runtime,
        trtspec_plugin_library=plugin_rel,
        engine_dir=str(engine_dir) if engine_dir is not None else None,
    )
    if runtime == "reference":
        v.update(
            trtspec_target_dir=str(Path(spec.target.path).resolve()),
            trtspec_heads_dir=heads_reference(spec.drafter) if spec.drafter else None,
            trtspec_also_draft=heads_reference(spec.also) if spec.also else None,
            trtspec_dtype=o.get("trtspec_dtype") or _dtype_name(spec.dtype),
            trtspec_speculative=bool(speculative),
            trtspec_adaptive=bool(o.get("trtspec_adaptive")) and bool(speculative),
            trtspec_draft_len_schedule=_schedule_text(spec, o.get("trtspec_draft_len_schedule"), bool(speculative)),
            engine_dir=None,
            executor_worker_path=None,
            kv_cache_free_gpu_mem_fraction=None,
            batching_strategy=None,
            batch_scheduler_policy=None,
        )
    else:
        v.update(
            trtspec_target_dir=None,
            trtspec_heads_dir=None,
            trtspec_also_draft=None,
            trtspec_dtype=None,
            trtspec_device=None,
            trtspec_speculative=None,
            trtspec_adaptive=None,
            trtspec_torch_threads=None,
            trtspec_batch_window_ms=None,
            trtspec_draft_len_schedule=None,
        )
        missing = [k for k in REQUIRED_TRTLLM if v.get(k) is None]
        if missing:
            hint = (
                " (pass --max-seq-len, the engine's trtllm-build --max_seq_len, or build the engines first)"
                if "max_seq_len" in missing
                else ""
            )
            raise UsageError(f"the trtllm runtime needs {', '.join(missing)}{hint}")
    if not isinstance(v["decoupled_mode"], bool):
        raise UsageError(f"decoupled_mode must be true or false, got {v['decoupled_mode']!r}")
    v.pop("speculative", None)
    return v


def _schedule_text(spec: SpecModel, value, speculative: bool) -> str | None:
    """The served draft-depth table as the config parameter text ("1:3,4:2,16:1"), validated; None when
    nothing is drafted."""
    from trtspec.runtime.batch_policy import default_schedule, parse_schedule

    depth = spec.tree.depth if spec.drafter is not None and spec.tree.choices else 0
    if not speculative or depth == 0:
        return None
    table = parse_schedule(value, depth) if value not in (None, "") else default_schedule(depth)
    return ",".join(f"{k}:{v}" for k, v in table.items())


def engine_max_seq_len(engine_dir: Path | None) -> int | None:
    """max_seq_len from a built engine's config.json (``build_config.max_seq_len``), if it is here."""
    if engine_dir is None:
        return None
    f = Path(engine_dir) / "config.json"
    if not f.is_file():
        return None
    try:
        value = json.loads(f.read_text()).get("build_config", {}).get("max_seq_len")
    except (json.JSONDecodeError, AttributeError):
        raise CheckpointError("engine config.json is not valid JSON", f) from None
    return int(value) if value else None


def _copy_tokenizer(spec: SpecModel, dest: Path) -> None:
    src = spec.target.tokenizer_path
    if src is None:
        raise CheckpointError(
            "the target has no tokenizer files; the Triton repository needs one to turn text into tokens",
            spec.target.path,
            "copy tokenizer.json (+ tokenizer_config.json) into the target directory",
        )
    src = Path(src)
    src_dir = src if src.is_dir() else src.parent
    dest.mkdir(parents=True, exist_ok=True)
    copied = 0
    for name in TOKENIZER_FILES:
        if (src_dir / name).is_file():
            shutil.copy2(src_dir / name, dest / name)
            copied += 1
    if not copied:
        raise CheckpointError("no tokenizer files found", src_dir, f"expected one of {', '.join(TOKENIZER_FILES[:4])}")


def _is_trtspec_repo(path: Path) -> bool:
    return (path / MANIFEST).is_file()


DRAFT_MODEL = "tensorrt_llm_draft"


def uses_draft_engine(spec: SpecModel) -> bool:
    """Whether the drafter is a separate model served next to the target (draft-model): a per-kind fact
    kept on the kind's ExportMode (trtspec/convert/modes.py)."""
    from trtspec.convert.modes import select_mode

    if spec.drafter is None or not registry.get(spec.drafter.kind).engine.supported:
        return False  # no engine layout (model-free kinds): nothing is served beside the target
    return select_mode(spec).separate_draft_model


def draft_values(spec: SpecModel, runtime: str, values: dict[str, Any], draft_engine_dir: Path | None) -> dict:
    """Template values for the draft model's own tensorrt_llm copy: a plain (non-speculative) model that
    tensorrt_llm_bls asks for draft tokens, TensorRT-LLM's draft-target deployment."""
    v = dict(
        values,
        decoding_mode=None,
        medusa_choices=None,
        eagle_choices=None,
        max_draft_len=None,
        trtspec_drafter_kind=None,
        trtspec_tree_choices=None,
        trtspec_plugin_library=None,
        tensorrt_llm_draft_model_name=None,
    )
    if runtime == "trtllm":
        if draft_engine_dir is None:
            raise UsageError(
                "a draft-model deployment needs the draft engine's directory (--draft-engine-dir)",
                fix="pass the directory trtspec build wrote engines/draft to",
            )
        v["engine_dir"] = str(Path(draft_engine_dir).resolve())
    else:
        v.update(
            trtspec_target_dir=str(Path(spec.drafter.path).resolve()),
            trtspec_heads_dir=None,
            trtspec_also_draft=None,
            trtspec_speculative=False,
            trtspec_adaptive=False,
            trtspec_draft_len_schedule=None,
        )
    return v


def emit_repository(
    spec: SpecModel,
    runtime: str,
    out_dir: Path,
    engine_dir: Path | None = None,
    plugin_library: Path | None = None,
    options: dict | None = None,
    draft_engine_dir: Path | None = None,
) -> Path:
    """Write the Triton model repository for ``spec`` to ``out_dir`` (atomically); returns ``out_dir``.

    ``runtime`` is ``trtllm`` (needs ``engine_dir``, the engines' path as the server will see it; a
    ``plugin_library`` is copied in and preloaded by the server) or ``reference``. ``options`` overrides
    template values (see DEFAULTS), e.g. ``{"triton_max_batch_size": 16, "speculative": False}``.
    """
    if runtime not in RUNTIMES:
        raise UsageError(f"unknown runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}")
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not _is_trtspec_repo(out_dir):
        raise UsageError(
            f"{out_dir} exists and is not a trtspec model repository; refusing to replace it",
            fix="choose another --out or remove the directory",
        )
    if runtime == "trtllm" and engine_dir is None:
        raise UsageError(
            "the trtllm runtime needs the engine directory (--engine-dir)",
            fix="pass the directory trtspec build wrote the engines to",
        )
    if engine_dir is not None and not Path(engine_dir).is_absolute():
        # the backend opens gpt_model_path relative to the *server's* working directory, which is never
        # the directory emit ran in: a relative path would point nowhere
        engine_dir = Path(engine_dir).resolve()
    if runtime == "reference" and plugin_library is not None:
        raise UsageError("a plugin library only applies to the trtllm runtime")
    if runtime == "trtllm" and spec.also is not None:
        raise UsageError(
            f"--also-draft {spec.also.kind}: TensorRT-LLM 1.2.1 engines run one drafter, none of them from text",
            fix="emit --runtime reference to serve heads with a model-free drafter beside them",
        )
    if plugin_library is not None and not Path(plugin_library).is_file():
        raise CheckpointError("plugin library not found", plugin_library, "build it with `trtspec plugins build`")
    options = dict(options or {})
    expected = options.get("plugin_library_name")
    if expected and (runtime != "trtllm" or "/" in str(expected)):
        raise UsageError("plugin_library_name is a bare file name, for the trtllm runtime only")
    name = Path(plugin_library).name if plugin_library is not None else expected
    plugin_rel = f"{PLUGIN_SUBDIR}/{name}" if name else None
    values = template_values(spec, runtime, engine_dir, plugin_rel, options)
    models = {m: values for m in MODELS}
    if uses_draft_engine(spec):
        # draft-target: the BLS drives the draft model; both engines keep their KV cache between the
        # draft and verify requests (the documented setting for this mode)
        if runtime == "trtllm":
            values["enable_kv_cache_reuse"] = True
        values["tensorrt_llm_draft_model_name"] = DRAFT_MODEL
        models[DRAFT_MODEL] = draft_values(spec, runtime, values, draft_engine_dir)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        for model, model_values in models.items():
            template = "tensorrt_llm" if model == DRAFT_MODEL else model
            src, dst = TEMPLATE_DIR / template, tmp / model
            (dst / "1").mkdir(parents=True)
            text = (src / "config.pbtxt").read_text()
            if model != template:
                text = text.replace(f'name: "{template}"', f'name: "{model}"', 1)
            (dst / "config.pbtxt").write_text(fill_template(text, model_values, src / "config.pbtxt"))
            model_py = src / "1" / "model.py"
            # the engine path's tensorrt_llm is the C++ backend: no model.py (it would only confuse)
            if model_py.is_file() and not (template == "tensorrt_llm" and runtime == "trtllm"):
                shutil.copy2(model_py, dst / "1" / "model.py")
        _copy_tokenizer(spec, tmp / TOKENIZER_SUBDIR)
        if plugin_rel is not None:
            (tmp / PLUGIN_SUBDIR).mkdir(parents=True, exist_ok=True)
        if plugin_library is not None:
            shutil.copy2(plugin_library, tmp / plugin_rel)
        if runtime == "trtllm":
            from trtspec.triton.launch import write_launch_script

            write_launch_script(
                tmp,
                values["engine_dir"],
                [m for m in models if m.startswith("tensorrt_llm") and m != "tensorrt_llm_bls"],
                plugin_rel,
                models[DRAFT_MODEL]["engine_dir"] if DRAFT_MODEL in models else None,
            )
        validate_repository(tmp)
        manifest = {
            "format": 1,
            "runtime": runtime,
            "models": list(models),
            "spec": spec.describe(),
            "draft_model": DRAFT_MODEL if DRAFT_MODEL in models else None,
            "draft_engine_dir": models[DRAFT_MODEL]["engine_dir"] if DRAFT_MODEL in models else None,
            "launch": "launch.sh" if runtime == "trtllm" else None,
            "drafter_kind": values["trtspec_drafter_kind"],
            "also_draft": spec.also.kind if spec.also is not None else None,
            "decoding_mode": values["decoding_mode"],
            "tree_choices": json.loads(values["trtspec_tree_choices"] or "[]"),
            "max_draft_len": values["max_draft_len"],
            "speculative": values.get("trtspec_speculative"),
            "adaptive": values.get("trtspec_adaptive"),
            "draft_len_schedule": _schedule_dict(values.get("trtspec_draft_len_schedule")),
            "engine_dir": values["engine_dir"],
            "plugin_library": plugin_rel,
            "max_batch_size": values["triton_max_batch_size"],
            "max_seq_len": values["max_seq_len"],
            "decoupled": values["decoupled_mode"],
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        old = None
        if out_dir.exists():
            old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _schedule_dict(text: str | None) -> dict[str, int] | None:
    """The manifest's draft_len_schedule: batch-size threshold (a JSON key) -> draft depth."""
    if not text:
        return None
    return {k: int(v) for k, v in (part.split(":") for part in text.split(","))}


def read_manifest(repo: Path) -> dict:
    f = Path(repo) / MANIFEST
    if not f.is_file():
        return {}
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError:
        raise CheckpointError("not valid JSON", f) from None


def heads_reference(drafter: DrafterSpec) -> str:
    """What the served model loads a drafter from: its directory as an absolute path, or, for a model-free
    drafter selected by name (``ngram``, ``suffix:corpus.jsonl``: no directory), that address with its
    argument made absolute when it names a file, so the server resolves it from any directory."""
    path = Path(drafter.path)
    if path.exists() or not registry.get(drafter.kind).model_free:
        return str(path.resolve())
    name, sep, arg = str(path).partition(":")
    return f"{name}:{Path(arg).resolve()}" if sep and Path(arg).exists() else str(path)
