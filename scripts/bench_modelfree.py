"""Model-free drafting side by side on SmolLM2-135M: plain greedy, trtspec ngram, trtspec suffix, and
Hugging Face transformers' prompt lookup (``generate(prompt_lookup_num_tokens=k)``) with its own plain.

Two prompt sets the target continues raw (no chat template): long prose (the held-out part of
trtspec.train.corpora's prose, two chunks joined: several hundred tokens each) and code (the held-out
Python standard library part: source that repeats its own names). Every method decodes the same prompts
batch-1 greedy in the same dtype (the auto policy, trtspec.dtypes) and thread count, interleaved per
prompt so load changes hit all alike. Each method's speedup is against its own plain run (trtspec's
runtime and transformers' differ in kernels). Greedy outputs must equal their plain run's.

Mean acceptance length = tokens committed per target forward after the prefill (transformers: forwards
counted on the model). Decode tok/s leaves the prefill out (long prompts, few new tokens: the prefill
would hide the decoding speed); end-to-end tok/s keeps it. Prints one table; ``--json`` writes the numbers.

    python scripts/bench_modelfree.py [--prompts 3] [--max-tokens 64] [--draft-len 6] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def prompt_sets(tok, n: int, min_tokens: int) -> dict[str, list[list[int]]]:
    """n prose and n code prompts of at least ``min_tokens`` tokens (consecutive held-out items joined)."""
    from trtspec.train.corpora import source_samples

    out = {}
    for name in ("prose", "code"):
        items = [s.text for s in source_samples(name, evaluation=True)]
        prompts, buf = [], ""
        for text in items:
            buf = f"{buf}\n\n{text}" if buf else text
            ids = tok(buf, add_special_tokens=False)["input_ids"]
            if len(ids) >= min_tokens:
                prompts.append(ids)
                buf = ""
            if len(prompts) == n:
                break
        out[name] = prompts
    return out


class ForwardCounter:
    """Counts a transformers model's forward calls (one per target step in assisted generation) and times
    the first (the prefill), so decode speed can leave the prefill out as trtspec's metrics do."""

    def __init__(self, model):
        self.calls, self.prefill_s, self._t0 = 0, 0.0, 0.0
        model.register_forward_pre_hook(self._before)
        model.register_forward_hook(self._after)

    def _before(self, module, args):
        if self.calls == 0:
            self._t0 = time.perf_counter()
        self.calls += 1

    def _after(self, module, args, output):
        if self.calls == 1:
            self.prefill_s = time.perf_counter() - self._t0


def hf_run(model, counter: ForwardCounter, prompt: list[int], max_tokens: int, lookup: int) -> dict:
    ids = torch.tensor([prompt])
    kw = {"prompt_lookup_num_tokens": lookup} if lookup else {}
    counter.calls = 0
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=0,
            **kw,
        )
    wall = time.perf_counter() - t0
    new = out[0, len(prompt) :].tolist()
    return {
        "tokens": new,
        "wall": wall,
        "decode": wall - counter.prefill_s,
        "steps": max(counter.calls - 1, 1),
        "committed": len(new) - 1,
    }


