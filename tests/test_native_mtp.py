"""A target that carries its own MTP module (DeepSeek-V3 layout) drafts with it, with no separate heads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.cli import main
from trtspec.drafters import registry
from trtspec.errors import CheckpointError
from trtspec.load import load_spec_model
from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator

NATIVE = next(n for n, k in registry.KINDS.items() if k.inside_target)


def _with_mtp_from(heads: Path, target: Path, out: Path) -> Path:
    """Write ``target`` + the module of mtp-single ``heads`` as DeepSeek-V3 MTP layer tensors (by hand, from
    the published key list: enorm, hnorm, eh_proj, the decoder layer, shared_head.norm)."""
    shutil.copytree(target, out)
    cfg = json.loads((out / "config.json").read_text())
    L = cfg["num_hidden_layers"]
    cfg["num_nextn_predict_layers"] = 1
    (out / "config.json").write_text(json.dumps(cfg))
    weights = load_file(str(out / "model.safetensors"))
    for name, t in load_file(str(heads / "heads.safetensors")).items():
        key = {"norm.weight": "shared_head.norm.weight"}.get(name, name.removeprefix("layer."))
        weights[f"model.layers.{L}.{key}"] = t
    save_file(weights, str(out / "model.safetensors"))
    return out


@pytest.fixture(scope="module")
def carrier(demo_paths, tmp_path_factory) -> tuple[Path, str]:
    single = "mtp-single"  # the same module, trained by trtspec and stored in its own format
    return _with_mtp_from(demo_paths[single], demo_paths["target"], tmp_path_factory.mktemp("mtp") / "target"), single


def test_target_with_mtp_layers_drafts_with_them_without_heads(carrier):
    path, _ = carrier
    spec = load_spec_model(path)
    assert spec.drafter is not None and spec.drafter.kind == NATIVE
    gen = SpeculativeGenerator(spec, dtype=torch.float32)
    cfg = GenerationConfig(max_new_tokens=12)
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    spec_out = gen.generate(prompts, cfg)
    assert spec_out.tokens == gen.generate(prompts, GenerationConfig(max_new_tokens=12, speculative=False)).tokens
    assert spec_out.metrics.draft_tokens > 0


def test_native_module_drafts_exactly_what_the_same_trained_module_drafts(carrier, demo_paths):
    """The layout mapping is right: the module read from the target's MTP layer proposes the very tokens the
    mtp-single heads it was written from propose (the same weights under DeepSeek-V3 names)."""
    path, single = carrier
    prompts = [[1, 2, 3, 4, 5, 6], [9, 8, 7]]
    cfg = GenerationConfig(max_new_tokens=16, adaptive=False)
    native = SpeculativeGenerator(load_spec_model(path, tree="chain:3"), dtype=torch.float32).generate(prompts, cfg)
    heads = load_spec_model(demo_paths["target"], demo_paths[single], tree="chain:3")
    ref = SpeculativeGenerator(heads, dtype=torch.float32).generate(prompts, cfg)
    assert native.tokens == ref.tokens
    assert native.metrics.draft_tokens == ref.metrics.draft_tokens > 0
    assert native.metrics.acceptance_histogram == ref.metrics.acceptance_histogram
    a, b = load_spec_model(path).drafter, heads.drafter
    assert sorted(a.tensors) == sorted(b.tensors)  # every canonical tensor, read from its DeepSeek-V3 name
    for name in a.tensors:
        assert a.tensors.load(name).equal(b.tensors.load(name)), name


def test_stripped_mtp_layer_is_one_clear_error(carrier, tmp_path):
    path, _ = carrier
    stripped = tmp_path / "stripped"
    shutil.copytree(path, stripped)
    L = json.loads((stripped / "config.json").read_text())["num_hidden_layers"]
    w = {
        k: v
        for k, v in load_file(str(stripped / "model.safetensors")).items()
        if not k.startswith(f"model.layers.{L}.")
    }
    save_file(w, str(stripped / "model.safetensors"))
    r = CliRunner().invoke(main, ["generate", "-t", str(stripped), "-p", "hi", "-n", "2"])
    assert r.exit_code == 2 and r.output.startswith("error: ") and "stripped" in r.output and "eh_proj" in r.output


def test_mtp_layers_of_another_target_are_refused(carrier, tmp_path):
    path, _ = carrier
    other = tmp_path / "other"
    shutil.copytree(path, other)
    w = load_file(str(other / "model.safetensors"))
    w["model.embed_tokens.weight"] = w["model.embed_tokens.weight"] + 1
    save_file(w, str(other / "model.safetensors"))
    with pytest.raises(CheckpointError, match="belong to another target"):
        load_spec_model(path, other)
    assert load_hf_causal_lm(other)  # the carrier itself is a valid target
