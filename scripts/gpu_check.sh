#!/usr/bin/env bash
# The GPU check of the CUDA kernels, in one go (expected about 5 minutes on an H200; each step has a time limit:
# build 240 s (a carried build/gpu_check of the same sources is reused in seconds), tests 200, benchmark 150,
# memcheck 100, racecheck 100):
#   1. build libtrtspec_kernels.so for this GPU with nvcc (or reuse a carried build/gpu_check of the same
#      sources), 2. the GPU tests (pytest -m gpu), 3. scripts/bench_kernels.py (figures + goals),
#   4. compute-sanitizer memcheck and 5. racecheck on a subset of the kernel tests.
# Runs from the repository root with PYTHONPATH=. : no install, no .venv, no network. Needs python3 with
# torch (CUDA), pytest, numpy; nvcc + cmake; compute-sanitizer for steps 4-5. Logs go to $OUT if set, else
# ./gpu_check_logs; each step prints its exit code, time and the tail of its log. Exit status 1 if any step
# failed.
#
#   bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
LOG="${OUT:-$PWD/gpu_check_logs}"
mkdir -p "$LOG"
BUILD="$PWD/build/gpu_check"
FAILED=()

step() {  # step NAME LIMIT_S CMD...: run with a time limit, log to $LOG/NAME.log, print a summary
  local name=$1 limit=$2 start rc
  shift 2
  echo "== $name (limit ${limit}s)"
  start=$(date +%s)
  timeout "$limit" "$@" >"$LOG/$name.log" 2>&1
  rc=$?
  echo "   $name: rc=$rc in $(( $(date +%s) - start ))s (log: $LOG/$name.log)"
  tail -n "${TAIL:-12}" "$LOG/$name.log" | sed 's/^/   | /'
  [ "$rc" -eq 0 ] || FAILED+=("$name(rc=$rc)")
  return "$rc"
}

echo "== device"
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/   /'
nvcc --version 2>&1 | grep -i release | sed 's/^/   /'
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' .')
ARCH=${ARCH:-90}
"$PY" -c "import torch; print('   torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())" 2>&1 | tail -n 1

# 1. build (reuse a carried build only when it was made from these very sources)
if ! step build 240 "$PY" - "$BUILD" "$ARCH" <<'EOF'
import sys
from pathlib import Path
from trtspec.kernels import build
out, arch = sys.argv[1], sys.argv[2]
info = build.read_build_info(Path(out))
lib = Path(out) / build.KERNELS_LIB
if info and lib.is_file() and info.get("sources_hash") == build.sources_hash() and arch in info.get("archs", []):
    print(f"reusing {lib} (sources {info['sources_hash']}, archs {info['archs']})")
else:
    res = build.build_plugins(out, archs=arch, with_trt=False)
    print(f"built {res.kernels_lib} for sm_{arch} in {res.seconds:.1f} s")
EOF
then
  echo "build failed: nothing else to run"
  exit 1
fi
export TRTSPEC_KERNELS_LIB="$BUILD/libtrtspec_kernels.so"

# 2. GPU tests (the CUDA backend of the kernel tests; the host-emulation half runs in CI)
TAIL=25 step gpu_tests 200 "$PY" -m pytest -q -rs -m gpu -p no:cacheprovider \
  tests/test_plugins_gpu.py tests/test_plugins_bugs.py

# 3. benchmark: figures and the issue's goals
TAIL=8 step bench 150 "$PY" scripts/bench_kernels.py --lib "$TRTSPEC_KERNELS_LIB" --json "$LOG/bench.json"

# 4-5. compute-sanitizer on a subset that reaches every kernel path (warp/block/scalar rmsnorm, head groups,
# verify on ids, logits, probabilities, multi-tile vocabularies, clusters of 1, 2 and 8)
SANITIZE=(
  "tests/test_plugins_gpu.py::test_rmsnorm_heads_matches_reference[cuda-33-256-float16]"
  "tests/test_plugins_gpu.py::test_rmsnorm_heads_matches_reference[cuda-33-2048-bfloat16]"
  "tests/test_plugins_gpu.py::test_rmsnorm_heads_matches_reference[cuda-3-100-float32]"
  "tests/test_plugins_gpu.py::test_rmsnorm_heads_unaligned_and_batched_inputs[cuda-float16]"
  "tests/test_plugins_bugs.py::test_rmsnorm_honours_every_stride[cuda-8-3-4096]"
  "tests/test_plugins_gpu.py::test_tree_verify_greedy_ids_exact[cuda-37-random64]"
  "tests/test_plugins_gpu.py::test_tree_verify_greedy_logits_exact[cuda-1003-float16]"
  "tests/test_plugins_gpu.py::test_tree_verify_sampling_probs_exact[cuda-random256]"
  "tests/test_plugins_gpu.py::test_tree_verify_sampling_duplicate_sibling_tokens[cuda]"
  "tests/test_plugins_bugs.py::test_greedy_logits_nan_rows_follow_torch_argmax[cuda-bfloat16]"
  "tests/test_plugins_bugs.py::test_clustered_verify_matches_the_reference[cuda-4099-1]"
  "tests/test_plugins_bugs.py::test_clustered_verify_matches_the_reference[cuda-4099-2]"
  "tests/test_plugins_bugs.py::test_clustered_verify_matches_the_reference[cuda-13-8]"
)
if command -v compute-sanitizer >/dev/null 2>&1; then
  for tool in memcheck racecheck; do
    TAIL=15 step "sanitizer_$tool" 100 compute-sanitizer --tool "$tool" --error-exitcode 9 \
      --log-file "$LOG/sanitizer_$tool.report" \
      "$PY" -m pytest -q -p no:cacheprovider -m gpu "${SANITIZE[@]}"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$LOG/sanitizer_$tool.report" 2>/dev/null | tail -n 2 | sed 's/^/   /'
  done
else
  echo "== sanitizers: compute-sanitizer not found"; FAILED+=("sanitizers(missing)")
fi

echo "== figures (scripts/bench_kernels.py, also $LOG/bench.json)"
grep -v "^Traceback\|^  File" "$LOG/bench.log" 2>/dev/null | tail -n 50 | sed 's/^/   /'
echo "== summary"
if [ "${#FAILED[@]}" -eq 0 ]; then
  echo "   all steps passed; logs in $LOG"
  exit 0
fi
echo "   failed: ${FAILED[*]}; logs in $LOG"
exit 1
