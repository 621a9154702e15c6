"""config.json carries every field TensorRT-LLM 1.2 reads for its architecture, typed right."""

from __future__ import annotations

import json

import pytest
from convert_fixtures import make_spec

from trtspec.convert.config import EAGLE_FIELDS, LLAMA_FIELDS, MEDUSA_FIELDS, REQUIRED_FIELDS, check_config
from trtspec.convert.core import convert
from trtspec.convert.modes import ConvertOptions

EXPECT = {
    "none": ("LlamaForCausalLM", None),
    "medusa": ("MedusaForCausalLM", MEDUSA_FIELDS),
    "mtp-linear": ("MedusaForCausalLM", MEDUSA_FIELDS),
    "eagle": ("EagleForCausalLM", EAGLE_FIELDS),
    "mtp-single": ("EagleForCausalLM", EAGLE_FIELDS),
    "draft-model": ("LlamaForCausalLM", LLAMA_FIELDS),
}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("cfg")


@pytest.mark.parametrize("kind", list(EXPECT))
def test_fields_present_and_typed(root, kind):
    spec = make_spec(root / kind, kind)
    out = root / f"out-{kind}"
    convert(spec, out, ConvertOptions(tp_size=2))
    d = out / "target" if kind == "draft-model" else out
    cfg = json.loads((d / "config.json").read_text())
    arch, fields = EXPECT[kind]
    assert cfg["architecture"] == arch
    for key, types in REQUIRED_FIELDS[arch].items():
        assert key in cfg, key
        assert isinstance(cfg[key], types), (key, cfg[key])
    assert check_config(cfg) == []
    a = spec.target.arch
    assert (cfg["hidden_size"], cfg["num_key_value_heads"], cfg["vocab_size"]) == (
        a.hidden_size,
        a.num_key_value_heads,
        a.vocab_size,
    )
    assert cfg["mapping"] == {"world_size": 2, "tp_size": 2, "pp_size": 1}
    assert cfg["use_parallel_embedding"] is True and cfg["embedding_sharding_dim"] == 0
    if arch == "MedusaForCausalLM":
        assert cfg["num_medusa_heads"] == spec.drafter.num_heads and cfg["max_draft_len"] == spec.tree.num_nodes
    if arch == "EagleForCausalLM":
        net = cfg["eagle_net_config"]
        assert check_config(net) == [] and net["num_hidden_layers"] == 1
        assert net["mapping"]["tp_size"] == 2  # EagleForCausalLM's nets use tp = world size
        assert cfg["num_eagle_layers"] == spec.tree.depth
        assert 1 <= cfg["max_non_leaves_per_layer"] <= spec.tree.num_nodes
    if kind == "draft-model":
        draft = json.loads((out / "draft" / "config.json").read_text())
        assert check_config(draft) == [] and draft["hidden_size"] == spec.drafter.arch.hidden_size


def test_eagle_non_leaves_counts_the_widest_level(root):
    spec = make_spec(root / "eagle", "eagle", tree=[[0], [1], [2], [0, 0], [0, 1], [1, 0]])
    out = root / "eagle-tree"
    convert(spec, out)
    cfg = json.loads((out / "config.json").read_text())
    # level 0: root; level 1: nodes (0) and (1) have children -> 2
    assert cfg["num_eagle_layers"] == 2 and cfg["max_non_leaves_per_layer"] == 2 and cfg["max_draft_len"] == 6


def test_check_config_catches_missing_and_mistyped():
    spec_cfg = {k: None for k in LLAMA_FIELDS}
    spec_cfg["architecture"] = "LlamaForCausalLM"
    problems = check_config(spec_cfg)
    assert any("hidden_size is NoneType" in p for p in problems)
    good = {"architecture": "MedusaForCausalLM"}
    assert any("num_medusa_heads missing" in p for p in check_config(good))
    assert check_config({"architecture": "QWenForCausalLM"})  # not one we write
