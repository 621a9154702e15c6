"""Never slower: plain vs fixed-tree vs adaptive speculation on SmolLM2-135M, per text domain, in one run.

Domains are prompts the target continues: chat (held-out chitchat conversations, chat template), code
(the Python standard library's own sources), gibberish (the Zen of Python in rot13) and random tokens.
The drafter is ``--heads`` (trained heads, any kind) or, by default, an untrained draft model made of the
target's first 4 layers: a drafter that is useless on every domain, the case adaptive speculation exists
for. Every variant decodes the same prompts batch-1 greedy, interleaved per prompt so load changes hit
all variants alike; outputs must be identical. Prints one table and the worst domain's adaptive/plain
ratio; ``--json`` writes the numbers.

    python scripts/bench_adaptive.py [--heads DIR] [--dtype auto] [--prompts 4] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import codecs
import inspect
import json
import random
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def domain_prompts(tok, n: int, seed: int = 0) -> dict[str, list[list[int]]]:
    import json as json_mod
    import this  # noqa: F401  (the Zen of Python, rot13-encoded in this.s)

    from trtspec.train.data import load_samples

    rng = random.Random(seed)
    chat = [s for s in load_samples(["chitchat:3000"], seed)[-n:]]
    chat_ids = [
        tok.apply_chat_template(
            [{"role": r, "content": c} for r, c in s.messages[:1]], add_generation_prompt=True, tokenize=True
        )
        for s in chat
    ]
    chat_ids = [c["input_ids"] if hasattr(c, "keys") else c for c in chat_ids]
    sources = [inspect.getsource(m) for m in (json_mod, codecs, inspect, random)]
    code = [tok(src[i * 800 : (i * 800) + 800])["input_ids"] for i, src in enumerate(sources[:n])]
    zen = __import__("this").s
    gibberish = [tok(zen[i * 120 : (i * 120) + 240])["input_ids"] for i in range(n)]
    rand = [[rng.randrange(100, 40000) for _ in range(48)] for _ in range(n)]
    return {"chat": chat_ids, "code": code, "gibberish": gibberish, "random": rand}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, default=ROOT / ".cache" / "smollm2")
    ap.add_argument("--heads", type=Path, default=None, help="drafter (default: the target's first 4 layers)")
    ap.add_argument("--tree", default=None, help="tree choices (default: the heads' own or trtspec's default)")
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per domain")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from trtspec.checkpoint.target import load_hf_causal_lm
    from trtspec.checkpoint.truncate import write_truncated_draft
    from trtspec.dtypes import resolve_dtype
    from trtspec.load import load_spec_model, load_tokenizer
    from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator
    from trtspec.runtime.report import table

    choice = resolve_dtype(args.dtype)
    dtype = str(choice.dtype).removeprefix("torch.")
    with tempfile.TemporaryDirectory() as tmp:
        heads = args.heads or write_truncated_draft(load_hf_causal_lm(args.target), 4, Path(tmp) / "draft")
        spec = load_spec_model(args.target, heads, tree=args.tree, dtype=dtype)
        gen = SpeculativeGenerator(spec, dtype=getattr(torch, dtype))
        tok = load_tokenizer(spec.target)
        variants = {
            "plain": GenerationConfig(max_new_tokens=args.max_tokens, speculative=False),
            "fixed": GenerationConfig(max_new_tokens=args.max_tokens),
            "adaptive": GenerationConfig(max_new_tokens=args.max_tokens, adaptive=True),
        }
        gen.generate([[1, 2, 3]], variants["fixed"])  # warm-up: packing, first allocations
        rows, out = [], {}
        for domain, prompts in domain_prompts(tok, args.prompts).items():
            acc = {v: {"tokens": 0, "wall": 0.0, "steps": 0, "spec": 0, "seq": 0, "accepted": 0} for v in variants}
            identical = True
            for p in prompts:
                ref = None
                for name, cfg in variants.items():
                    r = gen.generate([p], cfg)
                    m, a = r.metrics, acc[name]
                    a["tokens"] += m.new_tokens
                    a["wall"] += m.wall_s
                    a["steps"] += m.target_steps
                    a["spec"] += m.speculative_steps
                    a["seq"] += m.sequence_steps
                    a["accepted"] += m.accepted_draft_tokens
                    ref = ref or r.tokens
                    identical &= r.tokens == ref
            tps = {v: a["tokens"] / a["wall"] for v, a in acc.items()}
            out[domain] = {
                "tokens_per_s": tps,
                "identical": identical,
                "acceptance_length": {v: (a["accepted"] + a["seq"]) / max(a["seq"], 1) for v, a in acc.items()},
                "speculative_share": acc["adaptive"]["spec"] / max(acc["adaptive"]["steps"], 1),
            }
            rows.append(
                [
                    domain,
                    f"{tps['plain']:.1f}",
                    f"{tps['fixed']:.1f} ({tps['fixed'] / tps['plain']:.2f}x)",
                    f"{tps['adaptive']:.1f} ({tps['adaptive'] / tps['plain']:.2f}x)",
                    f"{out[domain]['acceptance_length']['fixed']:.2f}",
                    f"{out[domain]['speculative_share']:.0%}",
                    "yes" if identical else "NO",
                ]
            )
    print(
        f"target {args.target.name}, drafter {spec.drafter.kind} ({heads if args.heads else 'first 4 layers'}), "
        f"tree {spec.tree.num_nodes} nodes, dtype {dtype}, {torch.get_num_threads()} threads, "
        f"{args.prompts} prompts x {args.max_tokens} tokens per domain"
    )
    print(
        table(
            [
                "domain",
                "plain tok/s",
                "fixed tree",
                "adaptive",
                "accept len (fixed)",
                "adaptive spec steps",
                "identical",
            ],
            rows,
        )
    )
    worst = min(out, key=lambda d: out[d]["tokens_per_s"]["adaptive"] / out[d]["tokens_per_s"]["plain"])
    ratio = out[worst]["tokens_per_s"]["adaptive"] / out[worst]["tokens_per_s"]["plain"]
    print(f"worst domain for adaptive: {worst}, {ratio:.2f}x plain")
    if args.json:
        args.json.write_text(json.dumps({"domains": out, "worst": {"domain": worst, "ratio": ratio}}, indent=2) + "\n")


if __name__ == "__main__":
    main()
