"""build_configs/*.yaml: every preset loads, keys are strict, the command line overrides."""

from __future__ import annotations

import pytest

from trtspec.engine import presets
from trtspec.errors import UsageError
from trtspec.tree import normalize_choices, parse_choices


@pytest.mark.parametrize("name", ["demo", "llama3-8b-mtp", "llama3-70b-eagle-8gpu"])
def test_presets_load_and_are_consistent(name):
    path, values = presets.load_preset(name)
    assert path.parent == presets.PRESET_DIR
    merged = presets.merge(values, {})
    assert merged["max_input_len"] <= merged["max_seq_len"]
    tree = merged["tree"]
    choices = parse_choices(tree) if isinstance(tree, str) else normalize_choices(tree)
    assert choices  # every prefix of a choice is a choice (normalize_choices checks)


def test_70b_preset_is_eight_way_tensor_parallel_without_pp():
    _, v = presets.load_preset("llama3-70b-eagle-8gpu")
    assert v["tp_size"] * v["pp_size"] == 8 and v["pp_size"] == 1  # EAGLE engines allow no PP
    assert v["use_parallel_embedding"] is True


def test_unknown_key_is_an_error(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("max_batchsize: 4\n")
    with pytest.raises(UsageError, match="unknown key.*max_batchsize"):
        presets.load_preset(p)


def test_wrong_types_and_ranges(tmp_path):
    p = tmp_path / "x.yaml"
    for text, msg in [
        ("max_batch_size: '4'\n", "must be int"),
        ("dtype: fp8\n", "dtype must be"),
        ("kv_cache_free_gpu_mem_fraction: 1.5\n", r"\(0, 1\]"),
        ("tp_size: 0\n", ">= 1"),
        ("- 1\n", "mapping"),
    ]:
        p.write_text(text)
        with pytest.raises(UsageError, match=msg):
            presets.load_preset(p)


def test_command_line_overrides_preset():
    _, v = presets.load_preset("demo")
    merged = presets.merge(v, {"max_batch_size": 2, "tp_size": None, "kv_cache_free_gpu_mem_fraction": 1})
    assert merged["max_batch_size"] == 2  # given on the command line
    assert merged["tp_size"] == v["tp_size"]  # not given (None): the preset's
    assert merged["kv_cache_free_gpu_mem_fraction"] == 1.0 and isinstance(
        merged["kv_cache_free_gpu_mem_fraction"], float
    )
    with pytest.raises(UsageError, match="exceeds max_seq_len"):
        presets.merge(v, {"max_input_len": 4096})


def test_missing_preset_names_the_known_ones():
    with pytest.raises(UsageError, match="demo"):
        presets.load_preset("no-such-preset")
