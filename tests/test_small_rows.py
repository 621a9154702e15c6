"""Measured small-row linears (models/small_rows.py): every way computes nn.Linear's product, the plan is
a measurement, and the runtime's greedy output does not change."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trtspec.models.packed import packing_supported
from trtspec.models.small_rows import MEASURED_ROWS, SmallRowsLinear, measure_plan

needs_packing = pytest.mark.skipif(not packing_supported(torch.float32), reason="no float32 oneDNN linears here")


@pytest.mark.parametrize("how", ["linear", "wxt", "wxt2", pytest.param("packed", marks=needs_packing)])
@pytest.mark.parametrize("bias", [False, True])
def test_every_way_is_the_linear_product(how, bias):
    torch.manual_seed(0)
    lin = nn.Linear(48, 80, bias=bias)
    plan = {r: ("wxt2" if how == "wxt2" and r == 1 else ("wxt" if how == "wxt2" else how)) for r in MEASURED_ROWS}
    fast = SmallRowsLinear(lin, plan)
    with torch.no_grad():
        for rows in (1, 2, 3, 5, 7, 25, 32, 40):
            x = torch.randn(1, rows, 48)
            y = fast(x)
            assert y.shape == (1, rows, 80) and y.is_contiguous()  # the next layer gets a row-major input
            torch.testing.assert_close(y, lin(x), rtol=1e-5, atol=1e-5)
        x = torch.randn(3, 48).T.contiguous().T  # a column-major input still gives the product
        torch.testing.assert_close(fast(x), lin(x), rtol=1e-5, atol=1e-5)


def test_the_plan_is_measured_for_every_row_count():
    plan = measure_plan(torch.randn(256, 64), None, reps=1)
    assert sorted(plan) == list(MEASURED_ROWS)
    assert set(plan.values()) <= {"linear", "wxt", "wxt2", "packed"}
    assert all(plan[r] != "wxt2" for r in MEASURED_ROWS[1:])


@needs_packing
def test_packed_rows_come_out_the_same_alone_or_in_a_tree():
    """A token verified inside a tree of N rows gets the very bits it gets decoded alone (1 row), which
    keeps greedy speculative output equal to plain decoding on the packed way."""
    torch.manual_seed(0)
    lin = nn.Linear(576, 1536, bias=False)
    fast = SmallRowsLinear(lin, {r: "packed" for r in MEASURED_ROWS})
    assert fast.packed is not None
    x = torch.randn(17, 576)
    with torch.no_grad():
        together = fast(x)
        for rows in (1, 2, 3, 9, 16):
            assert torch.equal(fast(x[:rows]), together[:rows])
    plain = SmallRowsLinear(lin, {r: "wxt" for r in MEASURED_ROWS})
    assert plain.packed is None  # no packed copy of a weight whose plan never uses it


def test_tuning_keeps_greedy_output_and_can_be_turned_off(tmp_path, monkeypatch):
    from trtspec.demo.tiny import make_tiny_llama
    from trtspec.load import load_spec_model
    from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator

    target = make_tiny_llama(tmp_path / "t", seed=3, vocab_size=96, num_hidden_layers=2)
    spec = load_spec_model(target, "ngram:2", dtype="float32")
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 10, 11, 12]]
    cfg = GenerationConfig(max_new_tokens=24)
    monkeypatch.setenv("TRTSPEC_SMALL_ROWS", "0")
    off = SpeculativeGenerator(spec)
    assert off.small_rows == {} and not any(isinstance(m, SmallRowsLinear) for m in off.target.modules())
    want = off.generate(prompts, GenerationConfig(max_new_tokens=24, speculative=False)).tokens
    monkeypatch.delenv("TRTSPEC_SMALL_ROWS")
    on = SpeculativeGenerator(spec)
    swapped = sum(isinstance(m, SmallRowsLinear) for m in on.target.modules())
    assert swapped == 0 or on.small_rows  # whatever was measured faster here is what runs
    # every linear forced onto W @ x^T (what a CPU like the one in the module docstring measures)
    import trtspec.models.small_rows as small_rows

    monkeypatch.setattr(small_rows, "_PLANS", {})
    monkeypatch.setattr(
        small_rows, "measure_plan", lambda w, b, reps=3: {r: "wxt2" if r == 1 else "wxt" for r in MEASURED_ROWS}
    )
    forced = SpeculativeGenerator(spec)
    linears = [m for m in forced.target.modules() if isinstance(m, (nn.Linear, SmallRowsLinear))]
    assert linears and all(isinstance(m, SmallRowsLinear) for m in linears)
    for gen in (off, on, forced):
        assert gen.generate(prompts, cfg).tokens == want
        assert gen.generate(prompts, GenerationConfig(max_new_tokens=24, speculative=False)).tokens == want
