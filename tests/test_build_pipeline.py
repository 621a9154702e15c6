"""``trtspec build`` without TensorRT-LLM: checkpoint + plan + build_engines.sh + Triton repo + manifest.

The engine build itself needs a GPU with TensorRT-LLM 1.2.x: that test is marked gpu and skipped here.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from convert_fixtures import make_spec

from trtspec.cli import main
from trtspec.engine import trtllm
from trtspec.engine.plan import TRTLLM_BUILD_FLAGS, parse_script_commands

# kind -> (expected --speculative_decoding_mode, model class or None, plugin preloaded)
MODES = {
    "medusa": ("medusa", None, False),
    "mtp-linear": ("medusa", "TrtspecMtpLinearForCausalLM", True),
    "eagle": ("eagle", None, False),
    "mtp-single": ("eagle", "TrtspecMtpSingleForCausalLM", False),
    "draft-model": ("draft_tokens_external", None, False),
}
HEADS_DIR = {
    "medusa": "medusa",
    "mtp-linear": "mtp-linear",
    "eagle": "eagle",
    "mtp-single": "mtp-single",
    "draft-model": "draft",
}

needs_no_trtllm = pytest.mark.skipif(trtllm.available()[0], reason="TensorRT-LLM + GPU present: the real build runs")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("build")
    for kind in MODES:
        make_spec(r / kind, kind)
    return r


def run_cli(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


@needs_no_trtllm
def test_refuses_without_gpu_unless_allowed(root):
    out = root / "refused"
    r = run_cli(
        "build",
        "--target",
        str(root / "medusa" / "target"),
        "--heads",
        str(root / "medusa" / "medusa"),
        "--out",
        str(out),
        "--tree",
        "chain:3",
        "--no-progress",
    )
    assert r.exit_code == 2
    assert r.output.startswith("error: cannot build engines here") and "--allow-no-gpu" in r.output
    assert "Traceback" not in r.output and not out.exists()


@needs_no_trtllm
@pytest.mark.parametrize("kind", list(MODES))
def test_plan_and_script_per_mode(root, kind):
    mode, model_cls, plugin = MODES[kind]
    base = root / kind
    out = root / f"out-{kind}"
    r = run_cli(
        "build",
        "--target",
        str(base / "target"),
        "--heads",
        str(base / HEADS_DIR[kind]),
        "--out",
        str(out),
        "--tp-size",
        "2",
        "--config",
        "demo",
        "--tree",
        "chain:3",
        "--max-batch-size",
        "3",
        "--allow-no-gpu",
        "--no-progress",
    )
    assert r.exit_code == 0, r.output
    assert r.output.strip().splitlines()[-1].startswith("no engines built here")
    assert not (out / "engines").exists()  # never placeholder engines
    script = (out / "build_engines.sh").read_text()
    subprocess.run(["bash", "-n", str(out / "build_engines.sh")], check=True)
    commands = parse_script_commands(script)
    plan = json.loads((out / "plan.json").read_text())
    assert len(commands) == len(plan["engines"]) == (2 if kind == "draft-model" else 1)
    for argv in commands:
        flags = [a for a in argv if a.startswith("--")]
        assert set(flags) <= TRTLLM_BUILD_FLAGS, set(flags) - TRTLLM_BUILD_FLAGS
        assert len(flags) == len(set(flags))
        ckpt = Path(flag(argv, "--checkpoint_dir").replace("$HERE", str(out)))
        assert (ckpt / "config.json").is_file() and (ckpt / "rank1.safetensors").is_file()
        assert flag(argv, "--max_batch_size") == "3"  # the command line beats the preset (demo: 4)
        assert flag(argv, "--max_seq_len") == "512" and flag(argv, "--gemm_plugin") == "float16"  # from the preset
    target = commands[0]
    cfg = json.loads((Path(flag(target, "--checkpoint_dir").replace("$HERE", str(out))) / "config.json").read_text())
    assert flag(target, "--speculative_decoding_mode") == mode
    want_len = 3 if kind == "draft-model" else cfg["max_draft_len"]
    assert flag(target, "--max_draft_len") == str(want_len)
    assert flag(target, "--model_cls_name") == model_cls
    if model_cls:
        assert (out / "model_cls" / "trtspec_trtllm_models.py").is_file()
        assert f"class {model_cls}(" in (out / "model_cls" / "trtspec_trtllm_models.py").read_text()
    assert ("LD_PRELOAD" in script) == plugin and ("TRTSPEC_PLUGIN_LIBRARY" in script) == plugin
    if kind == "draft-model":
        draft = commands[1]
        assert flag(draft, "--speculative_decoding_mode") is None
        assert flag(target, "--use_paged_context_fmha") == flag(draft, "--use_paged_context_fmha") == "enable"


@needs_no_trtllm
def test_manifest_hashes_and_triton_repository(root):
    base = root / "eagle"
    out = root / "manifest-eagle"
    r = run_cli(
        "build",
        "--target",
        str(base / "target"),
        "--heads",
        str(base / "eagle"),
        "--out",
        str(out),
        "--config",
        "demo",
        "--allow-no-gpu",
        "--no-progress",
    )
    assert r.exit_code == 0, r.output
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "checkpoint-only" and m["mode"]["engine_mode"] == "eagle"
    assert m["outputs"]["engines"] == []
    for entry in m["outputs"]["checkpoint"]:
        assert hashlib.sha256((out / entry["path"]).read_bytes()).hexdigest() == entry["sha256"]
    tgt = {e["path"]: e for e in m["inputs"]["target"]["files"]}
    assert (
        tgt["model.safetensors"]["sha256"]
        == hashlib.sha256((base / "target" / "model.safetensors").read_bytes()).hexdigest()
    )
    assert m["inputs"]["heads"]["files"] and m["inputs"]["preset"].endswith("demo.yaml")
    assert m["versions"]["torch"] and m["versions"]["tensorrt_llm"] is None
    assert m["options"]["max_batch_size"] == 4 and m["options"]["tree"] == "chain:4"
    if m["outputs"]["triton_repository"]:
        assert (out / "triton_repo" / "tensorrt_llm" / "config.pbtxt").is_file()
        text = (out / "triton_repo" / "tensorrt_llm" / "config.pbtxt").read_text()
        assert str((out / "engines" / "target").resolve()) in text  # where build_engines.sh puts the engine
    assert not [p for p in root.iterdir() if p.name.startswith(".manifest-eagle")]


def test_eagle3_build_is_refused_with_alternatives(root, tmp_path):
    from convert_fixtures import eagle3_spec

    from trtspec.engine import presets
    from trtspec.engine.pipeline import run_build
    from trtspec.errors import UsageError

    spec = eagle3_spec(tmp_path)
    with pytest.raises(UsageError, match="no TensorRT engine mode"):
        run_build(spec, tmp_path / "e3", presets.merge({}, {}), allow_no_gpu=True)
    assert not (tmp_path / "e3").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not trtllm.available()[0], reason=f"engine build needs it: {trtllm.available()[1]}")
def test_real_engine_build_on_gpu(root, tmp_path):
    if shutil.which("trtllm-build") is None:
        pytest.skip("trtllm-build not on PATH")
    base = root / "medusa"
    out = tmp_path / "gpu-build"
    r = run_cli(
        "build",
        "--target",
        str(base / "target"),
        "--heads",
        str(base / "medusa"),
        "--out",
        str(out),
        "--config",
        "demo",
        "--tree",
        "chain:3",
        "--no-progress",
    )
    assert r.exit_code == 0, r.output
    assert json.loads((out / "manifest.json").read_text())["outputs"]["engines"]
