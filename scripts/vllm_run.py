"""Run vLLM's offline engine once and write what it produced as JSON (run with .venv-vllm's python).

    .venv-vllm/bin/python scripts/vllm_run.py REQUEST.json RESULT.json

REQUEST: {"model": dir, "speculative_config": {...} | null, "prompts": [[token ids]], "max_tokens": n,
"max_model_len": n, "sequential": bool}. RESULT: {"tokens": [[ids]], "spec": {metric name: value},
"init_s", "generate_s"}. Greedy (temperature 0), float32, eager: the settings the reference runtime is
compared under (tests/interop, scripts/bench_peers.py). ``sequential`` sends one prompt at a time (batch 1,
the latency setting); otherwise all at once. vLLM starts worker processes, hence the ``__main__`` guard.
"""

import json
import sys
import time


def spec_counters(llm) -> dict:
    """vLLM's spec-decode counters so far: {name: value} (per-position vectors as lists)."""
    out = {}
    for m in llm.get_metrics():
        if "spec_decode" in m.name:
            out[m.name] = list(m.values) if hasattr(m, "values") else m.value
    return out


def _minus(now, before):
    if before is None:
        return now
    if isinstance(now, list):
        return [a - b for a, b in zip(now, before)]
    return now - before


def main() -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    req = json.loads(open(sys.argv[1]).read())
    t0 = time.perf_counter()
    llm = LLM(
        model=req["model"],
        speculative_config=req.get("speculative_config"),
        dtype="float32",
        enforce_eager=True,
        max_model_len=req.get("max_model_len", 512),
        max_num_seqs=1 if req.get("sequential") else len(req["prompts"]),
        seed=0,
        disable_log_stats=False,
    )
    t1 = t_init = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=req["max_tokens"], ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in req["prompts"]]
    warm: dict = {}
    if req.get("sequential"):
        llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)  # warm-up
        warm = spec_counters(llm)
        t1 = time.perf_counter()
        outs = [o for p in prompts for o in llm.generate([p], params, use_tqdm=False)]
    else:
        outs = llm.generate(prompts, params, use_tqdm=False)
    t2 = time.perf_counter()
    spec = {k: _minus(v, warm.get(k)) for k, v in spec_counters(llm).items()}
    result = {
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "spec": spec,
        "init_s": t_init - t0,
        "generate_s": t2 - t1,
    }
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
