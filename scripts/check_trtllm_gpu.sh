#!/usr/bin/env bash
# What only a machine with NVIDIA GPUs and TensorRT-LLM 1.2.1 can check about trtspec's engine path and
# its `trtllm` Triton repository (the CPU test suite checks the rest against the recorded 1.2.1 facts).
#
# Run from the repository root, inside nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3 (TensorRT-LLM
# 1.2.1, trtllm-build, the tensorrtllm backend) with trtspec installed (`pip install -e .`):
#   scripts/check_trtllm_gpu.sh [WORKDIR]
# Exit 0 = every check passed; each failure prints "FAIL: <check>" and the script ends non-zero.
#
# Checks:
#  1. the installed TensorRT-LLM is 1.2.1 and its Python classes have the signatures the facts record
#     (EagleNet(config, logits_dtype), MedusaHead, RmsNorm, ColumnLinear, Parameter, ModuleList), and
#     trtspec/engine/trtllm_models.py imports against it;
#  2. every flag in build_engines.sh is accepted by this trtllm-build (its --help);
#  3. engines build for every kind (medusa, mtp-linear with the plugin library, eagle, mtp-single with and
#     without RMSNorm, draft-model) at tp=1 and, with >= 2 GPUs, tp=2 (mtp kinds through --model_cls_file
#     with --workers 1; the enorm inside the drafter fc survives parallel embedding at tp=2);
#  4. each engine's greedy output equals trtspec's reference runtime on the same prompt (logits dtype,
#     heads' epsilon and norms right);
#  5. the emitted `trtllm` repository loads in the real tensorrtllm backend (every parameter present, unset
#     ones left as placeholders), launch.sh starts one MPI rank per GPU, and:
#     - upstream's end_to_end_grpc_client.py with --return-perf-metrics succeeds (decoupled);
#     - a plain HTTP infer on `ensemble` of a --no-decoupled repository returns the greedy text;
#     - draft-model: tensorrt_llm_bls with num_draft_tokens returns the greedy text.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${1:-$(mktemp -d /tmp/trtspec-gpu-check.XXXXXX)}"
mkdir -p "$WORK"
FAILED=0
PROMPT="Hello there, how are"
N_TOKENS=16
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; FAILED=1; }
run() { local what="$1"; shift; if "$@" >"$WORK/log.$$" 2>&1; then pass "$what"; else fail "$what"; tail -30 "$WORK/log.$$"; fi; }

command -v trtllm-build >/dev/null || { echo "error: trtllm-build not found: run inside the TensorRT-LLM 1.2.1 image" >&2; exit 2; }
nvidia-smi -L >/dev/null 2>&1 || { echo "error: no NVIDIA GPU visible" >&2; exit 2; }
GPUS=$(nvidia-smi -L | grep -c '^GPU')
TPS="1"; [ "$GPUS" -ge 2 ] && TPS="1 2"
FACTS="${TRTSPEC_TRTLLM_FACTS:-$ROOT/../shared/facts/trtllm_1.2.json}"

# 1. version and signatures --------------------------------------------------------------------------
run "TensorRT-LLM is 1.2.1 and its signatures match the facts" python3 - "$ROOT" "$FACTS" <<'PY'
import importlib.util, inspect, json, os, sys
root, facts_path = sys.argv[1], sys.argv[2]
import tensorrt_llm
assert tensorrt_llm.__version__ == "1.2.1", tensorrt_llm.__version__
from tensorrt_llm.layers import ColumnLinear, Embedding, RmsNorm
from tensorrt_llm.models.eagle.model import EagleNet
from tensorrt_llm.models.medusa.model import MedusaHead
from tensorrt_llm.module import ModuleList
from tensorrt_llm.parameter import Parameter
params = lambda f: list(inspect.signature(f).parameters)
assert params(EagleNet.__init__)[:3] == ["self", "config", "logits_dtype"], params(EagleNet.__init__)
assert params(RmsNorm.__init__)[:4] == ["self", "normalized_shape", "num_groups", "eps"]
assert params(ColumnLinear.__init__)[:8] == ["self", "in_features", "out_features", "bias", "dtype", "tp_group",
                                             "tp_size", "gather_output"]
