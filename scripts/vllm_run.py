"""Run vLLM's offline engine once and write what it produced as JSON (run with .venv-vllm's python).

    python vllm_run.py REQUEST.json RESULT.json

REQUEST: {"model": dir, "speculative_config": {...} | null, "prompts": [[token ids]], "max_tokens": n,
"max_model_len": n}. RESULT: {"tokens": [[ids]], "spec": {metric name: value}, "init_s", "generate_s"}.
Greedy (temperature 0), float32, eager: the settings the reference runtime is compared under. vLLM starts
worker processes, hence the ``__main__`` guard.
"""

import json
import sys
import time


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
        max_num_seqs=len(req["prompts"]),
        seed=0,
        disable_log_stats=False,
    )
    t1 = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=req["max_tokens"], ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in req["prompts"]], params, use_tqdm=False)
    t2 = time.perf_counter()
    spec = {}
    for m in llm.get_metrics():
        if "spec_decode" in m.name:
            spec[m.name] = getattr(m, "values", None) if hasattr(m, "values") else m.value
    result = {
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "spec": spec,
        "init_s": t1 - t0,
        "generate_s": t2 - t1,
    }
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
