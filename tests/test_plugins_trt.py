"""libtrtspec_plugins.so as TensorRT's plugin-library loader sees it, without TensorRT: built against
TensorRT's public headers (no libnvinfer), its dynamic symbol table, and plugins/tests/plugin_probe.cpp
driving the real C++ creators (getCreators, setLoggerFinder, createPlugin, configurePlugin,
onShapeChange) with good and bad shapes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from trtspec.kernels import build, trt_network

TRT_INCLUDE = build.default_trt_include()
CXX = shutil.which("g++")
pytestmark = [
    pytest.mark.skipif(
        TRT_INCLUDE is None,
        reason=f"TensorRT headers not found (set TRTSPEC_TRT_INCLUDE, or "
        f"put them at <repo>/{build.SHARED_TRT_INCLUDE})",
    ),
    pytest.mark.skipif(
        shutil.which("cmake") is None or CXX is None or shutil.which("nm") is None,
        reason="needs cmake, nvcc, g++ and nm",
    ),
]
LOADER_ENTRY_POINTS = {"getCreators", "setLoggerFinder"}


@pytest.fixture(scope="module")
def plugins_lib(tmp_path_factory) -> Path:
    """The plugin library for sm_90 (one architecture keeps this quick; test_plugins_build builds all)."""
    res = build.build_plugins(tmp_path_factory.mktemp("trt"), archs="90", with_trt=True, trt_include=TRT_INCLUDE)
    assert res.plugins_lib is not None, res.trt_status
    return res.plugins_lib


def exported(lib: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r" [TW] (\w+)$", out, flags=re.MULTILINE))


def test_exports_exactly_the_loader_entry_points_and_the_c_abi(plugins_lib):
    """IPluginRegistry::loadLibrary and trtexec --dynamicPlugins dlsym getCreators and setLoggerFinder;
    everything else but the kernels' C ABI stays local (the version script)."""
    symbols = exported(plugins_lib)
    assert LOADER_ENTRY_POINTS <= symbols, f"missing {LOADER_ENTRY_POINTS - symbols}"
    others = symbols - LOADER_ENTRY_POINTS
    assert others and all(s.startswith("trtspec_") for s in others), sorted(others)[:10]


def test_links_without_libnvinfer(plugins_lib):
    needed = subprocess.run(["readelf", "-d", str(plugins_lib)], capture_output=True, text=True, check=True).stdout
    assert "libnvinfer" not in needed
    undefined = subprocess.run(
        ["nm", "-D", "--undefined-only", str(plugins_lib)], capture_output=True, text=True, check=True
    ).stdout
    assert not re.search(r"nvinfer|getPluginRegistry|getLogger", undefined), undefined


@pytest.fixture(scope="module")
def probe(plugins_lib, tmp_path_factory) -> tuple[str, str]:
    """(stdout, stderr) of plugin_probe run on the library."""
    src = build.plugins_source_dir() / "tests" / "plugin_probe.cpp"
    exe = tmp_path_factory.mktemp("probe") / "plugin_probe"
    nvcc_include = build.find_nvcc().resolve().parent.parent / "include"
    cmd = [
        CXX,
        "-std=c++17",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-isystem",
        str(TRT_INCLUDE),
        "-isystem",
        str(nvcc_include),
        "-isystem",
        "/usr/local/cuda/include",
        str(src),
        "-o",
        str(exe),
        "-ldl",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    run = subprocess.run([str(exe), str(plugins_lib)], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout, run.stderr


def _cases(stdout: str) -> dict[str, tuple[int, int, str]]:
    return {
        m[0]: (int(m[1]), int(m[2]), m[3])
        for m in re.findall(r"^case (\w+) rc=(-?\d+) errors=(\d+) last=(.*)$", stdout, flags=re.MULTILINE)
    }


def test_creators_register_the_agreed_names_and_fields(probe):
    stdout, _ = probe
    assert "entry getCreators=1 setLoggerFinder=1" in stdout
    creators = dict(re.findall(r"^creator (\w+) (.*)$", stdout, flags=re.MULTILINE))
    assert set(creators) == {trt_network.RMSNORM_HEADS, trt_network.TREE_VERIFY}
    for line in creators.values():
        assert f"version={trt_network.PLUGIN_VERSION} namespace={trt_network.PLUGIN_NAMESPACE}" in line
        assert "CREATOR_V3ONE" in line  # IPluginV3 creators: what getCreators must hand out
    fields = re.findall(r"^field (\w+) (\w+) (\w+) (\d+)$", stdout, flags=re.MULTILINE)
    want = [
        (trt_network.RMSNORM_HEADS, name, kind.lower(), "1") for name, _, kind in trt_network.rmsnorm_heads_fields(1e-6)
    ]
    want += [(trt_network.TREE_VERIFY, name, kind.lower(), "1") for name, _, kind in trt_network.tree_verify_fields()]
    assert fields == want


def test_half_precision_eps_fields_are_read(probe):
    stdout, _ = probe
    got = {k: float(v) for k, v in re.findall(r"^serialized (\w+) (\S+)$", stdout, flags=re.MULTILINE)}
    assert got["eps_fp16"] == pytest.approx(0.00100040436, rel=1e-7)  # not the 1e-6 default
    assert got["eps_bf16"] == pytest.approx(0.000999450684, rel=1e-7)
    assert got["eps_fp64"] == pytest.approx(1e-5, rel=1e-6)
    assert got["eps_default"] == pytest.approx(1e-6, rel=1e-6)


ACCEPTED = [
    "rms_ok",
    "rms_dynamic_ok",
    "rms_runtime_ok",
    "tv_greedy_ok",
    "tv_greedy_dynamic_ok",
    "tv_runtime_ok",
    "tv_ids_ok",
    "tv_sampling_ok",
    "tv_sampling_step_ok",
]
REJECTED = {
    "rms_negative_eps": "eps",
    "rms_hidden_mismatch": "(4096) and of the weights (2048) differ",
    "rms_weight_rank": "weights must be [K, H]",
    "rms_type_mismatch": "share one type",
    "rms_runtime_mismatch": "differ",
    "tv_batch_mismatch": "batch and node counts must match",
    "tv_nodes_mismatch": "batch and node counts",
    "tv_paths_too_long": "paths [40, 65] do not fit",
    "tv_too_many_paths": "paths [65, 6] do not fit",
    "tv_too_many_nodes": "1025 nodes",
    "tv_target_type": "target must be float32",
    "tv_wrong_input_count": "takes 3 inputs, got 2",
    "tv_runtime_batch_mismatch": "batch",
    "tv_ids_rank": "target [B, N1]",
    "tv_temperature_batch": "temperature",
    "tv_seed_three": "seed must be int64 [1]",
    "tv_seed_type": "seed must be int64",
    "tv_runtime_temperature": "temperature",
    "tv_bad_mode": "field 'mode'",
}


def test_good_shapes_pass_the_build_and_runtime_checks(probe):
    cases = _cases(probe[0])
    for name in ACCEPTED:
        assert cases[name][:2] == (0, 0), (name, cases[name])


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_bad_shapes_fail_with_one_error_through_tensorrts_logger(probe, name):
    rc, errors, last = _cases(probe[0])[name]
    assert rc == -1 and errors == 1, (name, rc, errors, last)
    assert last.startswith("[trtspec] Trtspec") and REJECTED[name] in last


def test_errors_go_to_stderr_before_tensorrt_hands_over_a_logger(probe):
    stdout, stderr = probe
    assert _cases(stdout)["no_finder_bad_layout"] == (-1, 0, "-")
    assert "[trtspec] TrtspecRmsNormHeads: field 'layout' must be 0" in stderr
