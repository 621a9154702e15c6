"""The emitted Triton repository: both runtimes parse against Triton's ModelConfig proto, with the names,
types and speculative parameters TensorRT-LLM's inflight_batcher_llm repository uses. No server here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from triton_support import make_model

from trtspec.cli import main
from trtspec.errors import CheckpointError, UsageError
from trtspec.load import load_spec_model
from trtspec.triton.emit import MANIFEST, MODELS, TEMPLATE_DIR, emit_repository, fill_template
from trtspec.triton.validate import load_repository, parse_config, validate_repository

pytest.importorskip("tritonclient.grpc.model_config_pb2")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("triton_emit_model"))


@pytest.fixture(scope="module")
def spec(model):
    return load_spec_model(model["target"], model["heads"])


def _params(cfg) -> dict[str, str]:
    """The parameters that are set (an unset one keeps its ${...} text, as upstream leaves it)."""
    return {k: v.string_value for k, v in cfg.parameters.items() if not v.string_value.startswith("${")}


def _unset(cfg) -> set[str]:
    return {k for k, v in cfg.parameters.items() if v.string_value.startswith("${")}


@pytest.mark.parametrize("runtime", ["reference", "trtllm"])
def test_both_runtimes_parse_and_share_the_contract(spec, tmp_path, runtime):
    repo = emit_repository(
        spec, runtime, tmp_path / "repo", engine_dir=Path("/engines/llama"), options={"max_seq_len": 256}
    )
    cfgs = validate_repository(repo)
    assert set(cfgs) == set(MODELS)
    llm = cfgs["tensorrt_llm"]
    assert llm.backend == ("tensorrtllm" if runtime == "trtllm" else "python")
    assert llm.model_transaction_policy.decoupled
    types = {i.name: i.data_type for i in llm.input}
    from tritonclient.grpc import model_config_pb2 as pb

    assert types["input_ids"] == pb.TYPE_INT32 and types["streaming"] == pb.TYPE_BOOL
    assert types["temperature"] == pb.TYPE_FP32 and types["seed"] == pb.TYPE_UINT64
    assert types["return_perf_metrics"] == pb.TYPE_BOOL
    outs = {o.name: o.data_type for o in llm.output}
    assert outs["acceptance_rate"] == pb.TYPE_FP32
    assert outs["total_accepted_draft_tokens"] == outs["total_draft_tokens"] == pb.TYPE_INT32
    assert [list(o.dims) for o in llm.output if o.name == "output_ids"] == [[-1, -1]]
    p = _params(llm)
    # speculative parameters come from the build: the heads' tree in TensorRT-LLM's notation
    assert p["decoding_mode"] == "medusa"
    assert p["medusa_choices"].startswith("{0}") and "eagle_choices" not in p
    assert int(p["max_draft_len"]) == spec.tree.num_nodes
    from trtspec.tree import parse_choices

    assert parse_choices(p["medusa_choices"]) == spec.tree.choices
    ens = cfgs["ensemble"]
    assert {i.name for i in ens.input} >= {
        "text_input",
        "max_tokens",
        "stream",
        "temperature",
        "top_k",
        "top_p",
        "return_perf_metrics",
    }
    assert "text_output" in {o.name for o in ens.output}
    assert [s.model_name for s in ens.ensemble_scheduling.step] == ["preprocessing", "tensorrt_llm", "postprocessing"]
    # the same tensors in both runtimes: only backend and runtime-specific parameters differ
    assert (repo / "preprocessing/1/tokenizer/tokenizer.json").is_file()
    manifest = json.loads((repo / MANIFEST).read_text())
    assert manifest["runtime"] == runtime and manifest["tree_choices"] == [list(c) for c in spec.tree.choices]
    if runtime == "trtllm":
        assert p["gpt_model_path"] == "/engines/llama"
        assert not (repo / "tensorrt_llm/1/model.py").exists()
        assert "trtspec_target_dir" not in p
    else:
        # unset parameters stay as upstream's fill_template leaves them: the key is there, with ${...}
        assert "gpt_model_path" not in p and "gpt_model_path" in _unset(llm)
        assert Path(p["trtspec_target_dir"]) == Path(spec.target.path).resolve()
        assert (repo / "tensorrt_llm/1/model.py").is_file()


def test_runtimes_have_identical_tensors(spec, tmp_path):
    a = load_repository(emit_repository(spec, "reference", tmp_path / "a"))
    b = load_repository(
        emit_repository(spec, "trtllm", tmp_path / "b", engine_dir=Path("/e"), options={"max_seq_len": 64})
    )
    for name in MODELS:
        for field in ("input", "output"):
            sig = lambda cfg: [
                (t.name, t.data_type, list(t.dims), t.optional if field == "input" else 0) for t in getattr(cfg, field)
            ]
            assert sig(a[name]) == sig(b[name]), (name, field)


def test_unfilled_placeholders_are_refused(tmp_path):
    text = (TEMPLATE_DIR / "tensorrt_llm" / "config.pbtxt").read_text()
    with pytest.raises(UsageError, match="no value for placeholder"):
        fill_template(text, {"triton_backend": "python"})
    with pytest.raises(CheckpointError, match=r"placeholder \$\{engine_dir\} was not filled"):
        parse_config(
            'name: "x"\nbackend: "tensorrtllm"\nparameters: { key: "gpt_model_type" value: { string_value: '
            '"v1" } }\nparameters: { key: "gpt_model_path" value: { string_value: "${engine_dir}" } }'
        )
    with pytest.raises(CheckpointError, match=r"placeholder \$\{n\} was not filled"):
        parse_config('name: "x"\nbackend: "python"\nmax_batch_size: ${n}\n')
    # an optional parameter left unset keeps its text, as upstream's fill_template leaves it
    parse_config('name: "x"\nbackend: "python"\nparameters: { key: "a" value: { string_value: "${lora_dir}" } }')
    with pytest.raises(CheckpointError, match="not a valid Triton ModelConfig"):
        parse_config('name: "x"\nbackend: "python"\nmax_batch_size: 8\nno_such_field: 1\n')
    with pytest.raises(CheckpointError, match="not a valid Triton ModelConfig"):
        parse_config('name: "x"\ninput [ { name: "a" data_type: TYPE_NOPE dims: [ 1 ] } ]\n')


def test_mis_wired_ensemble_is_caught(spec, tmp_path):
    repo = emit_repository(spec, "reference", tmp_path / "repo")
    f = repo / "ensemble" / "config.pbtxt"
    f.write_text(f.read_text().replace('key: "TOKENS_BATCH"', 'key: "TOKENS"'))
    with pytest.raises(CheckpointError, match="postprocessing has no input 'TOKENS'"):
        validate_repository(repo)


def test_eagle3_has_no_engine_path_and_options_are_checked(spec, tmp_path):
    import dataclasses

    e3 = dataclasses.replace(spec, drafter=dataclasses.replace(spec.drafter, kind="eagle3"))
    with pytest.raises(UsageError, match="EAGLE-3"):
        emit_repository(e3, "trtllm", tmp_path / "r", engine_dir=Path("/e"))
    with pytest.raises(UsageError, match="engine directory"):
        emit_repository(spec, "trtllm", tmp_path / "r")
    with pytest.raises(UsageError, match="unknown Triton option"):
        emit_repository(spec, "reference", tmp_path / "r", options={"max_bach_size": 4})
    with pytest.raises(UsageError, match="runtime"):
        emit_repository(spec, "onnx", tmp_path / "r")
    assert not (tmp_path / "r").exists()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # nothing half-written left behind


def test_plugin_library_is_copied_and_preloaded(spec, tmp_path):
    lib = tmp_path / "libtrtspec_plugins.so"
    lib.write_bytes(b"\x7fELF")  # only copied, never loaded here
    repo = emit_repository(
        spec, "trtllm", tmp_path / "repo", engine_dir=Path("/engines"), plugin_library=lib, options={"max_seq_len": 64}
    )
    rel = "tensorrt_llm/1/plugins/libtrtspec_plugins.so"
    assert (repo / rel).read_bytes() == b"\x7fELF"
    assert _params(load_repository(repo)["tensorrt_llm"])["trtspec_plugin_library"] == rel
    res = CliRunner().invoke(main, ["serve", str(repo)])
    assert res.exit_code == 0, res.output
    assert f"LD_PRELOAD=/models/{rel}" in res.output and "bash /models/launch.sh" in res.output


def test_plugin_library_built_later_is_still_preloaded(spec, tmp_path):
    repo = emit_repository(
        spec,
        "trtllm",
        tmp_path / "repo",
        engine_dir=Path("/engines"),
        options={"plugin_library_name": "libtrtspec_plugins.so", "max_seq_len": 64},
    )
    res = CliRunner().invoke(main, ["serve", str(repo)])
    assert res.exit_code == 0 and "LD_PRELOAD=/models/tensorrt_llm/1/plugins/libtrtspec_plugins.so" in res.output
    assert "is missing: copy the plugin library there first" in res.output


def test_replaces_only_trtspec_repositories(spec, tmp_path):
    repo = emit_repository(spec, "reference", tmp_path / "repo", options={"max_batch_size": 4})
    emit_repository(spec, "reference", repo, options={"max_batch_size": 2})
    assert load_repository(repo)["ensemble"].max_batch_size == 2
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("user data")
    with pytest.raises(UsageError, match="not a trtspec model repository"):
        emit_repository(spec, "reference", other)
    assert (other / "keep.txt").read_text() == "user data"


def test_cli_emit(model, tmp_path):
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps({"target": str(model["target"]), "heads": str(model["heads"]), "tree": "chain:2"}))
    res = CliRunner().invoke(
        main, ["triton", "emit", "--spec", str(spec_file), "--runtime", "reference", "--out", str(tmp_path / "repo")]
    )
    assert res.exit_code == 0, res.output
    p = _params(load_repository(tmp_path / "repo")["tensorrt_llm"])
    assert p["medusa_choices"] == "{0}, {0, 0}" and p["max_draft_len"] == "2"
    res = CliRunner().invoke(
        main, ["triton", "emit", "--target", str(model["target"]), "--runtime", "trtllm", "--out", str(tmp_path / "r2")]
    )
    assert res.exit_code == 2 and "engine directory" in res.output and "Traceback" not in res.output
    shutil.rmtree(tmp_path / "repo")


def test_target_without_heads(model, tmp_path):
    plain = load_spec_model(model["target"])
    repo = emit_repository(plain, "reference", tmp_path / "repo")
    p = _params(load_repository(repo)["tensorrt_llm"])
    assert not {"decoding_mode", "medusa_choices", "eagle_choices", "max_draft_len", "trtspec_heads_dir"} & set(p)
    assert json.loads((repo / MANIFEST).read_text())["drafter_kind"] is None


def test_model_free_settings_dir_emits_for_the_reference_runtime(model, tmp_path):
    """A model-free drafter (no engine layout) is served by the reference runtime; only trtllm refuses it."""
    from trtspec.drafters.matching import write_settings_dir

    heads = write_settings_dir(tmp_path / "ngram", "ngram", {"max_ngram": 2})
    spec = load_spec_model(model["target"], heads)
    repo = emit_repository(spec, "reference", tmp_path / "repo")
    p = _params(load_repository(repo)["tensorrt_llm"])
    assert p["trtspec_drafter_kind"] == "ngram" and p["trtspec_heads_dir"] == str(heads.resolve())
    assert "tensorrt_llm_draft" not in load_repository(repo)
    with pytest.raises(UsageError, match="cannot draft from text"):
        emit_repository(spec, "trtllm", tmp_path / "r2", engine_dir=Path("/e"))


def test_model_free_address_emits_and_the_server_loads_it(model, tmp_path, monkeypatch):
    """``--heads ngram:2`` / ``--heads suffix:corpus.jsonl`` (no directory) go to the config as the address,
    a corpus file made absolute; the served model's load (target dir, heads, kind) gets the same drafter."""
    (tmp_path / "corpus.jsonl").write_text(json.dumps({"token_ids": [5, 6, 7, 8]}) + "\n")
    monkeypatch.chdir(tmp_path)
    for address, want in (("ngram:2", "ngram:2"), ("suffix:corpus.jsonl", f"suffix:{tmp_path / 'corpus.jsonl'}")):
        repo = tmp_path / f"repo-{address.split(':')[0]}"
        res = CliRunner().invoke(
            main,
            ["triton", "emit", "--target", str(model["target"]), "--heads", address, "--runtime", "reference",
             "--out", str(repo)],
        )  # fmt: skip
        assert res.exit_code == 0, res.output
        p = _params(load_repository(repo)["tensorrt_llm"])
        assert p["trtspec_heads_dir"] == want
        served = load_spec_model(model["target"], p["trtspec_heads_dir"], heads_format=p["trtspec_drafter_kind"])
        given = load_spec_model(model["target"], address)
        assert served.drafter.kind == given.drafter.kind
        a, b = dict(served.drafter.config), dict(given.drafter.config)
        assert a.pop("corpus", None) in (b.pop("corpus", None), want.partition(":")[2]) and a == b
        assert sorted(served.drafter.tensors) == sorted(given.drafter.tensors)
        for name in served.drafter.tensors:  # the suffix corpus, as token ids
            assert torch.equal(served.drafter.tensors.load(name), given.drafter.tensors.load(name))


