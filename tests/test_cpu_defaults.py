"""The auto dtype policy, the one dtype table, the thread count from affinity/quota, and the batched
(continuous-batching) cache generation against plain greedy decoding.

The CPU probe's override (TRTSPEC_CPU_BF16) lets every test take both paths on any machine; the thread
tests restrict the real CPU affinity of a child process, so they check what torch actually uses."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.checkpoint.target import parse_dtype as target_parse_dtype
from trtspec.cli import main
from trtspec.cpu import cgroup_cpu_limit
from trtspec.demo.tiny import make_tiny_llama
from trtspec.demo.tokenizer import write_char_tokenizer
from trtspec.dtypes import DtypeError, cpu_native_bf16, dtype_name, parse_dtype, resolve_dtype
from trtspec.errors import CheckpointError, UsageError
from trtspec.load import load_spec_model
from trtspec.models.llama import build_llama
from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator
from trtspec.train.cache import run_items

REPO = Path(__file__).resolve().parent.parent
VOCAB = 128


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    tdir = make_tiny_llama(tmp_path_factory.mktemp("cpu") / "target", seed=1, vocab_size=VOCAB, num_hidden_layers=2)
    write_char_tokenizer(tdir, VOCAB)
    return tdir


def test_one_dtype_table_parses_aliases_and_refuses_unknown_names():
    assert parse_dtype("bf16") is torch.bfloat16 and parse_dtype("torch.float16") is torch.float16
    assert parse_dtype(torch.float32) is torch.float32 and dtype_name("fp16") == "float16"
    with pytest.raises(DtypeError, match="unknown dtype 'float8'"):
        parse_dtype("float8")
    with pytest.raises(DtypeError, match="auto must be resolved"):
        parse_dtype("auto")
    # the checkpoint loader and the spec loader use the same table and turn a bad name into their one-line errors
    assert target_parse_dtype("bf16", "config.json") is torch.bfloat16
    with pytest.raises(CheckpointError, match="unsupported dtype 'int3'"):
        target_parse_dtype("int3", "config.json")


def test_auto_follows_the_cpu_probe_and_explicit_dtypes_are_obeyed(monkeypatch):
    monkeypatch.setenv("TRTSPEC_CPU_BF16", "0")
    c = resolve_dtype("auto")
    assert c.dtype is torch.float32
    assert c.describe() == "dtype: float32 (auto: this CPU has no native bfloat16: TRTSPEC_CPU_BF16=0)"
    monkeypatch.setenv("TRTSPEC_CPU_BF16", "1")
    assert resolve_dtype("auto").dtype is torch.bfloat16 and resolve_dtype(None).dtype is torch.bfloat16
    assert resolve_dtype("float32").describe() == "dtype: float32 (as requested)"
    monkeypatch.setenv("TRTSPEC_CPU_BF16", "0")
    assert resolve_dtype("bf16").dtype is torch.bfloat16
    monkeypatch.setenv("TRTSPEC_CPU_BF16", "yes")
    with pytest.raises(DtypeError, match="TRTSPEC_CPU_BF16 must be 0 or 1"):
        resolve_dtype("auto")


def test_probe_reads_this_cpus_flags(monkeypatch):
    """Without the override the answer is the CPU's: native exactly when /proc/cpuinfo lists a bfloat16
    matmul flag (x86); a oneDNN ISA cap below bfloat16 turns it off, as it turns off the fast kernels."""
    monkeypatch.delenv("TRTSPEC_CPU_BF16", raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    flags = set(next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []))
    if not flags:
        pytest.skip("not an x86 /proc/cpuinfo")
    native, why = cpu_native_bf16()
    assert native == bool(flags & {"avx512_bf16", "amx_bf16"}), why
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert cpu_native_bf16() == (False, "ONEDNN_MAX_CPU_ISA=AVX2")


def test_spec_loader_resolves_auto_and_refuses_bad_names(tiny, monkeypatch):
    monkeypatch.setenv("TRTSPEC_CPU_BF16", "0")
    assert load_spec_model(tiny, dtype="auto").dtype is torch.float32
    monkeypatch.setenv("TRTSPEC_CPU_BF16", "1")
    assert load_spec_model(tiny, dtype="auto").dtype is torch.bfloat16
    with pytest.raises(UsageError, match="unknown dtype 'fp8'"):
        load_spec_model(tiny, dtype="fp8")


def test_cgroup_quota_is_read(tmp_path):
    f = tmp_path / "cpu.max"
    f.write_text("150000 100000\n")
    assert cgroup_cpu_limit(f) == 1.5
    f.write_text("max 100000\n")
    assert cgroup_cpu_limit(f) is None
    assert cgroup_cpu_limit(tmp_path / "missing") is None


_THREADS_CHILD = """
import os, sys
os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:int(sys.argv[1])]))
import torch
from trtspec.cpu import configure_threads, setup_compute
setup_compute("auto")
print(torch.get_num_threads())
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")
@pytest.mark.parametrize("cores", [1, 2])
def test_threads_follow_the_cpu_affinity_the_process_is_given(cores):
    """torch's own default ignores the affinity mask; after the helper the pool has one thread per core
    the process may run on (and the printed line says so)."""
    if len(os.sched_getaffinity(0)) < cores:
        pytest.skip(f"needs {cores} usable cores")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "TRTSPEC_THREADS", "LOCAL_WORLD_SIZE")}
    env["PYTHONPATH"] = str(REPO)
    env["TRTSPEC_CPU_BF16"] = "0"
    out = subprocess.run(
        [sys.executable, "-c", _THREADS_CHILD, str(cores)], env=env, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert (
        out[0] == f"dtype: float32 (auto: this CPU has no native bfloat16: TRTSPEC_CPU_BF16=0); threads: {cores} "
        f"({cores} in CPU affinity)"
    )
    assert int(out[-1]) == cores


def _items(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, VOCAB) for _ in range(rng.randrange(2, 14))] for _ in range(n)]


