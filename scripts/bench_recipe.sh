#!/usr/bin/env bash
# The README's recipe on SmolLM2-135M end to end, each stage timed, with the commands' defaults:
# prepare -> train-heads (default data mix:N) -> tune-tree (held-out mix-eval) -> generate --compare.
# Prints one line per stage and the speedup generate measured; the goal is the whole recipe in under
# 20 minutes on a 2-core AVX2-only CPU with a speedup > 1.
#
#   bash scripts/bench_recipe.sh                  # on this CPU as it is
#   bash scripts/bench_recipe.sh --mimic-avx2     # torch, oneDNN and MKL capped at AVX2, auto dtype float32
#   KIND=mtp-linear SAMPLES=300 OUT=/tmp/r bash scripts/bench_recipe.sh
#
# Every stage resumes (the cache shard by shard); delete OUT to measure from scratch.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--mimic-avx2" ]; then
  export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 TRTSPEC_CPU_BF16=0
fi
KIND=${KIND:-mtp-single}
SAMPLES=${SAMPLES:-400}
NODES=${NODES:-3,8,12}
OUT=${OUT:-.cache/bench_recipe}
T=.cache/smollm2
BIN=.venv/bin
mkdir -p "$OUT"
LOG=$OUT/stages.txt
: >"$LOG"

stage() { # name, command...: run it, tee its output, record its wall time
  local name=$1
  shift
  local t0
  t0=$(date +%s.%N)
  "$@" 2>&1 | tee "$OUT/$name.log" | grep -v "it/s\]" || true
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "error: stage $name failed; see $OUT/$name.log" >&2; exit 1; }
  python3 -c "import sys; print(f'{sys.argv[1]:<12} {float(sys.argv[3]) - float(sys.argv[2]):8.1f} s')" \
    "$name" "$t0" "$(date +%s.%N)" | tee -a "$LOG"
}

grep -m1 -o "model name.*" /proc/cpuinfo || true
echo "flags: $(grep -m1 -o -w 'avx2\|avx512f\|avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')" \
  "ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-unset}; nproc $(nproc)"
[ -x $BIN/trtspec ] || bash scripts/setup.sh
stage prepare $BIN/python scripts/prepare_smollm2.py
stage train-heads $BIN/trtspec train-heads -t $T --kind "$KIND" --data "mix:$SAMPLES" -o "$OUT/heads" --draft-vocab 8192
stage tune-tree $BIN/trtspec tune-tree -t $T -H "$OUT/heads" --data mix-eval --nodes "$NODES" --write-heads
stage generate $BIN/trtspec generate -t $T -H "$OUT/heads" --also-draft suffix -p "Explain how a bicycle works." --max-tokens 128 --compare
echo "--- recipe ($KIND, mix:$SAMPLES) ---"
cat "$LOG"
awk '{s += $2} END {printf "total        %8.1f s (%.1f min)\n", s, s / 60}' "$LOG"
grep -h -i "cache.*tok\|speedup\|dtype:" "$OUT"/train-heads.log "$OUT"/generate.log | grep -v "it/s\]" | tail -6 || true