assert params(MedusaHead.__init__)[:7] == ["self", "num_layers", "hidden_size", "vocab_size", "hidden_act",
                                           "dtype", "mapping"]
assert params(ModuleList.__init__)[:2] == ["self", "modules"]
assert params(Parameter.__init__)[:5] == ["self", "value", "shape", "dtype", "is_buffer"]
if os.path.isfile(facts_path):
    facts = json.load(open(facts_path))
    assert facts["python_api"]["tensorrt_llm.models.eagle.model (all classes)"]["EagleNet.__init__"] == \
        "(self, config, logits_dtype)"
spec = importlib.util.spec_from_file_location("trtspec_trtllm_models", f"{root}/trtspec/engine/trtllm_models.py")
spec.loader.exec_module(importlib.util.module_from_spec(spec))
PY

# plugin library (mtp-linear engines and their server need it)
run "plugin library builds" python3 -m trtspec.cli plugins build
PLUGIN_LIB=$(python3 -c "from trtspec.kernels.build import default_plugins_library as d; print(d())")
export TRTSPEC_PLUGIN_LIBRARY="$PLUGIN_LIB"

# demo models of every kind (+ mtp-single without RMSNorm)
python3 - "$WORK/demo" <<'PY' || { echo "error: demo models" >&2; exit 2; }
import sys
from pathlib import Path
from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.demo.build import build_demo, write_mtp
paths = build_demo(sys.argv[1])
write_mtp(load_hf_causal_lm(paths["target"]), Path(sys.argv[1]) / "heads" / "mtp-single-nonorm", "mtp-single",
          has_rmsnorm=False)
PY
DEMO="$WORK/demo"

greedy_reference() {  # kind heads -> token ids of trtspec's reference runtime
  python3 - "$DEMO/target" "$1" "$2" "$PROMPT" "$N_TOKENS" <<'PY'
import sys
from trtspec.load import load_spec_model, load_tokenizer
from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator
target, kind, heads, prompt, n = sys.argv[1:6]
spec = load_spec_model(target, heads, kind if kind != "mtp-single-nonorm" else "mtp-single")
tok = load_tokenizer(spec.target)
gen = SpeculativeGenerator(spec)
out = gen.generate([tok.encode(prompt)], GenerationConfig(max_new_tokens=int(n), temperature=0.0,
                                                          eos_token_id=tok.eos_token_id, speculative=False))
print(" ".join(map(str, out.tokens[0])))
PY
}

greedy_text() {  # kind heads -> the reference runtime's greedy text (what the server must return)
  local ids; ids=$(greedy_reference "$1" "$2")
  python3 - "$DEMO/target" "$ids" <<'PY'
import sys
from transformers import AutoTokenizer
t = AutoTokenizer.from_pretrained(sys.argv[1])
print(t.decode([int(x) for x in sys.argv[2].split()], skip_special_tokens=True))
PY
}

engine_greedy() {  # engine dir [draft engine dir] -> token ids from TensorRT-LLM's C++ runtime
  python3 - "$DEMO/target" "$PROMPT" "$N_TOKENS" "$@" <<'PY'
import sys
from tensorrt_llm.runtime import ModelRunnerCpp
from transformers import AutoTokenizer
target, prompt, n, engine = sys.argv[1:5]
tok = AutoTokenizer.from_pretrained(target)
ids = tok.encode(prompt)
import torch
runner = ModelRunnerCpp.from_dir(engine_dir=engine)
out = runner.generate([torch.tensor(ids, dtype=torch.int32)], max_new_tokens=int(n), end_id=tok.eos_token_id,
                      pad_id=tok.pad_token_id or tok.eos_token_id, temperature=1.0, top_k=1,
                      return_dict=True)
seq = out["output_ids"][0][0].tolist()
length = int(out["sequence_lengths"][0][0])
print(" ".join(map(str, seq[len(ids):length])))
PY
}

