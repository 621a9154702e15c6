"""Static draft trees: from Medusa/EAGLE "choices" to the buffers a tree step needs.

Node numbering (shared by the reference runtime, the CUDA TreeVerify kernel and the converter):
node 0 is the root (the last committed token, not yet fed to the target); nodes 1..N are the choices
sorted by (depth, path), so parents always come before children and siblings are in rank order.
"""

from __future__ import annotations

import ast
import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from trtspec.errors import CheckpointError, UsageError

#: a tuned tree recorded beside a drafter's files (``tune-tree --write-heads``), in any format: the public
#: layouts have no field for one and their loaders ignore a file they do not know
TREE_FILE = "trtspec_tree.json"


@dataclass(frozen=True)
class TreeSpec:
    """A static draft tree in Medusa/EAGLE "choices" notation.

    Each choice is a path of top-k ranks from the root: ``(0,)`` is the top-1 token at depth 1,
    ``(0, 1)`` is the second-best child of that node. The root (the last committed token) is implicit.
    Every prefix of a choice must also be a choice.
    """

    choices: tuple[tuple[int, ...], ...]

    @property
    def num_nodes(self) -> int:
        """Draft nodes, the root excluded."""
        return len(self.choices)

    @property
    def depth(self) -> int:
        return max((len(c) for c in self.choices), default=0)

    def buffers(self) -> TreeBuffers:
        return build_tree(self.choices)


@dataclass(frozen=True)
class TreeBuffers:
    """Everything derived from the choices, as CPU tensors.

    parents[n]   parent node of n (-1 for the root)
    depths[n]    depth of n (0 for the root) = its position offset from the root
    ranks[n]     top-k rank of n among its parent's candidates (0 for the root)
    mask[i, j]   True when j is i or an ancestor of i (tree attention: i may attend to j)
    paths[p]     root-to-leaf node indices of leaf p, root first, padded with -1 to depth+1
    packed_mask  int32 [N+1, ceil((N+1)/32)]: bit j%32 of word j//32 in row i is mask[i, j]
                 (the layout of TensorRT-LLM's spec_decoding_packed_mask)
    """

    choices: tuple[tuple[int, ...], ...]
    parents: torch.Tensor
    depths: torch.Tensor
    ranks: torch.Tensor
    mask: torch.Tensor
    paths: torch.Tensor
    packed_mask: torch.Tensor

    @property
    def size(self) -> int:
        """Rows of the tree step: the root plus every draft node (``TreeSpec.num_nodes + 1``)."""
        return int(self.parents.numel())

    @property
    def num_nodes(self) -> int:
        """Draft nodes, the root excluded (the one meaning of ``num_nodes`` in trtspec)."""
        return int(self.parents.numel()) - 1

    @property
    def max_depth(self) -> int:
        return int(self.depths.max())

    # Index lists as plain Python, computed once per tree: the runtime asks for them every step, and on a
    # CPU a tensor scan per question costs more than the small draft forwards it schedules.
    @functools.cached_property
    def child_lists(self) -> tuple[tuple[int, ...], ...]:
        parents = self.parents.tolist()
        return tuple(tuple(c for c in range(1, len(parents)) if parents[c] == n) for n in range(len(parents)))

    @functools.cached_property
    def _by_depth(self) -> tuple[tuple[int, ...], ...]:
        depths = self.depths.tolist()
        return tuple(tuple(n for n, d in enumerate(depths) if d == k) for k in range(max(depths) + 1))

    def children(self, node: int) -> list[int]:
        return list(self.child_lists[node])

    def nodes_at_depth(self, depth: int) -> list[int]:
        return list(self._by_depth[depth]) if 0 <= depth < len(self._by_depth) else []

    def count_up_to_depth(self, depth: int) -> int:
        """How many non-root nodes have depth <= ``depth`` (they are nodes 1..count: sorted by depth)."""
        return sum(len(self._by_depth[k]) for k in range(1, min(depth, len(self._by_depth) - 1) + 1))

    def max_rank_at_depth(self) -> list[int]:
        """For each depth d >= 1, how many top-k candidates that depth needs (max rank + 1)."""
        return [int(self.ranks[self.depths == d].max()) + 1 for d in range(1, self.max_depth + 1)]


def normalize_choices(choices) -> tuple[tuple[int, ...], ...]:
    """Validate and sort choices; every prefix of a path must itself be a path."""
    try:
        paths = [tuple(int(x) for x in c) for c in choices]
    except (TypeError, ValueError):
        raise UsageError(f"tree choices must be a list of lists of ints, got {choices!r:.80}") from None
    if any(len(p) == 0 for p in paths):
        raise UsageError("tree choices contain an empty path")
    if any(x < 0 for p in paths for x in p):
        raise UsageError("tree choices contain a negative rank")
    if len(set(paths)) != len(paths):
        raise UsageError("tree choices contain a duplicate path")
    have = set(paths)
    for p in paths:
        if len(p) > 1 and p[:-1] not in have:
            raise UsageError(f"tree choice {list(p)} has no parent {list(p[:-1])}: add it")
    return tuple(sorted(paths, key=lambda p: (len(p), p)))


