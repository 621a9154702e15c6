"""`trtspec plugins build|info|export-onnx`: compile the CUDA kernels and TensorRT plugins, say where they
are, and write draft heads as an ONNX graph of plugin nodes."""

from __future__ import annotations

import json
from pathlib import Path

import click

from trtspec.kernels import build as kbuild
from trtspec.kernels.onnx_export import ONNX_DTYPES, export_heads_onnx


@click.group("plugins")
def plugins() -> None:
    """Build and inspect the trtspec CUDA kernels and TensorRT plugins.

    The kernels (libtrtspec_kernels.so, C ABI) build wherever nvcc and CMake are; the TensorRT plugins
    (libtrtspec_plugins.so, IPluginV3 creators in the namespace "trtspec") build only where TensorRT's
    headers and libnvinfer are. The Triton server loads libtrtspec_plugins.so with LD_PRELOAD.
    """


@plugins.command("build")
@click.option(
    "--arch",
    "archs",
    default=",".join(kbuild.DEFAULT_ARCHS),
    show_default=True,
    help="CUDA compute capabilities to compile for (comma separated, e.g. 80,90,100 or 90a).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Output directory [default: $TRTSPEC_PLUGIN_DIR or ~/.cache/trtspec/plugins].",
)
@click.option(
    "--with-trt/--no-trt",
    "with_trt",
    default=None,
    help="Require (or skip) the TensorRT plugins. Default: build them when TensorRT is found.",
)
@click.option(
    "--trt-include",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Directory holding NvInfer.h (TensorRT 10+).",
)
@click.option(
    "--trt-lib",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Directory holding libnvinfer.so.",
)
@click.option("--jobs", "-j", type=click.IntRange(1, 256), default=None, help="Parallel compile jobs.")
def build_cmd(
    archs: str,
    out_dir: Path | None,
    with_trt: bool | None,
    trt_include: Path | None,
    trt_lib: Path | None,
    jobs: int | None,
) -> None:
    """Compile plugins/ with -Werror for the given architectures (CMake + nvcc, no GPU needed).

    Writes libtrtspec_kernels.so, libtrtspec_plugins.so (when TensorRT is there), trtspec_kernels.h,
    build_info.json and build.log to the output directory; a failed build leaves the previous
    libraries in place.
    """
    res = kbuild.build_plugins(
        out_dir, archs=archs, with_trt=with_trt, trt_include=trt_include, trt_lib=trt_lib, jobs=jobs
    )
    click.echo(f"kernels: {res.kernels_lib}")
    click.echo(f"plugins: {res.plugins_lib or 'not built'} ({res.trt_status})")
    click.echo(f"archs: {','.join(res.archs)}  time: {res.seconds:.1f} s  log: {res.log}")


@plugins.command("info")
@click.option(
    "--dir",
    "lib_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Library directory to inspect [default: the build default].",
)
def info_cmd(lib_dir: Path | None) -> None:
    """Show where the libraries are, how they were built, and whether they match the sources."""
    lib_dir = lib_dir or kbuild.default_library_dir()
    info = kbuild.read_build_info(lib_dir)
    out = {
        "library_dir": str(lib_dir),
        "kernels_lib": str(lib_dir / kbuild.KERNELS_LIB) if (lib_dir / kbuild.KERNELS_LIB).is_file() else None,
        "plugins_lib": str(lib_dir / kbuild.PLUGINS_LIB) if (lib_dir / kbuild.PLUGINS_LIB).is_file() else None,
        "built": info,
        "up_to_date": bool(info) and info.get("sources_hash") == kbuild.sources_hash(),
    }
    click.echo(json.dumps(out, indent=2))


@plugins.command("export-onnx")
@click.option(
    "--heads",
    "heads_dir",
    required=True,
    type=click.Path(exists=True, path_type=Path),
    help="Medusa or mtp-linear heads (any format trtspec reads).",
)
@click.option(
    "--target",
    "target_dir",
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The target model directory (its lm_head is the heads' shared projection).",
)
@click.option(
    "--out", "out_file", required=True, type=click.Path(dir_okay=False, path_type=Path), help="The .onnx file to write."
)
@click.option("--tree", default=None, help="Tree choices for the verify step [default: the heads' own tree].")
@click.option(
    "--dtype",
    type=click.Choice(sorted(ONNX_DTYPES)),
    default="float32",
    show_default=True,
    help="Activation and weight type of the head graph.",
)
@click.option(
    "--verify",
    type=click.Choice(["greedy", "sampling", "none"]),
    default="greedy",
    show_default=True,
    help="Add the TreeVerify step on target logits (greedy, or sampling with temperature and seed).",
)
@click.option(
    "--expand-plugins",
    is_flag=True,
    help="Write the plugin nodes as standard ONNX ops (runs in any ONNX runtime; no TensorRT plugins).",
)
def export_onnx_cmd(
    heads_dir: Path, target_dir: Path, out_file: Path, tree: str | None, dtype: str, verify: str, expand_plugins: bool
) -> None:
    """Write the draft heads and the verify step as an ONNX graph of trtspec plugin nodes.

    TensorRT builds it with the plugin library loaded, e.g.
    `trtexec --onnx=heads.onnx --dynamicPlugins=libtrtspec_plugins.so`.
    """
    out = export_heads_onnx(
        heads_dir, target_dir, out_file, tree=tree, dtype=dtype, verify=verify, expand_plugins=expand_plugins
    )
    click.echo(f"onnx: {out}")


COMMANDS = [plugins]
