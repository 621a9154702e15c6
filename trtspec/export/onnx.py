"""onnx: the heads and the verify step as one ONNX graph whose fused nodes are trtspec's TensorRT plugins
(``trtexec --onnx=OUT --dynamicPlugins=libtrtspec_plugins.so``); the graph builder is kernels/onnx_export."""

from __future__ import annotations

from pathlib import Path

import torch

from trtspec.dtypes import DTYPE_NAMES
from trtspec.export.base import Exporter, ExportOptions
from trtspec.spec import SpecModel

NAME = "onnx"


def write(spec: SpecModel, out: Path, opts: ExportOptions) -> None:
    from trtspec.kernels.onnx_export import export_heads_onnx  # noqa: PLC0415 - onnx is imported only here

    dtype = DTYPE_NAMES[opts.dtype or torch.float32]
    export_heads_onnx(opts.heads, opts.target, out, tree=opts.tree, dtype=dtype)


EXPORTER = Exporter(
    name=NAME,
    summary="heads + verify step as an ONNX graph with trtspec's TensorRT plugin nodes",
    loaders="trtexec / TensorRT with libtrtspec_plugins.so",
    write=write,
    single_file=True,
)
