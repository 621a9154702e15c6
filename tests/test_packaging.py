"""What a base ``pip install trtspec`` must bring for ``trtspec build`` and ``trtspec triton emit``: both
validate every config.pbtxt against Triton's ModelConfig (tritonclient.grpc.model_config_pb2)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _core() -> dict[str, str]:
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    return {re.split(r"[\[<>=!~ ;]", d, maxsplit=1)[0].lower(): d for d in deps}


def test_validation_needs_only_core_dependencies():
    core = _core()
    assert "tritonclient" in core and "grpc" in core["tritonclient"]  # model_config_pb2 lives in .grpc
    assert "protobuf" in core
    # the validator imports exactly these (checked in its source, so a new import fails here)
    src = (PYPROJECT.parent / "trtspec" / "triton" / "validate.py").read_text()
    assert "from tritonclient.grpc import model_config_pb2" in src and "from google.protobuf import" in src
