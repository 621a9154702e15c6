"""The streaming safetensors writer and the all-or-nothing output directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from convert_fixtures import make_spec
from safetensors import safe_open

from trtspec.convert.core import convert, plan_conversion, planned_totals
from trtspec.convert.modes import ConvertOptions
from trtspec.convert.writer import PlannedTensor, StreamingSafetensorsWriter, atomic_directory


def test_streamed_file_loads_with_safetensors(tmp_path):
    tensors = {
        "a": torch.randn(3, 5),
        "b": torch.arange(7, dtype=torch.int64),
        "c": torch.randn(2, 2).to(torch.bfloat16),
        "d": torch.randn(4).to(torch.float16),
        "e": torch.tensor(1.5),
    }
    path = tmp_path / "x.safetensors"
    w = StreamingSafetensorsWriter(
        path, [PlannedTensor(k, tuple(v.shape), v.dtype) for k, v in tensors.items()], {"role": "test"}
    )
    for k, v in tensors.items():
        w.write(k, v)
    w.close()
    assert path.stat().st_size == w.total_bytes
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"role": "test"}
        assert list(f.keys()) == sorted(tensors)
        for k, v in tensors.items():
            assert torch.equal(f.get_tensor(k), v)
    # the data section starts 8-byte aligned, as safetensors itself writes it
    assert (8 + int.from_bytes(path.read_bytes()[:8], "little")) % 8 == 0


def test_writer_refuses_deviations_from_its_header(tmp_path):
    plan = [PlannedTensor("a", (2,), torch.float32), PlannedTensor("b", (3,), torch.float32)]
    w = StreamingSafetensorsWriter(tmp_path / "y.safetensors", plan)
    with pytest.raises(RuntimeError, match="expected a"):
        w.write("b", torch.zeros(3))
    with pytest.raises(RuntimeError, match="expected a"):
        w.write("a", torch.zeros(3))  # wrong shape
    w.write("a", torch.zeros(2))
    with pytest.raises(RuntimeError, match="closed after 1/2"):
        w.close()


def test_atomic_directory_leaves_nothing_on_error(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(KeyError):
        with atomic_directory(out) as tmp:
            (tmp / "half.bin").write_bytes(b"x")
            raise KeyError("boom")
    assert list(tmp_path.iterdir()) == []


def test_interrupted_conversion_leaves_no_output(tmp_path):
    spec = make_spec(tmp_path / "m", "medusa")
    opts = ConvertOptions(tp_size=2)
    n, _ = planned_totals(plan_conversion(spec, opts)[1])
    seen = []

    def stop_half_way(name, nbytes):
        seen.append(name)
        if len(seen) == n // 2:
            raise RuntimeError("simulated crash half way")

    out = tmp_path / "ckpt"
    with pytest.raises(RuntimeError, match="half way"):
        convert(spec, out, opts, on_tensor=stop_half_way)
    assert len(seen) == n // 2
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ckpt")]  # no temp dir either
    # and the same call without the crash completes
    convert(spec, out, opts)
    assert (out / "rank1.safetensors").is_file()


def test_existing_output_needs_overwrite(tmp_path):
    spec = make_spec(tmp_path / "m", "none")
    out = tmp_path / "ckpt"
    convert(spec, out)
    from trtspec.errors import CheckpointError

    with pytest.raises(CheckpointError, match="already exists"):
        convert(spec, out)
    convert(spec, out, overwrite=True)
    assert sorted(p.name for p in Path(out).iterdir()) == ["config.json", "rank0.safetensors", "trtspec_convert.json"]
