"""Build the CUDA kernel library (and the TensorRT plugin library where TensorRT is) with CMake + nvcc.

Why CMake and not a bare nvcc line: plugins/CMakeLists.txt is the one place that knows the flags
(architectures, -Werror, static cudart, hidden visibility), so `trtspec plugins build`, CI and a user's
own cmake invocation produce the same libraries. The build runs in a temporary directory next to the
output; the finished .so files are renamed into place at the end, so a failed build never leaves a
half-written library where the Triton helper (LD_PRELOAD) or the bindings would pick it up.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trtspec.errors import UsageError

#: Compute capabilities compiled by default: Ampere (A100), Hopper (H100/H200), Blackwell (B200).
DEFAULT_ARCHS: tuple[str, ...] = ("80", "90", "100")
KERNELS_LIB = "libtrtspec_kernels.so"
EMULATION_LIB = "libtrtspec_kernels_emu.so"
PLUGINS_LIB = "libtrtspec_plugins.so"
HEADER = "trtspec_kernels.h"
BUILD_INFO = "build_info.json"
_ARCH_RE = re.compile(r"^\d{2,3}[af]?$")


class PluginBuildError(UsageError):
    """The CMake configure or build step failed; the message names the step and the log file."""


@dataclass
class BuildResult:
    """What a build produced. ``plugins_lib`` is None when TensorRT was not found (or not wanted)."""

    out_dir: Path
    kernels_lib: Path
    plugins_lib: Path | None
    archs: list[str]
    trt_status: str
    seconds: float
    log: Path
    sources_hash: str = ""
    extra: dict = field(default_factory=dict)


def plugins_source_dir() -> Path:
    """plugins/ of this checkout (the kernels ship as sources next to the Python package)."""
    src = Path(__file__).resolve().parents[2] / "plugins"
    if not (src / "CMakeLists.txt").is_file():
        raise UsageError(
            f"{src}/CMakeLists.txt not found", fix="run from a trtspec source checkout, which carries plugins/"
        )
    return src


def header_path() -> Path:
    return plugins_source_dir() / "include" / HEADER


#: Where CI keeps TensorRT's public headers: shared/ beside the checkout (Apache-2.0, headers only).
SHARED_TRT_INCLUDE = Path("..") / "shared" / "third_party" / "tensorrt-10.14" / "include"


def default_trt_include() -> Path | None:
    """TensorRT headers to compile the plugin wrappers against when no TensorRT is installed.

    $TRTSPEC_TRT_INCLUDE if set (it must hold NvInfer.h), else ../shared/third_party/tensorrt-10.14/include
    relative to the repository root (CI clones the repository beside shared/), else None.
    """
    env = os.environ.get("TRTSPEC_TRT_INCLUDE")
    if env:
        path = Path(env).expanduser()
        if not (path / "NvInfer.h").is_file():
            raise UsageError(
                f"TRTSPEC_TRT_INCLUDE={env}: no NvInfer.h there",
                fix="point it at TensorRT's include directory, or unset it",
            )
        return path.resolve()
    path = (plugins_source_dir().parent / SHARED_TRT_INCLUDE).resolve()
    return path if (path / "NvInfer.h").is_file() else None


def default_library_dir() -> Path:
    """Where `trtspec plugins build` puts the libraries and everything else looks for them.

    $TRTSPEC_PLUGIN_DIR if set, else $XDG_CACHE_HOME/trtspec/plugins (~/.cache/trtspec/plugins).
    """
    env = os.environ.get("TRTSPEC_PLUGIN_DIR")
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "trtspec" / "plugins"


def default_kernels_library() -> Path:
    return default_library_dir() / KERNELS_LIB


def default_plugins_library() -> Path:
    """The library the Triton server must load (LD_PRELOAD) so engines with trtspec plugins deserialize."""
    return default_library_dir() / PLUGINS_LIB


def find_nvcc() -> Path:
    """$CUDACXX, $CUDA_HOME/bin/nvcc, nvcc on PATH, then /usr/local/cuda/bin/nvcc."""
    candidates = [os.environ.get("CUDACXX")]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(str(Path(os.environ[var]) / "bin" / "nvcc"))
    candidates += [shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return Path(c)
    raise UsageError("nvcc (the CUDA compiler) not found", fix="install the CUDA toolkit, or set CUDACXX or CUDA_HOME")


def find_cmake() -> Path:
    c = shutil.which("cmake")
    if c is None:
        raise UsageError("cmake not found", fix="install CMake >= 3.24 (apt-get install cmake or pip install cmake)")
    return Path(c)


def tool_version(tool: Path) -> str:
    """First line of `tool --version` that has a version number in it."""
    try:
        text = subprocess.run([str(tool), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    lines = [ln.strip() for ln in text.splitlines() if re.search(r"\d+\.\d+", ln)]
    release = [ln for ln in lines if "release" in ln or "version" in ln]
    return (release or lines or ["unknown"])[0]


def parse_archs(archs) -> list[str]:
    """ "80,90,100" or ["80", 90] -> ["80", "90", "100"]; also "90a" (arch-specific) forms."""
    if isinstance(archs, str):
        items = [a.strip() for a in archs.replace(";", ",").split(",")]
    else:
        items = [str(a).strip() for a in archs]
    items = [a.removeprefix("sm_") for a in items if a]
    bad = [a for a in items if not _ARCH_RE.match(a)]
    if not items or bad:
        raise UsageError(f"bad CUDA architecture list {archs!r}", fix="use compute capabilities like 80,90,100")
    old = [a for a in items if int(re.match(r"\d+", a).group()) < 75]
    if old:
        raise UsageError(
            f"CUDA architecture {old[0]} is older than nvcc 13 supports", fix="use sm_75 or newer, e.g. 80,90,100"
        )
    return list(dict.fromkeys(items))


def sources_hash() -> str:
    """Hash of everything under plugins/ that goes into the libraries (to tell a stale build)."""
    src = plugins_source_dir()
    h = hashlib.sha256()
    for p in sorted(src.rglob("*")):
        rel = p.relative_to(src)
        if p.is_file() and p.suffix in {".cu", ".cuh", ".h", ".cpp", ".txt", ".map"} and "build" not in rel.parts[:-1]:
            h.update(str(rel).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def read_build_info(out_dir: Path | None = None) -> dict | None:
    path = Path(out_dir or default_library_dir()) / BUILD_INFO
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _run(cmd: list[str], log, step: str, log_path: Path, env: dict) -> str:
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    log.write(proc.stdout)
    log.flush()
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stdout.splitlines()]
        # Our own CMake messages first (they say what to set), then compiler errors, then the last line.
        ours = []
        for i, ln in enumerate(lines):
            if "trtspec:" in ln:  # CMake wraps a message over several lines, up to a blank one
                block = [ln]
                for nxt in lines[i + 1 :]:
                    if not nxt:
                        break
                    block.append(nxt)
                ours.append(" ".join(block))
                break
        errors = [ln for ln in lines if "error" in ln.lower() and not ln.startswith("CMake Error at")]
        first = (ours or errors or [ln for ln in lines if ln] or ["(no output)"])[0 if (ours or errors) else -1]
        fix = "the full output is in that log"
        if step == "configure":
            fix += "; `trtspec plugins build` takes --trt-include/--trt-lib for TensorRT, or --no-trt"
        raise PluginBuildError(f"plugin {step} failed: {first[:300]}", path=log_path, fix=fix)
    return proc.stdout


def build_plugins(
    out_dir: str | Path | None = None,
    archs=DEFAULT_ARCHS,
    with_trt: bool | None = None,
    trt_include: str | Path | None = None,
    trt_lib: str | Path | None = None,
    jobs: int | None = None,
    werror: bool = True,
) -> BuildResult:
    """Configure and build plugins/ for ``archs``; put the .so files (+ build_info.json) in ``out_dir``.

    with_trt: None = build the TensorRT plugins when NvInfer.h and libnvinfer are found, True = fail
    without them, False = kernels only.
    """
    started = time.monotonic()
    archs = parse_archs(archs)
    src = plugins_source_dir()
    nvcc, cmake = find_nvcc(), find_cmake()
    out = Path(out_dir) if out_dir is not None else default_library_dir()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=out))
    log_path = out / "build.log"
    env = dict(os.environ, CUDACXX=str(nvcc))
    mode = {None: "AUTO", True: "ON", False: "OFF"}[with_trt]
    cmd = [
        str(cmake),
        "-S",
        str(src),
        "-B",
        str(work / "cmake"),
        f"-DCMAKE_CUDA_COMPILER={nvcc}",
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(archs)}",
        f"-DTRTSPEC_WITH_TRT={mode}",
        f"-DTRTSPEC_WERROR={'ON' if werror else 'OFF'}",
    ]
    if shutil.which("ninja"):
        cmd += ["-G", "Ninja"]
    if trt_include:
        cmd.append(f"-DTRTSPEC_TRT_INCLUDE_DIR={Path(trt_include).resolve()}")
    if trt_lib:
        cmd.append(f"-DTRTSPEC_TRT_LIB_DIR={Path(trt_lib).resolve()}")
    try:
        with open(log_path, "w") as log:
            configured = _run(cmd, log, "configure", log_path, env)
            build = [str(cmake), "--build", str(work / "cmake"), "--parallel", str(jobs or os.cpu_count() or 2)]
            _run(build, log, "build", log_path, env)
        trt_lines = [ln.removeprefix("-- trtspec: ") for ln in configured.splitlines() if "-- trtspec:" in ln]
        built = work / "cmake"
        kernels = out / KERNELS_LIB
        os.replace(built / KERNELS_LIB, kernels)
        plugins: Path | None = None
        if (built / PLUGINS_LIB).is_file():
            plugins = out / PLUGINS_LIB
            os.replace(built / PLUGINS_LIB, plugins)
        elif (out / PLUGINS_LIB).exists():
            (out / PLUGINS_LIB).unlink()  # never leave a plugin library from an older build beside new kernels
        shutil.copy2(src / "include" / HEADER, out / HEADER)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = BuildResult(
        out_dir=out,
        kernels_lib=kernels,
        plugins_lib=plugins,
        archs=archs,
        trt_status="; ".join(trt_lines) or "unknown",
        seconds=time.monotonic() - started,
        log=log_path,
        sources_hash=sources_hash(),
        extra={"nvcc": tool_version(nvcc), "cmake": tool_version(cmake)},
    )
    info = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(result).items()}
    tmp = out / f".{BUILD_INFO}.tmp"
    tmp.write_text(json.dumps(info, indent=2) + "\n")
    os.replace(tmp, out / BUILD_INFO)
    return result


def build_host_emulation(out_dir: str | Path, cxx: str | None = None) -> Path:
    """Compile the kernel sources for the CPU (plugins/emu/cuda_host_emu.h) into libtrtspec_kernels_emu.so.

    Same C ABI, host pointers instead of device pointers. Used by the tests to run the kernels' logic
    against the PyTorch reference on machines without a GPU; never for speed.
    """
    compiler = cxx or os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise UsageError("no C++ compiler found for the host emulation build", fix="install g++ or set CXX")
    src = plugins_source_dir()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-emu-", dir=out))
    log_path = out / "build_emu.log"
    # -fno-strict-aliasing: the kernels move 16-byte vectors through uint4 as device code may.
    flags = [
        "-std=c++17",
        "-O2",
        "-fPIC",
        "-fno-strict-aliasing",
        "-DTRTSPEC_HOST_EMULATION",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-Wno-unknown-pragmas",
        f"-I{src / 'include'}",
    ]
    sources = [
        src / "kernels" / "common.cu",
        src / "kernels" / "rmsnorm_heads.cu",
        src / "kernels" / "tree_verify.cu",
        src / "emu" / "cuda_host_emu.cpp",
    ]
    try:
        with open(log_path, "w") as log:
            procs, objects = [], []
            for s in sources:  # compile in parallel: one process per file
                obj = work / (s.name + ".o")
                objects.append(obj)
                cmd = [compiler, *flags, "-x", "c++", "-c", str(s), "-o", str(obj)]
                log.write(f"$ {' '.join(cmd)}\n")
                procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
            failed = []
            for s, p in zip(sources, procs):
                text, _ = p.communicate()
                log.write(text)
                if p.returncode != 0:
                    failed.append(f"{s.name}: {(text.strip().splitlines() or ['?'])[0][:200]}")
            if failed:
                raise PluginBuildError(f"host emulation build failed: {failed[0]}", path=log_path)
            _run(
                [compiler, "-shared", "-o", str(work / EMULATION_LIB), *map(str, objects)],
                log,
                "emulation link",
                log_path,
                dict(os.environ),
            )
        os.replace(work / EMULATION_LIB, out / EMULATION_LIB)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out / EMULATION_LIB
