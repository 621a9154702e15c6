#!/usr/bin/env python
"""Benchmark the trtspec CUDA kernels against the PyTorch reference on the same GPU.

RmsNormHeads: achieved GB/s (bytes read + written: T*H*(1+K) + K*H elements) next to the device's
measured copy bandwidth (torch copy_ of 1 GiB, read + write). Goals (issue 18, H200): >= 80% of copy
bandwidth for every dtype at T*H >= 4M elements, and <= 3 us at T = 64, H = 4096.
TreeVerify: microseconds per call for batch 1/64/256 with a 64-node tree of depth 5 and a 128256-token
vocabulary, the logits built so that every sequence accepts 5 levels (6 visited rows): greedy on argmax
ids, greedy on fp16 logits, sampling on fp16 logits; the logits modes with the cluster size the kernel
picks ("auto") and with one CTA per sequence ("1", TRTSPEC_VERIFY_CLUSTER=1). row_GBps = visited rows'
bytes / kernel time. Goals at batch 64: greedy ids < 10 us, greedy logits <= 25 us, sampling <= 60 us.
kernel_us is device time per launch inside a CUDA graph (as in an engine); eager_call_us adds the Python
launch path; torch_us is the PyTorch reference (tensor ops, no Python loop) on the same GPU.

    python scripts/bench_kernels.py [--lib path/to/libtrtspec_kernels.so] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch


def _time_us(fn, iters: int, warmup: int = 10) -> float:
    """Mean microseconds per call over ``iters`` back-to-back calls (CUDA events)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters


def _time_graph_us(launch, per_graph: int = 50, replays: int = 20) -> float:
    """Device microseconds per launch: ``per_graph`` launches captured in one CUDA graph, replayed
    (removes Python and launch overhead, as inside an engine)."""
    launch()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_graph):
            launch()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / (replays * per_graph)


def copy_bandwidth_gbs() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = _time_us(lambda: dst.copy_(src), iters=20)
    return 2 * src.numel() / (us * 1e-6) / 1e9


def tree_of(nodes: int):
    """A deterministic tree with ``nodes`` nodes (root included): up to 4 children per node, breadth first."""
    from trtspec.tree import build_tree

    choices, frontier = [], [()]
    while len(choices) < nodes - 1:
        nxt = []
        for parent in frontier:
            for r in range(4):
                if len(choices) < nodes - 1:
                    choices.append(parent + (r,))
                    nxt.append(parent + (r,))
        frontier = nxt[:4]  # keep the tree deep: expand only the first few of each level
    return build_tree(choices)


def bench_rmsnorm(lib, copy_gbs: float) -> list[dict]:
    from trtspec.kernels import bindings, reference

    rows = []
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for tokens, hidden in ((512, 8192), (1024, 4096), (4096, 1024), (16384, 4096), (1, 4096), (64, 4096)):
            heads = 4
            x = torch.randn(tokens, hidden, device="cuda", dtype=dtype)
            w = torch.rand(heads, hidden, device="cuda", dtype=dtype) + 0.5
            launch, out = bindings.prepare_rmsnorm_heads(x, w, 1e-6, lib=lib)
            want = reference.rmsnorm_heads_reference(x, w, 1e-6)
            launch()
            atol, rtol = reference.RMSNORM_TOLERANCE[dtype]
            torch.testing.assert_close(out, want, atol=atol, rtol=rtol)  # never time a wrong kernel
            nbytes = (tokens * hidden * (1 + heads) + heads * hidden) * x.element_size()
            k_us = _time_graph_us(launch, per_graph=20 if tokens * hidden >= 1 << 22 else 200)
            r_us = _time_us(lambda: reference.rmsnorm_heads_reference(x, w, 1e-6), 20)
            gbs = nbytes / (k_us * 1e-6) / 1e9
            pct = 100 * gbs / copy_gbs
            goal = "-"
            if tokens * hidden >= 4 << 20:
                goal = "ok" if pct >= 80 else "MISS (>= 80%)"
            elif (tokens, hidden) == (64, 4096):
                goal = "ok" if k_us <= 3 else "MISS (<= 3 us)"
            rows.append(
                {
                    "dtype": str(dtype).split(".")[-1],
                    "T": tokens,
                    "H": hidden,
                    "K": heads,
                    "T*H": tokens * hidden,
                    "kernel_us": round(k_us, 2),
                    "kernel_GBps": round(gbs, 1),
                    "pct_copy_bw": round(pct, 1),
                    "torch_us": round(r_us, 2),
                    "torch_GBps": round(nbytes / (r_us * 1e-6) / 1e9, 1),
                    "speedup_vs_torch": round(r_us / k_us, 2),
                    "goal": goal,
                }
            )
    return rows


