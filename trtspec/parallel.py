"""The one parallel mapping type: tensor x pipeline parallel ranks, in TensorRT-LLM's rank layout.

The SpecModel carries it, the converter shards by it, the engine plan and launch scripts read its
world size; one type so that "rank 3" means the same thing in each of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Mapping:
    """TensorRT-LLM's rank layout (``tensorrt_llm/mapping.py``): rank = pp_rank * tp_size + tp_rank."""

    tp_size: int = 1
    pp_size: int = 1

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    def rank(self, tp_rank: int, pp_rank: int) -> int:
        return pp_rank * self.tp_size + tp_rank

    def tp_rank(self, rank: int) -> int:
        return rank % self.tp_size

    def stage_ranks(self, pp_rank: int) -> list[int]:
        return [self.rank(t, pp_rank) for t in range(self.tp_size)]

    def pp_layers(self, num_layers: int, pp_rank: int) -> list[int]:
        """Layers of stage pp_rank. TensorRT-LLM 1.x: torch.tensor_split, the first (L % pp) stages get
        one extra layer."""
        return torch.tensor_split(torch.arange(num_layers), self.pp_size)[pp_rank].tolist()

    def to_config(self) -> dict[str, int]:
        return {"world_size": self.world_size, "tp_size": self.tp_size, "pp_size": self.pp_size}
