"""Draft heads (Medusa, mtp-linear) and the tree-verify step as an ONNX graph of trtspec plugin ops.

Why ONNX: it is the standard way a plugin reaches TensorRT without TensorRT-LLM. TensorRT's ONNX parser
turns a node it has no importer for into a plugin layer: the node's op_type is the creator name, its
``plugin_version`` / ``plugin_namespace`` attributes pick the creator, and its other attributes become the
plugin fields by name. So with the nodes written here,

    trtexec --onnx=heads.onnx --dynamicPlugins=libtrtspec_plugins.so

builds an engine of the heads with the fused RmsNormHeads kernel and the TreeVerify kernel in it.

The graph (head-major, K heads, T tokens, H hidden, V vocabulary):
    hidden [T, H] --TrtspecRmsNormHeads(eps, layout=0)--> [K, T, H]      (mtp-linear; Medusa has no norm)
        --ResBlocks (MatMul + bias, SiLU, residual; one batched MatMul over the K heads per layer)-->
        --lm_head (shared [V, H] or per head)--> head_logits [K, T, V] (float32)
    paths (the tree, an initializer), draft_tokens [B, N1], target_logits [B, N1, V] (+ temperature [B],
    seed [2] for sampling) --TrtspecTreeVerify(mode, target=1)--> accepted_len, tokens, best_path, keep_nodes

``expand_plugins=True`` writes every plugin node as standard ONNX ops instead (the same numerics as the
kernels: fp32 RMSNorm rounded to the I/O dtype; the greedy walk unrolled over the tree's depth, first
matching child wins), which any ONNX runtime can execute: the tests compare that variant with the torch
heads and with trtspec/runtime/verify.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trtspec.errors import UsageError
from trtspec.kernels.trt_network import (
    PLUGIN_NAMESPACE,
    PLUGIN_VERSION,
    RMSNORM_HEADS,
    RMSNORM_LAYOUTS,
    TREE_VERIFY,
    VERIFY_MODES,
    VERIFY_TARGETS,
)

#: The custom-op domain of the plugin nodes (the parser keys on op_type + plugin_version/namespace).
PLUGIN_DOMAIN = "trtspec"
OPSET = 17
ONNX_DTYPES = {"float32": torch.float32, "float16": torch.float16}
#: Above this many bytes of initializers the weights go to an external-data file (protobuf's 2 GiB limit).
EXTERNAL_DATA_BYTES = 1 << 30
_BIG = np.iinfo(np.int64).max


def _onnx():
    try:
        import onnx  # noqa: PLC0415 - a dev/export dependency only
    except ImportError:
        raise UsageError("the onnx package is not installed", fix="pip install onnx (or trtspec[dev])") from None
    return onnx


@dataclass
class LinearHeadsWeights:
    """What the graph needs from K linear heads, stacked per layer (numpy, in the export dtype)."""

    norm: np.ndarray | None  # [K, H] RMSNorm weights (mtp-linear), None for Medusa
    eps: float
    res_w: list[np.ndarray]  # per layer: [K, H, H], already transposed (z @ w)
    res_b: list[np.ndarray]  # per layer: [K, 1, H]
    lm_head: np.ndarray  # [H, V] shared, or [K, H, V] per head (transposed)

    @property
    def num_heads(self) -> int:
        return self.res_w[0].shape[0] if self.res_w else (self.norm.shape[0] if self.norm is not None else 1)


def heads_weights(heads, shared_lm_head: torch.Tensor, dtype: torch.dtype) -> LinearHeadsWeights:
    """Stack a trtspec.models.heads.LinearHeads module's parameters for the graph."""

    def np_(t: torch.Tensor) -> np.ndarray:
        return t.detach().to(dtype).cpu().numpy()

    mods = list(heads.heads)
    if not mods:
        raise UsageError("the heads module has no heads")
    has_norm = mods[0].norm is not None
    if any((m.norm is not None) != has_norm for m in mods) or len({len(m.res) for m in mods}) != 1:
        raise UsageError("all heads must share one structure (norm, number of ResBlocks) to be exported")
    norm = np_(torch.stack([m.norm.weight for m in mods])) if has_norm else None
    eps = float(mods[0].norm.eps) if has_norm else 0.0
    layers = len(mods[0].res)
    res_w = [np_(torch.stack([m.res[layer].weight.t() for m in mods])) for layer in range(layers)]
    res_b = [np_(torch.stack([m.res[layer].bias for m in mods])[:, None, :]) for layer in range(layers)]
    own = [m.lm_head for m in mods]
    if all(o is not None for o in own):
        lm_head = np_(torch.stack([o.weight.t() for o in own]))
    elif any(o is not None for o in own):
        raise UsageError("either every head has its own lm_head or none has")
    else:
        lm_head = np_(shared_lm_head.t())
    return LinearHeadsWeights(norm, eps, res_w, res_b, lm_head)


