"""Shared fixtures: the demo models are built once per test session (real files in a temp dir)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SMOLLM2 = REPO / ".cache" / "smollm2"


@pytest.fixture(scope="session")
def demo_paths(tmp_path_factory) -> dict[str, Path]:
    from trtspec.demo.build import build_demo

    return build_demo(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="session")
def smollm2() -> Path:
    if not (SMOLLM2 / "model.safetensors").is_file():
        pytest.skip(f"SmolLM2 cache missing at {SMOLLM2}: run scripts/prepare_smollm2.py (CI does)")
    return SMOLLM2
