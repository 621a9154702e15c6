"""SpecModel -> TensorRT-LLM checkpoint(s), streamed: one source tensor in memory at a time.

Order of work: every rank file of a checkpoint is opened at once with its header already written (the
header is computed from shapes alone); then each job loads its source tensor(s) once, casts, splits into
tp shards and appends each shard to the rank files that hold it. Peak memory is therefore about one
source tensor plus its shards (~2x the largest tensor), independent of model size. Output goes to a
temporary directory next to ``out`` that is renamed only when everything has been written.
"""

from __future__ import annotations

import json
import logging
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trtspec import __version__
from trtspec.convert.config import check_config
from trtspec.convert.modes import CheckpointPlan, ConvertOptions, ExportMode, select_mode
from trtspec.convert.writer import PlannedTensor, StreamingSafetensorsWriter, atomic_directory
from trtspec.dtypes import DTYPES
from trtspec.errors import UsageError
from trtspec.spec import SpecModel

log = logging.getLogger("trtspec")

#: Written next to config.json: what trtspec did, for the build plan and for humans (TensorRT-LLM ignores it).
META_FILE = "trtspec_convert.json"

ProgressFn = Callable[[str, int], None]  # (tensor name, bytes written)


@dataclass
class FileStats:
    checkpoint: str
    rank: int
    path: str
    tensors: int
    bytes: int


@dataclass
class ConvertResult:
    out: Path
    kind: str
    mode: ExportMode
    plans: list[CheckpointPlan]
    files: list[FileStats] = field(default_factory=list)
    seconds: float = 0.0
    source_bytes: int = 0
    largest_tensor_bytes: int = 0
    peak_rss_bytes: int = 0

    @property
    def written_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    @property
    def tensors(self) -> int:
        return sum(f.tensors for f in self.files)

    def checkpoint_dirs(self) -> dict[str, Path]:
        """role -> checkpoint directory (``target`` always; ``draft`` for draft-model)."""
        return {p.role: (self.out / p.subdir if p.subdir else self.out) for p in self.plans}

    def summary(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "architecture": self.mode.architecture,
            "engine_mode": self.mode.engine_mode,
            "tensors": self.tensors,
            "written_bytes": self.written_bytes,
            "source_bytes": self.source_bytes,
            "largest_tensor_bytes": self.largest_tensor_bytes,
            "seconds": round(self.seconds, 3),
            "peak_rss_bytes": self.peak_rss_bytes,
            "files": [f.__dict__ for f in self.files],
        }


