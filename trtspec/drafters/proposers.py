"""The two model-based proposers every model kind builds on: they turn the target's committed state
into a static draft tree of token ids.

* ``HeadsDrafter``: K heads on the target's last hidden state; depth-d node tokens are the top-k of head
  d-1, independent of the parent (the Medusa scheme).
* ``RecurrentDrafter``: one model applied autoregressively with its own KV cache. Pair drafters consume
  (feature_q, token_{q+1}) at position q (EAGLE-style heads); a separate draft model consumes token_q at
  position q. The tree is expanded depth by depth: each depth runs one forward over all tree nodes above
  it with the tree mask (nothing committed), then takes top-k at each parent.

Both implement ``trtspec.drafters.base.Drafter``: ``observe`` feeds what the target just committed;
``propose`` returns [B, tree.size] tokens (node 0 = root). Both are batched; sequences may have committed
different numbers of tokens. Which kinds use which proposer is each kind module's business.
"""

from __future__ import annotations

import torch
from torch import nn

from trtspec.models.heads import LinearHeads
from trtspec.models.llama import LlamaModel, causal_mask
from trtspec.spec import DrafterSpec
from trtspec.tree import TreeBuffers


def load_module(
    module: nn.Module, drafter: DrafterSpec, dtype: torch.dtype, optional: tuple[str, ...] = ()
) -> nn.Module:
    """Fill a head module from the drafter's canonical tensors (names = parameter names)."""
    state = module_state(drafter)
    missing, unexpected = module.load_state_dict(state, strict=False)
    missing = [m for m in missing if m not in optional and not m.endswith("inv_freq")]
    if missing or unexpected:
        raise KeyError(f"{drafter.kind} heads: missing {missing[:4]}, unexpected {unexpected[:4]}")
    return module.to(dtype).eval()


def module_state(drafter: DrafterSpec) -> dict[str, torch.Tensor]:
    """The drafter's tensors its module holds, by canonical name: all but the target's shared embedding."""
    return {n: drafter.tensors.load(n) for n in drafter.tensors if n != "embed_tokens.weight"}


