"""The block proposer: a block drafter (``trtspec.models.block_draft``) filling a static tree from one forward.

``observe`` turns the target's aux-layer states at every newly committed position into context keys and
values (cached per draft layer, one entry per committed target position); ``propose`` runs the block
``[root, mask x (B-1)]`` at the positions right after the committed prefix and reads B-1 next-token
distributions at once. Depth d of the tree takes its tokens from block position d: without a ``bias``
every node of a depth shares that distribution (the drafter has no intra-block dependency); with one (a
Markov head's low-rank bigram bias) each parent adds ``bias(parent token)``, so the draft is
semi-autoregressive within the block. The tree may not be deeper than the block's drafts (``max_depth``:
B-1, or B for next-token blocks).

Confidence-scheduled verification: a drafter whose module has a confidence head also predicts, for each
sequence, the chance that the top-1 chain survives to each depth (the product of the per-draft
acceptance probabilities). ``verify_depth`` is then the deepest depth whose survival is at least
``min_survival`` for some live sequence of the batch (each request asks for its own depth, the batch
verifies the largest); the loop verifies only the tree's nodes up to that depth.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from trtspec.drafters.proposers import ModelDrafter, _fill_depth, load_module, pad_rows, restrict_rows
from trtspec.models.block_draft import BlockDraftModel, ContextCache
from trtspec.models.heads import project
from trtspec.models.llama import LlamaModel
from trtspec.spec import DrafterSpec
from trtspec.tree import TreeBuffers

#: prev token ids [B, K] -> additive logits [B, K, V] (V: the drafter's vocabulary rows)
Bias = Callable[[torch.Tensor], torch.Tensor]


class BlockDrafter(ModelDrafter):
    def __init__(
        self,
        module: BlockDraftModel,
        embed: nn.Embedding,
        lm_head: torch.Tensor,
        draft_vocab: torch.Tensor | None = None,
        bias: Bias | None = None,
        min_survival: float | None = None,
    ):
        self.module, self.embed, self.lm_head, self.projection = module, embed, lm_head, lm_head
        self.aux_layers, self.draft_vocab, self.bias = module.aux_layers, draft_vocab, bias
        self.max_depth = module.num_drafts
        self.min_survival = min_survival
        #: per sequence, the predicted chance that the top-1 chain survives to depth d [B, D] (or None)
        self.survival: torch.Tensor | None = None
        self.id_map = (lambda idx: draft_vocab[idx]) if draft_vocab is not None else None
        self.last_hidden: torch.Tensor | None = None  # block outputs of the last proposal [B, B-1, H]

    def reset(self, batch: int, capacity: int) -> None:
        arch = self.module.arch
        dtype = self.module.norm.weight.dtype
        layers = len(self.module.layers)
        self.cache = ContextCache(layers, batch, arch.num_key_value_heads, arch.head_dim, capacity, dtype)

    def forget(self, rows: list[int]) -> None:
        """Slots ``rows`` start new sequences (in-flight batching): their context cache restarts empty."""
        self.cache.forget(rows)

    def _lengths(self, rows: list[int] | None) -> torch.Tensor:
        """Committed context positions of the sequences in slots ``rows`` (None = rows 0..B-1)."""
        return self.cache.lengths if rows is None else self.cache.lengths[torch.as_tensor(rows, dtype=torch.long)]

    @torch.no_grad()
    def observe(self, hidden, aux, tokens_in, tokens_next, rows: list[int] | None = None) -> None:
        """Turn the aux-layer states of what was committed into context keys/values; ``rows``: the slots
        these sequences live in (None = rows 0..B-1)."""
        if aux is None:
            raise ValueError("a block drafter needs the target's aux-layer states")
        feats, valid = pad_rows(list(aux))
        positions = self._lengths(rows)[:, None] + torch.arange(feats.shape[1])[None, :]
        kv = self.module.context_kv(feats.to(self.module.norm.weight.dtype), positions)
        self.cache.append(kv, valid.sum(1), rows)

    @torch.no_grad()
    def block_logits(self, root: torch.Tensor, rows: list[int] | None = None) -> torch.Tensor:
        """Logits [B, D, V] of the block's D drafts after the committed prefix (anchor = ``root``) of the
        sequences in slots ``rows`` (None = rows 0..B-1)."""
        Bt, M = root.shape[0], self.module.block_size
        ids = torch.full((Bt, M), self.module.mask_token_id, dtype=torch.long)
        ids[:, 0] = root
        positions = self._lengths(rows)[:, None] + torch.arange(M)[None, :]
        prefix, valid = self.cache.prefix(rows)
        mask = torch.cat([valid[:, None, :].expand(Bt, M, -1), torch.ones(Bt, M, M, dtype=torch.bool)], -1)
        h = self.module.blocks(self.embed(ids), positions, prefix, mask[:, None])
        self.last_hidden = self.module.draft_states(h)
        return project(self.last_hidden, self.projection).float()

    @torch.no_grad()
    def propose(self, tree: TreeBuffers, root: torch.Tensor, rows: list[int] | None = None) -> torch.Tensor:
        Bt, N1 = root.shape[0], tree.size
        tokens = torch.zeros(Bt, N1, dtype=torch.long)
        tokens[:, 0] = root
        if N1 == 1:
            return tokens
        logits = self.block_logits(root, rows)
        for d in range(1, tree.max_depth + 1):
            if self.bias is None:
                _fill_depth(tokens, tree, d, logits[:, d - 1], self.id_map)
                continue
            parents = [n for n in ([0] if d == 1 else tree.nodes_at_depth(d - 1)) if tree.children(n)]
            prev = tokens[:, parents]  # target ids; the bias is indexed by them
            full = logits.new_full((Bt, N1, logits.shape[-1]), float("-inf"))
            full[:, parents] = logits[:, d - 1, None, :] + self.bias(prev).float()
            _fill_depth(tokens, tree, d, full, self.id_map)
        self.survival = self._survival(tree, tokens, root) if self.min_survival is not None else None
        return tokens

    def _survival(self, tree: TreeBuffers, tokens: torch.Tensor, root: torch.Tensor) -> torch.Tensor | None:
        """[B, D] predicted survival of the tree's top-1 chain (None without a confidence head)."""
        chain, node = [], 0
        while True:
            kids = [c for c in tree.children(node) if int(tree.ranks[c]) == 0]
            if not kids:
                break
            node = kids[0]
            chain.append(node)
        if not chain or getattr(self.module, "confidence_head", None) is None:
            return None
        prev = torch.cat([root[:, None], tokens[:, chain[:-1]]], 1)
        logits = self.module.confidence(self.last_hidden[:, : len(chain)], prev)
        return torch.sigmoid(logits.float()).cumprod(-1)

    def verify_depth(self, tree: TreeBuffers) -> int:
        """How deep the loop should verify this step's tree (see the module doc)."""
        if self.survival is None or self.min_survival is None:
            return tree.max_depth
        keep = (self.survival >= self.min_survival).sum(-1)  # per request
        return max(1, int(keep.max()))


