"""The real engine build through TensorRT-LLM 1.2's Python build API, behind an import boundary.

Nothing here imports tensorrt_llm at module import time: ``available()`` says whether this machine can
build (tensorrt_llm importable, version 1.2.x, a CUDA GPU), and ``build_engines`` runs the same steps
``trtllm-build`` runs (``tensorrt_llm/commands/build.py::main`` -> ``build_model`` -> ``build`` ->
``Engine.save``) for each engine of the plan, rank by rank, with trtspec's plugin library loaded into
this process first so TensorRT's plugin registry has its creators.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import importlib.util
import os
from pathlib import Path

from trtspec.engine.plan import MODEL_CLS_FILE, TRTLLM_VERSION_PREFIX, BuildPlan, EngineBuild
from trtspec.errors import UsageError


def available() -> tuple[bool, str]:
    """(can build here, why not). Cheap: imports only when the package exists."""
    if importlib.util.find_spec("tensorrt_llm") is None:
        return False, "tensorrt_llm is not installed"
    try:
        import torch

        if not torch.cuda.is_available():
            return False, "no CUDA GPU visible"
        import tensorrt_llm  # noqa: F401  (heavy; only reached on a GPU machine)
    except Exception as exc:  # a broken install raises anything
        return False, f"tensorrt_llm does not import ({exc.__class__.__name__}: {str(exc)[:120]})"
    version = getattr(tensorrt_llm, "__version__", "?")
    if not str(version).startswith(TRTLLM_VERSION_PREFIX):
        return False, f"TensorRT-LLM {version} found, the engine path needs {TRTLLM_VERSION_PREFIX}.x"
    return True, f"TensorRT-LLM {version}"


def trtllm_version() -> str | None:
    if importlib.util.find_spec("tensorrt_llm") is None:
        return None
    try:
        from importlib.metadata import version

        return version("tensorrt_llm")
    except Exception:
        return None


def load_plugin_library(path: Path) -> None:
    """dlopen with RTLD_GLOBAL: the library's static initialisers register its creators with TensorRT."""
    if not path.is_file():
        raise UsageError(f"plugin library {path} not found; build it first (plugins/) or set TRTSPEC_PLUGIN_LIBRARY")
    ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    os.environ["TRTSPEC_PLUGIN_LIBRARY"] = str(path)


def _plugin_config(engine: EngineBuild):
    """PluginConfig exactly as trtllm-build derives it from its plugin flags."""
    from tensorrt_llm.plugin import PluginConfig, add_plugin_argument

    parser = argparse.ArgumentParser()
    add_plugin_argument(parser)
    argv = engine.argv("")
    plugin_flags = {a for a in argv if a.startswith("--")} & {
        a.option_strings[0] for a in parser._actions if a.option_strings
    }
    picked: list[str] = []
    for i, a in enumerate(argv):
        if a in plugin_flags:
            picked += [a, argv[i + 1]]
    config = PluginConfig.from_arguments(parser.parse_args(picked))
    config.validate()
    return config


def _model_cls(root: Path, engine: EngineBuild, architecture: str):
    from tensorrt_llm.models import MODEL_MAP

    if engine.model_cls_name:
        from importlib.machinery import SourceFileLoader

        module = SourceFileLoader("trtspec_trtllm_models", str(root / MODEL_CLS_FILE)).load_module()
        return getattr(module, engine.model_cls_name)
    if architecture not in MODEL_MAP:
        raise UsageError(f"TensorRT-LLM has no model class for architecture {architecture!r}")
    return MODEL_MAP[architecture]


def build_engines(plan: BuildPlan, root: Path, log_level: str = "info") -> list[Path]:
    """Build every engine of ``plan`` under ``root``; returns the engine directories."""
    import torch
    from tensorrt_llm.builder import BuildConfig, build
    from tensorrt_llm.logger import logger
    from tensorrt_llm.models import PretrainedConfig
    from tensorrt_llm.models.modeling_utils import SpeculativeDecodingMode

    logger.set_level(log_level)
    if plan.needs_plugin:
        lib = Path(os.environ.get("TRTSPEC_PLUGIN_LIBRARY") or (root / plan.plugin_library))
        load_plugin_library(lib)
    out_dirs = []
    for engine in plan.engines:
        ckpt = root / engine.checkpoint_dir
        out = root / engine.output_dir
        out.mkdir(parents=True, exist_ok=True)
        model_config = PretrainedConfig.from_json_file(str(ckpt / "config.json"))
        mode = SpeculativeDecodingMode.NONE
        if engine.speculative_decoding_mode:
            mode = SpeculativeDecodingMode.from_arguments(
                argparse.Namespace(speculative_decoding_mode=engine.speculative_decoding_mode)
            )
        fields = {
            "max_input_len": engine.max_input_len,
            "max_seq_len": engine.max_seq_len,
            "max_batch_size": engine.max_batch_size,
            "max_draft_len": engine.max_draft_len if engine.speculative_decoding_mode else 0,
            "speculative_decoding_mode": mode,
            "strongly_typed": True,
        }
        if engine.max_num_tokens:
            fields["max_num_tokens"] = engine.max_num_tokens
        build_config = BuildConfig.from_dict(fields, plugin_config=_plugin_config(engine))
        model_cls = _model_cls(root, engine, model_config.architecture)
        for rank in range(model_config.mapping.world_size):
            torch.cuda.set_device(rank % max(torch.cuda.device_count(), 1))
            rank_config = copy.deepcopy(model_config)
            rank_config.set_rank(rank)
            model = model_cls.from_checkpoint(str(ckpt), config=rank_config)
            built = build(model, build_config)
            built.save(str(out))
            del model, built
        out_dirs.append(out)
    return out_dirs
