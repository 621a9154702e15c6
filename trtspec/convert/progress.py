"""Conversion progress on stderr (tensors, bytes, ETA) and the summary table printed at the end."""

from __future__ import annotations

import sys
from typing import TextIO

from trtspec.convert.core import ConvertResult


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class ConvertProgress:
    """A tqdm bar over bytes written (tqdm shows rate and ETA) with ``tensors i/N`` as its postfix.

    Used as ``on_tensor`` callback of ``convert``; disabled (no output at all) when ``enabled`` is false.
    """

    def __init__(self, total_tensors: int, total_bytes: int, enabled: bool = True, file: TextIO | None = None):
        self.total_tensors = total_tensors
        self.done = 0
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(
                total=total_bytes,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc="convert",
                file=file or sys.stderr,
                dynamic_ncols=True,
                leave=True,
                mininterval=0.2,
            )

    def __call__(self, name: str, nbytes: int) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(f"tensors {self.done}/{self.total_tensors}", refresh=False)
            self.bar.update(nbytes)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> ConvertProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def summary_table(result: ConvertResult) -> str:
    """One row per rank file, then totals: what was written, how fast, and the memory it took."""
    rows = [("checkpoint", "file", "tensors", "size")]
    for f in result.files:
        rows.append((f.checkpoint, f.path, str(f.tensors), human_bytes(f.bytes)))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    line = "  ".join("-" * w for w in widths)
    fmt = lambda r: "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    out = [fmt(rows[0]), line, *(fmt(r) for r in rows[1:]), line]
    secs = max(result.seconds, 1e-9)
    out.append(
        f"{result.kind} -> {result.mode.architecture}"
        f"{' (engine mode ' + result.mode.engine_mode + ')' if result.mode.engine_mode else ''}: "
        f"{result.tensors} tensors, {human_bytes(result.written_bytes)} written in {result.seconds:.2f} s "
        f"({result.written_bytes / secs / 1e6:.1f} MB/s); largest source tensor "
        f"{human_bytes(result.largest_tensor_bytes)}, peak RSS {human_bytes(result.peak_rss_bytes)}"
    )
    return "\n".join(out)