class _Graph:
    """A tiny builder over onnx.helper: unique names, initializers, nodes."""

    def __init__(self):
        self.onnx = _onnx()
        self.nodes: list = []
        self.inits: list = []
        self._n = 0

    def name(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def const(self, hint: str, value: np.ndarray) -> str:
        name = self.name(hint)
        self.inits.append(self.onnx.numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(
        self, op_type: str, inputs: list[str], hint: str | None = None, outputs: int = 1, domain: str = "", **attrs
    ) -> str | list[str]:
        outs = [self.name(hint or op_type.lower()) for _ in range(outputs)]
        self.nodes.append(
            self.onnx.helper.make_node(op_type, inputs, outs, name=self.name(op_type), domain=domain, **attrs)
        )
        return outs[0] if outputs == 1 else outs


def _tensor_type(dtype: torch.dtype) -> int:
    onnx = _onnx()
    return {torch.float32: onnx.TensorProto.FLOAT, torch.float16: onnx.TensorProto.FLOAT16}[dtype]


def _rmsnorm_heads(g: _Graph, hidden: str, w: LinearHeadsWeights, dtype: torch.dtype, expand: bool) -> str:
    """[T, H] -> [K, T, H]: the plugin node, or its standard-op expansion (rms_norm's numerics)."""
    weights = g.const("norm_weight", w.norm)
    if not expand:
        return g.op(
            RMSNORM_HEADS,
            [hidden, weights],
            "normed",
            domain=PLUGIN_DOMAIN,
            eps=float(w.eps),
            layout=RMSNORM_LAYOUTS["head-major"],
            plugin_version=PLUGIN_VERSION,
            plugin_namespace=PLUGIN_NAMESPACE,
        )
    onnx = _onnx()
    x32 = g.op("Cast", [hidden], "x32", to=onnx.TensorProto.FLOAT)
    mean = g.op("ReduceMean", [g.op("Mul", [x32, x32])], "mean_sq", axes=[-1], keepdims=1)
    inv = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [mean, g.const("eps", np.array(w.eps, np.float32))])])])
    n = g.op("Cast", [g.op("Mul", [x32, inv])], "n", to=_tensor_type(dtype))
    k_w = g.op("Unsqueeze", [weights, g.const("axis1", np.array([1], np.int64))])  # [K, 1, H]
    return g.op("Mul", [k_w, g.op("Unsqueeze", [n, g.const("axis0", np.array([0], np.int64))])], "normed")


def _heads(g: _Graph, hidden: str, w: LinearHeadsWeights, dtype: torch.dtype, expand: bool) -> str:
    """hidden [T, H] -> head logits [K, T, V] float32."""
    if w.norm is not None:
        z = _rmsnorm_heads(g, hidden, w, dtype, expand)
    else:  # Medusa: every head starts from the hidden state itself ([1, T, H] broadcasts over K)
        z = g.op("Unsqueeze", [hidden, g.const("axis0", np.array([0], np.int64))], "z")
    for layer, (rw, rb) in enumerate(zip(w.res_w, w.res_b)):
        y = g.op("Add", [g.op("MatMul", [z, g.const(f"res{layer}_w", rw)]), g.const(f"res{layer}_b", rb)])
        z = g.op("Add", [z, g.op("Mul", [y, g.op("Sigmoid", [y])])], f"z{layer}")  # z + SiLU(W z + b)
    if not w.res_w and w.norm is None:  # no block broadcast z over the heads yet
        z = g.op("Expand", [z, g.const("k_shape", np.array([w.num_heads, 1, 1], np.int64))])
    logits = g.op("MatMul", [z, g.const("lm_head", w.lm_head)])
    return g.op("Cast", [logits], "head_logits", to=_onnx().TensorProto.FLOAT)


