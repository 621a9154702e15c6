#!/usr/bin/env bash
# Interop check: build .venv-vllm (vLLM's CPU build, scripts/setup_vllm.sh; a no-op when present), then run
# tests/interop/ with trtspec's own venv: drafts trained and exported by trtspec must load in vLLM and
# speculate as the reference runtime does. Prints how long each part took (setup, tests).
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
bash scripts/setup_vllm.sh
t1=$(date +%s)
status=0
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" \
  .venv/bin/python -m pytest -q -rs -s -m interop tests/interop "$@" || status=$?
t2=$(date +%s)
echo "test_interop: setup $((t1 - t0)) s, tests $((t2 - t1)) s"
exit $status
