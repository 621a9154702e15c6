"""launch.sh and `trtspec serve` for the trtllm runtime: the image that ships TensorRT-LLM 1.2.1, and one
tritonserver rank per GPU under mpirun with the world size read from the built engine (upstream's
triton_backend/scripts/launch_triton_server.py layout). The script runs here with --dry-run."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from convert_fixtures import make_spec
from trtllm_facts import facts

from trtspec.cli import main
from trtspec.triton.emit import emit_repository
from trtspec.triton.launch import TRTLLM_IMAGE


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    root = tmp_path_factory.mktemp("launch")
    return {k: make_spec(root / k, k) for k in ("medusa", "draft-model")}


def fake_engine(path: Path, tp: int, pp: int) -> Path:
    """A built engine's config.json as trtllm-build writes it (only what launch.sh reads)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(
        json.dumps(
            {
                "version": "1.2.1",
                "pretrained_config": {"mapping": {"world_size": tp * pp, "tp_size": tp, "pp_size": pp}},
                "build_config": {"max_seq_len": 512},
            }
        )
    )
    return path


def dry_run(repo: Path, *args: str, inside: bool = True) -> list[str]:
    env = {"PATH": "/usr/bin:/bin", "TRITONSERVER": "/opt/tritonserver/bin/tritonserver"}
    if inside:
        env["TRTSPEC_INSIDE"] = "1"
    r = subprocess.run(
        ["bash", str(repo / "launch.sh"), "--dry-run", *args], capture_output=True, text=True, env=env, timeout=60
    )
    assert r.returncode == 0, r.stderr
    return shlex.split(r.stdout)


def test_image_is_the_one_that_ships_1_2_1():
    c = facts()["container"]
    assert TRTLLM_IMAGE == c["image"]
    assert any("TENSORRTLLM_VER=1.2.1" in line for e in c["evidence"] for line in e.get("lines", []))


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (2, 2), (8, 1)])
def test_one_rank_per_gpu_from_the_engine(specs, tmp_path, tp, pp):
    engine = fake_engine(tmp_path / "engines" / "target", tp, pp)
    repo = emit_repository(specs["medusa"], "trtllm", tmp_path / "repo", engine_dir=engine)
    subprocess.run(["bash", "-n", str(repo / "launch.sh")], check=True)
    argv = dry_run(repo, "--http-port", "9000")
    assert argv[:2] == ["mpirun", "--allow-run-as-root"]
    ranks = " ".join(argv[2:]).split(" : ")
    assert len(ranks) == tp * pp  # world size from the engine's config.json
    for i, rank in enumerate(ranks):
        words = rank.split()
        assert words[:3] == ["-n", "1", "/opt/tritonserver/bin/tritonserver"]
        assert f"--model-repository={repo}" in words and "--http-port=9000" in words
        assert f"--backend-config=python,shm-region-prefix-name=prefix{i}_" in words
        assert "--disable-auto-complete-config" in words
        explicit = ["--model-control-mode=explicit", "--load-model=tensorrt_llm"]
        assert all(w in words for w in explicit) == (i > 0)  # ranks > 0 are the backend's workers


def test_max_seq_len_comes_from_the_engine(specs, tmp_path):
    engine = fake_engine(tmp_path / "e", 1, 1)
    repo = emit_repository(specs["medusa"], "trtllm", tmp_path / "repo", engine_dir=engine)
    text = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert '"max_seq_len"' in text and 'string_value: "512"' in text  # not max_position_embeddings


def test_draft_target_runs_in_orchestrator_mode(specs, tmp_path):
    t, d = fake_engine(tmp_path / "engines" / "target", 2, 1), fake_engine(tmp_path / "engines" / "draft", 1, 1)
    repo = emit_repository(specs["draft-model"], "trtllm", tmp_path / "repo", engine_dir=t, draft_engine_dir=d)
    script = (repo / "launch.sh").read_text()
    assert "TRTLLM_ORCHESTRATOR=1" in script
    argv = dry_run(repo)
    assert argv.count("-n") == 1 and ":" not in argv
    assert "--pinned-memory-pool-byte-size=0" in argv and "--enable-peer-access=false" in argv
    text = (repo / "tensorrt_llm_draft" / "config.pbtxt").read_text()
    assert f'string_value: "{d}"' in text and 'name: "tensorrt_llm_draft"' in text
    bls = (repo / "tensorrt_llm_bls" / "config.pbtxt").read_text()
    assert 'key: "tensorrt_llm_draft_model_name"' in bls and '"tensorrt_llm_draft"' in bls
    with pytest.raises(Exception, match="draft engine"):
        emit_repository(specs["draft-model"], "trtllm", tmp_path / "r2", engine_dir=t)


def test_outside_the_image_it_runs_the_image(specs, tmp_path):
    engine = fake_engine(tmp_path / "e", 1, 1)
    repo = emit_repository(specs["medusa"], "trtllm", tmp_path / "repo", engine_dir=engine)
    argv = dry_run(repo, inside=False)
    assert argv[:2] == ["docker", "run"] and TRTLLM_IMAGE in argv
    assert f"{repo}:/models" in argv and f"{engine}:{engine}" in argv
    assert argv[-7:-6] == ["/models/launch.sh"] or "/models/launch.sh" in argv


def test_serve_prints_the_1_2_1_image_and_launch(specs, tmp_path):
    engine = fake_engine(tmp_path / "e", 2, 1)
    repo = emit_repository(specs["medusa"], "trtllm", tmp_path / "repo", engine_dir=engine)
    res = CliRunner().invoke(main, ["serve", str(repo)])
    assert res.exit_code == 0, res.output
    assert TRTLLM_IMAGE in res.output and "25.10" not in res.output
    assert "bash /models/launch.sh" in res.output and f"-v {engine}:{engine}" in res.output


def test_relative_engine_dir_is_made_absolute(specs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake_engine(tmp_path / "rel" / "engine", 1, 1)
    repo = emit_repository(specs["medusa"], "trtllm", tmp_path / "repo", engine_dir=Path("rel/engine"))
    text = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert f'string_value: "{tmp_path / "rel" / "engine"}"' in text


def test_emit_without_max_seq_len_is_one_clear_error(specs, tmp_path):
    res = CliRunner().invoke(
        main,
        [
            "triton",
            "emit",
            "--target",
            str(specs["medusa"].target.path),
            "--runtime",
            "trtllm",
            "--engine-dir",
            str(tmp_path / "nothing"),
            "--out",
            str(tmp_path / "r"),
        ],
    )
    assert res.exit_code == 2 and res.output.startswith("error: ") and "max_seq_len" in res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) <= 2
