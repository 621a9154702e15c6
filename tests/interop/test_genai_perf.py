"""NVIDIA genai-perf 0.0.16 (``.venv-genai``) profiles a served trtspec repository as it profiles TensorRT-LLM's
inflight_batcher_llm: Triton gRPC streaming to ``ensemble``, tensorrtllm request format, through
``scripts/genai_perf.sh`` (which builds the venv; this test only runs where it exists).

A tiny Llama with the model-free ``ngram`` drafter, 2 requests at concurrency 2, 8 output tokens each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from triton_support import make_model

REPO = Path(__file__).resolve().parents[2]
GENAI_VENV = Path(os.environ.get("TRTSPEC_GENAI_VENV", REPO / ".venv-genai"))
SCRIPT = REPO / "scripts" / "genai_perf.sh"


def _genai_perf_ready() -> bool:
    pa = GENAI_VENV / "bin" / "perf_analyzer"
    if not (GENAI_VENV / "bin" / "genai-perf").is_file() or not pa.is_file():
        return False
    return subprocess.run([str(pa), "--version"], capture_output=True).returncode == 0


pytestmark = [
    pytest.mark.interop,
    pytest.mark.slow,
    pytest.mark.skipif(not _genai_perf_ready(), reason=f"no genai-perf venv at {GENAI_VENV}: scripts/genai_perf.sh"),
]


def test_genai_perf_profiles_the_ensemble(tmp_path):
    pytest.importorskip("pytriton")
    from trtspec.drafters.matching import write_settings_dir
    from trtspec.load import load_spec_model
    from trtspec.triton.emit import emit_repository

    target = make_model(tmp_path / "m")["target"]
    spec = load_spec_model(target, write_settings_dir(tmp_path / "ngram", "ngram", {}))
    repo = emit_repository(
        spec, "reference", tmp_path / "repo", options={"max_batch_size": 2, "device": "cpu", "torch_threads": 1}
    )
    art = tmp_path / "artifacts"
    trtspec = Path(sys.executable).parent / "trtspec"
    env = {**os.environ, "GENAI_VENV": str(GENAI_VENV), "ARTIFACTS": str(art), "REQUESTS": "2", "ISL": "16",
           "OSL": "8", "TRTSPEC": str(trtspec) if trtspec.is_file() else "trtspec"}  # fmt: skip
    p = subprocess.run(["bash", str(SCRIPT), str(repo), "2"], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (out,) = art.glob("ensemble-triton-tensorrtllm-concurrency2/profile_export_genai_perf.json")
    m = json.loads(out.read_text())
    assert m["request_count"]["avg"] == 2
    assert m["output_sequence_length"]["avg"] > 0 and m["time_to_first_token"]["avg"] > 0
    assert m["output_token_throughput"]["avg"] > 0
