"""FasterDecoding/Medusa heads: config.json (MedusaConfig) + medusa_lm_head.safetensors|.pt.

Published keys ``{h}.{l}.linear.weight|bias`` (ResBlocks) and ``{h}.{Lm}.weight`` (per-head lm_head,
absent for version "2" heads, which reuse the base lm_head). K and Lm are read from the keys: the Hub
configs are known to misstate medusa_num_heads.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from trtspec.checkpoint.errors import CheckpointError
from trtspec.checkpoint.heads.common import check_hidden, check_vocab, expect_shape, open_weights, single_dtype
from trtspec.spec import DrafterSpec, TargetSpec

WEIGHT_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt", "medusa_lm_head.bin")
_KEY = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


def looks_like_medusa(keys) -> bool:
    return any(_KEY.match(k) for k in keys)


def load_medusa(path: Path, target: TargetSpec, allow_pickle: bool = False) -> DrafterSpec:
    store = open_weights(path, WEIGHT_FILES, allow_pickle)
    where = path
    heads: dict[int, set[int]] = {}
    lm_layer: dict[int, int] = {}
    for key in store:
        m = _KEY.match(key)
        if not m:
            raise CheckpointError(f"unexpected tensor {key!r} in Medusa heads", where,
                                  "expected FasterDecoding/Medusa keys like 0.0.linear.weight")
        h, l, kind = int(m.group(1)), int(m.group(2)), m.group(3)
        if kind == "weight":
            lm_layer[h] = l
        else:
            heads.setdefault(h, set()).add(l)
    if not heads:
        raise CheckpointError("no Medusa ResBlock tensors found", where)
    K = max(heads) + 1
    Lm = max(max(v) for v in heads.values()) + 1
    if sorted(heads) != list(range(K)):
        raise CheckpointError(f"Medusa heads are not numbered 0..{K - 1}", where)
    H = store.shape("0.0.linear.weight")[0]
    check_hidden(H, target, where)
    own_lm_head = bool(lm_layer)
    mapping = {}
    for h in range(K):
        for l in range(Lm):
            for p in ("weight", "bias"):
                src = f"{h}.{l}.linear.{p}"
                expect_shape(store, src, (H, H) if p == "weight" else (H,), where, "a Medusa ResBlock")
                mapping[f"heads.{h}.res.{l}.{p}"] = src
        if own_lm_head:
            src = f"{h}.{lm_layer.get(h, Lm)}.weight"
            if src not in store:
                raise CheckpointError(f"head {h} has no lm_head ({src})", where)
            check_vocab(store.shape(src)[0], target, where)
            mapping[f"heads.{h}.lm_head.weight"] = src
    cfg_file = (path / "config.json") if path.is_dir() else path.parent / "config.json"
    meta = {}
    if cfg_file.is_file():
        try:
            meta = json.loads(cfg_file.read_text())
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"not valid JSON ({exc})", cfg_file) from None
    config = {"num_heads": K, "num_layers": Lm, "has_rmsnorm": False, "own_lm_head": own_lm_head,
              "hidden_size": H, "vocab_size": target.arch.vocab_size,
              "base_model_name_or_path": meta.get("base_model_name_or_path")}
    return DrafterSpec("medusa", path, store.renamed(mapping), config, dtype=single_dtype(store, where))