def _greedy_verify_expanded(g: _Graph, paths: np.ndarray, draft: str, target: str) -> list[str]:
    """TreeVerify (greedy on logits) in standard ops: the walk unrolled over the tree's depth, every step
    vectorised over the batch (trtspec.kernels.reference.tree_verify_greedy_batched, step for step)."""
    onnx = _onnx()
    i64 = onnx.TensorProto.INT64
    width = paths.shape[1]
    paths = paths.astype(np.int64)
    arg = g.op("ArgMax", [target], "argmax", axis=-1, keepdims=0)  # [B, N1] int64
    tok = g.op("Cast", [draft], "draft64", to=i64)
    zero_col = g.op(
        "Mul",
        [
            g.op(
                "Slice",
                [
                    arg,
                    g.const("s0", np.array([0], np.int64)),
                    g.const("s1", np.array([1], np.int64)),
                    g.const("ax1", np.array([1], np.int64)),
                ],
            ),
            g.const("zero", np.array(0, np.int64)),
        ],
        "zero_col",
    )  # [B, 1] of 0
    minus_one = g.op("Sub", [zero_col, g.const("one", np.array(1, np.int64))], "minus_one")
    cur = zero_col
    alive = g.op("Equal", [zero_col, zero_col], "alive")  # [B, 1] true
    accepted = zero_col
    token_cols, keep_cols = [], [zero_col]
    big = g.const("big", np.array(_BIG, np.int64))
    for d in range(1, width):
        node = paths[:, d]
        want = g.op("GatherElements", [arg, cur], "want", axis=1)  # [B, 1]
        node_tok = g.op("Gather", [tok, g.const(f"node{d}", np.clip(node, 0, None))], "node_tok", axis=1)  # [B, P]
        same_parent = g.op("Equal", [cur, g.const(f"parent{d}", paths[:, d - 1][None, :])])
        match = g.op(
            "And",
            [
                g.op("And", [g.op("Equal", [node_tok, want]), same_parent]),
                g.op("And", [alive, g.const(f"valid{d}", (node >= 0)[None, :])]),
            ],
        )
        nxt = g.op(
            "ReduceMin",
            [g.op("Where", [match, g.const(f"nodev{d}", node[None, :]), big])],
            "next",
            axes=[1],
            keepdims=1,
        )  # [B, 1]
        moved = g.op("Less", [nxt, big], "moved")
        token_cols.append(g.op("Where", [moved, want, minus_one]))
        keep_cols.append(g.op("Where", [moved, nxt, minus_one]))
        cur = g.op("Where", [moved, nxt, cur], "cur")
        accepted = g.op("Add", [accepted, g.op("Cast", [moved], to=i64)], "accepted")
        alive = g.op("And", [alive, moved], "alive")
    bonus = g.op("GatherElements", [arg, cur], "bonus", axis=1)
    tokens = g.op("Concat", [*token_cols, minus_one], "tokens_pre", axis=1)  # [B, L]
    at_bonus = g.op("Equal", [g.const("positions", np.arange(width, dtype=np.int64)[None, :]), accepted])
    tokens = g.op("Where", [at_bonus, bonus, tokens])
    keep = g.op("Concat", keep_cols, "keep", axis=1)
    at_depth = g.op(
        "Gather",
        [g.const("paths_t", paths.T.copy()), g.op("Squeeze", [accepted, g.const("sq1", np.array([1], np.int64))])],
        "at_depth",
        axis=0,
    )  # [B, P]
    best = g.op(
        "ArgMax",
        [g.op("Cast", [g.op("Equal", [at_depth, cur])], to=onnx.TensorProto.INT32)],
        "best",
        axis=1,
        keepdims=0,
    )
    i32 = onnx.TensorProto.INT32
    return [
        g.op("Cast", [g.op("Squeeze", [accepted, g.const("sq1b", np.array([1], np.int64))])], "accepted_len", to=i32),
        g.op("Cast", [tokens], "tokens", to=i32),
        g.op("Cast", [best], "best_path", to=i32),
        g.op("Cast", [keep], "keep_nodes", to=i32),
    ]


