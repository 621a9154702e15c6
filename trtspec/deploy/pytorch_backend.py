"""``trtspec build --backend pytorch``: a draft deployed on TensorRT-LLM's PyTorch backend.

After 1.2, TensorRT-LLM deploys through its PyTorch backend: the LLM API's ``speculative_config``, the same
keys in a ``trtllm-serve`` options YAML, and Triton's ``llmapi`` python model, whose ``model.yaml`` carries
them too. Whether and how a kind deploys there is the kind's own ``PyTorchRoute``. One directory, written
under a temporary name and renamed at the end::

    DIR/draft/                       the draft in the layout the backend's loader reads
    DIR/extra_llm_api_options.yaml   trtllm-serve serve TARGET --backend pytorch --extra_llm_api_options ...
    DIR/triton_llmapi/tensorrt_llm/  Triton llmapi model: config.pbtxt + 1/model.yaml
    DIR/launch.sh                    either server in one command (TARGET=... overrides the target path)
    DIR/manifest.json                inputs (with hashes), the speculative config and where each value came from

Field names follow TensorRT-LLM's ``tensorrt_llm/llmapi/llm_args.py``: ``max_draft_len`` is the number of
drafter steps (the depth of a chain), ``speculative_model`` the draft directory, ``draft_len_schedule``
maps batch-size thresholds to draft lengths (``{1: max_draft_len, ...}``, batch sizes above the largest
key speculate with the last value), ``max_concurrency`` turns speculation off above a batch size.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trtspec import __version__
from trtspec.deploy.llmapi_config import llmapi_config_pbtxt
from trtspec.drafters import registry
from trtspec.errors import UsageError
from trtspec.export.eagle3 import trtllm_layers_to_capture
from trtspec.fsutil import atomic_directory
from trtspec.spec import SpecModel

OPTIONS_FILE = "extra_llm_api_options.yaml"
LLMAPI_DIR = "triton_llmapi"
#: where TensorRT-LLM's Triton image keeps the llmapi python model (copied from release/1.2.1's
#: triton_backend/all_models at image build time)
LLMAPI_MODEL_IN_IMAGE = "/app/all_models/llmapi/tensorrt_llm/1"


@dataclass
class PyTorchDeployment:
    out: Path
    speculative_config: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    @property
    def message(self) -> str:
        return (
            f"wrote {self.out}: {OPTIONS_FILE} (trtllm-serve), {LLMAPI_DIR}/ (Triton llmapi), launch.sh; "
            f"run 'bash {self.out}/launch.sh' on a machine with TensorRT-LLM"
        )


def check_route(spec: SpecModel) -> None:
    """Refuse up front, with the kind's own reason, when its drafts cannot run on the PyTorch backend."""
    if spec.drafter is None:
        raise UsageError("--backend pytorch deploys a draft: pass --heads")
    route = registry.get(spec.drafter.kind).pytorch
    if not route.supported:
        raise UsageError(f"{spec.drafter.kind} heads have no TensorRT-LLM PyTorch-backend route: {route.refusal}")


def validate_schedule(max_draft_len: int, schedule: dict[int, int] | None, max_concurrency: int | None) -> None:
    """The rules llm_args.py enforces at load time, checked here so a bad YAML never reaches a GPU machine."""
    if max_draft_len < 1:
        raise UsageError(f"max_draft_len must be >= 1, got {max_draft_len}")
    if schedule is None:
        if max_concurrency is not None and max_concurrency < 1:
            raise UsageError(f"--max-concurrency must be >= 1, got {max_concurrency}")
        return
    if max_concurrency is not None:
        raise UsageError("--draft-len-schedule and --max-concurrency are mutually exclusive; pass one")
    if schedule.get(1) != max_draft_len:
        raise UsageError(
            f"--draft-len-schedule must map batch size 1 to max_draft_len ({max_draft_len}), e.g. '1:{max_draft_len},8:1'"
        )
    bad = {b: d for b, d in schedule.items() if b < 1 or d < 0 or d > max_draft_len}
    if bad:
        raise UsageError(
            f"--draft-len-schedule: batch sizes must be >= 1 and lengths 0..{max_draft_len}; bad entries {bad}"
        )