def _accepting_logits(tree, draft: torch.Tensor, vocab: int) -> torch.Tensor:
    """fp16 logits [B, N1, V] whose argmax follows the deepest path: every sequence accepts max_depth levels
    (greedy), and sampling at temperature 1 accepts them with probability ~1 (the boost is e^16)."""
    b, n1 = draft.shape
    logits = torch.randn(b, n1, vocab, device="cuda", dtype=torch.float16)
    deepest = [int(n) for n in tree.paths[int(torch.argmax((tree.paths >= 0).sum(-1)))] if n >= 0]
    for parent, child in zip(deepest, deepest[1:]):
        logits[torch.arange(b, device="cuda"), parent, draft[:, child].long()] = 16.0
    return logits


def _with_cluster(value: str | None, fn):
    """Run fn with TRTSPEC_VERIFY_CLUSTER set to value (None: the kernel's own choice)."""
    old = os.environ.pop("TRTSPEC_VERIFY_CLUSTER", None)
    if value is not None:
        os.environ["TRTSPEC_VERIFY_CLUSTER"] = value
    try:
        return fn()
    finally:
        os.environ.pop("TRTSPEC_VERIFY_CLUSTER", None)
        if old is not None:
            os.environ["TRTSPEC_VERIFY_CLUSTER"] = old


GOALS_US = {"greedy_ids": 10.0, "greedy_logits_fp16": 25.0, "sampling_logits_fp16": 60.0}


def bench_tree_verify(lib) -> list[dict]:
    from trtspec.kernels import bindings, reference

    tree = tree_of(64)
    paths = tree.paths.int().cuda()
    n1, vocab, depth = tree.size, 128256, tree.max_depth
    rows = []
    for batch in (1, 64, 256):
        gen = torch.Generator(device="cuda").manual_seed(batch)
        draft = torch.randint(0, vocab, (batch, n1), device="cuda", dtype=torch.int32, generator=gen)
        for n in range(1, n1):  # distinct sibling tokens, as top-k drafts are
            draft[:, n] = (draft[:, int(tree.parents[n])] * 31 + int(tree.ranks[n]) * 17 + 5) % vocab
        logits = _accepting_logits(tree, draft, vocab)
        ids = logits.argmax(-1).int()
        seed = torch.tensor([1, 0], dtype=torch.int64, device="cuda")
        temp = torch.full((batch,), 1.0, device="cuda")
        want = reference.tree_verify_greedy_batched(paths, draft, ids)
        assert bool((want.accepted_len == depth).all()), "the benchmark logits must accept every level"
        torch_us = _time_us(lambda: reference.tree_verify_greedy_batched(paths, draft, ids), 100)
        torch_logits_us = _time_us(
            lambda: reference.tree_verify_greedy_batched(paths, draft, logits.argmax(-1).int()), 30
        )
        cases = [
            ("greedy_ids", None, dict(target=ids)),
            ("greedy_logits_fp16", "1", dict(target=logits, target_kind="logits")),
            ("greedy_logits_fp16", None, dict(target=logits, target_kind="logits")),
            (
                "sampling_logits_fp16",
                "1",
                dict(target=logits, mode="sampling", target_kind="logits", temperature=temp, seed=seed),
            ),
            (
                "sampling_logits_fp16",
                None,
                dict(target=logits, mode="sampling", target_kind="logits", temperature=temp, seed=seed),
            ),
        ]
        for name, cluster, kw in cases:
            target = kw.pop("target")

            def run(target=target, kw=kw):
                launch, out = bindings.prepare_tree_verify(paths, draft, target, lib=lib, **kw)
                launch()
                torch.cuda.synchronize()
                if name != "sampling_logits_fp16":  # never time a wrong kernel
                    assert torch.equal(out.accepted_len, want.accepted_len) and torch.equal(out.tokens, want.tokens)
                return (
                    _time_graph_us(launch, per_graph=100),
                    _time_us(launch, 200),
                    float(out.accepted_len.float().mean()),
                )

            k_us, e_us, acc = _with_cluster(cluster, run)
            row_bytes = batch * (acc + 1) * vocab * 2 if "logits" in name else 0
            torch_ref = {"greedy_ids": torch_us, "greedy_logits_fp16": torch_logits_us}.get(name)
            goal = "-"
            if batch == 64 and cluster is None:
                goal = "ok" if k_us <= GOALS_US[name] else f"MISS (<= {GOALS_US[name]:g} us)"
            rows.append(
                {
                    "case": name,
                    "cluster": cluster or "auto",
                    "batch": batch,
                    "nodes": n1,
                    "vocab": vocab if "logits" in name else "-",
                    "accepted": round(acc, 2),
                    "kernel_us": round(k_us, 2),
                    "row_GBps": round(row_bytes / (k_us * 1e-6) / 1e9, 1) if row_bytes else "-",
                    "eager_call_us": round(e_us, 2),
                    "torch_us": round(torch_ref, 2) if torch_ref else "-",
                    "goal": goal,
                }
            )
    return rows