def parse_choices(text: str) -> tuple[tuple[int, ...], ...]:
    """Parse "[[0],[0,0],[1]]" (JSON/Python), TensorRT-LLM's "{0}, {0, 0}, {1}", or "chain:N"."""
    text = text.strip()
    if text.startswith("chain:"):
        n = int(text.split(":", 1)[1])
        return tuple(tuple([0] * d) for d in range(1, n + 1))
    if text.startswith("{"):
        text = "[" + text.replace("{", "[").replace("}", "]") + "]"
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise UsageError(f"cannot parse tree choices {text[:60]!r}; use e.g. [[0],[0,0],[1]] or chain:4") from None
    return normalize_choices(value)


def format_choices_trtllm(choices) -> str:
    """TensorRT-LLM's runtime notation: "{0}, {0, 0}, {1}" (Triton medusa_choices/eagle_choices)."""
    return ", ".join("{" + ", ".join(str(x) for x in c) + "}" for c in normalize_choices(choices))


def format_choices_json(choices) -> str:
    return json.dumps([list(c) for c in normalize_choices(choices)])


def tree_file(heads: str | Path) -> Path:
    """Where a drafter directory (or the directory of a drafter file) keeps its recorded tree."""
    heads = Path(heads)
    return (heads if heads.is_dir() else heads.parent) / TREE_FILE


def read_recorded_tree(heads: str | Path) -> tuple[tuple[int, ...], ...] | None:
    """The tree recorded beside a drafter's files, or None where there is none."""
    path = tree_file(heads)
    if not path.is_file():
        return None
    try:
        choices = json.loads(path.read_text())["tree_choices"]
        return normalize_choices(choices)
    except (OSError, json.JSONDecodeError, KeyError, TypeError, UsageError) as e:
        raise CheckpointError(
            f"unreadable recorded tree ({e})", path, "delete it, or re-run tune-tree --write-heads"
        ) from None


def write_recorded_tree(heads: str | Path, choices, source: str) -> Path:
    """Record ``choices`` beside a drafter's files (temp file + rename: never half-written)."""
    path = tree_file(heads)
    body = {"tree_choices": [list(c) for c in normalize_choices(choices)], "written_by": source}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(body, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def build_tree(choices) -> TreeBuffers:
    paths = normalize_choices(choices)
    index = {(): 0}
    for i, p in enumerate(paths):
        index[p] = i + 1
    n = len(paths) + 1
    parents = torch.full((n,), -1, dtype=torch.long)
    depths = torch.zeros(n, dtype=torch.long)
    ranks = torch.zeros(n, dtype=torch.long)
    for p, i in index.items():
        if p:
            parents[i] = index[p[:-1]]
            depths[i] = len(p)
            ranks[i] = p[-1]
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = int(parents[j])
    has_child = torch.zeros(n, dtype=torch.bool)
    has_child[parents[parents >= 0]] = True
    leaves = [i for i in range(n) if not has_child[i]]
    max_depth = int(depths.max())
    path_t = torch.full((len(leaves), max_depth + 1), -1, dtype=torch.long)
    for r, leaf in enumerate(leaves):
        chain, j = [], leaf
        while j >= 0:
            chain.append(j)
            j = int(parents[j])
        chain.reverse()
        path_t[r, : len(chain)] = torch.tensor(chain)
    return TreeBuffers(paths, parents, depths, ranks, mask, path_t, pack_mask(mask))


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """Pack a bool [..., N, N] mask into int32 words along the last dim (bit j%32 of word j//32)."""
    n = mask.shape[-1]
    words = (n + 31) // 32
    padded = torch.zeros(*mask.shape[:-1], words * 32, dtype=torch.int64)
    padded[..., :n] = mask.to(torch.int64)
    bits = padded.view(*mask.shape[:-1], words, 32) << torch.arange(32, dtype=torch.int64)
    packed = bits.sum(-1)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed)  # two's complement for bit 31
    return packed.to(torch.int32)


def unpack_mask(packed: torch.Tensor, n: int) -> torch.Tensor:
    p = packed.to(torch.int64) & 0xFFFFFFFF
    bits = (p[..., None] >> torch.arange(32, dtype=torch.int64)) & 1
    return bits.flatten(-2)[..., :n].bool()


#: A reasonable default tree (depth 4, 24 nodes) when no tuned tree is given: wide at depth 1 where the
#: drafter is most accurate, narrowing with depth.
DEFAULT_CHOICES = normalize_choices(
    [
        [0],
        [1],
        [2],
        [3],
        [0, 0],
        [0, 1],
        [0, 2],
        [1, 0],
        [1, 1],
        [2, 0],
        [3, 0],
        [0, 0, 0],
        [0, 0, 1],
        [0, 1, 0],
        [1, 0, 0],
        [0, 2, 0],
        [2, 0, 0],
        [0, 0, 0, 0],
        [0, 0, 0, 1],
        [0, 0, 1, 0],
        [0, 1, 0, 0],
        [1, 0, 0, 0],
        [0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0],
    ]
)