def test_also_draft_goes_to_the_reference_config_and_the_engine_path_refuses_it(model, tmp_path):
    both = load_spec_model(model["target"], model["heads"], also_draft="suffix")
    repo = emit_repository(both, "reference", tmp_path / "repo")
    p = _params(load_repository(repo)["tensorrt_llm"])
    assert p["trtspec_also_draft"] == "suffix" and p["trtspec_drafter_kind"] == "medusa"
    assert json.loads((repo / MANIFEST).read_text())["also_draft"] == "suffix"
    alone = emit_repository(load_spec_model(model["target"], model["heads"]), "reference", tmp_path / "r1")
    assert "trtspec_also_draft" not in _params(load_repository(alone)["tensorrt_llm"])
    with pytest.raises(UsageError, match="also-draft"):
        emit_repository(both, "trtllm", tmp_path / "r2", engine_dir=Path("/e"))


def test_draft_len_schedule_goes_to_the_config_and_the_manifest(spec, tmp_path):
    depth = spec.tree.depth
    repo = emit_repository(spec, "reference", tmp_path / "repo")
    from trtspec.runtime.batch_policy import default_schedule

    manifest = json.loads((repo / MANIFEST).read_text())
    assert manifest["draft_len_schedule"] == {str(k): v for k, v in default_schedule(depth).items()}
    repo = emit_repository(spec, "reference", tmp_path / "r2", options={"draft_len_schedule": f"1:{depth},8:1"})
    assert _params(load_repository(repo)["tensorrt_llm"])["trtspec_draft_len_schedule"] == f"1:{depth},8:1"
    assert json.loads((repo / MANIFEST).read_text())["draft_len_schedule"] == {"1": depth, "8": 1}
    plain = emit_repository(spec, "reference", tmp_path / "r3", options={"speculative": False})
    assert json.loads((plain / MANIFEST).read_text())["draft_len_schedule"] is None
    with pytest.raises(UsageError, match="smallest batch size must map to the full depth"):
        emit_repository(spec, "reference", tmp_path / "r4", options={"draft_len_schedule": "1:1"})
