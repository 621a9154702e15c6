"""Filesystem helpers every writer shares: nothing half-written is ever left behind."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trtspec.errors import CheckpointError


@contextmanager
def atomic_directory(out: Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory next to ``out``; rename it to ``out`` only if the block succeeds.

    Why next to ``out``: a rename is atomic only within one file system. On any exception (including
    KeyboardInterrupt) the temporary directory is removed, so nothing half-written is ever left.
    """
    out = Path(out)
    if out.exists() and not overwrite:
        raise CheckpointError("output directory already exists", out, "pass --overwrite or choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            old = out.with_name(f".{out.name}.old-{tmp.name.rsplit('-', 1)[-1]}")
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
