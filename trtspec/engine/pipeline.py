"""``trtspec build``: validate -> convert -> plugin library -> engines -> Triton repository -> manifest.

Everything lands in one directory, written under a temporary name and renamed at the end::

    DIR/checkpoint/            TensorRT-LLM checkpoint (config.json + rank*.safetensors; target/ + draft/
                               for a draft model)
    DIR/plan.json              the engine build plan (every trtllm-build argument)
    DIR/build_engines.sh       runs exactly that plan on a GPU machine with TensorRT-LLM 1.2.x
    DIR/model_cls/             trtspec's TensorRT-LLM model classes (modes that need the plugins)
    DIR/engines/               the engines (only when built here; never placeholders)
    DIR/triton_repo/           the Triton model repository
    DIR/manifest.json          inputs (with hashes), versions, options, outputs

Where TensorRT-LLM and a GPU are present the engines are built here through its Python build API;
otherwise the run stops after the plan and the script (``allow_no_gpu``) or refuses up front.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import platform
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtspec import __version__
from trtspec.convert.core import ConvertResult, ProgressFn, convert_into, plan_conversion
from trtspec.convert.modes import ConvertOptions
from trtspec.convert.writer import atomic_directory
from trtspec.engine import trtllm
from trtspec.engine.plan import MODEL_CLS_FILE, PLUGIN_LIBRARY_NAME, BuildPlan, EngineBuild
from trtspec.errors import UsageError
from trtspec.spec import SpecModel

MODELS_SOURCE = Path(__file__).with_name("trtllm_models.py")


@dataclass
class BuildResult:
    out: Path
    status: str  # "engines-built" | "checkpoint-only"
    message: str
    convert: ConvertResult
    plan: BuildPlan
    triton_repository: Path | None
    notes: list[str] = field(default_factory=list)


def convert_options(options: dict[str, Any]) -> ConvertOptions:
    from trtspec.convert.core import dtype_from_name

    return ConvertOptions(
        tp_size=options["tp_size"],
        pp_size=options["pp_size"],
        dtype=dtype_from_name(options.get("dtype")),
        use_parallel_embedding=options.get("use_parallel_embedding"),
        embedding_sharding_dim=options.get("embedding_sharding_dim", 0),
        max_draft_len=options.get("max_draft_len"),
        draft_tp_size=options.get("draft_tp_size"),
    )


def make_plan(result: ConvertResult, options: dict[str, Any], plugin_library: str) -> BuildPlan:
    engines = []
    for p in result.plans:
        ckpt = f"checkpoint/{p.subdir}" if p.subdir else "checkpoint"
        engines.append(
            EngineBuild(
                name=p.role,
                checkpoint_dir=ckpt,
                output_dir=f"engines/{p.role}",
                world_size=p.world_size,
                speculative_decoding_mode=p.engine_mode,
                max_draft_len=p.max_draft_len,
                max_batch_size=options["max_batch_size"],
                max_input_len=options["max_input_len"],
                max_seq_len=options["max_seq_len"],
                max_num_tokens=options.get("max_num_tokens"),
                gemm_plugin=p.config["dtype"],
                use_paged_context_fmha=True,
                gpus_per_node=options.get("gpus_per_node", 8),
                model_cls_name=p.model_cls,
            )
        )
    return BuildPlan(
        result.kind,
        engines,
        result.mode.needs_plugin,
        plugin_library,
        options={k: v for k, v in options.items() if k != "description"},
    )


def locate_plugin_library(build_if_missing: bool) -> tuple[str, str]:
    """(path for the plan, note). The plugins helper's library when it exists; on a machine that can build
    engines (TensorRT present) it is built with ``trtspec.kernels.build.build_plugins``. Never a fake file."""
    from trtspec.kernels import build as kbuild

    lib = kbuild.default_plugins_library()
    if lib.is_file():
        return str(lib), f"plugin library {lib}"
    if build_if_missing:
        res = kbuild.build_plugins(with_trt=True)
        if res.plugins_lib is not None and Path(res.plugins_lib).is_file():
            return str(res.plugins_lib), f"plugin library built: {res.plugins_lib} ({res.trt_status})"
        raise UsageError(f"the TensorRT plugin library could not be built ({res.trt_status}); see {res.log}")
    return f"plugins/{PLUGIN_LIBRARY_NAME}", (
        f"plugin library not built here (no TensorRT); on the GPU machine run `trtspec plugins build` and copy "
        f"{PLUGIN_LIBRARY_NAME} to plugins/ next to build_engines.sh, or set TRTSPEC_PLUGIN_LIBRARY"
    )


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_entries(paths: list[Path], root: Path | None = None) -> list[dict[str, Any]]:
    out = []
    for p in sorted(paths):
        if p.is_file():
            out.append(
                {
                    "path": str(p.relative_to(root)) if root else str(p),
                    "bytes": p.stat().st_size,
                    "sha256": sha256_file(p),
                }
            )
    return out


def input_entries(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    path = Path(path)
    files = [path] if path.is_file() else [p for p in path.iterdir() if p.is_file()]
    return {"path": str(path.resolve()), "files": file_entries(files, None if path.is_file() else path)}


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"trtspec": __version__, "python": platform.python_version()}
    from importlib.metadata import PackageNotFoundError, version

    for pkg in ("torch", "transformers", "safetensors", "tensorrt_llm", "tensorrt"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def emit_triton(
    spec: SpecModel, root: Path, final_root: Path, options: dict[str, Any], plan: BuildPlan, notes: list[str]
) -> Path | None:
    """The Triton repository via trtspec.triton.emit, when that module exists (it is another package's job)."""
    if importlib.util.find_spec("trtspec.triton") is None or importlib.util.find_spec("trtspec.triton.emit") is None:
        notes.append("Triton repository skipped: trtspec.triton.emit is not available in this install")
        return None
    from trtspec.triton.emit import emit_repository

    target = next(e for e in plan.engines if e.name == "target")
    # The emitter derives decoding_mode, medusa/eagle choices and max_draft_len from the spec itself.
    tr_opts = {
        "max_batch_size": options["max_batch_size"],
        "max_seq_len": options["max_seq_len"],
        "decoupled_mode": bool(options.get("decoupled", True)),
    }
    runtime = options.get("runtime", "trtllm")
    if runtime == "trtllm":
        tr_opts["kv_cache_free_gpu_mem_fraction"] = options["kv_cache_free_gpu_mem_fraction"]
    lib = None
    if plan.needs_plugin and runtime == "trtllm":
        lib = Path(plan.plugin_library) if plan.plugin_library.startswith("/") else root / plan.plugin_library
        if not lib.is_file():
            # still tell the server to preload it (by name): the engines cannot load without its creators
            notes.append(
                f"Triton repository written without the plugin library (not built here); copy "
                f"{PLUGIN_LIBRARY_NAME} to triton_repo/tensorrt_llm/1/plugins/ before serving"
            )
            tr_opts["plugin_library_name"] = lib.name
            lib = None
    # the engines' path as the server will see it: the final directory, not the temporary one
    engine_dir = final_root.resolve() / target.output_dir if runtime == "trtllm" else None
    draft = next((e for e in plan.engines if e.name == "draft"), None)
    draft_dir = final_root.resolve() / draft.output_dir if draft is not None and runtime == "trtllm" else None
    return emit_repository(spec, runtime, root / "triton_repo", engine_dir, lib, tr_opts, draft_engine_dir=draft_dir)


def check_can_build(allow_no_gpu: bool) -> tuple[bool, str]:
    """Whether engines can be built here (and why not); without --allow-no-gpu, "not" is an error.
    Called before any work so that a refused build prints nothing but the one error line."""
    can_build, why = trtllm.available()
    if not can_build and not allow_no_gpu:
        raise UsageError(
            f"cannot build engines here ({why}); pass --allow-no-gpu to write the checkpoint, the "
            "build plan and build_engines.sh for a GPU machine with TensorRT-LLM 1.2.x"
        )
    return can_build, why


def run_build(
    spec: SpecModel,
    out: str | Path,
    options: dict[str, Any],
    allow_no_gpu: bool = False,
    overwrite: bool = False,
    on_tensor: ProgressFn | None = None,
    argv: list[str] | None = None,
    inputs: dict[str, Path | None] | None = None,
) -> BuildResult:
    out = Path(out)
    opts = convert_options(options)
    mode, _ = plan_conversion(spec, opts)  # validate: refuses EAGLE-3, bad TP/PP, unsupported targets
    can_build, why = check_can_build(allow_no_gpu)
    notes: list[str] = []
    with atomic_directory(out, overwrite=overwrite) as tmp:
        (tmp / "checkpoint").mkdir()
        conv = convert_into(spec, tmp / "checkpoint", opts, on_tensor)
        plugin_library = f"plugins/{PLUGIN_LIBRARY_NAME}"
        if conv.mode.needs_plugin:
            plugin_library, note = locate_plugin_library(build_if_missing=can_build)
            notes.append(note)
        plan = make_plan(conv, options, plugin_library)
        if any(e.model_cls_name for e in plan.engines):
            (tmp / MODEL_CLS_FILE).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(MODELS_SOURCE, tmp / MODEL_CLS_FILE)
        plan_path, script_path = plan.write(tmp)
        engine_dirs: list[Path] = []
        if can_build:
            engine_dirs = trtllm.build_engines(plan, tmp)
        repo = emit_triton(spec, tmp, out, options, plan, notes)
        status = "engines-built" if engine_dirs else "checkpoint-only"
        ckpt_files = [p for p in (tmp / "checkpoint").rglob("*") if p.is_file()]
        manifest = {
            "format": "trtspec-build",
            "version": 1,
            "status": status,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": argv if argv is not None else sys.argv,
            "spec": spec.describe(),
            "inputs": {
                "target": input_entries(spec.target.path),
                "heads": input_entries(spec.drafter.path) if spec.drafter else None,
                **({k: str(v) for k, v in (inputs or {}).items() if v is not None}),
            },
            "versions": versions(),
            "options": {k: v for k, v in options.items()},
            "mode": {
                "kind": conv.kind,
                "architecture": conv.mode.architecture,
                "engine_mode": conv.mode.engine_mode,
                "needs_plugin": conv.mode.needs_plugin,
                "plugin_library": plugin_library if conv.mode.needs_plugin else None,
                "plugin": {"creator": "TrtspecRmsNormHeads", "version": "1", "namespace": "trtspec"}
                if conv.mode.needs_plugin
                else None,
            },
            "outputs": {
                "checkpoint": file_entries(ckpt_files, tmp),
                "plan": "plan.json",
                "build_script": "build_engines.sh",
                "engines": file_entries([p for d in engine_dirs for p in d.rglob("*") if p.is_file()], tmp),
                "triton_repository": "triton_repo" if repo is not None else None,
            },
            "convert": conv.summary(),
            "notes": notes,
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")
        del plan_path, script_path
    conv.out = out / "checkpoint"
    if status == "engines-built":
        message = f"engines built under {out / 'engines'} ({why}); manifest at {out / 'manifest.json'}"
    else:
        message = (
            f"no engines built here ({why}): wrote {out / 'checkpoint'}, {out / 'plan.json'} and "
            f"{out / 'build_engines.sh'} -- run that script on a GPU machine with TensorRT-LLM 1.2.x"
        )
    return BuildResult(out, status, message, conv, plan, out / "triton_repo" if repo else None, notes)