def build_heads_model(
    weights: LinearHeadsWeights,
    paths: torch.Tensor | None,
    dtype: torch.dtype = torch.float32,
    verify: str = "greedy",
    expand_plugins: bool = False,
    vocab: int | None = None,
):
    """The ONNX ModelProto: the heads, plus the verify step on ``paths`` unless verify == "none"."""
    onnx = _onnx()
    helper = onnx.helper
    if verify not in ("greedy", "sampling", "none"):
        raise UsageError(f"unknown verify mode {verify!r}", fix="use greedy, sampling or none")
    if expand_plugins and verify == "sampling":
        raise UsageError("the standard-op expansion covers greedy verification only")
    g = _Graph()
    h = weights.lm_head.shape[-2]
    v = vocab or weights.lm_head.shape[-1]
    k = weights.num_heads
    elem = _tensor_type(dtype)
    inputs = [helper.make_tensor_value_info("hidden", elem, ["tokens", h])]
    logits = _heads(g, "hidden", weights, dtype, expand_plugins)
    g.nodes.append(helper.make_node("Identity", [logits], ["head_logits"], name="head_logits_out"))
    outputs = [helper.make_tensor_value_info("head_logits", onnx.TensorProto.FLOAT, [k, "tokens", v])]
    if verify != "none":
        if paths is None:
            raise UsageError("the verify step needs the tree's paths")
        p = paths.to(torch.int32).cpu().numpy()
        n1 = int(p.max()) + 1
        inputs += [
            helper.make_tensor_value_info("draft_tokens", onnx.TensorProto.INT32, ["batch", n1]),
            helper.make_tensor_value_info("target_logits", onnx.TensorProto.FLOAT, ["batch", n1, v]),
        ]
        if expand_plugins:
            outs = _greedy_verify_expanded(g, p, "draft_tokens", "target_logits")
        else:
            ins = [g.const("paths", p), "draft_tokens", "target_logits"]
            if verify == "sampling":
                inputs += [
                    helper.make_tensor_value_info("temperature", onnx.TensorProto.FLOAT, ["batch"]),
                    helper.make_tensor_value_info("seed", onnx.TensorProto.INT64, [2]),
                ]
                ins += ["temperature", "seed"]
            outs = g.op(
                TREE_VERIFY,
                ins,
                "verify",
                outputs=4,
                domain=PLUGIN_DOMAIN,
                mode=VERIFY_MODES[verify],
                target=VERIFY_TARGETS["logits"],
                plugin_version=PLUGIN_VERSION,
                plugin_namespace=PLUGIN_NAMESPACE,
            )
        names = ["accepted_len", "tokens", "best_path", "keep_nodes"]
        width = p.shape[1]
        for out, name in zip(outs, names):
            g.nodes.append(helper.make_node("Identity", [out], [name], name=f"{name}_out"))
        shapes = {
            "accepted_len": ["batch"],
            "tokens": ["batch", width],
            "best_path": ["batch"],
            "keep_nodes": ["batch", width],
        }
        outputs += [helper.make_tensor_value_info(n, onnx.TensorProto.INT32, shapes[n]) for n in names]
    graph = helper.make_graph(g.nodes, "trtspec_heads", inputs, outputs, g.inits)
    opsets = [helper.make_opsetid("", OPSET)]
    if not expand_plugins:
        opsets.append(helper.make_opsetid(PLUGIN_DOMAIN, 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="trtspec")
    model.ir_version = min(model.ir_version, 9)  # readable by the ONNX parsers of TensorRT 10.x
    return model


def load_linear_heads(heads_dir: str | Path, target_dir: str | Path, dtype: torch.dtype):
    """(LinearHeads module, shared lm_head [V, H], DrafterSpec) of Medusa / mtp-linear heads, full vocabulary."""
    from trtspec.checkpoint.target import load_hf_causal_lm  # noqa: PLC0415
    from trtspec.drafters import registry  # noqa: PLC0415 - heavy imports only when exporting
    from trtspec.drafters.proposers import load_module  # noqa: PLC0415
    from trtspec.load import load_drafter  # noqa: PLC0415
    from trtspec.models.heads import LinearHeads  # noqa: PLC0415

    target = load_hf_causal_lm(target_dir)
    drafter = load_drafter(heads_dir, target, draft_vocab=0)
    if "onnx" not in registry.get(drafter.kind).export_formats:
        takes = ", ".join(n for n, k in registry.KINDS.items() if "onnx" in k.export_formats)
        raise UsageError(
            f"{heads_dir}: {drafter.kind} heads cannot be exported as an ONNX head graph yet",
            fix=f"export-onnx takes {takes} heads",
        )
    cfg = drafter.config
    heads = LinearHeads(
        int(cfg["num_heads"]),
        int(cfg["hidden_size"]),
        target.arch.vocab_size,
        int(cfg.get("num_layers", 1)),
        has_norm="heads.0.norm.weight" in drafter.tensors,
        eps=float(cfg.get("rms_norm_eps", 1e-6)),
        own_lm_head=bool(cfg.get("own_lm_head", False)),
    )
    heads = load_module(heads, drafter, dtype)
    lm_head = target.tensors.load(target.lm_head_name).to(dtype)
    return heads, lm_head, drafter


def export_heads_onnx(
    heads_dir: str | Path,
    target_dir: str | Path,
    out: str | Path,
    tree=None,
    dtype: str = "float32",
    verify: str = "greedy",
    expand_plugins: bool = False,
) -> Path:
    """Write the heads (and the verify step on the heads' tree) to ``out``; checked with onnx.checker."""
    from trtspec.load import resolve_tree  # noqa: PLC0415
    from trtspec.tree import build_tree  # noqa: PLC0415

    if dtype not in ONNX_DTYPES:
        raise UsageError(f"unknown ONNX export dtype {dtype!r}", fix=f"use one of {', '.join(ONNX_DTYPES)}")
    onnx = _onnx()
    torch_dtype = ONNX_DTYPES[dtype]
    heads, lm_head, drafter = load_linear_heads(heads_dir, target_dir, torch_dtype)
    paths = build_tree(resolve_tree(tree, drafter).choices).paths if verify != "none" else None
    model = build_heads_model(heads_weights(heads, lm_head, torch_dtype), paths, torch_dtype, verify, expand_plugins)
    onnx.checker.check_model(model)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    big = sum(t.ByteSize() for t in model.graph.initializer) > EXTERNAL_DATA_BYTES
    onnx.save_model(model, str(out), save_as_external_data=big, location=f"{out.name}.data" if big else None)
    return out
