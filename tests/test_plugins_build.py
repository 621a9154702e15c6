"""CPU checks of the CUDA plugins: they really compile (sm_80/90/100, -Werror), the C header parses and
matches the bindings, the ctypes bindings work up to the GPU boundary, and the references agree with
trtspec/runtime/verify.py. The library is built once per session into a temporary directory."""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.errors import UsageError
from trtspec.kernels import bindings, build, reference, trt_network
from trtspec.models.llama import rms_norm
from trtspec.runtime.verify import verify_greedy
from trtspec.tree import DEFAULT_CHOICES, build_tree, normalize_choices

HAVE_TOOLCHAIN = shutil.which("cmake") is not None and any(
    shutil.which(c) for c in ("nvcc", "/usr/local/cuda/bin/nvcc")
)
needs_toolchain = pytest.mark.skipif(not HAVE_TOOLCHAIN, reason="nvcc and cmake are needed to compile the kernels")


TRT_INCLUDE = build.default_trt_include()
needs_trt_headers = pytest.mark.skipif(
    TRT_INCLUDE is None,
    reason=f"TensorRT headers not found (set TRTSPEC_TRT_INCLUDE, or put them at <repo>/{build.SHARED_TRT_INCLUDE})",
)


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> build.BuildResult:
    """Kernels for every default architecture, and the plugin library where TensorRT's headers are."""
    if not HAVE_TOOLCHAIN:
        pytest.skip("nvcc and cmake are needed to compile the kernels")
    return build.build_plugins(tmp_path_factory.mktemp("plugins"), archs=build.DEFAULT_ARCHS, trt_include=TRT_INCLUDE)


@pytest.fixture(scope="session")
def lib(built) -> bindings.KernelLibrary:
    return bindings.load_library(built.kernels_lib)


# ------------------------------------------------------------------------------------------ compile


@needs_toolchain
def test_kernels_compile_for_every_arch_with_werror(built):
    data = built.kernels_lib.read_bytes()
    for arch in ("80", "90", "100"):
        assert f".target sm_{arch}".encode() in data, f"no PTX for sm_{arch}"
        assert f"-arch sm_{arch} -m 64 -Werror".encode() in data, f"no SASS for sm_{arch} built with -Werror"
    assert built.archs == ["80", "90", "100"]
    info = build.read_build_info(built.out_dir)
    assert info["sources_hash"] == build.sources_hash()
    assert (built.out_dir / build.HEADER).read_text() == build.header_path().read_text()
    assert not [p for p in built.out_dir.iterdir() if p.name.startswith(".build-")], "temporary build dir left"
    # No TensorRT here: the plugin library is skipped, with the reason.
    if built.plugins_lib is None:
        assert "TensorRT not found" in built.trt_status


@needs_toolchain
@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils)")
def test_library_exports_the_c_abi(built):
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(built.kernels_lib)], capture_output=True, text=True, check=True
    ).stdout
    exported = set(re.findall(r" T (trtspec_\w+)", out))
    assert exported == set(bindings._SIGNATURES)


@needs_toolchain
def test_failed_build_keeps_previous_library(built, tmp_path):
    out = tmp_path / "libs"
    out.mkdir()
    old = out / build.KERNELS_LIB
    old.write_bytes(b"previous build")
    with pytest.raises(build.PluginBuildError, match="failed") as err:
        build.build_plugins(out, archs="99")  # passes the list check, but nvcc 13 has no sm_99
    assert old.read_bytes() == b"previous build"
    assert err.value.path == out / "build.log" and (out / "build.log").stat().st_size > 0
    assert not [p for p in out.iterdir() if p.name.startswith(".build-")]


