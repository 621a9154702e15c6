#!/usr/bin/env bash
# Set up and run the main job on the embedded demo: tiny target + heads of every kind, the reference
# runtime, then `trtspec build` (checkpoint, build plan, Triton repository). Usage: bash scripts/demo.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/trtspec demo --out "${1:-out/demo}"