def trtspec_run(gen, prompt: list[int], cfg) -> dict:
    r = gen.generate([prompt], cfg)
    m = r.metrics
    return {
        "tokens": r.tokens[0],
        "wall": m.wall_s,
        "decode": m.wall_s - m.prefill_s,
        "steps": max(m.sequence_steps, 1),
        "committed": m.new_tokens - 1,
        "drafted": m.draft_tokens,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, default=ROOT / ".cache" / "smollm2")
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto")
    ap.add_argument("--prompts", type=int, default=3, help="prompts per set")
    ap.add_argument("--min-prompt-tokens", type=int, default=400)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--draft-len", type=int, default=6, help="deepest draft of every method (HF: lookup tokens)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    import transformers

    from trtspec.dtypes import resolve_dtype
    from trtspec.load import load_spec_model, load_tokenizer
    from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator
    from trtspec.runtime.report import table

    transformers.utils.logging.set_verbosity_error()
    dtype = resolve_dtype(args.dtype).dtype
    k = args.draft_len
    chain = f"chain:{k}"
    suffix_tree = [[0] * d for d in range(1, k + 1)] + [[0] * d + [1] for d in range(min(3, k))] + [[1, 0]]
    gens = {
        "ngram": SpeculativeGenerator(load_spec_model(args.target, "ngram", tree=chain, dtype=dtype), dtype=dtype),
        "suffix": SpeculativeGenerator(
            load_spec_model(args.target, "suffix", tree=suffix_tree, dtype=dtype), dtype=dtype
        ),
    }
    plain_gen = gens["ngram"]  # plain decoding = the same target with speculation off
    tok = load_tokenizer(plain_gen.spec.target)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(args.target), torch_dtype=dtype).eval()
    hf.generation_config.eos_token_id = None
    counter = ForwardCounter(hf)
    plain_cfg = GenerationConfig(max_new_tokens=args.max_tokens, speculative=False)
    spec_cfg = GenerationConfig(max_new_tokens=args.max_tokens)

    methods = {
        "trtspec plain": lambda p: trtspec_run(plain_gen, p, plain_cfg),
        "trtspec ngram": lambda p: trtspec_run(gens["ngram"], p, spec_cfg),
        "trtspec suffix": lambda p: trtspec_run(gens["suffix"], p, spec_cfg),
        "hf plain": lambda p: hf_run(hf, counter, p, args.max_tokens, 0),
        "hf prompt lookup": lambda p: hf_run(hf, counter, p, args.max_tokens, k),
    }
    own_plain = {m: ("hf plain" if m.startswith("hf") else "trtspec plain") for m in methods}
    warm = tok("warm up the kernels", add_special_tokens=False)["input_ids"]
    for m, run in methods.items():
        t0 = time.perf_counter()
        run(warm)
        print(f"warm-up {m}: {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)

    sets = prompt_sets(tok, args.prompts, args.min_prompt_tokens)
    results: dict = {}
    rows = []
    for name, prompts in sets.items():
        acc = {m: {"wall": 0.0, "decode": 0.0, "steps": 0, "committed": 0, "tokens": 0} for m in methods}
        identical = {m: True for m in methods}
        for p in prompts:
            outs = {}
            for m, run in methods.items():
                r = run(p)
                print(f"{name} {len(p)} tokens, {m}: {r['wall']:.1f}s", file=sys.stderr, flush=True)
                outs[m] = r["tokens"]
                a = acc[m]
                a["wall"] += r["wall"]
                a["decode"] += r["decode"]
                a["steps"] += r["steps"]
                a["committed"] += r["committed"]
                a["tokens"] += len(r["tokens"])
            for m in methods:
                identical[m] &= outs[m] == outs[own_plain[m]]
        res = {}
        for m, a in acc.items():
            res[m] = {
                "mean_acceptance_length": a["committed"] / a["steps"],
                "tokens_per_s": a["tokens"] / a["wall"],  # end to end, the prefill included
                "decode_tokens_per_s": a["committed"] / a["decode"],  # after the prefill's first token
                "identical_to_own_plain": identical[m],
            }
        for m in methods:
            base = res[own_plain[m]]
            res[m]["speedup_vs_own_plain"] = res[m]["tokens_per_s"] / base["tokens_per_s"]
            res[m]["decode_speedup_vs_own_plain"] = res[m]["decode_tokens_per_s"] / base["decode_tokens_per_s"]
            rows.append(
                [
                    name,
                    m,
                    f"{res[m]['mean_acceptance_length']:.2f}",
                    f"{res[m]['decode_tokens_per_s']:.1f}",
                    f"{res[m]['decode_speedup_vs_own_plain']:.2f}x",
                    f"{res[m]['tokens_per_s']:.1f}",
                    f"{res[m]['speedup_vs_own_plain']:.2f}x",
                    "yes" if identical[m] else "NO",
                ]
            )
        results[name] = {"prompt_tokens": [len(p) for p in prompts], "methods": res}
    print(
        f"target {args.target.name}, dtype {str(dtype).removeprefix('torch.')}, {torch.get_num_threads()} threads, "
        f"{args.prompts} prompts x {args.max_tokens} new tokens per set, draft length {k}, transformers "
        f"{transformers.__version__}; prompt tokens: "
        + "; ".join(f"{n} {results[n]['prompt_tokens']}" for n in results)
    )
    headers = ["set", "method", "accept len", "decode tok/s", "vs own plain", "e2e tok/s", "vs own plain", "identical"]
    print(table(headers, rows))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    bad = [(n, m) for n in results for m, r in results[n]["methods"].items() if not r["identical_to_own_plain"]]
    assert not [b for b in bad if b[1].startswith("trtspec")], f"trtspec output differs from plain greedy: {bad}"
    if bad:
        print(f"note: transformers' prompt lookup differs from its own plain greedy on {bad} (its numerics)")


if __name__ == "__main__":
    main()