@needs_toolchain
@needs_trt_headers
def test_trt_wrappers_compile_and_link_against_tensorrt_headers(built):
    """The plugin wrappers compile with -Werror against TensorRT's headers and link into a library with
    no libnvinfer (--no-undefined), carrying the kernels for every architecture."""
    assert built.plugins_lib is not None and built.plugins_lib.is_file(), built.trt_status
    assert "building libtrtspec_plugins.so against the headers" in built.trt_status
    exported = subprocess.run(
        ["nm", "-D", "--defined-only", str(built.plugins_lib)], capture_output=True, text=True, check=True
    ).stdout
    assert " T getCreators" in exported and " T setLoggerFinder" in exported  # the loader's entry points
    data = built.plugins_lib.read_bytes()
    for arch in ("80", "90", "100"):
        assert f".target sm_{arch}".encode() in data, f"no PTX for sm_{arch} in the plugin library"
    needed = subprocess.run(["readelf", "-d", str(built.plugins_lib)], capture_output=True, text=True).stdout
    assert "libnvinfer" not in needed


def test_arch_list_parsing():
    assert build.parse_archs("80, 90;100") == ["80", "90", "100"]
    assert build.parse_archs(["sm_90a", 100, "90a"]) == ["90a", "100"]
    for bad in ("", "eighty", "8", "80,x"):
        with pytest.raises(UsageError):
            build.parse_archs(bad)