def test_batched_cache_generation_gives_the_tokens_of_unbatched_greedy(tiny):
    """The continuous-batching pool (3 rows for 11 prompts of different lengths: rows are refilled as
    replies end and dropped at the tail) produces, for every prompt, the tokens and labels it produces
    alone, and those are the runtime's plain greedy decoding."""
    target = load_hf_causal_lm(tiny)
    model = build_llama(target.arch, target.tensors)
    items = _items(11)
    free = run_items(model, items, "generate", 20, 0, set(), rows=11)
    common = np.bincount(np.concatenate([r.argmax[len(it) + 2 :] for it, r in zip(items, free)]), minlength=VOCAB)
    eos_id = int(common.argmax())  # a token the random target writes often: replies end at different lengths
    eos = {eos_id}
    pooled = run_items(model, items, "generate", 20, 3, eos, rows=3)
    gen = SpeculativeGenerator(load_spec_model(tiny))
    lengths = set()
    for it, rec in zip(items, pooled):
        alone = run_items(model, [it], "generate", 20, 3, eos, rows=1)[0]
        assert rec.tokens.tolist() == alone.tokens.tolist()
        assert rec.argmax.tolist() == alone.argmax.tolist()
        assert rec.topk_ids.tolist() == alone.topk_ids.tolist()
        np.testing.assert_allclose(rec.hidden.astype(np.float32), alone.hidden.astype(np.float32), atol=2e-3)
        P = len(it)
        assert rec.plen == P and rec.tokens[:P].tolist() == it
        ref = gen.generate([it], GenerationConfig(max_new_tokens=20, speculative=False, eos_token_id=eos_id)).tokens[0]
        reply = rec.tokens[P:].tolist() + [int(rec.argmax[-1])]
        assert reply == ref
        lengths.add(len(reply))
    assert len(lengths) > 1, "every reply had the same length: the refill path was not exercised"


def test_generate_prints_the_dtype_it_runs_in(tiny, monkeypatch):
    runner = CliRunner()
    monkeypatch.setenv("TRTSPEC_CPU_BF16", "0")
    res = runner.invoke(main, ["generate", "-t", str(tiny), "-p", "hello", "-n", "4", "--no-chat", "--json"])
    assert res.exit_code == 0, res.output
    assert "dtype: float32 (auto: this CPU has no native bfloat16: TRTSPEC_CPU_BF16=0); threads:" in res.output
    monkeypatch.setenv("TRTSPEC_CPU_BF16", "1")
    res = runner.invoke(main, ["generate", "-t", str(tiny), "-p", "hello", "-n", "4", "--no-chat", "--json"])
    assert res.exit_code == 0, res.output
    assert "dtype: bfloat16 (auto: this CPU has native bfloat16: TRTSPEC_CPU_BF16=1)" in res.output
    res = runner.invoke(
        main, ["generate", "-t", str(tiny), "-p", "hello", "-n", "4", "--no-chat", "--dtype", "float32"]
    )
    assert res.exit_code == 0 and "dtype: float32 (as requested)" in res.output
    res = runner.invoke(main, ["generate", "-t", str(tiny), "-p", "hello", "--dtype", "fp8"])
    assert res.exit_code == 2 and "fp8" in res.output


def test_train_heads_defaults_to_auto_for_cache_and_lm_head(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("TRTSPEC_CPU_BF16", "0")
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": "abcdefghij klmnop " * 2}) + "\n" for _ in range(4)))
    res = CliRunner().invoke(
        main,
        [
            "train-heads",
            "-t",
            str(tiny),
            "-k",
            "mtp-linear",
            "-d",
            str(data),
            "-o",
            str(tmp_path / "heads"),
            "--gen-tokens",
            "6",
            "--steps",
            "2",
            "--no-chat",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "cache dtype: float32 (auto: this CPU has no native bfloat16: TRTSPEC_CPU_BF16=0)" in res.output
    assert "lm_head dtype: float32 (auto: this CPU has no native bfloat16: TRTSPEC_CPU_BF16=0)" in res.output
    meta = json.loads(next((tmp_path / "heads.cache").glob("part-*/meta.json")).read_text())
    assert "dtype" not in meta  # float32 caches keep their old hash/options
