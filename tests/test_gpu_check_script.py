"""scripts/check_trtllm_gpu.sh (the checks only a GPU machine with TensorRT-LLM 1.2.1 can run) stays a
valid bash script that covers each of them; it refuses cleanly where trtllm-build is missing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_trtllm_gpu.sh"


def test_script_is_valid_bash_and_covers_the_gpu_only_checks():
    assert os.access(SCRIPT, os.X_OK)
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text()
    for needle in (
        '__version__ == "1.2.1"',
        'trtllm-build", "--help',
        "build_engines.sh",
        "ModelRunnerCpp",
        "mtp-single-nonorm",
        "end_to_end_grpc_client.py",
        "--return-perf-metrics",
        "--no-decoupled",
        "num_draft_tokens",
        "launch.sh",
        "shm-region-prefix-name",
    ):
        assert needle in text, needle


def test_refuses_without_trtllm(tmp_path):
    r = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, timeout=60
    )
    assert r.returncode == 2 and r.stderr.startswith("error: trtllm-build not found")