def test_default_library_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TRTSPEC_PLUGIN_DIR", str(tmp_path / "p"))
    assert build.default_library_dir() == tmp_path / "p"
    assert build.default_plugins_library() == tmp_path / "p" / "libtrtspec_plugins.so"
    monkeypatch.delenv("TRTSPEC_PLUGIN_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert build.default_library_dir() == tmp_path / "cache" / "trtspec" / "plugins"


# ------------------------------------------------------------------------------------------ header


@pytest.mark.parametrize("lang,std", [("c", "-std=c99"), ("c++", "-std=c++17")])
def test_header_parses(lang, std):
    compiler = shutil.which("gcc" if lang == "c" else "g++")
    if compiler is None:
        pytest.skip(f"no {lang} compiler")
    src = f'#include "{build.header_path()}"\nint main(void) {{ return TRTSPEC_KERNELS_ABI_VERSION - 1; }}\n'
    proc = subprocess.run(
        [compiler, "-x", lang, std, "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only", "-"],
        input=src,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr


def test_header_constants_match_bindings():
    text = build.header_path().read_text()

    def value(name: str) -> int:
        return int(re.search(rf"\b{name}\s*=?\s*(\d+)", text).group(1))

    assert value("TRTSPEC_KERNELS_ABI_VERSION") == bindings.ABI_VERSION
    assert value("TRTSPEC_MAX_TREE_NODES") == bindings.MAX_TREE_NODES
    assert [value(n) for n in ("TRTSPEC_FLOAT32", "TRTSPEC_FLOAT16", "TRTSPEC_BFLOAT16")] == [
        bindings.DTYPES[t] for t in (torch.float32, torch.float16, torch.bfloat16)
    ]
    assert (
        value("TRTSPEC_LAYOUT_HEAD_MAJOR")
        == bindings.LAYOUTS["head-major"]
        == trt_network.RMSNORM_LAYOUTS["head-major"]
    )
    assert value("TRTSPEC_LAYOUT_TOKEN_MAJOR") == bindings.LAYOUTS["token-major"]
    assert [
        value(n)
        for n in (
            "TRTSPEC_VERIFY_GREEDY_IDS",
            "TRTSPEC_VERIFY_GREEDY_LOGITS",
            "TRTSPEC_VERIFY_SAMPLE_LOGITS",
            "TRTSPEC_VERIFY_SAMPLE_PROBS",
        )
    ] == [
        bindings.VERIFY_MODES[k]
        for k in (("greedy", "ids"), ("greedy", "logits"), ("sampling", "logits"), ("sampling", "probs"))
    ]
    for name, args in bindings._SIGNATURES.items():  # every bound function is declared with that arity
        decl = re.search(rf"TRTSPEC_API [^;(]*\b{name}\(([^)]*)\);", text).group(1)
        n = 0 if decl.strip() == "void" else decl.count(",") + 1
        assert n == len(args[1]), name


def test_plugin_sources_use_the_agreed_names():
    common = (build.plugins_source_dir() / "trt" / "plugin_common.h").read_text()
    for name in (trt_network.RMSNORM_HEADS, trt_network.TREE_VERIFY):
        assert f'"{name}"' in common
    assert f'kPluginNamespace = "{trt_network.PLUGIN_NAMESPACE}"' in common
    assert f'kPluginVersion = "{trt_network.PLUGIN_VERSION}"' in common


# ------------------------------------------------------------------------------------------ ctypes


@needs_toolchain
def test_binding_loads_and_checks_abi(lib):
    assert lib.lib.trtspec_kernels_abi_version() == bindings.ABI_VERSION
    assert lib.status_string(0) == "ok" and lib.status_string(1) == "invalid argument"
    assert lib.status_string(99) == "unknown status"
    assert bindings.load_library(lib.path) is lib  # cached per path


def test_missing_library_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="plugins build"):
        bindings.load_library(tmp_path / "nope.so")


@needs_toolchain
def test_invalid_arguments_rejected_before_any_launch(lib):
    rms, tv = lib.lib.trtspec_rmsnorm_heads_layout, lib.lib.trtspec_tree_verify
    fake = 1 << 20  # never dereferenced: every call below fails its argument checks first
    assert rms(None, None, None, 4, 8, 2, 1e-6, 0, 0, None) == bindings.STATUS_INVALID
    assert rms(fake, fake, fake, 4, 0, 2, 1e-6, 0, 0, None) == bindings.STATUS_INVALID  # H = 0
    assert rms(fake, fake, fake, 4, 8, 2, 1e-6, 7, 0, None) == bindings.STATUS_INVALID  # bad dtype
    assert rms(fake, fake, fake, 4, 8, 2, 1e-6, 0, 5, None) == bindings.STATUS_INVALID  # bad layout
    assert rms(None, None, None, 0, 8, 2, 1e-6, 0, 0, None) == bindings.STATUS_OK  # nothing to do
    args = dict(
        mode=0,
        paths=fake,
        num_paths=1,
        path_len=2,
        draft=fake,
        batch=3,
        nodes=2,
        ids=fake,
        target=None,
        dtype=0,
        vocab=0,
        temp=None,
        seed=None,
        seed_len=0,
    )

    def call(**kw):
        a = {**args, **kw}
        return tv(
            a["mode"],
            a["paths"],
            a["num_paths"],
            a["path_len"],
            a["draft"],
            a["batch"],
            a["nodes"],
            a["ids"],
            a["target"],
            a["dtype"],
            a["vocab"],
            a["temp"],
            a["seed"],
            a["seed_len"],
            fake,
            fake,
            fake,
            fake,
            None,
        )

    assert call(mode=9) == bindings.STATUS_INVALID
    assert call(path_len=3) == bindings.STATUS_INVALID  # deeper than the tree has nodes
    assert call(ids=None) == bindings.STATUS_INVALID  # greedy ids without ids
    assert call(mode=1, target=None, vocab=10) == bindings.STATUS_INVALID
    assert call(mode=2, target=fake, vocab=10, seed=None) == bindings.STATUS_INVALID  # sampling needs a seed
    assert call(mode=2, target=fake, vocab=10, seed=fake, seed_len=3) == bindings.STATUS_INVALID  # (seed, step) at most
    assert call(nodes=2000, path_len=2) == bindings.STATUS_UNSUPPORTED  # > TRTSPEC_MAX_TREE_NODES
    assert call(batch=0) == bindings.STATUS_OK


@needs_toolchain
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the failure without a GPU driver")
def test_launch_without_gpu_reports_the_cuda_error(lib):
    fake = 1 << 20
    status = lib.lib.trtspec_rmsnorm_heads_layout(fake, fake, fake, 4, 8, 2, 1e-6, 0, 0, None)
    assert status == bindings.STATUS_CUDA
    with pytest.raises(bindings.KernelError, match="CUDA error: .*driver"):
        lib.check("trtspec_rmsnorm_heads_layout", status)


def test_rmsnorm_wrapper_checks_inputs():
    x, w = torch.randn(3, 5, 16), torch.randn(4, 16)
    assert bindings.rmsnorm_out_shape(x.shape, 4, "head-major") == (4, 3, 5, 16)
    assert bindings.rmsnorm_out_shape(x.shape, 4, "token-major") == (3, 5, 4, 16)
    out = torch.empty(4, 3, 5, 16)
    args = bindings.rmsnorm_heads_call_args(x, w, 1e-5, "token-major", out)
    assert args[3:] == (15, 16, 4, pytest.approx(1e-5), 0, 1)
    with pytest.raises(UsageError, match="CUDA tensors"):
        bindings.rmsnorm_heads(x, w, 1e-5)
    with pytest.raises(UsageError, match="weights are"):
        bindings.rmsnorm_heads(x, w.half(), 1e-5)
    with pytest.raises(UsageError, match="do not fit"):
        bindings.rmsnorm_heads(x, torch.randn(4, 8), 1e-5)
    with pytest.raises(UsageError, match="layout"):
        bindings.rmsnorm_heads(x, w, 1e-5, layout="sideways")
    with pytest.raises(UsageError, match="unsupported"):
        bindings.rmsnorm_heads(x.double(), w.double(), 1e-5)


def test_tree_verify_wrapper_checks_inputs():
    tree = build_tree(DEFAULT_CHOICES)
    paths = tree.paths.int()
    n1 = tree.size
    draft = torch.zeros(2, n1, dtype=torch.int32)
    ids = torch.zeros(2, n1, dtype=torch.int32)
    with pytest.raises(UsageError, match="CUDA tensors"):
        bindings.tree_verify(paths, draft, ids)
    with pytest.raises(UsageError, match="paths must be int32"):
        bindings.tree_verify(tree.paths, draft, ids)
    with pytest.raises(UsageError, match="do not fit"):
        bindings.tree_verify(paths, draft[:, :5], ids[:, :5])
    with pytest.raises(UsageError, match="target ids"):
        bindings.tree_verify(paths, draft, ids.long())
    with pytest.raises(UsageError, match="unsupported"):
        bindings.tree_verify(paths, draft, ids, mode="sampling", target_kind="ids")
    logits = torch.randn(2, n1, 50)
    with pytest.raises(UsageError, match="seed"):
        bindings.tree_verify(paths, draft, logits, mode="sampling", target_kind="logits")
    with pytest.raises(UsageError, match="temperature"):
        bindings.tree_verify(
            paths, draft, logits, mode="sampling", target_kind="logits", temperature=torch.ones(3), seed=1
        )
    with pytest.raises(UsageError, match="at most 1024"):
        bindings.tree_verify(paths, torch.zeros(1, 1100, dtype=torch.int32), torch.zeros(1, 1100, dtype=torch.int32))


# ------------------------------------------------------------------------------------------ references


def _random_tree(rng: random.Random, max_nodes: int, max_width: int = 4):
    choices = [(r,) for r in range(rng.randint(1, max_width))]
    while len(choices) < max_nodes - 1 and rng.random() < 0.95:
        parent = rng.choice(choices)
        kids = [c for c in choices if len(c) == len(parent) + 1 and c[:-1] == parent]
        if len(kids) < max_width:
            choices.append(parent + (len(kids),))
    return build_tree(normalize_choices(choices))


def _draft_for(tree, batch: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """Distinct tokens among siblings (as top-k drafts are)."""
    draft = torch.randint(0, vocab, (batch, tree.size), generator=gen)
    for n in range(1, tree.size):
        draft[:, n] = (draft[:, int(tree.parents[n])] * 7 + int(tree.ranks[n]) * 3 + 1) % vocab
    return draft


def test_batched_greedy_hand_worked():
    # root -> a(1) b(2); a -> c(3) d(4); c -> e(5)
    tree = build_tree([[0], [1], [0, 0], [0, 1], [0, 0, 0]])
    assert tree.paths.tolist() == [[0, 2, -1, -1], [0, 1, 4, -1], [0, 1, 3, 5]]
    draft = torch.tensor(
        [[100, 11, 12, 13, 14, 15], [100, 11, 12, 13, 14, 15], [100, 11, 12, 13, 14, 15]], dtype=torch.int32
    )
    # row 0: root->11 (node1) -> 14 (node 4, leaf): bonus = arg[4] = 77
    # row 1: nothing matches at the root: bonus = arg[0] = 99
    # row 2: 11 -> 13 -> 15 (all the way down): bonus = arg[5] = 55
    ids = torch.tensor([[11, 14, 0, 0, 77, 0], [99, 14, 0, 0, 77, 0], [11, 13, 0, 15, 0, 55]], dtype=torch.int32)
    out = reference.tree_verify_greedy_batched(tree.paths.int(), draft, ids)
    assert out.accepted_len.tolist() == [2, 0, 3]
    assert out.tokens.tolist() == [[11, 14, 77, -1], [99, -1, -1, -1], [11, 13, 15, 55]]
    assert out.keep_nodes.tolist() == [[0, 1, 4, -1], [0, -1, -1, -1], [0, 1, 3, 5]]
    assert out.best_path.tolist() == [1, 0, 2]  # nothing accepted (row 1): the first path
    ref = reference.tree_verify_reference(tree, draft, ids)
    for name in ("accepted_len", "tokens", "best_path", "keep_nodes"):
        assert torch.equal(getattr(out, name), getattr(ref, name)), name


@pytest.mark.parametrize("seed", range(6))
def test_batched_greedy_agrees_with_verify_py_on_random_trees(seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    tree = _random_tree(rng, max_nodes=rng.choice([2, 8, 64, 256]))
    batch, vocab = 16, 12
    draft = _draft_for(tree, batch, vocab, gen)
    # Make acceptance likely: the argmax at a node is often one of its children's tokens.
    ids = torch.randint(0, vocab, (batch, tree.size), generator=gen)
    kids = [tree.children(n) for n in range(tree.size)]
    for b in range(batch):
        for n in range(tree.size):
            if kids[n] and rng.random() < 0.7:
                ids[b, n] = draft[b, rng.choice(kids[n])]
    got = reference.tree_verify_greedy_batched(tree.paths.int(), draft.int(), ids.int())
    want = verify_greedy(tree, draft, ids)
    assert got.accepted_len.tolist() == want.accepted_len
    assert got.best_path.tolist() == want.best_path
    for b in range(batch):
        n = want.accepted_len[b]
        assert got.tokens[b, : n + 1].tolist() == want.tokens[b]
        assert got.keep_nodes[b, : n + 1].tolist() == want.keep_nodes[b]
        assert (got.tokens[b, n + 1 :] == -1).all() and (got.keep_nodes[b, n + 1 :] == -1).all()


def test_batched_greedy_root_only_tree():
    tree = build_tree([])
    assert tree.paths.tolist() == [[0]]
    out = reference.tree_verify_greedy_batched(
        tree.paths.int(), torch.tensor([[5]], dtype=torch.int32), torch.tensor([[9]], dtype=torch.int32)
    )
    assert out.as_lists() == {"accepted_len": [0], "tokens": [[9]], "best_path": [0], "keep_nodes": [[0]]}


def test_reference_sampling_uses_each_rows_temperature():
    tree = build_tree([[0], [1], [0, 0]])
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, tree.size, 20, generator=gen)
    draft = _draft_for(tree, 3, 20, gen)
    temps = torch.tensor([0.5, 1.0, 2.0])
    probs = reference.sampling_probs(logits, "logits", temps)
    for i, t in enumerate(temps.tolist()):
        assert torch.allclose(probs[i], torch.softmax(logits[i] / t, -1))
    a = reference.tree_verify_reference(tree, draft, logits, "sampling", "logits", temps, seed=11)
    b = reference.tree_verify_reference(tree, draft, probs, "sampling", "probs", seed=11)
    assert a.as_lists() == b.as_lists()


@pytest.mark.parametrize("layout", ["head-major", "token-major"])
def test_rmsnorm_reference_layouts(layout):
    x, w = torch.randn(2, 3, 8), torch.randn(4, 8)
    out = reference.rmsnorm_heads_reference(x, w, 1e-6, layout)
    for k in range(4):
        head = out[k] if layout == "head-major" else out[:, :, k]
        assert torch.equal(head, rms_norm(x, w[k], 1e-6))


# ------------------------------------------------------------------------------------------ TRT helpers


def test_trt_helpers_fail_clearly_without_tensorrt():
    try:
        import tensorrt  # noqa: F401

        pytest.skip("TensorRT is installed here")
    except ImportError:
        pass
    with pytest.raises(UsageError, match="TensorRT Python package"):
        trt_network.add_rmsnorm_heads(None, None, None, 1e-6)
    with pytest.raises(UsageError, match="TensorRT Python package"):
        trt_network.get_creator(trt_network.TREE_VERIFY)


def test_trt_plugin_fields():
    eps, layout = trt_network.rmsnorm_heads_fields(1e-5, "token-major")
    assert eps[0] == "eps" and eps[1].dtype.name == "float32" and eps[2] == "FLOAT32"
    assert layout[1].tolist() == [1] and layout[2] == "INT32"
    assert [f[1].tolist() for f in trt_network.tree_verify_fields("sampling", "probs")] == [[1], [2]]
    assert trt_network.tree_verify_num_inputs("greedy", "ids") == 3
    assert trt_network.tree_verify_num_inputs("sampling", "logits") == 5
    assert trt_network.tree_verify_num_inputs("sampling", "probs") == 4
    with pytest.raises(UsageError):
        trt_network.tree_verify_fields("sampling", "ids")
    with pytest.raises(UsageError):
        trt_network.rmsnorm_heads_fields(-1.0)
    with pytest.raises(UsageError, match="not found"):
        trt_network.load_plugin_library("/nonexistent/libtrtspec_plugins.so")


# ------------------------------------------------------------------------------------------ CLI


def test_cli_build_error_is_one_line(tmp_path):
    if not HAVE_TOOLCHAIN:
        pytest.skip("nvcc and cmake are needed")
    res = CliRunner().invoke(main, ["plugins", "build", "--arch", "80,x", "--out", str(tmp_path)])
    assert res.exit_code == 2
    assert res.output.count("\n") == 1 and res.output.startswith("error:") and "architecture" in res.output


@needs_toolchain
def test_cli_with_trt_fails_clearly_without_tensorrt(tmp_path):
    if any(
        Path(d, "NvInfer.h").is_file()
        for d in (
            "/usr/include/x86_64-linux-gnu",
            "/usr/local/tensorrt/include",
            "/opt/tensorrt/include",
            "/usr/include",
        )
    ):
        pytest.skip("TensorRT headers are installed here")
    res = CliRunner().invoke(main, ["plugins", "build", "--with-trt", "--arch", "90", "--out", str(tmp_path)])
    assert res.exit_code == 2 and res.output.startswith("error:") and res.output.count("\n") == 1
    assert "TensorRT not found" in res.output and "--trt-include" in res.output
    assert not (tmp_path / build.KERNELS_LIB).exists()


@needs_toolchain
def test_cli_info_reports_the_build(built):
    res = CliRunner().invoke(main, ["plugins", "info", "--dir", str(built.out_dir)])
    assert res.exit_code == 0, res.output
    assert '"up_to_date": true' in res.output and str(built.kernels_lib) in res.output


def test_cli_help():
    for args in (["plugins", "--help"], ["plugins", "build", "--help"], ["plugins", "info", "--help"]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 0 and "Usage" in res.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_bench_script_exits_clearly_without_gpu():
    script = build.plugins_source_dir().parent / "scripts" / "bench_kernels.py"
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no CUDA GPU" in proc.stderr and proc.stdout == ""