def build_block_drafter(
    drafter: DrafterSpec,
    target: LlamaModel,
    dtype: torch.dtype,
    module: BlockDraftModel,
    min_survival: float | None = None,
) -> BlockDrafter:
    """Load ``module`` from the drafter's tensors and wrap it on the target's embedding and lm_head. A
    module with a Markov head (``markov_head``) biases each draft by its parent token; one with a
    confidence head schedules verification when ``min_survival`` is set."""
    module = load_module(module, drafter, dtype)
    dv = drafter.draft_vocab
    lm_head = restrict_rows(target.lm_head.weight.detach(), dv)
    head = getattr(module, "markov_head", None)
    bias = None if head is None else _markov_bias(head, dv)
    return BlockDrafter(module, target.embed_tokens, lm_head, dv, bias, min_survival)


def _markov_bias(head: nn.Module, rows: torch.Tensor | None) -> Bias:
    """The Markov head's bias over the draft vocabulary's ``rows`` only, those rows gathered once (not at
    every depth of every step: 220 -> 42 us per depth for a 4,096-token vocabulary on one CPU thread, and
    the gather was about a fifth of the time a 7-deep SmolLM2 DSpark chain took to draft)."""
    w2 = head.markov_w2.weight if rows is None else head.markov_w2.weight[rows]
    return lambda prev: F.linear(head.markov_w1(prev), w2)
