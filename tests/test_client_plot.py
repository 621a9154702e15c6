"""The sweep plot (client.plot): a valid PNG whose pixels show each series in its own colour."""

from __future__ import annotations

import struct
import zlib

from trtspec.client.plot import COLORS, write_sweep_plot
from trtspec.client.sweep import ratios


def _pixels(data: bytes) -> tuple[int, int, bytes]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", data[16:24])
    idat, pos = b"", 8
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8 : pos + 8 + n]
        pos += 12 + n
    raw = zlib.decompress(idat)
    assert len(raw) == h * (1 + 3 * w)  # one filter byte + RGB per row
    return w, h, raw


def test_sweep_plot_is_a_png_with_both_series(tmp_path):
    rows = [
        {"label": label, "concurrency": c, "output_tokens_per_s": v * c, "ttft_p50_ms": 10.0 * c, "itl_p50_ms": 5.0 + c}
        for label, v in (("speculative", 30.0), ("plain", 20.0))
        for c in (1, 2, 4, 8)
    ]
    w, h, raw = _pixels(write_sweep_plot(tmp_path / "p.png", rows).read_bytes())
    assert (w, h) == (1200, 420)
    for color in COLORS[:2]:
        assert raw.count(bytes(color)) > 100
    assert ratios(rows) == {1: 1.5, 2: 1.5, 4: 1.5, 8: 1.5}