# 2.-4. engines per kind -----------------------------------------------------------------------------
for tp in $TPS; do
  for kind in medusa mtp-linear eagle mtp-single mtp-single-nonorm draft-model; do
    heads="$DEMO/heads/$kind"
    fmt="$kind"; [ "$kind" = mtp-single-nonorm ] && fmt=mtp-single
    out="$WORK/build-$kind-tp$tp"
    if ! python3 -m trtspec.cli build --target "$DEMO/target" --heads "$heads" --heads-format "$fmt" \
         --tree chain:3 --config demo --tp-size "$tp" --out "$out" --allow-no-gpu --no-progress --overwrite \
         >"$WORK/build-$kind-tp$tp.log" 2>&1; then
      fail "trtspec build $kind tp=$tp"; tail -20 "$WORK/build-$kind-tp$tp.log"; continue
    fi
    run "every build_engines.sh flag is a 1.2.1 trtllm-build flag ($kind tp=$tp)" python3 - "$out/build_engines.sh" <<'PY'
import subprocess, sys
from trtspec.engine.plan import parse_script_commands
help_text = subprocess.run(["trtllm-build", "--help"], capture_output=True, text=True).stdout
for argv in parse_script_commands(open(sys.argv[1]).read()):
    for a in argv:
        assert not a.startswith("--") or a in help_text, a
PY
    run "engines build ($kind tp=$tp)" bash "$out/build_engines.sh"
    [ -f "$out/engines/target/config.json" ] || continue
    if [ "$tp" = 1 ] && [ "$kind" != draft-model ]; then
      want=$(greedy_reference "$fmt" "$heads")
      got=$(engine_greedy "$out/engines/target" 2>"$WORK/run-$kind.log")
      if [ -n "$got" ] && [ "$got" = "$want" ]; then pass "engine greedy == reference ($kind)"
      else fail "engine greedy == reference ($kind): engine [$got] reference [$want]"; tail -20 "$WORK/run-$kind.log"; fi
    fi
  done
done

# 5. Triton: the real tensorrtllm backend ------------------------------------------------------------
wait_ready() {  # port
  for _ in $(seq 1 180); do
    curl -sf "localhost:$1/v2/health/ready" >/dev/null && return 0
    sleep 2
  done
  return 1
}
serve_check() {  # name build-dir decoupled(1/0) check-command...
  local name="$1" dir="$2" dec="$3"; shift 3
  local repo="$dir/triton_repo"
  local flag="--decoupled"; [ "$dec" = 0 ] && flag="--no-decoupled"
  local fmt; fmt=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['drafter_kind'] or '')" "$repo/trtspec_repo.json")
  local emit_args=(--target "$DEMO/target" --runtime trtllm --engine-dir "$dir/engines/target" --out "$dir/repo-$dec" $flag)
  [ -n "$fmt" ] && emit_args+=(--heads "$DEMO/heads/$fmt" --heads-format "$fmt" --tree chain:3)
  [ -d "$dir/engines/draft" ] && emit_args+=(--draft-engine-dir "$dir/engines/draft")
  [ -f "$repo/tensorrt_llm/1/plugins/$(basename "$PLUGIN_LIB")" ] || true
  if ! python3 -m trtspec.cli triton emit "${emit_args[@]}" >"$WORK/emit-$name.log" 2>&1; then
    fail "emit $name"; tail -5 "$WORK/emit-$name.log"; return
  fi
  if grep -q plugins "$dir/repo-$dec/trtspec_repo.json"; then
    mkdir -p "$dir/repo-$dec/tensorrt_llm/1/plugins" && cp "$PLUGIN_LIB" "$dir/repo-$dec/tensorrt_llm/1/plugins/"
  fi
  run "launch.sh: one rank per GPU of the engine ($name)" bash -c "
    bash '$dir/repo-$dec/launch.sh' --dry-run | grep -o 'shm-region-prefix-name=prefix' | wc -l |
    grep -qx \"\$(python3 -c \"import json; print(json.load(open('$dir/engines/target/config.json'))['pretrained_config']['mapping']['world_size'])\")\""
  TRTSPEC_INSIDE=1 bash "$dir/repo-$dec/launch.sh" --http-port 18000 --grpc-port 18001 --metrics-port 18002 \
    >"$WORK/server-$name.log" 2>&1 &
  local pid=$!
  if wait_ready 18000; then
    pass "tensorrtllm backend loads the emitted repository ($name)"
    run "$name: $*" "$@"
  else
    fail "tensorrtllm backend loads the emitted repository ($name)"; tail -40 "$WORK/server-$name.log"
  fi
  kill -- "$pid" 2>/dev/null; pkill -P "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  sleep 5
}

