"""Loading and validation: every bad input is one line naming the file, exit code 2, no traceback."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.cli import main
from trtspec.demo.tiny import make_tiny_llama
from trtspec.drafters.registry import detect as detect_heads_format
from trtspec.errors import CheckpointError
from trtspec.load import load_spec_model


def run_cli(*args: str):
    return CliRunner().invoke(main, list(args))


def assert_clean_error(result, *needles: str):
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    for n in needles:
        assert n in lines[0], lines[0]


def gen_args(target, heads=None, *extra):
    args = ["generate", "--target", str(target), "--prompt", "hi", "-n", "2"]
    if heads is not None:
        args += ["--heads", str(heads)]
    return args + list(extra)


@pytest.fixture()
def target_copy(demo_paths, tmp_path) -> Path:
    return Path(shutil.copytree(demo_paths["target"], tmp_path / "target"))


def test_detects_every_format(demo_paths):
    for kind in ("medusa", "eagle", "eagle3", "mtp-linear", "mtp-single", "draft-model"):
        assert detect_heads_format(demo_paths[kind]) == kind


def test_generate_cli_runs(demo_paths):
    r = run_cli(*gen_args(demo_paths["target"], demo_paths["medusa"], "--compare"))
    assert r.exit_code == 0, r.output
    assert "mean acceptance length" in r.output and "identical" in r.output


def test_missing_target_dir(tmp_path):
    assert_clean_error(run_cli(*gen_args(tmp_path / "nope")), "nope", "not found")


def test_missing_config(target_copy):
    (target_copy / "config.json").unlink()
    assert_clean_error(run_cli(*gen_args(target_copy)), "config.json", "not found")


def test_truncated_safetensors(target_copy):
    f = target_copy / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    assert_clean_error(run_cli(*gen_args(target_copy)), "model.safetensors", "truncated")


def test_corrupt_header(target_copy):
    f = target_copy / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[8:20] = b"garbage!!!!!"
    f.write_bytes(bytes(data))
    assert_clean_error(run_cli(*gen_args(target_copy)), "model.safetensors")


def test_index_pointing_outside(target_copy):
    (target_copy / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.embed_tokens.weight": "../../etc/passwd"}})
    )
    assert_clean_error(run_cli(*gen_args(target_copy)), "index.json", "outside")


def test_index_missing_shard(tmp_path):
    d = make_tiny_llama(tmp_path / "sharded", max_shard_size="40KB")
    shards = sorted(d.glob("model-*.safetensors"))
    assert len(shards) > 2
    shards[1].unlink()
    assert_clean_error(run_cli(*gen_args(d)), shards[1].name, "missing")


def test_unknown_architecture(target_copy):
    cfg = json.loads((target_copy / "config.json").read_text())
    cfg["model_type"] = "gpt_neox"
    (target_copy / "config.json").write_text(json.dumps(cfg))
    assert_clean_error(run_cli(*gen_args(target_copy)), "gpt_neox", "config.json")


def test_config_weights_shape_mismatch(target_copy):
    cfg = json.loads((target_copy / "config.json").read_text())
    cfg["intermediate_size"] = 99
    (target_copy / "config.json").write_text(json.dumps(cfg))
    assert_clean_error(run_cli(*gen_args(target_copy)), "mlp.gate_proj.weight", "shape")


def test_pickle_refused_then_loaded_with_flag(target_copy):
    from safetensors.torch import load_file

    state = load_file(target_copy / "model.safetensors")
    (target_copy / "model.safetensors").unlink()
    torch.save(state, target_copy / "pytorch_model.bin")
    assert_clean_error(run_cli(*gen_args(target_copy)), "pytorch_model.bin", "--allow-pickle")
    r = run_cli(*gen_args(target_copy, None, "--allow-pickle"))
    assert r.exit_code == 0, r.output


def test_heads_hidden_mismatch(demo_paths, tmp_path):
    other = make_tiny_llama(tmp_path / "wide", hidden_size=32, intermediate_size=64, vocab_size=128)
    assert_clean_error(run_cli(*gen_args(other, demo_paths["medusa"])), "hidden size mismatch", "medusa")


def test_heads_vocab_mismatch(demo_paths, tmp_path):
    other = make_tiny_llama(tmp_path / "v", vocab_size=100)
    shutil.copy(demo_paths["target"] / "tokenizer.json", other)
    for kind in ("medusa", "mtp-single", "draft-model", "eagle"):
        assert_clean_error(run_cli(*gen_args(other, demo_paths[kind])), "vocab size mismatch")


def test_heads_dtype_mismatch(demo_paths, tmp_path):
    heads = Path(shutil.copytree(demo_paths["medusa"], tmp_path / "medusa16"))
    f = heads / "medusa_lm_head.safetensors"
    from safetensors.torch import load_file

    save_file({k: v.half() for k, v in load_file(f).items()}, f)
    # with no compute dtype (convert/build keep the weights' dtype) mismatched heads are refused ...
    with pytest.raises(CheckpointError, match="dtype mismatch.*--dtype"):
        load_spec_model(demo_paths["target"], heads)
    # ... a compute dtype runs both in it: explicit, or generate's default (auto)
    r = run_cli(*gen_args(demo_paths["target"], heads, "--dtype", "float32"))
    assert r.exit_code == 0, r.output
    r = run_cli(*gen_args(demo_paths["target"], heads))
    assert r.exit_code == 0 and "dtype: " in r.output and "(auto: " in r.output, r.output


def test_unknown_heads_format(demo_paths, tmp_path):
    d = tmp_path / "weird"
    d.mkdir()
    save_file({"something.weight": torch.zeros(2, 2)}, d / "x.safetensors")
    assert_clean_error(run_cli(*gen_args(demo_paths["target"], d)), "unknown heads format", "--heads-format")


def test_wrong_heads_format_flag(demo_paths):
    r = run_cli(*gen_args(demo_paths["target"], demo_paths["medusa"], "--heads-format", "eagle"))
    assert r.exit_code == 2 and "Traceback" not in r.output


def test_tree_deeper_than_heads(demo_paths):
    assert_clean_error(run_cli(*gen_args(demo_paths["target"], demo_paths["medusa"], "--tree", "chain:9")), "exceeds")


def test_bad_tree(demo_paths):
    assert_clean_error(run_cli(*gen_args(demo_paths["target"], demo_paths["medusa"], "--tree", "[[0,0]]")), "parent")


def test_medusa_v2_heads_without_lm_head(demo_paths, tmp_path):
    """Medusa "version 2" heads (no per-head lm_head) reuse the target's lm_head."""
    from safetensors.torch import load_file

    heads = Path(shutil.copytree(demo_paths["medusa"], tmp_path / "m2"))
    f = heads / "medusa_lm_head.safetensors"
    save_file({k: v for k, v in load_file(f).items() if "linear" in k}, f)
    spec = load_spec_model(demo_paths["target"], heads)
    assert spec.drafter.config["own_lm_head"] is False and spec.drafter.num_heads == 4


def test_validation_reads_headers_not_data(demo_paths, tmp_path):
    """Shapes/dtypes come from the header: a file whose tensor bytes are zeroed still validates, and
    only the tensor asked for is read."""
    d = Path(shutil.copytree(demo_paths["target"], tmp_path / "t"))
    f = d / "model.safetensors"
    raw = bytearray(f.read_bytes())
    hlen = int.from_bytes(raw[:8], "little")
    raw[8 + hlen :] = bytes(len(raw) - 8 - hlen)
    f.write_bytes(bytes(raw))
    t = load_hf_causal_lm(d)
    assert t.tensors.shape("model.norm.weight") == (t.arch.hidden_size,)
    assert torch.count_nonzero(t.tensors.load("model.norm.weight")) == 0


def test_eagle3_needs_d2t_when_vocab_differs(demo_paths, tmp_path):
    from safetensors.torch import load_file

    heads = Path(shutil.copytree(demo_paths["eagle3"], tmp_path / "e3"))
    f = heads / "model.safetensors"
    save_file({k: v for k, v in load_file(f).items() if k != "d2t"}, f)
    with pytest.raises(CheckpointError, match="d2t"):
        load_spec_model(demo_paths["target"], heads)
