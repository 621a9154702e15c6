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
               aux.npy         float16 [n, A*H] (when aux layers are asked for) the residual stream entering
                                               each of the A target layers ``meta["aux_layers"]`` (sorted),
                                               concatenated: the features of drafters that fuse several
                                               target layers (a kind's ``TrainingRecipe.aux_layers``)
               lossmask.npy    uint8 [n]       (teacher mode, chat data) 1 where x_q is assistant text: the
                                               loss is taken only on predictions of such tokens

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

from trtspec.dtypes import parse_dtype
from trtspec.errors import CheckpointError, UsageError
from trtspec.models.llama import KVCache, LlamaModel, build_llama, causal_mask
from trtspec.spec import TargetSpec

FORMAT = "trtspec-train-cache"
META = "meta.json"
FP16_MAX = 65504.0
#: generate mode: batches handed to one continuous-batching pool (``batch_size`` rows in flight). Several,
#: so that rows freed by short replies are refilled instead of idling until the longest reply ends;
#: resumable shards still end on batch boundaries.
POOL_BATCHES = 4


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
    aux: np.ndarray | None = None
    mask: np.ndarray | None = None  # uint8 [n]: 1 where the token is one the loss may predict


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


class _Parts:
    """The pieces of one item's record, gathered while it is prefilled and decoded."""

    def __init__(self, plen: int):
        self.plen = plen
        self.tokens: list[torch.Tensor] = []
        self.hidden: list[torch.Tensor] = []
        self.argmax: list[torch.Tensor] = []
        self.ti: list[torch.Tensor] = []
        self.tv: list[torch.Tensor] = []
        self.aux: list[torch.Tensor] = []

    def add(self, tokens, hidden, argmax, ti, tv, aux=None) -> None:
        self.tokens.append(tokens)
        self.hidden.append(hidden)
        self.argmax.append(argmax)
        if ti is not None:
            self.ti.append(ti)
            self.tv.append(tv)
        if aux is not None:
            self.aux.append(aux)

    def record(self, generated: bool) -> _Record:
        return _Record(
            torch.cat(self.tokens).numpy().astype(np.int32),
            _to_f16(torch.cat(self.hidden).float()),
            torch.cat(self.argmax).numpy().astype(np.int32),
            torch.cat(self.ti).numpy().astype(np.int32) if self.ti else None,
            torch.cat(self.tv).to(torch.float16).numpy() if self.tv else None,
            self.plen if generated else 1,
            _to_f16(torch.cat(self.aux).float()) if self.aux else None,
        )


def _aux_cat(aux: list[torch.Tensor]) -> torch.Tensor | None:
    return torch.cat(aux, -1) if aux else None


def _prefill(model: LlamaModel, rows: list[list[int]], topk: int, aux_layers: tuple[int, ...] = ()):
    """Run prompts (right-padded, causal) in one forward into a fresh cache; label every valid position
    with one lm_head call (not one per prompt: a bigger matmul is a faster one). Returns the cache, the
    lengths and per row (tokens, hidden, argmax, topk ids, topk logits, aux layers' states or None)."""
    B = len(rows)
    ids, valid = _pad(rows)
    T = ids.shape[1]
    cache = model.new_cache(B, T)
    hidden, aux = model(ids, torch.arange(T)[None].expand(B, -1), cache, causal_mask(T) & valid[:, None, :], aux_layers)
    aux_all = _aux_cat(aux)
    lengths = valid.sum(1)
    cache.commit([torch.arange(int(n)) for n in lengths])
    am, ti, tv = _labels(model, hidden[valid], topk)
    out, a = [], 0
    for b in range(B):
        n = int(lengths[b])
        out.append(
            (
                ids[b, :n],
                hidden[b, :n],
                am[a : a + n],
                ti[a : a + n] if ti is not None else None,
                tv[a : a + n] if tv is not None else None,
                aux_all[b, :n] if aux_all is not None else None,
            )
        )
        a += n
    return cache, lengths, out


#: a prefill pads its prompts to the longest one: at most this many (padded) tokens per forward
PREFILL_TOKENS = 4096


def _prefill_chunks(lengths: list[int]) -> list[list[int]]:
    """Split prompts (in order; build_cache sorts them by length) into consecutive groups whose padded size
    (rows x longest) stays within PREFILL_TOKENS, so one long prompt does not pad a whole pool."""
    chunks: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for j, n in enumerate(lengths):
        if cur and (len(cur) + 1) * max(longest, n) > PREFILL_TOKENS:
            chunks.append(cur)
            cur, longest = [], 0
        cur.append(j)
        longest = max(longest, n)
    if cur:
        chunks.append(cur)
    return chunks


def _compact(cache: KVCache, keep: list[int]) -> None:
    """Drop every cache row not in ``keep`` (in place): the tail of a pool decodes only live rows."""
    idx = torch.tensor(keep, dtype=torch.long)
    for store in (cache.k, cache.v):
        for i, t in enumerate(store):
            store[i] = t.index_select(0, idx)
    cache.lengths = cache.lengths.index_select(0, idx)


@torch.no_grad()
def generate_pool(
    model: LlamaModel,
    items: list[list[int]],
    gen_tokens: int,
    topk: int,
    eos: set[int],
    rows: int,
    aux_layers: tuple[int, ...] = (),
) -> list[_Record]:
    """Greedy replies of up to ``gen_tokens`` tokens to every item, ``rows`` sequences decoding at once
    with a KV cache (continuous batching): when a reply ends (EOS or length), the next prompt is prefilled
    into its row, so the batch stays full and every decode step is a ``rows``-row matmul instead of a
    shrinking one; when no prompts are left, finished rows are dropped from the cache. Each sequence's
    tokens are its own greedy continuation whatever else shares the batch (rows never attend to each
    other). Records come back in ``items`` order."""
    n = len(items)
    W = max(1, min(rows, n))
    capacity = max(len(it) for it in items) + gen_tokens + 1
    cache = model.new_cache(W, capacity)
    parts: list[_Parts | None] = [None] * n
    slot: list[int] = [-1] * W  # item held by each row (-1: free)
    steps_left = [0] * W  # decode steps each row may still take
    cur = torch.zeros(W, dtype=torch.long)
    nxt = 0
    while True:
        free = [r for r in range(W) if slot[r] < 0]
        if free and nxt < n:
            take = list(range(nxt, min(n, nxt + len(free))))
            nxt += len(take)
            got, lengths, subs = [], [], []
            for chunk in _prefill_chunks([len(items[i]) for i in take]):  # bounded padding per prefill
                sub, lens, g = _prefill(model, [items[take[j]] for j in chunk], topk, aux_layers)
                got += g
                lengths += [int(x) for x in lens]
                subs += [(sub, k) for k in range(len(chunk))]
            for j, (r, i) in enumerate(zip(free, take)):
                sub, jj = subs[j]
                L = lengths[j]
                for dst, src in ((cache.k, sub.k), (cache.v, sub.v)):
                    for layer in range(len(dst)):
                        dst[layer][r, :L] = src[layer][jj, :L]
                cache.lengths[r] = L
                p = _Parts(L)
                p.add(*got[j])
                parts[i] = p
                last = got[j][2][-1]
                if gen_tokens > 1 and int(last) not in eos:
                    slot[r], steps_left[r], cur[r] = i, gen_tokens - 1, last
        live = [r for r in range(W) if slot[r] >= 0]
        if not live:
            if nxt >= n:
                break
            continue
        if nxt >= n and len(live) <= (3 * W) // 4 and len(live) < W:  # tail: decode only the live rows
            _compact(cache, live)
            slot = [slot[r] for r in live]
            steps_left = [steps_left[r] for r in live]
            cur = cur[live]
            W = len(live)
            live = list(range(W))
        h, aux = model(cur[:, None], cache.lengths[:, None], cache, causal_mask(1), aux_layers)
        aux_all = _aux_cat(aux)
        cache.commit([torch.arange(1 if slot[r] >= 0 else 0) for r in range(W)])
        am, ti, tv = _labels(model, h[:, 0], topk)
        for r in live:
            parts[slot[r]].add(
                cur[r : r + 1],
                h[r, :1],
                am[r : r + 1],
                ti[r : r + 1] if ti is not None else None,
                tv[r : r + 1] if tv is not None else None,
                aux_all[r, 0:1] if aux_all is not None else None,
            )
            steps_left[r] -= 1
            if steps_left[r] == 0 or int(am[r]) in eos:
                slot[r] = -1
        cur = am.clone()  # rows refilled next round overwrite cur in place; the recorded argmax views stay intact
    return [p.record(True) for p in parts]


@torch.no_grad()
def run_items(
    model: LlamaModel,
    items: list[list[int]],
    mode: str,
    gen_tokens: int,
    topk: int,
    eos: set[int],
    rows: int | None = None,
    aux_layers: tuple[int, ...] = (),
) -> list[_Record]:
    """Records for ``items``: ``teacher`` -- one batched prefill, labels on the data's own tokens;
    ``generate`` -- the target's greedy replies (``generate_pool`` with ``rows`` sequences in flight,
    default all). The same model code as the runtime's target forward; ``aux_layers``: also record the
    residual stream entering those layers, as the runtime hands it to drafters that ask for it."""
    if mode == "generate":
        return generate_pool(model, items, gen_tokens, topk, eos, rows or len(items), aux_layers)
    _, _, got = _prefill(model, items, topk, aux_layers)
    out = []
    for g in got:
        p = _Parts(1)
        p.add(*g)
        out.append(p.record(False))
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
    if records[0].aux is not None:
        np.save(tmp / "aux.npy", np.concatenate([r.aux for r in records]))
    if records[0].mask is not None:
        np.save(tmp / "lossmask.npy", np.concatenate([r.mask for r in records]))
    final = directory / name
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return sum(lens)


def _write_meta(directory: Path, meta: dict) -> None:
    tmp = directory / f".{META}.tmp"
    tmp.write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(tmp, directory / META)


def build_cache(
    target: TargetSpec,
    items: list[list[int]],
    out: str | Path,
    mode: str = "generate",
    gen_tokens: int = 128,
    topk: int = 0,
    batch_size: int = 16,
    shard_tokens: int = 32768,
    model: LlamaModel | None = None,
    progress: bool = True,
    rank: int = 0,
    world: int = 1,
    dtype: str = "float32",
    aux_layers: tuple[int, ...] | list[int] = (),
    loss_masks: list[list[int]] | None = None,
    aux_optional: bool = False,
) -> Path:
    """Build (or resume) the cache for ``items`` (token-id prompts/texts). Returns the cache dir.

    ``aux_layers``: also store the residual stream entering these target layers (``aux.npy``). They are
    not part of the data hash: a cache that already holds every asked layer is reused as it is (so one
    cache serves a kind that fuses target layers and one that does not); one that lacks some is refused,
    unless ``aux_optional`` (the caller computes missing layers aside, ``train.aux_cache``). Index L (the
    last layer's output) is allowed.

    ``loss_masks`` (teacher mode): per item, 1 for each token the loss may predict (the assistant turns of
    chat data, ``train.data.encode_text_with_mask``); without them every teacher-mode token counts.

    ``dtype`` is the target's compute dtype: ``bfloat16`` (pre-packed oneDNN matmuls on CPUs with native
    bfloat16) caches several times faster and labels what a bfloat16 deployment of the target says; on
    other CPUs float32 is the fast one (callers pick with ``trtspec.dtypes.resolve_dtype``). ``model``:
    pass the target already built (and packed) by the caller, e.g. tune-tree's generator, to reuse it.

    generate mode decodes ``batch_size`` sequences at once with a KV cache and refills a row with the
    next prompt as soon as its reply ends (``generate_pool``).

    Under torch.distributed each rank builds every ``world``-th batch into its own ``part-{rank}``
    sub-directory; readers union all parts."""
    if mode not in ("generate", "teacher"):
        raise UsageError(f"unknown cache mode {mode!r}; use generate or teacher")
    if not items:
        raise UsageError("no data items to cache")
    if loss_masks is not None and (mode != "teacher" or [len(m) for m in loss_masks] != [len(i) for i in items]):
        raise UsageError("loss masks are for teacher mode, one 0/1 per token of every item")
    out = Path(out)
    options = {
        "mode": mode,
        "gen_tokens": gen_tokens if mode == "generate" else 0,
        "topk": topk,
        "fingerprint": target.fingerprint,
        "world": world,
        "batch_size": batch_size,
    }
    if dtype != "float32":  # float32 caches keep the hash they had before the option existed
        options["dtype"] = dtype
    if loss_masks is not None:
        options["loss_mask"] = True
    dhash = data_hash(items if loss_masks is None else [*items, *loss_masks], options)
    wanted = sorted({int(i) for i in aux_layers})
    L = target.arch.num_hidden_layers
    if any(not 0 <= i <= L for i in wanted):
        raise UsageError(f"aux layers {wanted} are not all layers of the {L}-layer target")
    part = out / f"part-{rank}-of-{world}"
    meta_path = part / META
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if meta.get("data_hash") != dhash:
            raise UsageError(
                f"{out}: this cache was built from other data, options or target "
                f"(hash {meta.get('data_hash')} != {dhash}); delete it or pass another --cache"
            )
        missing = sorted(set(wanted) - set(meta.get("aux_layers", [])))
        if missing and not aux_optional:
            raise UsageError(
                f"{out}: this cache holds the target's layer inputs {meta.get('aux_layers', [])}, not {missing} "
                "that this drafter kind reads; delete it or pass another --cache"
            )
    else:
        part.mkdir(parents=True, exist_ok=True)
        meta = {
            "format": FORMAT,
            "version": 1,
            "data_hash": dhash,
            **options,
            "hidden_size": target.arch.hidden_size,
            "vocab_size": target.arch.vocab_size,
            "target_path": str(target.path),
            "num_items": len(items),
            "aux_layers": wanted,
            "shards": [],
            "complete": False,
        }
        _write_meta(part, meta)
    if meta.get("complete"):
        return out
    for stale in part.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    order = sorted(range(len(items)), key=lambda i: (len(items[i]), i))  # less padding, deterministic
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    mine = [bi for bi in range(len(batches)) if bi % world == rank]
    done_batches = sum(s["batches"] for s in meta["shards"])
    eos = target.arch.eos_token_id
    eos_set = set() if eos is None else ({int(eos)} if isinstance(eos, int) else {int(e) for e in eos})
    if model is None:
        from trtspec.models.packed import pack_if_bf16

        torch_dtype = parse_dtype(dtype)
        model = build_llama(target.arch, target.tensors, torch_dtype)
        pack_if_bf16(model, torch_dtype, batch_invariant=False)  # labels, not bit-equal tree steps
    from tqdm import tqdm

    bar = tqdm(
        total=len(mine),
        initial=done_batches,
        desc="cache",
        unit="batch",
        disable=not progress or rank != 0,
        dynamic_ncols=True,
    )
    pending: list[_Record] = []
    pending_batches = 0
    n_tokens, t0 = 0, time.perf_counter()
    try:
        todo = mine[done_batches:]
        per_call = POOL_BATCHES if mode == "generate" else 1
        for g in range(0, len(todo), per_call):
            group = todo[g : g + per_call]
            taken = [i for bi in group for i in batches[bi]]
            recs = run_items(
                model,
                [items[i] for i in taken],
                mode,
                gen_tokens,
                topk,
                eos_set,
                rows=batch_size,
                aux_layers=tuple(meta.get("aux_layers", [])),
            )
            if loss_masks is not None:
                for r, i in zip(recs, taken):
                    r.mask = np.asarray(loss_masks[i], dtype=np.uint8)
            pending.extend(recs)
            pending_batches += len(group)
            n_tokens += sum(len(r.tokens) for r in recs)
            bar.update(len(group))
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
        self.aux = np.load(d / "aux.npy", mmap_mode="r") if (d / "aux.npy").exists() else None
        self.mask = np.load(d / "lossmask.npy", mmap_mode="r") if (d / "lossmask.npy").exists() else None


class HiddenCache:
    """Read side: memory-mapped shards and a list of sequences (shard, start, length)."""

    def __init__(
        self,
        directory: str | Path,
        fingerprint: str | None = None,
        allow_incomplete: bool = False,
        world: int | None = None,
    ):
        self.dir = Path(directory)
        parts = sorted(self.dir.glob("part-*-of-*"))
        if not parts:
            raise CheckpointError("not a trtspec training cache (no part-* directories)", self.dir)
        worlds = sorted({p.name.rsplit("-", 1)[1] for p in parts})
        if world is not None:
            parts = [p for p in parts if p.name.endswith(f"-of-{world}")]
        elif len(worlds) > 1:
            raise CheckpointError(
                f"the cache holds builds for several world sizes ({', '.join(worlds)})",
                self.dir,
                "delete it or pass the world size",
            )
        if not parts:
            raise CheckpointError(
                f"no cache parts built with {world} ranks", self.dir, "the cache is rebuilt by train-heads"
            )
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

    def trained(self, i: int) -> np.ndarray:
        """bool [n]: the positions q of sequence ``i`` whose prediction (of x_{q+1}) is text the drafter should
        learn: the target's own reply (q >= prompt length - 1), and, where the cache holds a loss mask, an
        assistant token (the last position takes the last token's mask)."""
        si, a, n = self.sequences[i]
        q = np.arange(n)
        ok = q >= self.prompt_lengths[i] - 1
        mask = self.shards[si].mask
        if mask is not None:
            ok &= np.asarray(mask[a : a + n], dtype=bool)[np.minimum(q + 1, n - 1)]
        return ok

    @property
    def aux_layers(self) -> tuple[int, ...]:
        """The target layers whose input residual stream the cache holds (sorted; () = none)."""
        return tuple(int(i) for i in self.meta.get("aux_layers", []))

    def aux_columns(self, layers: tuple[int, ...] | list[int]) -> np.ndarray:
        """Column indices into ``aux`` that give ``layers``' states concatenated in that order (a layer may
        repeat), or a usage error naming the layers the cache lacks."""
        held = self.aux_layers
        missing = sorted(set(layers) - set(held))
        if missing:
            raise UsageError(
                f"{self.dir}: the cache holds the target's layer inputs {list(held)}, not {missing}; "
                "rebuild it for this drafter kind (delete it or pass another --cache)"
            )
        H = self.hidden_size
        return np.concatenate([np.arange(held.index(i) * H, (held.index(i) + 1) * H) for i in layers])

    def sequence(self, i: int) -> dict[str, np.ndarray]:
        si, a, n = self.sequences[i]
        s = self.shards[si]
        out = {"hidden": s.hidden[a : a + n], "tokens": s.tokens[a : a + n], "argmax": s.argmax[a : a + n]}
        if s.topk_ids is not None:
            out["topk_ids"] = s.topk_ids[a : a + n]
            out["topk_logits"] = s.topk_logits[a : a + n]
        if s.aux is not None:
            out["aux"] = s.aux[a : a + n]
        return out
