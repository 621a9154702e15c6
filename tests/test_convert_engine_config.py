"""config.json keys trtspec's TensorRT-LLM model classes read, checked against what the checkpoint holds.

- mtp-linear: the heads' RMSNorm epsilon (``trtspec_rmsnorm_heads_eps``), not the target's norm_epsilon;
- mtp-single: ``trtspec_mtp_norms`` lists exactly the norms whose weights are written, so the model class
  (which creates only those) never leaves a required parameter unset (heads trained without RMSNorm);
- the names the model class uses for those keys are the converter's (parsed, the file imports tensorrt_llm).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from convert_fixtures import make_spec
from safetensors import safe_open

from trtspec.convert import names as N
from trtspec.convert.core import convert
from trtspec.convert.modes import ConvertOptions, MtpSingle
from trtspec.drafters.trtspec_heads import save_trtspec_heads as save_mtp
from trtspec.load import load_spec_model

MODELS_FILE = Path(__file__).resolve().parents[1] / "trtspec" / "engine" / "trtllm_models.py"


def _rank_names(out: Path, world: int) -> list[set[str]]:
    out_names = []
    for r in range(world):
        with safe_open(str(out / f"rank{r}.safetensors"), "pt") as f:
            out_names.append(set(f.keys()))
    return out_names


def test_mtp_linear_heads_keep_their_own_epsilon(tmp_path):
    spec = make_spec(tmp_path / "m", "mtp-linear")
    tensors = {k: spec.drafter.tensors.load(k) for k in spec.drafter.tensors}
    heads = save_mtp(
        tmp_path / "eps",
        "mtp-linear",
        tensors,
        spec.target,
        num_heads=3,
        num_layers=1,
        has_rmsnorm=True,
        rms_norm_eps=3e-5,
    )
    spec = load_spec_model(spec.target.path, heads, "mtp-linear", tree="chain:3")
    convert(spec, tmp_path / "out", ConvertOptions(tp_size=2))
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg[N.RMSNORM_HEADS_EPS_KEY] == 3e-5
    assert cfg["norm_epsilon"] == spec.target.arch.rms_norm_eps != 3e-5


def test_mtp_single_lists_exactly_the_norms_it_writes(tmp_path):
    with_norms = make_spec(tmp_path / "a", "mtp-single")
    convert(with_norms, tmp_path / "with", ConvertOptions(tp_size=2))
    cfg = json.loads((tmp_path / "with" / "config.json").read_text())
    assert cfg[N.MTP_NORMS_KEY] == ["enorm", "hnorm", "final_norm"]
    layers = cfg["num_eagle_layers"]
    for names in _rank_names(tmp_path / "with", 2):
        for i in range(layers):
            assert {f"eagle_nets.{i}.{n}.weight" for n in cfg[N.MTP_NORMS_KEY]} <= names

    # heads trained without RMSNorm: no norm tensors, and the config says so
    tensors = {
        k: with_norms.drafter.tensors.load(k)
        for k in with_norms.drafter.tensors
        if k not in ("enorm.weight", "hnorm.weight", "norm.weight")
    }
    meta = {
        k: with_norms.drafter.config[k]
        for k in ("intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")
    }
    heads = save_mtp(
        tmp_path / "plain",
        "mtp-single",
        tensors,
        with_norms.target,
        num_heads=1,
        num_layers=1,
        has_rmsnorm=False,
        rms_norm_eps=1e-6,
        **meta,
    )
    spec = load_spec_model(with_norms.target.path, heads, "mtp-single", tree="chain:3")
    convert(spec, tmp_path / "without", ConvertOptions(tp_size=2))
    cfg = json.loads((tmp_path / "without" / "config.json").read_text())
    assert cfg[N.MTP_NORMS_KEY] == []
    for names in _rank_names(tmp_path / "without", 2):
        assert not any(n.endswith(("enorm.weight", "hnorm.weight", "final_norm.weight")) for n in names)


def test_model_class_reads_the_converters_keys_and_norm_names():
    tree = ast.parse(MODELS_FILE.read_text())
    consts = {
        t.id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)
    }
    assert consts["RMSNORM_HEADS_EPS_KEY"] == N.RMSNORM_HEADS_EPS_KEY
    assert consts["MTP_NORMS_KEY"] == N.MTP_NORMS_KEY
    mtp = next(c for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "MtpNet")
    init = next(f for f in mtp.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    default = ast.literal_eval(init.args.defaults[-1])
    assert list(default) == [dst for _, dst in MtpSingle.NORMS]
    # no instance-level monkeypatching of forward (lost when TensorRT-LLM rebuilds a module)
    src = MODELS_FILE.read_text()
    assert '"forward"' not in src and "'forward'" not in src
    # the drafter logits leave MtpNet in the configured logits dtype
    fwd = next(f for f in mtp.body if isinstance(f, ast.FunctionDef) and f.name == "forward")
    assert any(isinstance(n, ast.Call) and getattr(n.func, "id", "") == "cast" for n in ast.walk(fwd))
