"""``trtspec build --backend pytorch``: every key checked against TensorRT-LLM's recorded fields."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from click.testing import CliRunner
from deploy_docs import decoding_types, llmapi_inputs, llmapi_model_yaml_keys, llmapi_outputs, pytorch_fields

from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.cli import main
from trtspec.drafters import registry
from trtspec.load import load_drafter
from trtspec.triton.validate import parse_config

SUPPORTED = [n for n, k in registry.KINDS.items() if k.pytorch.supported]
WITH_DRAFT = [n for n in SUPPORTED if registry.get(n).pytorch.draft_format is not None]
REFUSED = [n for n, k in registry.KINDS.items() if not k.pytorch.supported]


def build(demo_paths, kind, out, *extra):
    return CliRunner().invoke(
        main,
        ["build", "-t", str(demo_paths["target"]), "--heads", str(demo_paths[kind]), "--backend", "pytorch"]
        + ["--out", str(out), *extra],
    )


@pytest.fixture(scope="module")
def deployments(demo_paths, tmp_path_factory):
    root = tmp_path_factory.mktemp("pytorch")
    outs = {}
    for kind in SUPPORTED:
        r = build(demo_paths, kind, root / kind)
        assert r.exit_code == 0, r.output
        outs[kind] = root / kind
    return outs


def test_some_kinds_deploy_and_every_refusal_says_why():
    assert SUPPORTED, "no kind declares a PyTorch-backend route"
    for name in REFUSED:
        assert registry.get(name).pytorch.refusal, f"{name}: no route and no reason"


@pytest.mark.parametrize("kind", SUPPORTED)
def test_speculative_config_uses_only_recorded_fields(deployments, kind):
    """decoding_type is a recorded literal and every other key a field of that config class (llm_args.py)."""
    options = yaml.safe_load((deployments[kind] / "extra_llm_api_options.yaml").read_text())
    assert set(options) <= {"backend", "speculative_config"}
    cfg = options["speculative_config"]
    classes = {v: k for k, v in decoding_types().items()}
    assert cfg["decoding_type"] in classes, f"{cfg['decoding_type']!r} is not a recorded decoding_type"
    unknown = set(cfg) - pytorch_fields(classes[cfg["decoding_type"]])
    assert not unknown, f"keys TensorRT-LLM would reject (extra='forbid'): {unknown}"
    assert cfg["max_draft_len"] >= 1
    # a draft directory sits in the deployment and is what the kind's loader reads back
    if registry.get(kind).pytorch.draft_format is None:
        assert "speculative_model" not in cfg and not (deployments[kind] / "draft").exists()
        return
    draft = deployments[kind] / cfg["speculative_model"]
    assert draft.is_dir() and registry.detect(draft) == kind


def test_draft_loads_back_with_the_same_tensors(deployments, demo_paths):
    tgt = load_hf_causal_lm(demo_paths["target"])
    for kind in WITH_DRAFT:
        a = load_drafter(demo_paths[kind], tgt)
        b = load_drafter(deployments[kind] / "draft", tgt)
        assert sorted(a.tensors) == sorted(b.tensors)
        for name in a.tensors:
            assert a.tensors.load(name).equal(b.tensors.load(name)), (kind, name)


@pytest.mark.parametrize("kind", SUPPORTED)
def test_llmapi_repository_matches_the_recorded_model(deployments, kind):
    model = deployments[kind] / "triton_llmapi" / "tensorrt_llm"
    cfg = parse_config((model / "config.pbtxt").read_text(), model / "config.pbtxt")  # Triton's own schema
    assert cfg.name == "tensorrt_llm" and cfg.backend == "python"
    assert cfg.max_batch_size == 0 and not cfg.HasField("model_transaction_policy"), "those live in model.yaml"
    from tritonclient.grpc import model_config_pb2 as pb

    def table(tensors):
        return {t.name: (pb.DataType.Name(t.data_type).removeprefix("TYPE_"), tuple(t.dims)) for t in tensors}

    inputs, required = llmapi_inputs()
    assert table(cfg.input) == inputs
    assert {t.name for t in cfg.input if not t.optional} == required
    assert table(cfg.output) == llmapi_outputs()
    doc = yaml.safe_load((model / "1" / "model.yaml").read_text())
    assert set(doc) - {"speculative_config"} <= llmapi_model_yaml_keys()
    assert doc["backend"] == "pytorch" and set(doc["triton_config"]) == {"max_batch_size", "decoupled"}
    options = yaml.safe_load((deployments[kind] / "extra_llm_api_options.yaml").read_text())
    assert doc["speculative_config"] == options["speculative_config"], "model.yaml carries the same config"


def test_launch_script_is_valid_and_fails_clearly_without_tensorrt_llm(deployments):
    script = deployments[SUPPORTED[0]] / "launch.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and r.stderr.startswith("error: trtllm-serve not found")
    r = subprocess.run(
        ["bash", str(script), "triton"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "LLMAPI_MODEL_DIR": "/nonexistent"},
    )
    assert r.returncode == 2 and "LLMAPI_MODEL_DIR" in r.stderr


@pytest.mark.parametrize("kind", REFUSED)
def test_kinds_without_a_route_are_refused_with_the_reason(demo_paths, tmp_path, kind):
    r = build(demo_paths, kind, tmp_path / "out")
    assert r.exit_code == 2
    assert r.output.startswith("error: ") and registry.get(kind).pytorch.refusal in r.output
    assert not (tmp_path / "out").exists()


def test_schedule_follows_the_backend_rules(demo_paths, tmp_path):
    kind = SUPPORTED[0]
    ok = build(demo_paths, kind, tmp_path / "ok", "--tree", "chain:3", "--draft-len-schedule", "1:3,4:2,16:0")
    assert ok.exit_code == 0, ok.output
    cfg = yaml.safe_load((tmp_path / "ok" / "extra_llm_api_options.yaml").read_text())["speculative_config"]
    assert cfg["max_draft_len"] == 3 and cfg["draft_len_schedule"] == {1: 3, 4: 2, 16: 0}
    for bad, why in [
        (["--draft-len-schedule", "1:2,4:1"], "batch size 1 to max_draft_len (3)"),
        (["--draft-len-schedule", "1:3,4:5"], "lengths 0..3"),
        (["--draft-len-schedule", "1:3", "--max-concurrency", "8"], "mutually exclusive"),
        (["--draft-len-schedule", "one:3"], "expected 'BATCH:LEN"),
    ]:
        r = build(demo_paths, kind, tmp_path / "bad", "--tree", "chain:3", *bad)
        assert r.exit_code == 2 and why in r.output, r.output
        assert not (tmp_path / "bad").exists()


def test_eagle3_capture_layers_are_the_drafts_layer_inputs_minus_one(deployments):
    """DEPLOY_FORMATS §0: vLLM / the draft config name layer inputs, TensorRT-LLM layer outputs."""
    kind = next(n for n in SUPPORTED if registry.get(n).pytorch.decoding_type == "Eagle3")
    cfg = yaml.safe_load((deployments[kind] / "extra_llm_api_options.yaml").read_text())["speculative_config"]
    draft = json.loads((deployments[kind] / "draft" / "config.json").read_text())
    ids = draft.get("eagle_aux_hidden_state_layer_ids") or draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert cfg["eagle3_layers_to_capture"] == sorted(a - 1 for a in ids)
