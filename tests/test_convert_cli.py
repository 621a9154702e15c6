"""``trtspec convert``: progress on stderr, summary table on stdout, one-line errors."""

from __future__ import annotations

import io

import pytest
from click.testing import CliRunner
from convert_fixtures import make_spec

from trtspec.cli import main
from trtspec.convert.core import convert
from trtspec.convert.progress import ConvertProgress, summary_table


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("cli")
    make_spec(r, "medusa")
    return r


def test_convert_command_progress_and_summary(root):
    runner = CliRunner()
    out = root / "ck"
    r = runner.invoke(
        main,
        [
            "convert",
            "--target",
            str(root / "target"),
            "--heads",
            str(root / "medusa"),
            "--out",
            str(out),
            "--tp-size",
            "2",
            "--tree",
            "chain:3",
        ],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    assert "tensors 80/80" in r.stderr  # 40 tensors per rank, 2 ranks
    assert "rank0.safetensors" in r.stdout and "rank1.safetensors" in r.stdout
    assert "medusa -> MedusaForCausalLM (engine mode medusa)" in r.stdout and "MB/s" in r.stdout
    assert (out / "rank1.safetensors").is_file()


def test_convert_errors_are_one_line(root):
    runner = CliRunner()
    r = runner.invoke(
        main,
        [
            "convert",
            "--target",
            str(root / "target"),
            "--heads",
            str(root / "medusa"),
            "--out",
            str(root / "bad"),
            "--tp-size",
            "3",
            "--tree",
            "chain:3",
        ],
    )
    assert r.exit_code == 2
    assert r.output.count("\n") == 1 and r.output.startswith("error:") and "not divisible" in r.output
    assert not (root / "bad").exists()


def test_progress_counts_tensors_and_bytes(root):
    spec = make_spec(root, "none")
    buf = io.StringIO()
    from trtspec.convert.core import plan_conversion, planned_totals
    from trtspec.convert.modes import ConvertOptions

    n, b = planned_totals(plan_conversion(spec, ConvertOptions())[1])
    with ConvertProgress(n, b, file=buf) as bar:
        result = convert(spec, root / "p", on_tensor=bar)
    assert bar.done == n == result.tensors
    assert bar.bar.n == b  # every planned byte reported
    assert f"tensors {n}/{n}" in buf.getvalue()
    table = summary_table(result)
    assert table.splitlines()[0].split() == ["checkpoint", "file", "tensors", "size"]
    assert f"{result.tensors} tensors" in table and "peak RSS" in table
