#!/usr/bin/env bash
# The project's test command (README and CI): set up, prepare the real SmolLM2 model, build the CUDA
# kernels (compile only: no GPU here), check lint, format and the import layers, run the whole pytest
# suite. GPU tests skip with the reason.
# TensorRT's public headers (../shared/third_party/tensorrt-10.14/include beside the checkout, or
# $TRTSPEC_TRT_INCLUDE) let the plugin library be compiled and linked too; no libnvinfer is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python scripts/prepare_smollm2.py
TRT_INCLUDE="${TRTSPEC_TRT_INCLUDE:-../shared/third_party/tensorrt-10.14/include}"
if [ -f "$TRT_INCLUDE/NvInfer.h" ]; then
  TRTSPEC_TRT_INCLUDE="$(cd "$TRT_INCLUDE" && pwd)"
  export TRTSPEC_TRT_INCLUDE
fi
if .venv/bin/trtspec plugins --help >/dev/null 2>&1; then
  .venv/bin/trtspec plugins build ${TRTSPEC_TRT_INCLUDE:+--trt-include "$TRTSPEC_TRT_INCLUDE"}
fi
# Style and architecture first: they take seconds and name the file to fix.
.venv/bin/ruff check trtspec tests scripts triton_repo
.venv/bin/ruff format --check trtspec tests scripts triton_repo
.venv/bin/lint-imports --no-cache
exec .venv/bin/python -m pytest -q -rs "$@"
