#!/usr/bin/env python3
"""Conversion speed and memory: SmolLM2-135M and a synthetic ~4 GB Llama checkpoint.

Prints, per case: seconds, MB/s (bytes written), the child process's peak RSS, its RSS before the
conversion started (Python + torch + the lazy model), the largest source tensor and the model size.
Each conversion runs in its own process so that peak RSS belongs to that conversion alone.

    python scripts/prepare_smollm2.py            # once: .cache/smollm2 (HF safetensors)
    python scripts/bench_convert.py [--synthetic-gb 4] [--tp 1,2] [--work .cache/bench]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def make_synthetic(out: Path, target_gb: float) -> Path:
    """A Llama-7B-wide (h4096, i11008, GQA 32/8) fp16 checkpoint with enough layers for ~target_gb, 2 shards."""
    import torch

    from trtspec.convert.writer import PlannedTensor, StreamingSafetensorsWriter

    if (out / "config.json").exists():
        return out
    H, I, V, nh, nkv = 4096, 11008, 32000, 32, 8
    d = H // nh
    per_layer = 2 * (H * H + nkv * d * H) + 3 * H * I + 2 * H
    layers = max(1, round((target_gb * 1e9 / 2 - 2 * V * H - H) / per_layer))
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": H,
        "intermediate_size": I,
        "num_hidden_layers": layers,
        "num_attention_heads": nh,
        "num_key_value_heads": nkv,
        "vocab_size": V,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
    }
    shapes = {"model.embed_tokens.weight": (V, H)}
    for l in range(layers):
        p = f"model.layers.{l}."
        shapes.update(
            {
                p + "input_layernorm.weight": (H,),
                p + "post_attention_layernorm.weight": (H,),
                p + "self_attn.q_proj.weight": (H, H),
                p + "self_attn.k_proj.weight": (nkv * d, H),
                p + "self_attn.v_proj.weight": (nkv * d, H),
                p + "self_attn.o_proj.weight": (H, H),
                p + "mlp.gate_proj.weight": (I, H),
                p + "mlp.up_proj.weight": (I, H),
                p + "mlp.down_proj.weight": (H, I),
            }
        )
    shapes.update({"model.norm.weight": (H,), "lm_head.weight": (V, H)})
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    names = list(shapes)
    half = len(names) // 2
    index = {}
    g = torch.Generator().manual_seed(0)
    for i, chunk in enumerate((names[:half], names[half:])):
        fname = f"model-{i + 1:05d}-of-00002.safetensors"
        w = StreamingSafetensorsWriter(tmp / fname, [PlannedTensor(n, shapes[n], torch.float16) for n in chunk])
        for n in chunk:
            t = torch.randn(shapes[n], generator=g, dtype=torch.float32).mul_(0.02).to(torch.float16)
            w.write(n, t)
            index[n] = fname
        w.close()
    (tmp / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    tmp.rename(out)
    return out


def child(target: str, out: str, tp: int) -> None:
    """Runs in its own process: load lazily, convert, report."""
    from trtspec.convert.core import convert, peak_rss_bytes
    from trtspec.convert.modes import ConvertOptions
    from trtspec.load import load_spec_model

    spec = load_spec_model(target)
    before = peak_rss_bytes()
    largest = max(spec.target.tensors[n].nbytes for n in spec.target.tensors)
    r = convert(spec, out, ConvertOptions(tp_size=tp), overwrite=True)
    print(
        json.dumps(
            {
                "seconds": r.seconds,
                "written": r.written_bytes,
                "peak_rss": peak_rss_bytes(),
                "rss_before": before,
                "largest": largest,
                "model": spec.target.tensors.total_bytes(),
                "tensors": r.tensors,
            }
        )
    )


def run_case(name: str, target: Path, out: Path, tp: int) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(target), str(out), str(tp)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode:
        sys.exit(f"{name}: conversion failed:\n{proc.stderr[-2000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    shutil.rmtree(out, ignore_errors=True)
    return {"case": name, "tp": tp, **res}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--smollm2", type=Path, default=ROOT / ".cache" / "smollm2")
    ap.add_argument("--synthetic-gb", type=float, default=4.0, help="size of the synthetic checkpoint (0 = skip)")
    ap.add_argument("--tp", default="1,2,3", help="comma-separated TP sizes (those a model's heads allow)")
    ap.add_argument("--work", type=Path, default=ROOT / ".cache" / "bench")
    ap.add_argument("--keep", action="store_true", help="keep the synthetic checkpoint for the next run")
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    tps = [int(x) for x in args.tp.split(",")]
    args.work.mkdir(parents=True, exist_ok=True)
    cases = []
    if (args.smollm2 / "config.json").exists():
        cases.append(("SmolLM2-135M (fp32)", args.smollm2))
    else:
        print(f"skip SmolLM2: {args.smollm2} missing (run scripts/prepare_smollm2.py)", file=sys.stderr)
    synth = None
    if args.synthetic_gb > 0:
        t0 = time.perf_counter()
        synth = make_synthetic(args.work / f"synthetic-{args.synthetic_gb:g}gb", args.synthetic_gb)
        print(f"synthetic checkpoint ready in {time.perf_counter() - t0:.1f} s: {synth}", file=sys.stderr)
        cases.append((f"synthetic Llama {args.synthetic_gb:g} GB (fp16)", synth))
    rows = []
    for name, path in cases:
        heads = json.loads((path / "config.json").read_text())["num_attention_heads"]
        for tp in [t for t in tps if heads % t == 0] or [1]:
            rows.append(run_case(name, path, args.work / "out", tp))
            r = rows[-1]
            print(
                f"{r['case']:<30} tp{tp}: {r['seconds']:7.2f} s  {r['written'] / r['seconds'] / 1e6:7.1f} MB/s  "
                f"peak RSS {r['peak_rss'] / 2**20:7.0f} MiB (before convert {r['rss_before'] / 2**20:.0f} MiB)  "
                f"largest tensor {r['largest'] / 2**20:6.0f} MiB  model {r['model'] / 2**20:7.0f} MiB  "
                f"peak-before = {(r['peak_rss'] - r['rss_before']) / max(r['largest'], 1):.2f}x largest, "
                f"{(r['peak_rss'] - r['rss_before']) / max(r['model'], 1):.3f}x model",
                flush=True,
            )
    print(json.dumps(rows, indent=1))
    if synth is not None and not args.keep:
        shutil.rmtree(synth, ignore_errors=True)


if __name__ == "__main__":
    main()
