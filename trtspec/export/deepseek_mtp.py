"""deepseek-v3-mtp: an MTP module written into a copy of the target, the way DeepSeek-V3 and GLM-4.5 ship
theirs (``num_nextn_predict_layers: 1``; ``model.layers.{L}.{enorm, hnorm, eh_proj, shared_head.*}`` and
one decoder layer after the main model's L layers).

mtp-single trains exactly this module, so its heads can travel inside the target: one directory that is
both ``--target`` and drafter (trtspec's ``native-mtp`` kind reads it back; with no ``--heads`` the
target drafts with its own module). The RMSNorms are part of the layout: heads trained with
``--no-rmsnorm`` cannot be written as it.
"""

from __future__ import annotations

from pathlib import Path

from trtspec.drafters.native_mtp import write_target_with_mtp
from trtspec.errors import UsageError
from trtspec.export.base import Exporter, ExportOptions, drafter_tensors
from trtspec.spec import SpecModel

NAME = "deepseek-v3-mtp"
NORMS = ("enorm.weight", "hnorm.weight", "norm.weight")


def write(spec: SpecModel, out: Path, opts: ExportOptions) -> None:
    tensors = drafter_tensors(spec, opts.dtype)
    missing = [n for n in NORMS if n not in tensors]
    if missing:
        raise UsageError(
            f"{opts.heads} has no {', '.join(missing)}: the DeepSeek-V3 MTP layout carries enorm/hnorm and "
            f"the shared head's norm; train the heads with their RMSNorm kept (the default, no --no-rmsnorm)"
        )
    write_target_with_mtp(spec.target, tensors, out, opts.dtype)


EXPORTER = Exporter(
    name=NAME,
    summary="the target with the MTP module inside it (DeepSeek-V3 layout, num_nextn_predict_layers: 1)",
    loaders="trtspec (native-mtp: the directory is --target and drafter at once); DeepSeek-V3-style MTP readers",
    write=write,
)
