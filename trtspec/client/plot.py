"""A dependency-free PNG line chart for `trtspec client bench` (tokens/s and latency vs concurrency).

Why not matplotlib: the client is meant to run anywhere the project runs (a bare venv, a CI box) and a
benchmark's plot is a few lines on a grid. So this draws into an RGB byte array with its own 3x5 pixel
font (digits, capitals and a few signs, scaled up) and writes the PNG with zlib: one function per job.
"""

from __future__ import annotations

import math
import struct
import zlib
from pathlib import Path

# 3x5 glyphs, rows top to bottom, "#" = ink
_FONT = {
    "0": "###|#.#|#.#|#.#|###", "1": ".#.|##.|.#.|.#.|###", "2": "###|..#|###|#..|###", "3": "###|..#|.##|..#|###",
    "4": "#.#|#.#|###|..#|..#", "5": "###|#..|###|..#|###", "6": "###|#..|###|#.#|###", "7": "###|..#|.#.|.#.|.#.",
    "8": "###|#.#|###|#.#|###", "9": "###|#.#|###|..#|###", ".": "...|...|...|...|.#.", "/": "..#|..#|.#.|#..|#..",
    "-": "...|...|###|...|...", "(": ".#.|#..|#..|#..|.#.", ")": ".#.|..#|..#|..#|.#.", " ": "...|...|...|...|...",
    "x": "...|#.#|.#.|#.#|...", ":": "...|.#.|...|.#.|...", "=": "...|###|...|###|...",
    "A": ".#.|#.#|###|#.#|#.#", "B": "##.|#.#|##.|#.#|##.", "C": "###|#..|#..|#..|###", "D": "##.|#.#|#.#|#.#|##.",
    "E": "###|#..|##.|#..|###", "F": "###|#..|##.|#..|#..", "G": "###|#..|#.#|#.#|###", "H": "#.#|#.#|###|#.#|#.#",
    "I": "###|.#.|.#.|.#.|###", "J": "..#|..#|..#|#.#|###", "K": "#.#|#.#|##.|#.#|#.#", "L": "#..|#..|#..|#..|###",
    "M": "#.#|###|###|#.#|#.#", "N": "##.|#.#|#.#|#.#|#.#", "O": "###|#.#|#.#|#.#|###", "P": "###|#.#|###|#..|#..",
    "Q": "###|#.#|#.#|###|..#", "R": "##.|#.#|##.|#.#|#.#", "S": "###|#..|###|..#|###", "T": "###|.#.|.#.|.#.|.#.",
    "U": "#.#|#.#|#.#|#.#|###", "V": "#.#|#.#|#.#|#.#|.#.", "W": "#.#|#.#|###|###|#.#", "X": "#.#|#.#|.#.|#.#|#.#",
    "Y": "#.#|#.#|.#.|.#.|.#.", "Z": "###|..#|.#.|#..|###",
}  # fmt: skip

COLORS = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40))


class Canvas:
    """An RGB image in a bytearray, white to start."""

    def __init__(self, width: int, height: int):
        self.w, self.h = width, height
        self.px = bytearray(b"\xff" * (width * height * 3))

    def dot(self, x: int, y: int, color: tuple[int, int, int], size: int = 1) -> None:
        for dy in range(size):
            for dx in range(size):
                xx, yy = x + dx, y + dy
                if 0 <= xx < self.w and 0 <= yy < self.h:
                    i = 3 * (yy * self.w + xx)
                    self.px[i : i + 3] = bytes(color)

    def line(self, x0: float, y0: float, x1: float, y1: float, color, width: int = 1) -> None:
        n = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        for k in range(n + 1):
            t = k / n
            self.dot(round(x0 + (x1 - x0) * t), round(y0 + (y1 - y0) * t), color, width)

    def text(self, x: int, y: int, s: str, color=(0, 0, 0), scale: int = 2) -> None:
        for ch in s.upper():
            rows = _FONT.get(ch, _FONT[" "]).split("|")
            for r, row in enumerate(rows):
                for c, ink in enumerate(row):
                    if ink == "#":
                        self.dot(x + c * scale, y + r * scale, color, scale)
            x += 4 * scale

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(self.px[3 * self.w * y : 3 * self.w * (y + 1)]) for y in range(self.h))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

        header = struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
        )


def _nice(v: float) -> str:
    return f"{v:.0f}" if v >= 10 else f"{v:.1f}"


def panel(canvas: Canvas, box: tuple[int, int, int, int], title: str, xs: list[int], series: dict[str, list[float]]):
    """One chart in ``box`` (x, y, w, h): log2 x axis over ``xs``, linear y from 0, a line per series."""
    x0, y0, w, h = box
    left, bottom = x0 + 60, y0 + h - 30
    right, top = x0 + w - 10, y0 + 30
    canvas.text(x0 + 60, y0 + 6, title)
    values = [v for vs in series.values() for v in vs if v == v and math.isfinite(v)]
    ymax = max(values) * 1.1 if values else 1.0
    lx = [math.log2(x) for x in xs]
    span = (max(lx) - min(lx)) or 1.0

    def X(x: int) -> float:
        return left + (math.log2(x) - min(lx)) / span * (right - left)

    def Y(v: float) -> float:
        return bottom - v / ymax * (bottom - top)

    grey = (200, 200, 200)
    for k in range(5):
        v = ymax * k / 4
        canvas.line(left, Y(v), right, Y(v), grey)
        canvas.text(x0 + 4, int(Y(v)) - 5, _nice(v))
    for x in xs:
        canvas.line(X(x), bottom, X(x), bottom + 4, (0, 0, 0))
        canvas.text(int(X(x)) - 4 * len(str(x)), bottom + 8, str(x))
    canvas.line(left, bottom, right, bottom, (0, 0, 0))
    canvas.line(left, top, left, bottom, (0, 0, 0))
    for vs, color in zip(series.values(), COLORS):
        pts = [(X(x), Y(v)) for x, v in zip(xs, vs) if v == v and math.isfinite(v)]
        for (a, b), (c, d) in zip(pts, pts[1:]):
            canvas.line(a, b, c, d, color, 2)
        for a, b in pts:
            canvas.dot(int(a) - 2, int(b) - 2, color, 5)


def write_sweep_plot(path: Path, rows: list[dict]) -> Path:
    """tokens/s, TTFT p50 and ITL p50 against concurrency, one line per label (speculative, plain)."""
    labels = list(dict.fromkeys(r["label"] or "run" for r in rows))
    xs = sorted({r["concurrency"] for r in rows})

    def series(key: str) -> dict[str, list[float]]:
        out = {}
        for lb in labels:
            by_c = {r["concurrency"]: r[key] for r in rows if (r["label"] or "run") == lb}
            out[lb] = [by_c.get(x, float("nan")) for x in xs]
        return out

    c = Canvas(1200, 420)
    panel(c, (0, 20, 400, 380), "OUTPUT TOK/S", xs, series("output_tokens_per_s"))
    panel(c, (400, 20, 400, 380), "TTFT P50 MS", xs, series("ttft_p50_ms"))
    panel(c, (800, 20, 400, 380), "ITL P50 MS", xs, series("itl_p50_ms"))
    x = 70
    for lb, color in zip(labels, COLORS):  # legend
        c.dot(x, 6, color, 10)
        c.text(x + 16, 6, lb)
        x += 16 + 8 * len(lb) + 30
    c.text(900, 6, "X: CONCURRENCY")
    path = Path(path)
    path.write_bytes(c.png())
    return path
