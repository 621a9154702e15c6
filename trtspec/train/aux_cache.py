"""The target's states at chosen layers for every cached position, stored next to a training cache.

Why a side file: the self-distillation cache holds the target's final hidden state, but a drafter that
reads other layers (a block drafter's context) needs those layers' states. They are a pure function of
the cached tokens, so one teacher-forced forward over each cached sequence (prompt + the target's own
reply) recovers them: far cheaper than the generation that wrote the cache, and the cache itself stays
as it is. Layout: ``<cache>/aux-<l1>-<l2>.../shard-<i>.npy`` float16 [n_i, len(layers) * H] for the
cache's i-th shard (in ``HiddenCache.shards`` order), each written to a temp file and renamed, so an
interrupted run resumes at the next missing shard.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from trtspec.dtypes import parse_dtype
from trtspec.models.llama import build_llama, causal_mask
from trtspec.models.packed import pack_if_bf16
from trtspec.spec import TargetSpec
from trtspec.train.cache import HiddenCache, _to_f16

#: sequences per teacher-forced forward
ROWS = 16


class _Columns:
    """Rows of a memory-mapped array restricted to ``cols``, read only when sliced."""

    def __init__(self, array, cols: np.ndarray):
        self.array, self.cols = array, cols
        self.shape = (array.shape[0], len(cols))

    def __getitem__(self, rows: slice) -> np.ndarray:
        return np.asarray(self.array[rows])[:, self.cols]


def layer_states(cache: HiddenCache, target: TargetSpec, layers: tuple[int, ...], progress: bool = True) -> list:
    """Per cache shard, the states entering target ``layers`` concatenated in that order, sliceable by rows:
    the cache's own columns where it recorded every one of them, else the side file (``aux_features``).
    Why one front door: any cache serves any kind that reads target layers (EAGLE-3 on a cache written
    for a block drafter, or for a kind that reads none), at the price of one teacher-forced pass."""
    layers = tuple(layers)
    if layers and set(layers) <= set(cache.aux_layers):
        cols = cache.aux_columns(layers)
        if np.array_equal(cols, np.arange(cols[0], cols[0] + len(cols))):  # a column range: a plain view
            return [s.aux[:, cols[0] : cols[0] + len(cols)] for s in cache.shards]
        return [_Columns(s.aux, cols) for s in cache.shards]
    return aux_features(cache, target, layers, progress=progress)


def aux_dir(cache: HiddenCache, layers: tuple[int, ...]) -> Path:
    return cache.dir / ("aux-" + "-".join(str(i) for i in layers))


def aux_features(
    cache: HiddenCache, target: TargetSpec, layers: tuple[int, ...], progress: bool = True
) -> list[np.ndarray]:
    """Per cache shard, the memory-mapped [n, len(layers) * H] states entering target ``layers`` (trtspec's
    capture convention, index L = the last layer's output), concatenated in ``layers`` order, computed once
    into the side file in the dtype the cache was built in (callers go through ``layer_states``, which
    reads the cache's own columns instead where it recorded the layers)."""
    out_dir = aux_dir(cache, layers)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [out_dir / f"shard-{i:05d}.npy" for i in range(len(cache.shards))]
    todo = [i for i, f in enumerate(files) if not f.is_file()]
    if todo:
        from tqdm import tqdm

        dtype = parse_dtype(cache.meta.get("dtype", "float32"))
        model = build_llama(target.arch, target.tensors, dtype)
        pack_if_bf16(model, dtype, batch_invariant=False)  # features for training, not bit-equal tree steps
        seqs = [[(a, n) for si, a, n in cache.sequences if si == i] for i in range(len(cache.shards))]
        bar = tqdm(total=sum(len(seqs[i]) for i in todo), desc="aux states", unit="seq", disable=not progress)
        for i in todo:
            tokens = cache.shards[i].tokens
            arr = np.zeros((len(tokens), len(layers) * target.arch.hidden_size), dtype=np.float16)
            for g in range(0, len(seqs[i]), ROWS):
                group = seqs[i][g : g + ROWS]
                T = max(n for _, n in group)
                ids = torch.zeros(len(group), T, dtype=torch.long)
                valid = torch.zeros(len(group), T, dtype=torch.bool)
                for b, (a, n) in enumerate(group):
                    ids[b, :n] = torch.from_numpy(np.asarray(tokens[a : a + n], dtype=np.int64))
                    valid[b, :n] = True
                cache_kv = model.new_cache(len(group), T)
                with torch.no_grad():
                    _, aux = model(
                        ids,
                        torch.arange(T)[None].expand(len(group), -1),
                        cache_kv,
                        causal_mask(T) & valid[:, None, :],
                        layers,
                    )
                feats = torch.cat(aux, -1).float()
                for b, (a, n) in enumerate(group):
                    arr[a : a + n] = _to_f16(feats[b, :n])
                bar.update(len(group))
            tmp = files[i].with_name(files[i].name + ".tmp.npy")
            np.save(tmp, arr)
            os.replace(tmp, files[i])
        bar.close()
    return [np.load(f, mmap_mode="r") for f in files]
