#!/usr/bin/env python
"""Peer benchmark on SmolLM2-135M (CPU): the same prompts, greedy, batch 1, one run of each system.

Systems: trtspec's reference runtime plain and with trained heads (EAGLE or EAGLE-3, a chain of ``--k``
drafts); vLLM's CPU build plain, with its n-gram proposer, and with the same heads as exported by
``trtspec export --format eagle|eagle3``; Hugging Face ``generate`` plain and with prompt lookup decoding. Prints a table
(tokens/s, speedup over the same runtime's plain run, accepted drafts per step, whether the output is the
plain greedy output) and writes ``<out>/results.json`` and ``<out>/peers.png`` (a bar chart).

The heads come from ``--heads`` (EAGLE or EAGLE-3, detected), or EAGLE heads are trained here first with ``trtspec train-heads`` (a short
run: the point is the comparison, not the heads). vLLM runs from ``.venv-vllm``
(``scripts/setup_vllm.sh``), each configuration in its own process (``scripts/vllm_run.py``).

    python scripts/bench_peers.py                          # train heads, then all systems
    python scripts/bench_peers.py --heads DIR --prompts 4 --new-tokens 48
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"

import torch


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, default=ROOT / ".cache" / "smollm2")
    ap.add_argument("--heads", type=Path, default=None, help="trained EAGLE or EAGLE-3 heads (default: train EAGLE)")
    ap.add_argument("--out", type=Path, default=ROOT / ".cache" / "bench_peers")
    ap.add_argument("--prompts", type=int, default=6, help="held-out prompts, alternately chat and code")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=3, help="draft tokens per step (every speculative system)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--train-steps", type=int, default=80)
    ap.add_argument("--train-samples", type=int, default=48)
    ap.add_argument("--systems", default="all", help="comma-separated subset of the system names, or all")
    return ap.parse_args()


def prompts(target: Path, n: int) -> list[list[int]]:
    from trtspec.checkpoint.target import load_hf_causal_lm
    from trtspec.load import load_tokenizer
    from trtspec.train.corpora import source_samples
    from trtspec.train.data import encode_prompt

    tok = load_tokenizer(load_hf_causal_lm(target))
    chat, code = source_samples("chat", True), source_samples("code", True)
    picked = [s for pair in zip(chat, code) for s in pair][:n]
    return [encode_prompt(tok, s)[-384:] for s in picked]


def train_heads(args) -> Path:
    out = args.out / "heads-eagle"
    if (out / "config.json").is_file():
        return out
    cmd = [sys.executable, "-m", "trtspec.cli", "train-heads", "-t", str(args.target), "-k", "eagle",
           "-d", f"mix:{args.train_samples}", "-o", str(out), "--steps", str(args.train_steps),
           "--gen-tokens", "64", "--cache-batch", "16", "--lm-dtype", "float32", "--cache-dtype", "float32",
           "--batch-tokens", "1024"]  # fmt: skip
    print("training EAGLE heads:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return out


def trtspec_run(args, heads: Path | None, ids: list[list[int]]) -> dict:
    from trtspec.load import load_spec_model
    from trtspec.runtime.generate import GenerationConfig, SpecMetrics, SpeculativeGenerator

    chain = [[0] * d for d in range(1, args.k + 1)]
    gen = SpeculativeGenerator(load_spec_model(args.target, heads, tree=chain if heads else None, dtype="float32"))
    cfg = GenerationConfig(max_new_tokens=args.new_tokens)
    gen.generate(ids[:1], GenerationConfig(max_new_tokens=2))  # warm-up
    tokens, m, t0 = [], SpecMetrics(), time.perf_counter()
    for p in ids:
        r = gen.generate([p], cfg)
        tokens.append(r.tokens[0])
        m = m.merge(r.metrics)
    wall = time.perf_counter() - t0
    acc = m.accepted_draft_tokens / m.sequence_steps if heads else None
    return {"tokens": tokens, "wall_s": wall, "accepted_per_step": acc}


def hf_run(args, ids: list[list[int]], lookup: bool) -> dict:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    kw = {"prompt_lookup_num_tokens": args.k} if lookup else {}
    tokens, t0 = [], None
    with torch.no_grad():
        model.generate(torch.tensor([ids[0]]), max_new_tokens=2, do_sample=False)  # warm-up
        t0 = time.perf_counter()
        for p in ids:
            out = model.generate(torch.tensor([p]), max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                 do_sample=False, **kw)  # fmt: skip
            tokens.append(out[0, len(p) :].tolist())
    return {"tokens": tokens, "wall_s": time.perf_counter() - t0, "accepted_per_step": None}


def vllm_run(args, name: str, spec: dict | None, ids: list[list[int]]) -> dict:
    req, res = args.out / f"vllm-{name}.request.json", args.out / f"vllm-{name}.result.json"
    req.write_text(json.dumps({"model": str(args.target), "speculative_config": spec, "prompts": ids,
                               "max_tokens": args.new_tokens, "max_model_len": 1024, "sequential": True}))  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}"}
    env.pop("PYTHONPATH", None)
    with open(args.out / f"vllm-{name}.log", "w") as log:
        subprocess.run([str(VLLM_PY), str(ROOT / "scripts" / "vllm_run.py"), str(req), str(res)],
                       check=True, env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    r = json.loads(res.read_text())
    s = r["spec"]
    drafts = s.get("vllm:spec_decode_num_drafts")
    acc = s["vllm:spec_decode_num_accepted_tokens"] / drafts if drafts else None
    return {"tokens": r["tokens"], "wall_s": r["generate_s"], "accepted_per_step": acc, "init_s": r["init_s"]}


def chart(rows: list[dict], path: Path) -> None:
    """A bar chart of tokens/s per system, drawn with Pillow from the vLLM venv (no plotting library here)."""
    code = r"""