def pad_rows(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack variable-length rows [m_b, ...] into [B, M, ...] plus a validity mask [B, M]."""
    M = max(r.shape[0] for r in rows)
    out = rows[0].new_zeros(len(rows), M, *rows[0].shape[1:])
    valid = torch.zeros(len(rows), M, dtype=torch.bool)
    for b, r in enumerate(rows):
        out[b, : r.shape[0]] = r
        valid[b, : r.shape[0]] = True
    return out, valid


def _fill_depth(tokens: torch.Tensor, tree: TreeBuffers, depth: int, parent_logits: torch.Tensor, id_map=None) -> None:
    """Write the tokens of every node at ``depth``: rank r of its parent's top-k.
    parent_logits [B, N+1, V] indexed by parent node (or [B, V] shared by all parents)."""
    nodes = tree.nodes_at_depth(depth)
    ranks, parents = tree.ranks.tolist(), tree.parents.tolist()
    k = max(ranks[n] for n in nodes) + 1
    tops: dict[int, torch.Tensor] = {}  # one top-k per parent (or one in all when shared)
    for n in nodes:
        p = parents[n] if parent_logits.dim() == 3 else -1
        if p not in tops:
            logits = parent_logits if p < 0 else parent_logits[:, p]
            tops[p] = torch.topk(logits, k, dim=-1).indices
        top = tops[p][:, ranks[n]]
        tokens[:, n] = id_map(top) if id_map is not None else top


class ModelDrafter:
    """Shared by both proposers: the module, its vocabulary projection, and bfloat16 pre-packing."""

    aux_layers: tuple[int, ...] = ()
    max_depth: int | None = None
    module: nn.Module
    lm_head: torch.Tensor | None
    draft_vocab: torch.Tensor | None

    def drafted(self) -> torch.Tensor | None:
        """Every node: a model fills the whole tree."""
        return None

    def pack(self, target_projection: nn.Module) -> None:
        """Pre-pack the drafter's matmuls and vocabulary projection (bfloat16 CPU inference, models.packed).
        ``lm_head`` stays the plain weight (tree tuning reads it); ``projection`` is what proposing calls:
        the target's own packed lm_head when the drafter projects onto the full vocabulary (``lm_head`` is
        then the target's weight), a packed copy of the draft-vocabulary rows otherwise."""
        from trtspec.models.packed import pack_module, pack_projection

        pack_module(self.module)
        if self.lm_head is not None:
            self.projection = target_projection if self.draft_vocab is None else pack_projection(self.lm_head)

    def tune_small_rows(self, target_projection: nn.Module, dtype: torch.dtype, device: str) -> None:
        """The same for unpacked CPU inference (models.small_rows): the module's linears and the vocabulary
        projection run as measured fastest on this CPU for a step's few rows."""
        from trtspec.models.small_rows import small_rows_projection, tune_small_rows

        tune_small_rows(self.module, dtype, device)
        if self.lm_head is not None:
            full = self.draft_vocab is None
            self.projection = target_projection if full else small_rows_projection(self.lm_head, device)


class HeadsDrafter(ModelDrafter):
    def __init__(self, heads: LinearHeads, lm_head: torch.Tensor, draft_vocab: torch.Tensor | None = None):
        self.heads, self.lm_head, self.draft_vocab = heads, lm_head, draft_vocab
        self.module, self.projection = heads, lm_head
        self.max_depth = len(heads.heads)
        self.id_map = (lambda idx: draft_vocab[idx]) if draft_vocab is not None else None
        self.last_hidden: torch.Tensor | None = None

    def reset(self, batch: int, capacity: int) -> None:
        self.last_hidden = None
        self.slots = batch

    def forget(self, rows: list[int]) -> None:
        """Nothing to clear: a slot's next ``observe`` replaces its hidden state."""

    def observe(self, hidden, aux, tokens_in, tokens_next, rows=None) -> None:
        last = torch.stack([h[-1] for h in hidden])
        if rows is None:
            self.last_hidden = last
            return
        if self.last_hidden is None or self.last_hidden.shape[0] != self.slots:
            self.last_hidden = last.new_zeros(self.slots, last.shape[-1])
        self.last_hidden[rows] = last

    @torch.no_grad()
    def propose(self, tree: TreeBuffers, root: torch.Tensor, rows=None) -> torch.Tensor:
        tokens = torch.zeros(root.shape[0], tree.size, dtype=torch.long)
        tokens[:, 0] = root
        hidden = self.last_hidden if rows is None else self.last_hidden[rows]
        for d in range(1, tree.max_depth + 1):  # only the heads the tree reaches
            _fill_depth(tokens, tree, d, self.heads.heads[d - 1](hidden, self.projection).float(), self.id_map)
        return tokens


class RecurrentDrafter(ModelDrafter):
    """One module applied autoregressively: a pair head (``features`` + ``head_logits``) or a draft model.

    ``id_map`` turns the module's output ids into target ids (a draft vocabulary's rows, EAGLE-3's d2t)."""

    def __init__(
        self,
        module: nn.Module,
        embed: nn.Embedding | None,
        lm_head: torch.Tensor | None,
        aux_layers: tuple[int, ...] = (),
        draft_vocab: torch.Tensor | None = None,
        id_map=None,
    ):
        self.module, self.embed, self.lm_head = module, embed, lm_head
        self.projection = lm_head
        self.aux_layers, self.draft_vocab = aux_layers, draft_vocab
        self.is_draft_model = isinstance(module, LlamaModel)
        self.id_map = id_map
        if draft_vocab is not None:
            self.id_map = lambda idx: draft_vocab[idx]

    def reset(self, batch: int, capacity: int) -> None:
        self.cache = self.module.new_cache(batch, capacity)
        self.target_len = torch.zeros(batch, dtype=torch.long)  # target-committed positions seen so far
        self.last_out: torch.Tensor | None = None
        self.last_logits: torch.Tensor | None = None

    def forget(self, rows: list[int]) -> None:
        """Slots ``rows`` start new sequences (in-flight batching): their cache and counters restart."""
        from trtspec.models.kv_rows import free_rows

        free_rows(self.cache, rows)
        self.target_len[rows] = 0

    def _view(self, rows):
        """The cache as the next forward sees it: all rows, or the slots ``rows`` (models.kv_rows)."""
        if rows is None:
            return self.cache
        from trtspec.models.kv_rows import KVRows

        return KVRows(self.cache, rows)

    def _keep(self, name: str, value: torch.Tensor | None, rows) -> None:
        """Store per-row state ``name`` for all rows, or into the slots ``rows``."""
        if rows is None or value is None:
            setattr(self, name, value)
            return
        full = getattr(self, name)
        if full is None or full.shape[0] != self.target_len.shape[0]:
            full = value.new_zeros(self.target_len.shape[0], *value.shape[1:])
            setattr(self, name, full)
        full[rows] = value

    def _step(
        self,
        tokens: torch.Tensor,
        features: torch.Tensor | None,
        new_mask: torch.Tensor,
        depth_offset: torch.Tensor | None = None,
        cache=None,
    ) -> torch.Tensor:
        """Run the drafter on new tokens (not committed); returns its outputs [B, T, H]."""
        cache = self.cache if cache is None else cache
        T = tokens.shape[1]
        positions = cache.lengths[:, None] + (
            depth_offset[None, :] if depth_offset is not None else torch.arange(T)[None, :]
        )
        if self.is_draft_model:
            hidden, _ = self.module(tokens, positions, cache, new_mask)
            return hidden
        return self.module.features(self.embed(tokens), features, positions, cache, new_mask)

    def _logits(self, out: torch.Tensor) -> torch.Tensor:
        if self.is_draft_model:
            return self.module.logits(out)
        return self.module.head_logits(out, self.projection)

    @torch.no_grad()
    def observe(self, hidden, aux, tokens_in, tokens_next, rows=None) -> None:
        """``rows``: the slots these sequences live in (in-flight batching); None = rows 0..B-1."""
        B = len(tokens_next)
        cache = self._view(rows)
        target_len = self.target_len if rows is None else self.target_len[rows]
        if self.is_draft_model:
            seqs = []
            for b in range(B):
                seq = torch.cat([tokens_in[b], tokens_next[b][-1:]])
                skip = int(cache.lengths[b] - target_len[b])
                seqs.append(seq[skip:])
            feats = None
        else:
            seqs = list(tokens_next)
            src = aux if self.aux_layers else hidden
            feats, _ = pad_rows(list(src))
        toks, valid = pad_rows(seqs)
        mask = causal_mask(toks.shape[1]) & valid[:, None, :]
        out = self._step(toks, feats, mask, cache=cache)
        counts = valid.sum(1)
        cache.commit([torch.arange(int(c)) for c in counts])
        last_out = out[torch.arange(B), counts - 1]
        self._keep("last_logits", self._logits(last_out), rows)
        self._keep("last_out", None if self.is_draft_model else last_out, rows)
        seen = torch.tensor([t.shape[0] for t in tokens_in])
        if rows is None:
            self.target_len += seen
        else:
            self.target_len[rows] += seen

    @torch.no_grad()
    def propose(self, tree: TreeBuffers, root: torch.Tensor, rows=None) -> torch.Tensor:
        B, N1 = root.shape[0], tree.size
        tokens = torch.zeros(B, N1, dtype=torch.long)
        tokens[:, 0] = root
        if N1 == 1:
            return tokens
        cache = self._view(rows)
        last_logits = self.last_logits if rows is None else self.last_logits[rows]
        last_out = self.last_out if rows is None or self.last_out is None else self.last_out[rows]
        _fill_depth(tokens, tree, 1, last_logits, self.id_map)
        feats = None
        if last_out is not None:
            feats = last_out.new_zeros(B, N1, last_out.shape[-1])
            feats[:, 0] = last_out
        for d in range(2, tree.max_depth + 1):
            M = tree.count_up_to_depth(d - 1)  # nodes 1..M (sorted by depth)
            nodes = torch.arange(1, M + 1)
            parent_feats = feats[:, tree.parents[nodes]] if feats is not None else None
            mask = tree.mask[1 : M + 1, 1 : M + 1][None]
            out = self._step(tokens[:, nodes], parent_feats, mask, depth_offset=tree.depths[nodes] - 1, cache=cache)
            if feats is not None:
                feats[:, 1 : M + 1] = out
            expand = [n for n in tree.nodes_at_depth(d - 1) if tree.children(n)]
            logits = self._logits(out[:, torch.tensor(expand) - 1])
            full = logits.new_full((B, N1, logits.shape[-1]), float("-inf"))
            full[:, expand] = logits
            _fill_depth(tokens, tree, d, full, self.id_map)
        return tokens


def restrict_rows(weight: torch.Tensor, draft_vocab: torch.Tensor | None) -> torch.Tensor:
    """The rows of a vocabulary projection the drafter may propose (a contiguous copy: one matmul, no gather)."""
    return weight if draft_vocab is None else weight[draft_vocab].contiguous()


def build_heads_drafter(drafter: DrafterSpec, target: LlamaModel, dtype: torch.dtype, has_norm: bool) -> HeadsDrafter:
    """Medusa-scheme heads (``heads.{k}.res.{l}.*``, optional norms and own lm_heads) on the target."""
    cfg, dv = drafter.config, drafter.draft_vocab
    heads = LinearHeads(
        int(cfg["num_heads"]),
        int(cfg["hidden_size"]),
        target.arch.vocab_size,
        int(cfg.get("num_layers", 1)),
        has_norm=has_norm,
        eps=float(cfg.get("rms_norm_eps", 1e-6)),
        own_lm_head=bool(cfg.get("own_lm_head", False)),
    )
    heads = load_module(heads, drafter, dtype)
    for head in heads.heads:
        if head.lm_head is not None and dv is not None:
            head.lm_head.weight = nn.Parameter(restrict_rows(head.lm_head.weight.detach(), dv), requires_grad=False)
    return HeadsDrafter(heads, restrict_rows(target.lm_head.weight.detach(), dv), dv)


def build_pair_drafter(
    drafter: DrafterSpec,
    target: LlamaModel,
    dtype: torch.dtype,
    module: nn.Module,
    aux_layers: tuple[int, ...] = (),
    id_map=None,
) -> RecurrentDrafter:
    """A one-layer pair head (EAGLE-style) on the target's embedding (or its own) and lm_head."""
    module = load_module(module, drafter, dtype, optional=("d2t",))
    embed = target.embed_tokens
    if "embed_tokens.weight" in drafter.tensors:
        embed = nn.Embedding.from_pretrained(drafter.tensors.load("embed_tokens.weight").to(dtype))
    lm_head = restrict_rows(target.lm_head.weight.detach(), drafter.draft_vocab)
    return RecurrentDrafter(
        module,
        embed,
        lm_head,
        aux_layers,
        draft_vocab=drafter.draft_vocab,
        id_map=id_map(module) if id_map is not None else None,
    )