def _table(rows: list[dict]) -> str:
    keys = list(rows[0])
    widths = {k: max(len(k), *(len(str(r[k])) for r in rows)) for k in keys}
    lines = ["  ".join(k.ljust(widths[k]) for k in keys)]
    lines += ["  ".join(str(r[k]).ljust(widths[k]) for k in keys) for r in rows]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", help="libtrtspec_kernels.so (default: build for this GPU into the default dir)")
    ap.add_argument("--json", help="also write the numbers to this file")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(
            "bench_kernels: no CUDA GPU here (torch.cuda.is_available() is False); run it on a GPU machine",
            file=sys.stderr,
        )
        return 2
    from trtspec.kernels import bindings, build

    lib_path = args.lib
    if lib_path is None:
        major, minor = torch.cuda.get_device_capability()
        lib_path = build.build_plugins(archs=[f"{major}{minor}"], with_trt=False).kernels_lib
    lib = bindings.load_library(lib_path)
    device = torch.cuda.get_device_name()
    copy_gbs = copy_bandwidth_gbs()
    print(f"device: {device}  measured copy bandwidth: {copy_gbs:.0f} GB/s (read + write)")
    rms = bench_rmsnorm(lib, copy_gbs)
    print("\nRmsNormHeads (head-major, K = 4; goals: >= 80% of copy bandwidth at T*H >= 4M, <= 3 us at T=64 H=4096)")
    print(_table(rms))
    tv = bench_tree_verify(lib)
    print(
        "\nTreeVerify (64-node tree, depth 5, 5 levels accepted; goals at batch 64: greedy ids < 10 us, "
        "greedy logits <= 25 us, sampling <= 60 us)"
    )
    print(_table(tv))
    missed = [r for r in rms + tv if str(r.get("goal", "-")).startswith("MISS")]
    print(
        f"\ngoals: {len(missed)} missed"
        + "".join(
            f"\n  {r.get('case', 'rmsnorm_heads')} {r.get('dtype', '')} T={r.get('T', '')} H={r.get('H', '')} "
            f"batch={r.get('batch', '')}: {r['kernel_us']} us {r['goal']}"
            for r in missed
        )
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "copy_GBps": copy_gbs, "rmsnorm_heads": rms, "tree_verify": tv}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