import json, sys
from PIL import Image, ImageDraw
rows = json.loads(sys.argv[1]); W, bar, gap, left = 900, 34, 14, 330
H = 70 + len(rows) * (bar + gap)
img = Image.new("RGB", (W, H), "white"); d = ImageDraw.Draw(img)
top = max(r["tokens_per_s"] for r in rows) or 1.0
d.text((10, 10), "SmolLM2-135M on CPU, greedy, batch 1: generated tokens/s (same prompts)", fill="black")
colors = {"trtspec": (46, 110, 180), "vLLM": (200, 90, 40), "HF": (80, 150, 80)}
for i, r in enumerate(rows):
    y = 45 + i * (bar + gap)
    w = int((W - left - 120) * r["tokens_per_s"] / top)
    d.rectangle([left, y, left + max(w, 1), y + bar], fill=colors[r["system"].split()[0]])
    d.text((10, y + bar // 3), r["system"], fill="black")
    acc = "" if r["accepted_per_step"] is None else f"  acc/step {r['accepted_per_step']:.2f}"
    d.text((left + w + 6, y + bar // 3), f"{r['tokens_per_s']:.1f}{acc}", fill="black")
img.save(sys.argv[2])
"""
    subprocess.run([str(VLLM_PY), "-c", code, json.dumps(rows), str(path)], check=True)


def main() -> None:
    args = parse()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    from trtspec.drafters import registry
    from trtspec.export import export_draft

    heads = args.heads or train_heads(args)
    method = registry.detect(heads)  # eagle / eagle3: the kind, its export format and vLLM's method agree
    if method not in ("eagle", "eagle3"):
        sys.exit(f"error: {heads} holds {method} heads; vLLM's CPU bench here takes eagle or eagle3 heads")
    exported = export_draft(heads, args.target, method, args.out / f"export-{method}", overwrite=True)
    label = {"eagle": "EAGLE", "eagle3": "EAGLE-3"}[method]
    ids = prompts(args.target, args.prompts)
    k = args.k
    systems = {
        "trtspec plain": lambda: trtspec_run(args, None, ids),
        f"trtspec {label} k={k}": lambda: trtspec_run(args, heads, ids),
        "vLLM plain": lambda: vllm_run(args, "plain", None, ids),
        f"vLLM ngram k={k}": lambda: vllm_run(
            args, "ngram", {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4}, ids
        ),
        f"vLLM {label} (trtspec export) k={k}": lambda: vllm_run(
            args, method, {"method": method, "model": str(exported), "num_speculative_tokens": k}, ids
        ),
        "HF plain": lambda: hf_run(args, ids, lookup=False),
        f"HF prompt lookup k={k}": lambda: hf_run(args, ids, lookup=True),
    }
    wanted = None if args.systems == "all" else {s.strip() for s in args.systems.split(",")}
    results = {}
    for name, run in systems.items():
        if wanted and not any(name.startswith(w) for w in wanted):
            continue
        print(f"running {name} ...", flush=True)
        results[name] = run()
    rows = []
    for name, r in results.items():
        plain = results.get(name.split()[0] + " plain")
        n = sum(len(t) for t in r["tokens"])
        tps = n / r["wall_s"]
        rows.append({
            "system": name, "tokens": n, "wall_s": round(r["wall_s"], 2), "tokens_per_s": round(tps, 2),
            "speedup_vs_own_plain": round(plain["wall_s"] / r["wall_s"], 3) if plain else None,
            "accepted_per_step": r["accepted_per_step"],
            "same_as_own_plain": (r["tokens"] == plain["tokens"]) if plain else None,
            "init_s": r.get("init_s"),
        })  # fmt: skip
    ref = results.get("trtspec plain")
    print(f"\n{len(ids)} prompts x {args.new_tokens} new tokens, greedy, batch 1, {args.threads} threads\n")
    print(f"| system | tok/s | speedup vs own plain | accepted/step (k={k}) | output = own plain | = trtspec plain |")
    print("|---|---|---|---|---|---|")
    for row, (name, r) in zip(rows, results.items()):
        acc = "" if row["accepted_per_step"] is None else f"{row['accepted_per_step']:.2f}"
        same_ref = "" if ref is None else str(r["tokens"] == ref["tokens"])
        print(f"| {name} | {row['tokens_per_s']:.1f} | {row['speedup_vs_own_plain'] or ''} | {acc} | "
              f"{'' if row['same_as_own_plain'] is None else row['same_as_own_plain']} | {same_ref} |")  # fmt: skip
    (args.out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    chart(rows, args.out / "peers.png")
    print(f"\nwrote {args.out / 'results.json'} and {args.out / 'peers.png'}")


if __name__ == "__main__":
    main()
