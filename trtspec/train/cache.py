"""The on-disk self-distillation cache: the target's hidden states and its own next-token choices.

Why: every head kind trains on (target final hidden h_q, target token choices), and running the target is
by far the expensive part. The cache runs it once; training epochs, other head kinds, the RMSNorm ablation
and tree tuning all read the same files. Layout (``<cache>/``):

  meta.json                    format, target fingerprint, data hash, options, the list of finished shards
  shard-00000/hidden.npy       float16 [n, H]  final post-norm hidden state of position q
               tokens.npy      int32 [n]       token x_q fed at position q
               argmax.npy      int32 [n]       the target's greedy choice at q (its prediction of x_{q+1})
               starts.npy      int64 [s+1]     sequence boundaries inside the shard
               plens.npy       int32 [s]       prompt length of each sequence (generate mode; 1 for teacher)
               topk_ids.npy    int32 [n, k]    (when topk > 0) the target's k best tokens at q ...
               topk_logits.npy float16 [n, k]  ... and their logits (soft labels)

Shards are written to a temp dir and renamed, then meta.json is replaced atomically, so an interrupted
build (Ctrl-C, a killed job) resumes at the last finished shard and never leaves a half shard behind.
Readers memory-map the arrays: the corpus is never loaded into RAM.

Modes: ``generate`` (default) -- the target writes a greedy reply of up to ``gen_tokens`` tokens to each
prompt and the cache holds prompt + reply, so the data IS what the target says at serving time;
``teacher`` -- the data's own tokens are fed (one batched forward per item) and labels are the target's
argmax on them (cheaper; for text corpora whose continuations are the serving distribution).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trtspec.errors import CheckpointError, UsageError
from trtspec.models.llama import LlamaModel, build_llama, causal_mask
from trtspec.spec import TargetSpec

FORMAT = "trtspec-train-cache"
META = "meta.json"
FP16_MAX = 65504.0


def _pad(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    M = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), M, dtype=torch.long)
    valid = torch.zeros(len(rows), M, dtype=torch.bool)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.tensor(r, dtype=torch.long)
        valid[b, : len(r)] = True
    return ids, valid


def data_hash(items: list[list[int]], options: dict) -> str:
    h = hashlib.sha256(json.dumps(options, sort_keys=True).encode())
    for it in items:
        h.update(np.asarray(it, dtype=np.int64).tobytes())
        h.update(b"|")
    return h.hexdigest()[:16]


@dataclass
class _Record:
    tokens: np.ndarray
    hidden: np.ndarray
    argmax: np.ndarray
    topk_ids: np.ndarray | None
    topk_logits: np.ndarray | None
    plen: int = 1


def _labels(model: LlamaModel, hidden: torch.Tensor, topk: int):
    logits = model.logits(hidden)
    am = logits.argmax(-1)
    if topk > 0:
        v, i = torch.topk(logits, topk, dim=-1)
        return am, i, v
    return am, None, None


def _to_f16(h: torch.Tensor) -> np.ndarray:
    if torch.isfinite(h).all() and float(h.abs().max()) > FP16_MAX:
        raise CheckpointError("target hidden states exceed the float16 range; the cache cannot store them")
    return h.to(torch.float16).numpy()


@torch.no_grad()
def run_items(model: LlamaModel, items: list[list[int]], mode: str, gen_tokens: int, topk: int,
              eos: set[int]) -> list[_Record]:
    """One batch: prefill (right-padded, causal), then for ``generate`` a greedy decode loop that
    records every fed token's hidden state. The same model code as the runtime's target forward."""
    B = len(items)
    ids, valid = _pad(items)
    T = ids.shape[1]
    extra = gen_tokens if mode == "generate" else 0
    cache = model.new_cache(B, T + extra + 1)
    hidden, _ = model(ids, torch.arange(T)[None].expand(B, -1), cache, causal_mask(T) & valid[:, None, :])
    lengths = valid.sum(1)
    cache.commit([torch.arange(int(n)) for n in lengths])
    parts: list[dict[str, list]] = []
    for b in range(B):
        n = int(lengths[b])
        am, ti, tv = _labels(model, hidden[b, :n], topk)
        parts.append({"tokens": [ids[b, :n]], "hidden": [hidden[b, :n]], "argmax": [am],
                      "ti": [ti] if ti is not None else [], "tv": [tv] if tv is not None else []})
    if mode == "generate":
        cur = torch.stack([p["argmax"][0][-1] for p in parts])
        done = [int(cur[b]) in eos for b in range(B)]
        for _ in range(gen_tokens - 1):
            if all(done):
                break
            h, _ = model(cur[:, None], cache.lengths[:, None], cache, causal_mask(1))
            cache.commit([torch.arange(1)] * B)
            am, ti, tv = _labels(model, h[:, 0], topk)
            for b in range(B):
                if done[b]:
                    continue
                p = parts[b]
                p["tokens"].append(cur[b:b + 1])
                p["hidden"].append(h[b, :1])
                p["argmax"].append(am[b:b + 1])
                if ti is not None:
                    p["ti"].append(ti[b:b + 1])
                    p["tv"].append(tv[b:b + 1])
                done[b] = int(am[b]) in eos
            cur = am
    out = []
    for b, p in enumerate(parts):
        out.append(_Record(torch.cat(p["tokens"]).numpy().astype(np.int32), _to_f16(torch.cat(p["hidden"]).float()),
                           torch.cat(p["argmax"]).numpy().astype(np.int32),
                           torch.cat(p["ti"]).numpy().astype(np.int32) if p["ti"] else None,
                           torch.cat(p["tv"]).to(torch.float16).numpy() if p["tv"] else None,
                           int(lengths[b]) if mode == "generate" else 1))
    return out


def _write_shard(directory: Path, name: str, records: list[_Record]) -> int:
    tmp = directory / f".tmp-{name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    lens = [len(r.tokens) for r in records]
    np.save(tmp / "tokens.npy", np.concatenate([r.tokens for r in records]))
    np.save(tmp / "hidden.npy", np.concatenate([r.hidden for r in records]))
    np.save(tmp / "argmax.npy", np.concatenate([r.argmax for r in records]))
    np.save(tmp / "starts.npy", np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))
    np.save(tmp / "plens.npy", np.asarray([r.plen for r in records], dtype=np.int32))
    if records[0].topk_ids is not None:
        np.save(tmp / "topk_ids.npy", np.concatenate([r.topk_ids for r in records]))
        np.save(tmp / "topk_logits.npy", np.concatenate([r.topk_logits for r in records]))
    final = directory / name
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return sum(lens)


def _write_meta(directory: Path, meta: dict) -> None:
    tmp = directory / f".{META}.tmp"
    tmp.write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(tmp, directory / META)


def build_cache(target: TargetSpec, items: list[list[int]], out: str | Path, mode: str = "generate",
                gen_tokens: int = 128, topk: int = 0, batch_size: int = 16, shard_tokens: int = 32768,
                model: LlamaModel | None = None, progress: bool = True, rank: int = 0, world: int = 1,
                dtype: str = "float32") -> Path:
    """Build (or resume) the cache for ``items`` (token-id prompts/texts). Returns the cache dir.

    ``dtype`` is the target's compute dtype: ``bfloat16`` (pre-packed oneDNN matmuls on CPUs that have
    them) caches several times faster and labels what a bfloat16 deployment of the target says.

    Under torch.distributed each rank builds every ``world``-th batch into its own ``part-{rank}``
    sub-directory; readers union all parts."""
    if mode not in ("generate", "teacher"):
        raise UsageError(f"unknown cache mode {mode!r}; use generate or teacher")
    if not items:
        raise UsageError("no data items to cache")
    out = Path(out)
    options = {"mode": mode, "gen_tokens": gen_tokens if mode == "generate" else 0, "topk": topk,
               "fingerprint": target.fingerprint, "world": world, "batch_size": batch_size}
    if dtype != "float32":  # float32 caches keep the hash they had before the option existed
        options["dtype"] = dtype
    dhash = data_hash(items, options)
    part = out / f"part-{rank}-of-{world}"
    part.mkdir(parents=True, exist_ok=True)
    meta_path = part / META
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if meta.get("data_hash") != dhash:
            raise UsageError(f"{out}: this cache was built from other data, options or target "
                             f"(hash {meta.get('data_hash')} != {dhash}); delete it or pass another --cache")
    else:
        meta = {"format": FORMAT, "version": 1, "data_hash": dhash, **options,
                "hidden_size": target.arch.hidden_size, "vocab_size": target.arch.vocab_size,
                "target_path": str(target.path), "num_items": len(items), "shards": [], "complete": False}
        _write_meta(part, meta)
    if meta.get("complete"):
        return out
    for stale in part.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    order = sorted(range(len(items)), key=lambda i: (len(items[i]), i))  # less padding, deterministic
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    mine = [bi for bi in range(len(batches)) if bi % world == rank]
    done_batches = sum(s["batches"] for s in meta["shards"])
    eos = target.arch.eos_token_id
    eos_set = set() if eos is None else ({int(eos)} if isinstance(eos, int) else {int(e) for e in eos})
    if model is None:
        from trtspec.models.packed import pack_if_bf16

        torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
        model = build_llama(target.arch, target.tensors, torch_dtype)
        pack_if_bf16(model, torch_dtype)
    from tqdm import tqdm

    bar = tqdm(total=len(mine), initial=done_batches, desc="cache", unit="batch", disable=not progress or rank != 0,
               dynamic_ncols=True)
    pending: list[_Record] = []
    pending_batches = 0
    n_tokens, t0 = 0, time.perf_counter()
    try:
        for bi in mine[done_batches:]:
            recs = run_items(model, [items[i] for i in batches[bi]], mode, gen_tokens, topk, eos_set)
            pending.extend(recs)
            pending_batches += 1
            n_tokens += sum(len(r.tokens) for r in recs)
            bar.update(1)
            bar.set_postfix(tok_s=f"{n_tokens / (time.perf_counter() - t0):.0f}")
            if sum(len(r.tokens) for r in pending) >= shard_tokens:
                _flush(part, meta, pending, pending_batches)
                pending, pending_batches = [], 0
        if pending:
            _flush(part, meta, pending, pending_batches)
        meta["complete"] = True
        _write_meta(part, meta)
    finally:
        bar.close()
    return out


def _flush(part: Path, meta: dict, pending: list[_Record], nb: int) -> None:
    name = f"shard-{len(meta['shards']):05d}"
    n = _write_shard(part, name, pending)
    meta["shards"].append({"name": name, "tokens": n, "sequences": len(pending), "batches": nb})
    _write_meta(part, meta)


class _Shard:
    def __init__(self, d: Path):
        self.hidden = np.load(d / "hidden.npy", mmap_mode="r")
        self.tokens = np.load(d / "tokens.npy", mmap_mode="r")
        self.argmax = np.load(d / "argmax.npy", mmap_mode="r")
        self.starts = np.load(d / "starts.npy")
        n = len(self.starts) - 1
        self.plens = np.load(d / "plens.npy") if (d / "plens.npy").exists() else np.ones(n, dtype=np.int32)
        self.topk_ids = np.load(d / "topk_ids.npy", mmap_mode="r") if (d / "topk_ids.npy").exists() else None
        self.topk_logits = np.load(d / "topk_logits.npy", mmap_mode="r") if (d / "topk_logits.npy").exists() else None


class HiddenCache:
    """Read side: memory-mapped shards and a list of sequences (shard, start, length)."""

    def __init__(self, directory: str | Path, fingerprint: str | None = None, allow_incomplete: bool = False,
                 world: int | None = None):
        self.dir = Path(directory)
        parts = sorted(self.dir.glob("part-*-of-*"))
        if not parts:
            raise CheckpointError("not a trtspec training cache (no part-* directories)", self.dir)
        worlds = sorted({p.name.rsplit("-", 1)[1] for p in parts})
        if world is not None:
            parts = [p for p in parts if p.name.endswith(f"-of-{world}")]
        elif len(worlds) > 1:
            raise CheckpointError(f"the cache holds builds for several world sizes ({', '.join(worlds)})", self.dir,
                                  "delete it or pass the world size")
        if not parts:
            raise CheckpointError(f"no cache parts built with {world} ranks", self.dir, "the cache is rebuilt by train-heads")
        self.shards: list[_Shard] = []
        self.meta: dict = {}
        for p in parts:
            meta = json.loads((p / META).read_text())
            if not meta.get("complete") and not allow_incomplete:
                raise CheckpointError("the cache is incomplete", p, "run train-heads again to finish it")
            if fingerprint and meta.get("fingerprint") != fingerprint:
                raise CheckpointError("the cache was built with another target", p, "delete it or pass another --cache")
            self.meta = meta
            self.shards.extend(_Shard(p / s["name"]) for s in meta["shards"])
        self.sequences: list[tuple[int, int, int]] = []
        self.prompt_lengths: list[int] = []  # positions q < prompt_length - 1 are the prompt's (not the target's text)
        for si, s in enumerate(self.shards):
            for j, (a, b) in enumerate(zip(s.starts[:-1], s.starts[1:])):
                self.sequences.append((si, int(a), int(b - a)))
                self.prompt_lengths.append(int(s.plens[j]))
        if not self.sequences:
            raise CheckpointError("the cache holds no sequences", self.dir)

    @property
    def hidden_size(self) -> int:
        return int(self.shards[0].hidden.shape[1])

    @property
    def num_tokens(self) -> int:
        return sum(n for _, _, n in self.sequences)

    @property
    def has_topk(self) -> bool:
        return self.shards[0].topk_ids is not None

    def sequence(self, i: int) -> dict[str, np.ndarray]:
        si, a, n = self.sequences[i]
        s = self.shards[si]
        out = {"hidden": s.hidden[a:a + n], "tokens": s.tokens[a:a + n], "argmax": s.argmax[a:a + n]}
        if s.topk_ids is not None:
            out["topk_ids"] = s.topk_ids[a:a + n]
            out["topk_logits"] = s.topk_logits[a:a + n]
        return out