def peak_rss_bytes() -> int:
    """This process's peak resident set. Linux: VmHWM (ru_maxrss would carry a parent's peak across exec)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def plan_files(plan: CheckpointPlan) -> dict[int, list[PlannedTensor]]:
    """rank -> header entries, in job order, from shapes alone (no tensor data read)."""
    files: dict[int, list[PlannedTensor]] = {r: [] for r in range(plan.world_size)}
    for job in plan.jobs.jobs:
        shapes = job.shapes()
        for rank, names in job.targets.items():
            for name in names:
                files[rank].append(PlannedTensor(name, shapes[rank % job.tp_size], job.dtype))
    return files


def plan_conversion(spec: SpecModel, opts: ConvertOptions) -> tuple[ExportMode, list[CheckpointPlan]]:
    mode = select_mode(spec)
    plans = mode.checkpoints(spec, opts)
    for p in plans:
        try:
            plan_files(p)  # every shape and TP constraint checked before anything is written
        except UsageError as exc:
            raise UsageError(f"{p.role} checkpoint: {exc}") from None
        problems = check_config(p.config)
        if problems:  # a bug in trtspec, not a user error: say exactly what
            raise RuntimeError(f"internal: config.json for {p.role} fails the 1.2 field check: {problems}")
    return mode, plans


def _write_checkpoint(
    plan: CheckpointPlan,
    directory: Path,
    spec: SpecModel,
    mode: ExportMode,
    on_tensor: ProgressFn | None,
    result: ConvertResult,
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(plan.config, indent=4) + "\n")
    files = plan_files(plan)
    meta = {"format": "trtspec", "trtspec_version": __version__, "role": plan.role}
    writers = {
        r: StreamingSafetensorsWriter(directory / f"rank{r}.safetensors", entries, meta) for r, entries in files.items()
    }
    try:
        for job in plan.jobs.jobs:
            tensors = []
            for s in job.sources:
                t = s.load()
                tensors.append(t if t.dtype == job.dtype else t.to(job.dtype))
                del t
            result.largest_tensor_bytes = max(result.largest_tensor_bytes, max(s.nbytes for s in job.sources))
            result.source_bytes += job.source_bytes
            shards = job.rule.split(tensors, job.tp_size)
            del tensors
            for rank, names in job.targets.items():
                shard = shards[rank % job.tp_size]
                for name in names:
                    n = writers[rank].write(name, shard)
                    if on_tensor is not None:
                        on_tensor(name, n)
            del shards
        for w in writers.values():
            w.close()
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    for r, w in writers.items():
        rel = f"{plan.subdir}/{w.path.name}" if plan.subdir else w.path.name
        result.files.append(FileStats(plan.role, r, rel, len(files[r]), w.total_bytes))
    (directory / META_FILE).write_text(
        json.dumps(
            {
                **meta,
                "kind": mode.kind,
                "engine_mode": plan.engine_mode,
                "max_draft_len": plan.max_draft_len,
                "model_cls": plan.model_cls,
                "needs_plugin": mode.needs_plugin,
                "tree_choices": [list(c) for c in spec.tree.choices],
                "source": {
                    "target": str(spec.target.path),
                    "target_fingerprint": spec.target.fingerprint,
                    "drafter": str(spec.drafter.path) if spec.drafter else None,
                    # reference-runtime only: the engine drafts over the full vocabulary (a superset, lossless)
                    "draft_vocab_not_exported": _draft_vocab_size(spec),
                },
            },
            indent=2,
        )
        + "\n"
    )


def _draft_vocab_size(spec: SpecModel) -> int | None:
    dv = spec.drafter.draft_vocab if spec.drafter is not None else None
    return None if dv is None else int(dv.numel())


def planned_totals(plans: list[CheckpointPlan]) -> tuple[int, int]:
    """(tensor entries, bytes) the conversion will write: what the progress bar counts toward."""
    n = b = 0
    for p in plans:
        for entries in plan_files(p).values():
            n += len(entries)
            b += sum(e.nbytes for e in entries)
    return n, b


def convert_into(
    spec: SpecModel, directory: Path, opts: ConvertOptions, on_tensor: ProgressFn | None = None
) -> ConvertResult:
    """Write the checkpoint(s) into an existing (temporary) directory; the caller renames it."""
    mode, plans = plan_conversion(spec, opts)
    dropped = _draft_vocab_size(spec)
    if dropped:
        log.warning(
            "%s: the %d-token draft vocabulary is used by the reference runtime only; TensorRT-LLM drafts "
            "over the full vocabulary (same output, the drafter's lm_head is not reduced)",
            spec.drafter.path,
            dropped,
        )
    result = ConvertResult(Path(directory), mode.kind, mode, plans)
    t0 = time.perf_counter()
    for plan in plans:
        _write_checkpoint(plan, directory / plan.subdir if plan.subdir else directory, spec, mode, on_tensor, result)
    result.seconds = time.perf_counter() - t0
    result.peak_rss_bytes = peak_rss_bytes()
    return result


def convert(
    spec: SpecModel,
    out: str | Path,
    opts: ConvertOptions | None = None,
    overwrite: bool = False,
    on_tensor: ProgressFn | None = None,
) -> ConvertResult:
    """Write the TensorRT-LLM checkpoint(s) for ``spec`` to ``out`` (atomically)."""
    opts = opts or ConvertOptions(tp_size=spec.parallel.tp_size, pp_size=spec.parallel.pp_size)
    out = Path(out)
    plan_conversion(spec, opts)  # refuse bad options before a temporary directory exists
    with atomic_directory(out, overwrite=overwrite) as tmp:
        result = convert_into(spec, tmp, opts, on_tensor)
    result.out = out
    return result


def dtype_from_name(name: str | None) -> torch.dtype | None:
    if name is None:
        return None
    dt = DTYPES.get(name)
    if dt not in (torch.float16, torch.bfloat16, torch.float32):
        raise UsageError(f"unknown dtype {name!r}; choose float16, bfloat16 or float32")
    return dt
