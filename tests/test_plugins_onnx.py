"""ONNX export of the draft heads (Medusa, mtp-linear) and the verify step as trtspec plugin nodes.

The plugin graph is checked with onnx.checker and against the creators' registration (op type = creator
name, plugin_version/plugin_namespace attributes, the other attributes = the creators' fields); the
standard-op expansion of the same graph runs in onnxruntime and is compared with the torch heads and
with trtspec/runtime/verify.py.
"""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.kernels import onnx_export, reference, trt_network
from trtspec.tree import build_tree

onnx = pytest.importorskip("onnx")
KINDS = ["medusa", "mtp-linear"]


@pytest.fixture(scope="module")
def exported(demo_paths, tmp_path_factory) -> dict:
    """{(kind, expanded): model path} for both head kinds, plugin nodes and standard-op expansion."""
    out = tmp_path_factory.mktemp("onnx")
    paths = {}
    for kind in KINDS:
        for expanded in (False, True):
            paths[kind, expanded] = onnx_export.export_heads_onnx(
                demo_paths[kind], demo_paths["target"], out / f"{kind}-{int(expanded)}.onnx", expand_plugins=expanded
            )
    return paths


def _attrs(node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize("kind", KINDS)
def test_plugin_nodes_carry_the_creators_names_and_fields(exported, kind):
    model = onnx.load(str(exported[kind, False]))
    onnx.checker.check_model(model, full_check=False)
    plugin_nodes = [n for n in model.graph.node if n.domain == onnx_export.PLUGIN_DOMAIN]
    types = sorted(n.op_type for n in plugin_nodes)
    want = [trt_network.TREE_VERIFY] + ([trt_network.RMSNORM_HEADS] if kind == "mtp-linear" else [])
    assert types == sorted(want)
    assert {o.domain: o.version for o in model.opset_import}[onnx_export.PLUGIN_DOMAIN] == 1
    fields = {
        trt_network.RMSNORM_HEADS: trt_network.rmsnorm_heads_fields(1e-6),
        trt_network.TREE_VERIFY: trt_network.tree_verify_fields("greedy", "logits"),
    }
    onnx_kind = {"FLOAT32": onnx.AttributeProto.FLOAT, "INT32": onnx.AttributeProto.INT}
    for node in plugin_nodes:
        attrs = _attrs(node)
        assert attrs.pop("plugin_version") == trt_network.PLUGIN_VERSION.encode()
        assert attrs.pop("plugin_namespace") == trt_network.PLUGIN_NAMESPACE.encode()
        assert sorted(attrs) == sorted(name for name, _, _ in fields[node.op_type])
        kinds = {a.name: a.type for a in node.attribute}
        for name, _, field_type in fields[node.op_type]:
            assert kinds[name] == onnx_kind[field_type], (node.op_type, name)
        if node.op_type == trt_network.TREE_VERIFY:
            assert (attrs["mode"], attrs["target"]) == (0, 1) and len(node.input) == 3 and len(node.output) == 4
        else:
            assert attrs["layout"] == 0 and attrs["eps"] == pytest.approx(1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_expanded_graph_matches_the_torch_heads(exported, demo_paths, kind):
    ort = pytest.importorskip("onnxruntime")
    model = onnx.load(str(exported[kind, True]))
    assert not [n for n in model.graph.node if n.domain]  # standard ops only
    heads, lm_head, _ = onnx_export.load_linear_heads(demo_paths[kind], demo_paths["target"], torch.float32)
    hidden = torch.randn(7, lm_head.shape[1], generator=torch.Generator().manual_seed(1)) * 2
    session = ort.InferenceSession(str(exported[kind, True]), providers=["CPUExecutionProvider"])
    n1 = model.graph.input[1].type.tensor_type.shape.dim[1].dim_value
    feeds = {
        "hidden": hidden.numpy(),
        "draft_tokens": torch.zeros(1, n1, dtype=torch.int32).numpy(),
        "target_logits": torch.zeros(1, n1, lm_head.shape[0]).numpy(),
    }
    got = torch.from_numpy(session.run(["head_logits"], feeds)[0])
    with torch.no_grad():
        want = heads(hidden, lm_head)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_expanded_verify_matches_verify_py(exported, demo_paths):
    ort = pytest.importorskip("onnxruntime")
    from trtspec.checkpoint.target import load_hf_causal_lm
    from trtspec.load import load_drafter, resolve_tree

    target = load_hf_causal_lm(demo_paths["target"])
    tree = build_tree(resolve_tree(None, load_drafter(demo_paths["medusa"], target, draft_vocab=0)).choices)
    session = ort.InferenceSession(str(exported["medusa", True]), providers=["CPUExecutionProvider"])
    batch, vocab, n1 = 32, target.arch.vocab_size, tree.size
    gen = torch.Generator().manual_seed(4)
    draft = torch.randint(0, 3, (batch, n1), generator=gen)  # few tokens: siblings often share one
    ids = torch.randint(0, 3, (batch, n1), generator=gen)
    logits = torch.randn(batch, n1, vocab, generator=gen)
    logits.scatter_(-1, ids[..., None], 10.0)
    feeds = {
        "hidden": torch.zeros(1, target.arch.hidden_size).numpy(),
        "draft_tokens": draft.int().numpy(),
        "target_logits": logits.numpy(),
    }
    names = ["accepted_len", "tokens", "best_path", "keep_nodes"]
    got = dict(zip(names, session.run(names, feeds)))
    want = reference.tree_verify_reference(tree, draft, logits, target_kind="logits")
    for name in names:
        assert torch.equal(torch.from_numpy(got[name]), getattr(want, name)), name
    assert want.accepted_len.float().mean() > 1


def test_cli_export_onnx(demo_paths, tmp_path):
    out = tmp_path / "heads.onnx"
    res = CliRunner().invoke(
        main,
        [
            "plugins",
            "export-onnx",
            "--heads",
            str(demo_paths["mtp-linear"]),
            "--target",
            str(demo_paths["target"]),
            "--out",
            str(out),
            "--verify",
            "sampling",
            "--dtype",
            "float16",
        ],
    )
    assert res.exit_code == 0, res.output
    model = onnx.load(str(out))
    onnx.checker.check_model(model)
    verify = next(n for n in model.graph.node if n.op_type == trt_network.TREE_VERIFY)
    assert _attrs(verify)["mode"] == 1 and list(verify.input)[3:] == ["temperature", "seed"]
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16


def test_cli_export_onnx_rejects_other_head_kinds(demo_paths, tmp_path):
    res = CliRunner().invoke(
        main,
        [
            "plugins",
            "export-onnx",
            "--heads",
            str(demo_paths["eagle"]),
            "--target",
            str(demo_paths["target"]),
            "--out",
            str(tmp_path / "x.onnx"),
        ],
    )
    assert res.exit_code == 2 and res.output.startswith("error:") and res.output.count("\n") == 1
    assert "takes mtp-linear, medusa heads" in res.output and not (tmp_path / "x.onnx").exists()
