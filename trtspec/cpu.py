"""How many cores this process may use, torch's thread count set from it once, and the one line every
computing command prints (dtype and threads).

Why: torch sizes its thread pool from the machine's online CPUs (or OMP_NUM_THREADS), not from what the
process is *given*: a container limited by a cgroup CPU quota, or a job pinned with taskset / a
scheduler's affinity mask, then runs more threads than cores (oversubscription: threads wait on each
other at every barrier of every small matmul) or, when the pool was sized at 1 somewhere, leaves cores
idle. ``usable_cores`` reads both limits; ``configure_threads`` applies the result to torch once.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import torch

from trtspec.dtypes import DtypeChoice, resolve_dtype

#: environment override of the thread count (a positive int); OMP_NUM_THREADS is honoured as well.
ENV_THREADS = "TRTSPEC_THREADS"
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
_configured: tuple[int, str] | None = None  # (threads, why) of the first call


def cgroup_cpu_limit(path: Path = CGROUP_CPU_MAX) -> float | None:
    """CPUs allowed by the cgroup v2 quota (``cpu.max``: ``"<quota> <period>"`` or ``"max <period>"``),
    or None when there is no quota or no such file."""
    try:
        quota, _, period = path.read_text().strip().partition(" ")
    except OSError:
        return None
    if quota == "max" or not period:
        return None
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def usable_cores() -> tuple[int, str]:
    """(cores this process may use, how that was found): the affinity mask, capped by the cgroup quota
    (rounded up: a 1.5-CPU quota still runs two threads usefully)."""
    try:
        affinity = len(os.sched_getaffinity(0))
        why = f"{affinity} in CPU affinity"
    except (AttributeError, OSError):  # not Linux
        affinity = os.cpu_count() or 1
        why = f"{affinity} online"
    n = affinity
    quota = cgroup_cpu_limit()
    if quota is not None and math.ceil(quota) < n:
        n = max(1, math.ceil(quota))
        why += f", cgroup quota {quota:g} CPUs"
    return max(1, n), why


def configure_threads(threads: int | None = None) -> tuple[int, str]:
    """Set torch's intra-op threads to ``threads``, else ``TRTSPEC_THREADS``, else OMP_NUM_THREADS (the
    user's explicit choice), else the usable cores. Returns (threads now used, why). Idempotent: the
    first call decides, later calls without ``threads`` keep it (torch's pool is created once, and
    resizing it between stages only costs)."""
    global _configured
    if threads is None and _configured is not None:
        return torch.get_num_threads(), _configured[1]
    why = "requested"
    if threads is None:
        env = os.environ.get(ENV_THREADS) or os.environ.get("OMP_NUM_THREADS")
        if env and env.strip().isdigit() and int(env) > 0:
            threads = int(env)
            why = f"{ENV_THREADS if os.environ.get(ENV_THREADS) else 'OMP_NUM_THREADS'}={threads}"
        else:
            threads, why = usable_cores()
            local = os.environ.get("LOCAL_WORLD_SIZE", "")
            if local.isdigit() and int(local) > 1:  # torchrun: the ranks on this node share the cores
                threads = max(1, threads // int(local))
                why += f", shared by {local} local ranks"
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    _configured = (threads, why)
    return torch.get_num_threads(), why


def setup_compute(
    requested: str | torch.dtype | None = "auto",
    device: str | torch.device = "cpu",
    echo: Callable[[str], object] | None = print,
) -> DtypeChoice:
    """What every computing command does first: threads from the usable cores, the dtype from the
    ``auto`` policy (or the explicit one), and one line saying both, e.g.
    ``dtype: float32 (auto: this CPU has no native bfloat16: AVX2); threads: 2 (2 in CPU affinity)``."""
    choice = resolve_dtype(requested, device)
    if torch.device(device).type == "cpu":
        n, why = configure_threads()
        line = f"{choice.describe()}; threads: {n} ({why})"
    else:
        line = f"{choice.describe()}; device: {device}"
    if echo is not None:
        echo(line)
    return choice
