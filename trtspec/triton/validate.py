"""Check a Triton model repository against Triton's own ModelConfig schema before any server sees it.

``tritonclient`` ships Triton's real ``model_config_pb2``; a strict ``text_format.Parse`` rejects unknown
fields, misspelt enums, wrong types and unquoted ``${...}`` placeholders. On top of the schema, the
cross-model checks a server would only report at load time (or never, for a mis-wired ensemble): every
ensemble step names a model of the repository and tensors that model really has.
"""

from __future__ import annotations

import re
from pathlib import Path

from trtspec.errors import CheckpointError, UsageError

PLACEHOLDER = re.compile(r"\$\{([A-Za-z0-9_]+)\}")
#: parameters the tensorrtllm backend cannot do without (model_instance_state.cc: the engine path and
#: gpt_model_type are read unconditionally)
TRTLLM_REQUIRED_PARAMETERS = ("gpt_model_path", "gpt_model_type")
#: an unset parameter as TensorRT-LLM's fill_template leaves it: the whole string_value is one placeholder
UNSET_PARAMETER = re.compile(
    r'^\s*parameters\s*:?\s*\{\s*key:\s*"[^"]+"\s*value:\s*\{\s*string_value:\s*'
    r'"\$\{[A-Za-z0-9_]+\}"\s*\}\s*\}\s*$'
)


def _proto():
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except ImportError:  # pragma: no cover - the serve extra is missing
        raise UsageError(
            "validating Triton configs needs tritonclient", fix="pip install 'tritonclient[all]'"
        ) from None
    return text_format, model_config_pb2


def parse_config(text: str, path: str | Path = "config.pbtxt"):
    """Parse one config.pbtxt strictly; unfilled placeholders and schema errors name the file and line.

    The one placeholder allowed is a whole ``parameters`` string_value: an optional parameter left unset
    the way upstream's fill_template leaves it (the tensorrtllm backend reads that text as "not set")."""
    text_format, pb = _proto()
    for lineno, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0]
        m = PLACEHOLDER.search(code)
        if m and not UNSET_PARAMETER.match(code):
            raise CheckpointError(
                f"line {lineno}: placeholder ${{{m.group(1)}}} was not filled", path, f"give a value for {m.group(1)!r}"
            )
    cfg = pb.ModelConfig()
    try:
        text_format.Parse(text, cfg)
    except text_format.ParseError as exc:
        raise CheckpointError(f"not a valid Triton ModelConfig: {exc}", path) from None
    if cfg.backend == "tensorrtllm":
        for key in TRTLLM_REQUIRED_PARAMETERS:
            value = cfg.parameters[key].string_value if key in cfg.parameters else ""
            m = PLACEHOLDER.fullmatch(value)
            if not value or m:
                raise CheckpointError(
                    f"parameter {key!r} is not set" + (f" (placeholder ${{{m.group(1)}}} was not filled)" if m else ""),
                    path,
                    "the tensorrtllm backend cannot load the model without it",
                )
    return cfg


def load_repository(repo: str | Path) -> dict:
    """Parse every ``<model>/config.pbtxt``; returns {model name: ModelConfig}."""
    repo = Path(repo)
    if not repo.is_dir():
        raise CheckpointError("model repository not found", repo)
    configs = {}
    for d in sorted(p for p in repo.iterdir() if p.is_dir() and not p.name.startswith(".")):
        f = d / "config.pbtxt"
        if not f.is_file():
            raise CheckpointError(
                "model directory has no config.pbtxt (Triton would refuse to start)",
                d,
                "remove the directory or add its config",
            )
        cfg = parse_config(f.read_text(), f)
        if cfg.name and cfg.name != d.name:
            raise CheckpointError(f"config name {cfg.name!r} differs from its directory {d.name!r}", f)
        if not any(v.is_dir() and v.name.isdigit() for v in d.iterdir()):
            raise CheckpointError("model has no version directory (e.g. 1/)", d)
        configs[d.name] = cfg
    if not configs:
        raise CheckpointError("model repository holds no models", repo)
    return configs


def validate_repository(repo: str | Path) -> dict:
    """Schema check of every model plus ensemble wiring; returns {model name: ModelConfig}."""
    configs = load_repository(repo)
    for name, cfg in configs.items():
        if cfg.platform != "ensemble":
            continue
        where = Path(repo) / name / "config.pbtxt"
        own_inputs = {i.name for i in cfg.input}
        produced: set[str] = set()
        for k, step in enumerate(cfg.ensemble_scheduling.step):
            model = configs.get(step.model_name)
            if model is None:
                raise CheckpointError(
                    f"ensemble step {k} uses model {step.model_name!r}, which the repository does not have", where
                )
            ins, outs = {i.name for i in model.input}, {o.name for o in model.output}
            for key, value in step.input_map.items():
                if key not in ins:
                    raise CheckpointError(f"step {k}: {step.model_name} has no input {key!r}", where)
                if value not in own_inputs and value not in produced:
                    raise CheckpointError(
                        f"step {k}: tensor {value!r} is neither an ensemble input nor an earlier step's output", where
                    )
            for i in model.input:
                if not i.optional and i.name not in step.input_map:
                    raise CheckpointError(
                        f"step {k}: required input {i.name!r} of {step.model_name} is not mapped", where
                    )
            for key, value in step.output_map.items():
                if key not in outs:
                    raise CheckpointError(f"step {k}: {step.model_name} has no output {key!r}", where)
                produced.add(value)
        for o in cfg.output:
            if o.name not in produced:
                raise CheckpointError(f"ensemble output {o.name!r} is produced by no step", where)
    return configs