def parse_schedule(text: str | None) -> dict[int, int] | None:
    """'1:4,8:2,32:0' -> {1: 4, 8: 2, 32: 0}."""
    if not text:
        return None
    try:
        pairs = [item.split(":") for item in text.split(",") if item.strip()]
        return dict(sorted((int(b), int(d)) for b, d in pairs))
    except ValueError:
        raise UsageError(f"--draft-len-schedule {text!r}: expected 'BATCH:LEN,...', e.g. '1:4,8:2,32:0'") from None


def speculative_config(
    spec: SpecModel,
    draft_dir: Path,
    max_draft_len: int | None = None,
    draft_len_schedule: dict[int, int] | None = None,
    max_concurrency: int | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """The ``speculative_config`` mapping and a note per value that was derived rather than given."""
    assert spec.drafter is not None
    route = registry.get(spec.drafter.kind).pytorch
    notes = []
    if max_draft_len is None:
        max_draft_len = spec.tree.depth or 1
        notes.append(f"max_draft_len {max_draft_len}: the depth of the heads' tree ({spec.tree.num_nodes} nodes)")
    validate_schedule(max_draft_len, draft_len_schedule, max_concurrency)
    cfg: dict[str, Any] = {"decoding_type": route.decoding_type, "max_draft_len": max_draft_len}
    if route.draft_format is not None:
        cfg["speculative_model"] = str(draft_dir)
    serving = registry.get(spec.drafter.kind).serving_configs
    own = serving(spec.drafter, max_draft_len).get("trtllm-pytorch", {}) if serving is not None else {}
    assert own.get("decoding_type", route.decoding_type) == route.decoding_type, own
    cfg.update({k: v for k, v in own.items() if k not in cfg})  # the kind's own fields (e.g. n-gram size)
    aux = spec.drafter.config.get("aux_layers")
    if aux:  # EAGLE-3 style fused features: TensorRT-LLM counts layer outputs, the draft config layer inputs
        L = spec.target.arch.num_hidden_layers
        capture = sorted(set(trtllm_layers_to_capture([int(a) for a in aux])))
        if min(capture) < 0:
            raise UsageError(
                f"the draft reads target layer inputs {list(aux)}: TensorRT-LLM's eagle3_layers_to_capture counts "
                "layer outputs, and the input of layer 0 (the embeddings) is none; retrain with layers >= 1"
            )
        if set(capture) != {1, L // 2 - 1, L - 4}:
            cfg["eagle3_layers_to_capture"] = capture
            notes.append(f"eagle3_layers_to_capture {capture}: the draft reads target layers {list(aux)} (inputs)")
    if draft_len_schedule is not None:
        cfg["draft_len_schedule"] = draft_len_schedule
    if max_concurrency is not None:
        cfg["max_concurrency"] = max_concurrency
    return cfg, notes


def _write_draft(spec: SpecModel, dest: Path, max_draft_len: int) -> None:
    """The draft directory in the layout the backend loads: exported when the kind can be written in it,
    else the heads' own files (a Hugging Face draft model is already that layout)."""
    assert spec.drafter is not None
    kind = registry.get(spec.drafter.kind)
    fmt = kind.pytorch.draft_format
    if fmt in kind.export_formats:
        from trtspec.export.draft import export_draft

        export_draft(spec.drafter.path, spec.target.path, fmt, dest, tree=f"chain:{max_draft_len}")
        return
    if fmt not in kind.formats:  # pragma: no cover - a route names a layout its kind can produce
        raise UsageError(f"{kind.name} heads cannot be written as {fmt}, the layout the PyTorch backend loads")
    src = spec.drafter.path if spec.drafter.path.is_dir() else spec.drafter.path.parent
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns(".*"))


def _model_yaml(target: Path, spec_cfg: dict[str, Any], spec: SpecModel, max_batch_size: int, decoupled: bool) -> dict:
    return {
        "model": str(target),
        "backend": "pytorch",
        "tensor_parallel_size": spec.parallel.tp_size,
        "pipeline_parallel_size": spec.parallel.pp_size,
        "speculative_config": spec_cfg,
        "triton_config": {"max_batch_size": max_batch_size, "decoupled": decoupled},
    }


def _launch_script(target: Path) -> str:
    return f"""#!/usr/bin/env bash
# Serve {target.name} with its trtspec draft on TensorRT-LLM's PyTorch backend.
#   bash launch.sh                 OpenAI-compatible server: trtllm-serve (PORT, default 8000)
#   bash launch.sh triton          Triton with the llmapi model (in TensorRT-LLM's Triton image)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
cd "$HERE"  # speculative_model is ./draft
TARGET="${{TARGET:-{target}}}"
case "${{1:-serve}}" in
  serve)
    command -v trtllm-serve >/dev/null || {{ echo "error: trtllm-serve not found: install TensorRT-LLM (pip install tensorrt-llm) or use its container" >&2; exit 2; }}
    exec trtllm-serve serve "$TARGET" --backend pytorch --host "${{HOST:-0.0.0.0}}" --port "${{PORT:-8000}}" \\
      --extra_llm_api_options "$HERE/{OPTIONS_FILE}"
    ;;
  triton)
    SRC="${{LLMAPI_MODEL_DIR:-{LLMAPI_MODEL_IN_IMAGE}}}"
    [ -f "$SRC/model.py" ] || {{ echo "error: $SRC/model.py not found: set LLMAPI_MODEL_DIR to TensorRT-LLM's triton_backend/all_models/llmapi/tensorrt_llm/1" >&2; exit 2; }}
    cp "$SRC"/*.py "$HERE/{LLMAPI_DIR}/tensorrt_llm/1/"
    sed -i "s|^model: .*|model: $TARGET|" "$HERE/{LLMAPI_DIR}/tensorrt_llm/1/model.yaml"
    exec tritonserver --model-repository "$HERE/{LLMAPI_DIR}"
    ;;
  *) echo "error: unknown mode '$1': use 'serve' or 'triton'" >&2; exit 2 ;;
esac
"""


def write_pytorch_deployment(
    spec: SpecModel,
    out: Path,
    *,
    max_draft_len: int | None = None,
    draft_len_schedule: dict[int, int] | None = None,
    max_concurrency: int | None = None,
    max_batch_size: int = 64,
    decoupled: bool = True,
    overwrite: bool = False,
    argv: list[str] | None = None,
) -> PyTorchDeployment:
    """Write the whole deployment directory atomically (see the module docstring)."""
    check_route(spec)
    out = Path(out).absolute()
    target = spec.target.path.absolute()
    # relative to the deployment directory (launch.sh runs from there): the directory can be copied to the
    # GPU machine as a whole
    spec_cfg, notes = speculative_config(spec, Path("draft"), max_draft_len, draft_len_schedule, max_concurrency)
    with atomic_directory(out, overwrite=overwrite) as tmp:
        if "speculative_model" in spec_cfg:
            _write_draft(spec, tmp / "draft", spec_cfg["max_draft_len"])
        options = {"backend": "pytorch", "speculative_config": spec_cfg}
        (tmp / OPTIONS_FILE).write_text(yaml.safe_dump(options, sort_keys=False))
        model_dir = tmp / LLMAPI_DIR / "tensorrt_llm"
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "config.pbtxt").write_text(llmapi_config_pbtxt())
        model_yaml = _model_yaml(target, spec_cfg, spec, max_batch_size, decoupled)
        (model_dir / "1" / "model.yaml").write_text(yaml.safe_dump(model_yaml, sort_keys=False))
        launch = tmp / "launch.sh"
        launch.write_text(_launch_script(target))
        launch.chmod(0o755)
        manifest = {
            "trtspec_version": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "backend": "pytorch",
            "argv": argv or [],
            "target": str(target),
            "heads": str(spec.drafter.path),
            "kind": spec.drafter.kind,
            "speculative_config": spec_cfg,
            "derived": notes,
            "outputs": sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file()),
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return PyTorchDeployment(out, spec_cfg, notes)
