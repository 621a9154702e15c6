"""Teacher-forced ranks: where the target's own choice falls among a drafter's candidates, per depth.

For every calibration position q (the target has committed x_0..x_q, the root is x_{q+1}) and depth
d = 1..D, the rank of a_{q+d} (the target's greedy choice for position q+d+1) among the drafter's
logits at depth d when every ancestor on the path is the true token: exactly what a tree node whose
ancestors were all accepted sees. tune-tree turns these into path probabilities (trtspec.train.tune).

Each proposer type of trtspec.drafters is measured with its own runtime modules and weights, so the
numbers are the runtime's:
* ``HeadsDrafter`` (medusa, mtp-linear): head d on the target's last hidden state h_q.
* ``RecurrentDrafter`` pair heads (eagle, eagle3, mtp-single, native MTP): unrolled on their own outputs
  (trtspec.train.unroll), step 0 reading h_q or, for a drafter with ``aux_layers`` (EAGLE-3), the target's
  states entering those layers.
* ``RecurrentDrafter`` draft models: one forward over the true text; depth d reads position q+d.
* ``BlockDrafter`` (dflash, dspark): the block ``[x_{q+1}, mask...]`` over the target's aux-layer states
  before it, every anchor of a sequence in one forward (the block-sparse mask of trtspec.train.block);
  a Markov head adds its bias of the true previous token, as a tree parent on the accepted path would.
A drafter projecting onto its own vocabulary (a draft vocabulary, EAGLE-3's d2t) is ranked in that
vocabulary; a target token outside it is a miss.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from trtspec.errors import UsageError
from trtspec.models.llama import causal_mask
from trtspec.train.aux_cache import layer_states
from trtspec.train.cache import HiddenCache
from trtspec.train.unroll import unrolled

#: block anchors per forward when measuring a block drafter
BLOCK_ANCHORS = 32


def check_measurable(drafter) -> None:
    """Refuse, before any work, a drafter whose per-depth ranks cannot be computed (model-free and
    combined drafters: they draft from text, not from logits)."""
    from trtspec.drafters.block_proposer import BlockDrafter
    from trtspec.drafters.proposers import HeadsDrafter, RecurrentDrafter

    if not isinstance(drafter, HeadsDrafter | RecurrentDrafter | BlockDrafter):
        raise UsageError(
            "tune-tree measures drafters that score candidates with a model; this one drafts from text "
            "(model-free or combined): pass a tree with --tree (e.g. chain:4) and measure it with generate --compare"
        )


def label_index(drafter, logits_width: int, vocab_size: int) -> torch.Tensor:
    """[vocab_size] target id -> column of the drafter's logits (-1: the drafter cannot propose it)."""
    id_map = getattr(drafter, "id_map", None)
    if id_map is None:
        if logits_width != vocab_size:
            raise ValueError(f"{logits_width} logits and no id map for a {vocab_size}-token vocabulary")
        return torch.arange(vocab_size)
    inv = torch.full((vocab_size,), -1, dtype=torch.long)
    inv[id_map(torch.arange(logits_width))] = torch.arange(logits_width)
    return inv


