#!/usr/bin/env bash
# The project's test command (README and CI): set up, prepare the real SmolLM2 model, build the CUDA
# kernels (compile only: no GPU here), check lint, format and the import layers, run the whole pytest
# suite. GPU tests skip with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python scripts/prepare_smollm2.py
if .venv/bin/trtspec plugins --help >/dev/null 2>&1; then
  .venv/bin/trtspec plugins build
fi
# Style and architecture first: they take seconds and name the file to fix.
.venv/bin/ruff check trtspec tests scripts triton_repo
.venv/bin/ruff format --check trtspec tests scripts triton_repo
.venv/bin/lint-imports --no-cache
exec .venv/bin/python -m pytest -q -rs "$@"