CLIENTS=/app/inflight_batcher_llm/client
[ -d "$CLIENTS" ] || CLIENTS=/app/client
for kind in medusa mtp-linear eagle mtp-single; do
  dir="$WORK/build-$kind-tp1"
  [ -f "$dir/engines/target/config.json" ] || continue
  serve_check "$kind decoupled, end_to_end_grpc_client --return-perf-metrics" "$dir" 1 \
    python3 "$CLIENTS/end_to_end_grpc_client.py" -u localhost:18001 -p "$PROMPT" -o "$N_TOKENS" --return-perf-metrics -S
  want=$(greedy_text "$kind" "$DEMO/heads/$kind")
  serve_check "$kind not decoupled, HTTP infer on ensemble == greedy" "$dir" 0 python3 - "$PROMPT" "$N_TOKENS" "$want" <<'PY'
import sys
import numpy as np
import tritonclient.http as h
prompt, n, want = sys.argv[1], int(sys.argv[2]), sys.argv[3]
c = h.InferenceServerClient("localhost:18000")
ins = [h.InferInput("text_input", [1, 1], "BYTES"), h.InferInput("max_tokens", [1, 1], "INT32")]
ins[0].set_data_from_numpy(np.array([[prompt]], dtype=object))
ins[1].set_data_from_numpy(np.array([[n]], dtype=np.int32))
got = c.infer("ensemble", ins).as_numpy("text_output")[0].decode()
assert got == want, (got, want)
PY
done
dir="$WORK/build-draft-model-tp1"
if [ -f "$dir/engines/draft/config.json" ]; then
  want=$(greedy_text draft-model "$DEMO/heads/draft-model")
  serve_check "draft-model: BLS with num_draft_tokens == greedy" "$dir" 0 python3 - "$PROMPT" "$N_TOKENS" "$want" <<'PY'
import sys
import numpy as np
import tritonclient.http as h
prompt, n, want = sys.argv[1], int(sys.argv[2]), sys.argv[3]
c = h.InferenceServerClient("localhost:18000")
arrays = {"text_input": np.array([[prompt]], dtype=object), "max_tokens": np.array([[n]], dtype=np.int32),
          "num_draft_tokens": np.array([[3]], dtype=np.int32),
          "return_perf_metrics": np.array([[True]], dtype=bool)}
ins = []
for name, arr in arrays.items():
    t = h.InferInput(name, list(arr.shape), {object: "BYTES", np.int32: "INT32", np.bool_: "BOOL"}[arr.dtype.type])
    t.set_data_from_numpy(arr)
    ins.append(t)
res = c.infer("tensorrt_llm_bls", ins)
got = res.as_numpy("text_output")[0].decode()
assert got == want, (got, want)
assert res.as_numpy("total_draft_tokens")[0][0] > 0
PY
fi

echo
if [ "$FAILED" = 0 ]; then echo "all GPU checks passed (logs in $WORK)"; else echo "some GPU checks FAILED (logs in $WORK)"; fi
exit "$FAILED"