def rank_of(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Rank of each row's label column among its logits (0 = argmax); -1 where the label is < 0."""
    ok = labels >= 0
    lg = logits.float()
    tl = lg.gather(1, labels.clamp_min(0)[:, None])
    r = (lg > tl).sum(1)
    return torch.where(ok, r, torch.full_like(r, -1))


#: per depth, the drafter's logits [n-1-first, V'] at positions q = first .. n-2 (row q: root x_{q+1})
DepthLogits = Callable[[int], torch.Tensor]


def _heads_logits(drafter, hidden: torch.Tensor, tokens: torch.Tensor, first: int) -> DepthLogits:
    h = hidden[first : len(tokens) - 1].to(drafter.lm_head.dtype)
    return lambda d: drafter.heads.heads[d - 1](h, drafter.lm_head).float()


def _recurrent_logits(drafter, features: torch.Tensor, tokens: torch.Tensor, depth: int, first: int) -> DepthLogits:
    n = len(tokens)
    module = drafter.module
    q = torch.arange(first, n - 1)
    if drafter.is_draft_model:  # a plain causal LM: depth d at q is its next-token logits at q + d
        hid, _ = module(tokens[None], torch.arange(n)[None], module.new_cache(1, n), causal_mask(n))
        return lambda d: module.logits(hid[0, (q + d).clamp_max(n - 1)]).float()
    dtype = next(module.parameters()).dtype
    qa = torch.arange(n - 1)  # the drafter attends to every committed position; logits are read from ``first``
    steps = [torch.where(qa + s + 1 < n, tokens[(qa + s + 1).clamp_max(n - 1)], 0)[None] for s in range(depth)]
    eye = torch.eye(drafter.embed.weight.shape[1], dtype=dtype)
    res = unrolled(  # an identity "lm_head": step outputs stay narrow; the projection runs on rows >= first only
        module,
        drafter.embed.weight,
        eye,
        features[None, : n - 1].to(dtype),
        steps,
        torch.zeros(1, dtype=torch.long),
        torch.ones(1, n - 1, dtype=torch.bool),
    )
    return lambda d: module.head_logits(res[d - 1][0][0, first:], drafter.lm_head).float()


def _block_logits(drafter, features: torch.Tensor, tokens: torch.Tensor, first: int) -> DepthLogits:
    from trtspec.models.heads import project
    from trtspec.train.block import anchored_states

    m = drafter.module
    n, B = len(tokens), m.block_size
    dtype = m.norm.weight.dtype
    positions = torch.arange(n)[None]
    prefix = m.context_kv(features[None].to(dtype), positions)
    valid = torch.ones(1, n, dtype=torch.bool)
    anchors = torch.arange(first + 1, n)  # p = q + 1
    states = torch.zeros(len(anchors), m.num_drafts, m.arch.hidden_size, dtype=dtype)
    for s in range(0, len(anchors), BLOCK_ANCHORS):
        a = anchors[s : s + BLOCK_ANCHORS][None]
        A = a.shape[1]
        ids = torch.full((1, A * B), m.mask_token_id, dtype=torch.long)
        ids[0, ::B] = tokens[a[0]]
        states[s : s + A] = anchored_states(m, drafter.embed(ids), a, prefix, positions, valid)[0]
    q = anchors - 1

    def logits(d: int) -> torch.Tensor:
        out = project(states[:, d - 1], drafter.lm_head).float()
        if drafter.bias is not None:  # the true previous token x_{q+d}, as the accepted parent
            out = out + drafter.bias(tokens[(q + d).clamp_max(n - 1)][:, None])[:, 0].float()
        return out

    return logits


def drafter_aux(drafter, cache: HiddenCache, target):
    """The drafter's aux-layer states on ``cache`` (``aux_cache.layer_states``), or None if it reads none."""
    if not drafter.aux_layers:
        return None
    return layer_states(cache, target, tuple(drafter.aux_layers), progress=False)


@torch.no_grad()
def depth_logits(drafter, features: torch.Tensor, tokens: torch.Tensor, depth: int, first: int = 0) -> DepthLogits:
    """The drafter's teacher-forced logits on one sequence: ``tokens`` [n] (the true text), ``features``
    [n, F] the target's states there (its last hidden state, or its aux-layer states for a drafter that
    reads them); rows from position ``first`` on (the target's reply: where serving drafts)."""
    from trtspec.drafters.block_proposer import BlockDrafter
    from trtspec.drafters.proposers import HeadsDrafter

    if isinstance(drafter, HeadsDrafter):
        return _heads_logits(drafter, features, tokens, first)
    if isinstance(drafter, BlockDrafter):
        return _block_logits(drafter, features, tokens, first)
    return _recurrent_logits(drafter, features, tokens, depth, first)


@torch.no_grad()
def measure_ranks(
    drafter,
    cache: HiddenCache,
    depth: int,
    max_positions: int = 20000,
    aux: list[np.ndarray] | None = None,
) -> np.ndarray:
    """[n, depth] true-token ranks per calibration position (the target's replies only) for a runtime
    drafter on a cache of the target's own text. ``aux``: per cache shard, the target's states entering
    the drafter's ``aux_layers`` (``drafter_aux``), needed when it has any."""
    return np.concatenate(ranks_by_sequence(drafter, cache, depth, max_positions, aux))[:max_positions]


@torch.no_grad()
def ranks_by_sequence(
    drafter,
    cache: HiddenCache,
    depth: int,
    max_positions: int = 20000,
    aux: list[np.ndarray] | None = None,
) -> list[np.ndarray]:
    """``measure_ranks`` per cached sequence: [m_i, depth], row j for the root at position prompt length
    + j (what ``simulated_length`` walks through as decoding would)."""
    check_measurable(drafter)
    if drafter.aux_layers and aux is None:
        raise ValueError("this drafter reads target layers: pass their states (drafter_aux)")
    vocab = int(cache.meta["vocab_size"])
    rows, total, index = [], 0, None
    for i, (shard, start, n) in enumerate(cache.sequences):
        first = max(cache.prompt_lengths[i] - 1, 0)  # only where the target wrote the text, as when serving
        if n - 1 - first < 1:
            continue
        seq = cache.sequence(i)
        tokens = torch.from_numpy(np.asarray(seq["tokens"], dtype=np.int64))
        am = torch.from_numpy(np.asarray(seq["argmax"], dtype=np.int64))
        src = aux[shard][start : start + n] if drafter.aux_layers else seq["hidden"]
        features = torch.from_numpy(np.asarray(src, dtype=np.float32))
        logits_at = depth_logits(drafter, features, tokens, depth, first)
        q = torch.arange(first, n - 1)
        ranks = torch.full((len(q), depth), -1, dtype=torch.long)
        for d in range(1, depth + 1):
            logits = logits_at(d)
            if index is None:
                index = label_index(drafter, logits.shape[-1], vocab)
            t = q + d
            lab = torch.where(t < n, am[t.clamp_max(n - 1)], -1)
            ranks[:, d - 1] = rank_of(logits, torch.where(lab >= 0, index[lab.clamp_min(0)], -1))
        rows.append(ranks.numpy())
        total += len(q)
        if total >= max_positions:
            break
    if not rows:
        raise UsageError("the calibration cache holds no reply of two tokens or more")
    return rows


def simulated_length(sequences: list[np.ndarray], choices, limit: int | None = None) -> float:
    """Tokens per target step that greedy decoding with the static tree ``choices`` gets on the measured
    text: from each root, the deepest tree path its ranks start with is accepted, plus the bonus token,
    and the next root is the token after them. ``limit``: decode that many new tokens per sequence (as
    ``max_new_tokens``; the last step's drafts count in full, as the runtime counts them); None: to
    the end of each text.

    Why not the mean over positions of 1 + sum P(node): steps skip the positions they accept, so
    predictable stretches take fewer steps than positions, and that mean runs high wherever acceptance
    varies along the text. (The tree builder maximises it: for one position it is the right objective.)"""
    nodes = {tuple(int(r) for r in c) for c in choices}
    depth = max((len(c) for c in nodes), default=0)
    steps = tokens = 0
    for ranks in sequences:
        end = len(ranks) if limit is None else min(len(ranks), limit - 1)  # root j is new token j + 1
        j = 0
        while j < end:
            accepted = 0
            while accepted < min(depth, ranks.shape[1]) and tuple(int(r) for r in ranks[j, : accepted + 1]) in nodes:
                accepted += 1
            if limit is None:
                accepted = min(accepted, len(ranks) - 1 - j)  # not past the end of the text
            steps += 1
            tokens += accepted + 1
            j += accepted + 1
    return tokens / steps if steps else 1.0
