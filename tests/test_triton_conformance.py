"""(a) Every emitted config.pbtxt against TensorRT-LLM 1.2.1's inflight_batcher_llm models (shared facts).

For every drafter kind x tp/pp x decoupled setting, through ``trtspec build --allow-no-gpu`` (which emits the
``trtllm`` repository) and ``trtspec triton emit --runtime reference``: each of the five models has every
upstream input, output and parameter with the same data type and dims (and the same optional/reshape), extra
inputs only as optional ones, the ensemble steps map what upstream maps, and ``decoupled`` is what was asked.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from convert_fixtures import make_spec
from tritonclient.grpc import model_config_pb2 as pb
from trtllm_facts import facts

from trtspec.cli import main
from trtspec.engine import trtllm
from trtspec.triton.validate import PLACEHOLDER, validate_repository

HEADS_DIR = {
    "none": None,
    "medusa": "medusa",
    "mtp-linear": "mtp-linear",
    "eagle": "eagle",
    "mtp-single": "mtp-single",
    "draft-model": "draft",
}
PARALLEL = {
    "none": [(1, 1), (2, 2)],
    "medusa": [(1, 1), (2, 1)],
    "mtp-linear": [(2, 1)],
    "eagle": [(2, 1)],
    "mtp-single": [(1, 1)],
    "draft-model": [(1, 1), (2, 2)],
}
SETTINGS = [(k, tp, pp, dec) for k, par in PARALLEL.items() for tp, pp in par for dec in (True, False)]

needs_no_trtllm = pytest.mark.skipif(trtllm.available()[0], reason="TensorRT-LLM + GPU present: the real build runs")


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    return tmp_path_factory.mktemp("conf-triton")


def _build(root, kind, tp, pp, decoupled):
    base = root / kind
    if not (base / "target").exists():
        make_spec(base, kind)
    out = root / f"b-{kind}-{tp}-{pp}-{decoupled}"
    if (out / "triton_repo").is_dir():
        return out / "triton_repo"
    args = [
        "build",
        "--target",
        str(base / "target"),
        "--out",
        str(out),
        "--tp-size",
        str(tp),
        "--pp-size",
        str(pp),
        "--config",
        "demo",
        "--allow-no-gpu",
        "--no-progress",
        "--decoupled" if decoupled else "--no-decoupled",
    ]
    if HEADS_DIR[kind]:
        args += ["--heads", str(base / HEADS_DIR[kind]), "--tree", "chain:3"]
    r = CliRunner().invoke(main, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return out / "triton_repo"


def _dtype(name: str) -> int:
    return pb.DataType.Value(name)


def check_model(name: str, cfg, decoupled: bool) -> list[str]:
    """Differences between one emitted model config and the recorded upstream one."""
    up = facts()["triton_models"][name]
    problems = []
    ours_in = {t.name: t for t in cfg.input}
    for t in up["inputs"]:
        o = ours_in.get(t["name"])
        if o is None:
            problems.append(f"{name}: input {t['name']} missing")
            continue
        if not PLACEHOLDER.fullmatch(t["data_type"]) and o.data_type != _dtype(t["data_type"]):
            problems.append(f"{name}: input {t['name']} is {pb.DataType.Name(o.data_type)}, upstream {t['data_type']}")
        if list(o.dims) != t["dims"]:
            problems.append(f"{name}: input {t['name']} dims {list(o.dims)}, upstream {t['dims']}")
        if o.optional != bool(t.get("optional")):
            problems.append(f"{name}: input {t['name']} optional={o.optional}, upstream {bool(t.get('optional'))}")
        if o.HasField("reshape") != ("reshape" in t):
            problems.append(f"{name}: input {t['name']} reshape differs from upstream")
    upstream_in = {t["name"] for t in up["inputs"]}
    for extra in set(ours_in) - upstream_in:
        if not ours_in[extra].optional:
            problems.append(f"{name}: extra input {extra} is not optional (upstream clients never send it)")
    ours_out = {t.name: t for t in cfg.output}
    for t in up["outputs"]:
        o = ours_out.get(t["name"])
        if o is None:
            problems.append(f"{name}: output {t['name']} missing")
            continue
        if not PLACEHOLDER.fullmatch(t["data_type"]) and o.data_type != _dtype(t["data_type"]):
            problems.append(f"{name}: output {t['name']} is {pb.DataType.Name(o.data_type)}, upstream {t['data_type']}")
        if list(o.dims) != t["dims"]:
            problems.append(f"{name}: output {t['name']} dims {list(o.dims)}, upstream {t['dims']}")
    for key in up["parameters"]:
        if key not in cfg.parameters:
            problems.append(f"{name}: parameter {key} missing")
    if up.get("model_transaction_policy_decoupled") and cfg.model_transaction_policy.decoupled != decoupled:
        problems.append(f"{name}: decoupled={cfg.model_transaction_policy.decoupled}, asked for {decoupled}")
    return problems


def check_repository(repo, decoupled: bool) -> list[str]:
    cfgs = validate_repository(repo)
    problems = []
    for name in facts()["triton_models"]:
        if name not in cfgs:
            problems.append(f"model {name} missing")
            continue
        problems += check_model(name, cfgs[name], decoupled)
    steps = {s.model_name: s for s in cfgs["ensemble"].ensemble_scheduling.step}
    for up in facts()["ensemble_steps"]:
        ours = steps.get(up["model_name"])
        if ours is None:
            problems.append(f"ensemble: no {up['model_name']} step")
            continue
        for kind in ("input_map", "output_map"):
            mine = dict(getattr(ours, kind).items())
            for k, v in up[kind].items():
                if mine.get(k) != v:
                    problems.append(f"ensemble step {up['model_name']}: {kind} {k} -> {mine.get(k)}, upstream {v}")
    return problems


@needs_no_trtllm
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: f"{s[0]}-tp{s[1]}-pp{s[2]}-{'dec' if s[3] else 'nodec'}")
def test_trtllm_repository_matches_upstream(fixtures, setting):
    kind, tp, pp, decoupled = setting
    repo = _build(fixtures, kind, tp, pp, decoupled)
    problems = check_repository(repo, decoupled)
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("decoupled", [True, False])
@pytest.mark.parametrize("kind", ["none", "medusa", "mtp-linear", "eagle", "mtp-single", "draft-model"])
def test_reference_repository_matches_upstream(fixtures, kind, decoupled):
    base = fixtures / kind
    if not (base / "target").exists():
        make_spec(base, kind)
    out = fixtures / f"ref-{kind}-{decoupled}"
    args = [
        "triton",
        "emit",
        "--target",
        str(base / "target"),
        "--runtime",
        "reference",
        "--out",
        str(out),
        "--decoupled" if decoupled else "--no-decoupled",
    ]
    if HEADS_DIR[kind]:
        args += ["--heads", str(base / HEADS_DIR[kind]), "--heads-format", kind, "--tree", "chain:3"]
    r = CliRunner().invoke(main, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    problems = check_repository(out, decoupled)
    assert problems == [], "\n".join(problems)


def test_checker_is_not_vacuous(fixtures):
    """The old defects are each reported: 2-D text output, a dropped parameter, an undeclared perf output."""
    import re

    from trtspec.triton.validate import parse_config

    repo = _build(fixtures, "medusa", 1, 1, True)

    def mutated(model: str, pattern: str, repl: str):
        text = (repo / model / "config.pbtxt").read_text()
        new = re.sub(pattern, repl, text, count=1, flags=re.M)
        assert new != text, pattern
        return parse_config(new)

    flat = mutated("postprocessing", r'(name: "OUTPUT"\s+data_type: TYPE_STRING\s+dims: )\[ -1 \]', r"\1[ -1, -1 ]")
    assert any("OUTPUT dims [-1, -1]" in p for p in check_model("postprocessing", flat, True))
    dropped = mutated("tensorrt_llm", r'^parameters: \{ key: "guided_decoding_backend".*$', "")
    assert "tensorrt_llm: parameter guided_decoding_backend missing" in check_model("tensorrt_llm", dropped, True)
    perf = mutated("ensemble", r'^\s*\{ name: "kv_cache_reused_blocks".*\},?$', "")
    assert "ensemble: output kv_cache_reused_blocks missing" in check_model("ensemble", perf, True)
    coupled = parse_config((repo / "tensorrt_llm" / "config.pbtxt").read_text())
    assert any("decoupled=True, asked for False" in p for p in check_model("tensorrt_llm", coupled, False))
