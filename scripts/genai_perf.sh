#!/usr/bin/env bash
# Profile a served trtspec repository with NVIDIA genai-perf 0.0.16, as one profiles TensorRT-LLM's
# inflight_batcher_llm: Triton gRPC streaming to `ensemble` (or MODEL), tensorrtllm request format.
#
#   scripts/genai_perf.sh REPO [CONCURRENCY] [extra genai-perf args...]
#   e.g. trtspec triton emit --target T --heads H --runtime reference --out repo
#        nice -n 19 scripts/genai_perf.sh repo 2 --request-count 4
#
# env: MODEL (ensemble), REQUESTS (4), ISL (32), OSL (16) prompt/output tokens, TOKENIZER (the repository's
#      copy, REPO/preprocessing/1/tokenizer), ARTIFACTS (out/genai-perf), TRTSPEC (.venv/bin/trtspec, else
#      trtspec on PATH), GENAI_VENV (.venv-genai).
#
# Builds GENAI_VENV when missing. genai-perf 0.0.16 has no --service-kind flag: `--endpoint-type kserve`
# is its Triton service kind (genai_perf/config/endpoint_config.py). Its perf-analyzer dependency resolves
# to a 0.1.0 placeholder on glibc < 2.38: the real binary comes from the perf-analyzer 2.60.0 wheel
# (manylinux_2_38, needs GLIBC_2.38 and GLIBCXX_3.4.32), run there with Debian trixie's libc6/libstdc++6
# unpacked into the venv (apt-get download; the system's own libraries are not touched).
# The server runs on free 127.0.0.1 ports and is stopped on exit; the artifacts dir is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=${1:?usage: scripts/genai_perf.sh REPO [CONCURRENCY] [genai-perf args...]}
CONCURRENCY=${2:-1}
shift $(($# < 2 ? $# : 2))
VENV=$(realpath -m "${GENAI_VENV:-.venv-genai}")
ARTIFACTS=${ARTIFACTS:-out/genai-perf}
TOKENIZER=${TOKENIZER:-$REPO/preprocessing/1/tokenizer}
TRTSPEC=${TRTSPEC:-$([ -x .venv/bin/trtspec ] && echo .venv/bin/trtspec || echo trtspec)}

if [ ! -x "$VENV/bin/genai-perf" ]; then
  python3 -m venv "$VENV"
  nice -n 19 "$VENV/bin/pip" install -q genai-perf==0.0.16
fi
if ! "$VENV/bin/perf_analyzer" --version >/dev/null 2>&1; then
  if ! nice -n 19 "$VENV/bin/pip" install -q perf-analyzer==2.60.0 2>/dev/null; then
    lib=$VENV/perf_analyzer_glibc tmp=$(mktemp -d)
    nice -n 19 "$VENV/bin/pip" download -q --no-deps --only-binary=:all: --platform manylinux_2_38_x86_64 \
      perf-analyzer==2.60.0 -d "$tmp"
    mkdir -p "$lib" "$tmp/lists/partial" "$tmp/cache/archives/partial"
    unzip -q -o -j "$tmp"/perf_analyzer-*.whl perf_analyzer/bin/perf_analyzer -d "$lib"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
      >"$tmp/sources.list"
    apt=(-o "Dir::Etc::SourceList=$tmp/sources.list" -o Dir::Etc::SourceParts=/dev/null
      -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache" -o APT::Sandbox::User=root)
    nice -n 19 apt-get -qq "${apt[@]}" update
    (cd "$tmp" && nice -n 19 apt-get -qq "${apt[@]}" download libc6 libstdc++6 libgcc-s1)
    for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$lib"; done
    rm -rf "$tmp"
    # the placeholder package's console script is replaced by one that runs the binary with trixie's loader
    so=$lib/usr/lib/x86_64-linux-gnu
    printf '#!/bin/sh\nexec "%s/ld-linux-x86-64.so.2" --library-path "%s:/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu" "%s/perf_analyzer" "$@"\n' \
      "$so" "$so" "$lib" >"$VENV/bin/perf_analyzer"
    chmod +x "$VENV/bin/perf_analyzer" "$lib/perf_analyzer"
  fi
  "$VENV/bin/perf_analyzer" --version
fi

log=$(mktemp -d)
"$TRTSPEC" serve "$REPO" --http-port 0 --grpc-port 0 --metrics-port 0 --log-file "$log/tritonserver.log" \
  >"$log/serve.out" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
until grep -qs '^ready:' "$log/serve.out"; do
  kill -0 $server 2>/dev/null || { cat "$log/serve.out"; tail -20 "$log/tritonserver.log"; exit 1; }
  sleep 1
done
grpc=$(sed -n 's/^ready:.*gRPC \([0-9.:]*\).*/\1/p' "$log/serve.out")
echo "serving $REPO: gRPC $grpc (server log $log/tritonserver.log)"

PATH="$VENV/bin:$PATH" genai-perf profile -m "${MODEL:-ensemble}" --endpoint-type kserve \
  --backend tensorrtllm --streaming -u "$grpc" --tokenizer "$TOKENIZER" --concurrency "$CONCURRENCY" \
  --request-count "${REQUESTS:-4}" --num-dataset-entries "${REQUESTS:-4}" \
  --synthetic-input-tokens-mean "${ISL:-32}" --synthetic-input-tokens-stddev 0 \
  --output-tokens-mean "${OSL:-16}" --output-tokens-stddev 0 --artifact-dir "$ARTIFACTS" "$@"
echo "genai-perf artifacts: $ARTIFACTS"
