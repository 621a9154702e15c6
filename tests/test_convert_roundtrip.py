"""Round trip: converted rank files, read back and un-sharded, equal the source tensors exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from convert_fixtures import KINDS, eagle3_spec, make_spec
from safetensors import safe_open

from trtspec.convert.core import convert, plan_conversion
from trtspec.convert.modes import ConvertOptions
from trtspec.convert.names import RMSNORM_HEADS_NAME
from trtspec.errors import UsageError


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("convert")


def read_ranks(directory: Path, world: int) -> list[dict[str, torch.Tensor]]:
    out = []
    for r in range(world):
        with safe_open(str(directory / f"rank{r}.safetensors"), framework="pt") as f:
            out.append({k: f.get_tensor(k) for k in f.keys()})
    return out


def assert_round_trip(spec, opts: ConvertOptions, out: Path) -> int:
    """Un-shard every job of every checkpoint and compare with its sources; returns tensors checked."""
    _, plans = plan_conversion(spec, opts)
    checked = 0
    for plan in plans:
        d = out / plan.subdir if plan.subdir else out
        ranks = read_ranks(d, plan.world_size)
        expected_keys: list[set[str]] = [set() for _ in ranks]
        for job in plan.jobs.jobs:
            srcs = [s.load().to(job.dtype) for s in job.sources]
            shapes = [tuple(s.shape) for s in job.sources]
            stages: dict[int, list[int]] = {}
            for r in sorted(job.targets):
                stages.setdefault(r // job.tp_size, []).append(r)
            for stage_ranks in stages.values():
                assert len(stage_ranks) == job.tp_size
                for i, name in enumerate(job.targets[stage_ranks[0]]):
                    parts = [ranks[r][name] for r in stage_ranks]
                    merged = job.rule.merge(parts, shapes)
                    for m, s in zip(merged, srcs):
                        assert m.dtype == s.dtype and torch.equal(m, s), (name, job.rule)
                    for r in stage_ranks:
                        expected_keys[r].add(name)
                    checked += 1
        for r, tensors in enumerate(ranks):
            assert set(tensors) == expected_keys[r], f"rank {r}: unplanned or missing tensors"
    return checked


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_every_kind_and_tp(root, kind, tp):
    spec = make_spec(root / kind, kind)
    opts = ConvertOptions(tp_size=tp, draft_tp_size=min(tp, 2))  # the tiny draft model has 2 heads
    out = root / f"{kind}-tp{tp}"
    result = convert(spec, out, opts)
    assert assert_round_trip(spec, opts, out) > 0
    assert result.written_bytes == sum((out / f.path).stat().st_size for f in result.files)
    world = {f.checkpoint for f in result.files}
    assert world == ({"target", "draft"} if kind == "draft-model" else {"target"})


@pytest.mark.parametrize("kind", ["none", "draft-model"])
def test_round_trip_pipeline_parallel(root, kind):
    spec = make_spec(root / kind, kind)
    opts = ConvertOptions(tp_size=2, pp_size=2)
    out = root / f"{kind}-tp2-pp2"
    convert(spec, out, opts)
    assert_round_trip(spec, opts, out)
    tgt = out / "target" if kind == "draft-model" else out
    ranks = read_ranks(tgt, 4)
    # rank = pp_rank * tp + tp_rank; stage 0 has layers 0,1 and the embedding, stage 1 layers 2,3 + heads
    for r in (0, 1):
        assert "transformer.vocab_embedding.weight" in ranks[r] and "lm_head.weight" not in ranks[r]
        assert not any(k.startswith("medusa") for k in ranks[r])
    for r in (2, 3):
        assert "lm_head.weight" in ranks[r] and "transformer.ln_f.weight" in ranks[r]
        assert "transformer.vocab_embedding.weight" not in ranks[r]
    layers = {int(k.split(".")[2]) for k in ranks[2] if k.startswith("transformer.layers.")}
    assert layers == {0, 1}  # local numbering per stage
    src = spec.target.tensors.load("model.layers.2.input_layernorm.weight")
    assert torch.equal(ranks[2]["transformer.layers.0.input_layernorm.weight"], src)


def test_layout_matches_tensorrt_llm(root):
    """Independent of merge(): the per-rank layout TensorRT-LLM's loader expects, checked by hand."""
    spec = make_spec(root / "medusa", "medusa")
    out = root / "layout-tp4"
    convert(spec, out, ConvertOptions(tp_size=4))
    ranks = read_ranks(out, 4)
    T = spec.target.tensors
    q, k, v = (T.load(f"model.layers.1.self_attn.{p}_proj.weight") for p in "qkv")
    d = 16  # head_dim; 4 q heads, 2 kv heads -> each rank: 1 q head and a replicated kv head
    for r in range(4):
        kv = r // 2  # dup_kv_weight: kv head h serves ranks 2h and 2h+1
        want = torch.cat([q[r * d : (r + 1) * d], k[kv * d : (kv + 1) * d], v[kv * d : (kv + 1) * d]])
        assert torch.equal(ranks[r]["transformer.layers.1.attention.qkv.weight"], want)
        I4 = 96 // 4
        assert torch.equal(
            ranks[r]["transformer.layers.1.mlp.fc.weight"],
            T.load("model.layers.1.mlp.gate_proj.weight")[r * I4 : (r + 1) * I4],
        )
        assert torch.equal(
            ranks[r]["transformer.layers.1.mlp.gate.weight"],
            T.load("model.layers.1.mlp.up_proj.weight")[r * I4 : (r + 1) * I4],
        )
        assert torch.equal(
            ranks[r]["transformer.layers.1.mlp.proj.weight"],
            T.load("model.layers.1.mlp.down_proj.weight")[:, r * I4 : (r + 1) * I4],
        )
        assert torch.equal(
            ranks[r]["transformer.layers.1.attention.dense.weight"],
            T.load("model.layers.1.self_attn.o_proj.weight")[:, r * d : (r + 1) * d],
        )
    # vocab 101 -> padded to 104, 26 rows per rank; the 3 padding rows (last rank) are zero
    lm = torch.cat([ranks[r]["lm_head.weight"] for r in range(4)])
    assert lm.shape == (104, 64) and torch.equal(lm[:101], T.load("lm_head.weight")) and not lm[101:].any()
    emb = torch.cat([ranks[r]["transformer.vocab_embedding.weight"] for r in range(4)])
    assert emb.shape == (104, 64) and torch.equal(emb[:101], T.load("model.embed_tokens.weight"))
    # heads without their own lm_head share the target's (TensorRT-LLM Medusa heads each have one)
    assert torch.equal(ranks[1]["medusa_heads.2.lm_head.weight"], ranks[1]["lm_head.weight"])


def test_embedding_sharding_dim_1_and_replicated(root):
    spec = make_spec(root / "none", "none")
    out1 = root / "emb-dim1"
    convert(spec, out1, ConvertOptions(tp_size=2, embedding_sharding_dim=1))
    r = read_ranks(out1, 2)
    assert r[0]["transformer.vocab_embedding.weight"].shape == (101, 32)
    out2 = root / "emb-repl"
    convert(spec, out2, ConvertOptions(tp_size=2, use_parallel_embedding=False))
    r = read_ranks(out2, 2)
    assert torch.equal(
        r[1]["transformer.vocab_embedding.weight"], spec.target.tensors.load("model.embed_tokens.weight")
    )


def test_mtp_linear_norms_are_stacked_for_the_plugin(root):
    spec = make_spec(root / "mtp-linear", "mtp-linear")
    out = root / "mtp-norms"
    convert(spec, out, ConvertOptions(tp_size=2))
    r = read_ranks(out, 2)
    stacked = r[1][RMSNORM_HEADS_NAME]
    assert stacked.shape == (3, 64)
    for k in range(3):
        assert torch.equal(stacked[k], spec.drafter.tensors.load(f"heads.{k}.norm.weight"))


def test_dtype_cast(root):
    spec = make_spec(root / "eagle", "eagle")
    opts = ConvertOptions(tp_size=2, dtype=torch.float16)
    out = root / "eagle-fp16"
    convert(spec, out, opts)
    assert assert_round_trip(spec, opts, out) > 0
    r = read_ranks(out, 2)
    assert r[0]["eagle_nets.0.drafter.fc.bias"].dtype == torch.float16
    assert not r[0]["eagle_nets.0.drafter.fc.bias"].any()  # EAGLE head without fc bias -> zeros


def test_eagle3_is_refused_with_alternatives(root):
    with pytest.raises(UsageError, match="PyTorch backend"):
        convert(eagle3_spec(root / "e3"), root / "e3-out")
    assert not (root / "e3-out").exists()


@pytest.mark.parametrize("kind", ["medusa", "mtp-linear", "eagle", "mtp-single"])
def test_head_kinds_refuse_pipeline_parallelism(root, kind):
    """TensorRT-LLM 1.2 creates Medusa heads / EAGLE nets on every pipeline stage but their weights live on
    the last one only: a pp > 1 checkpoint of a head kind would never load, so it is refused up front."""
    spec = make_spec(root / kind, kind)
    with pytest.raises(UsageError, match="pipeline parallelism is not available") as err:
        convert(spec, root / f"{kind}-pp2", ConvertOptions(tp_size=1, pp_size=2))
    assert "--pp-size 1" in str(err.value)
    assert not (root / f"{kind}-pp2").exists()


def test_bad_parallel_options_fail_before_writing(root):
    spec = make_spec(root / "eagle", "eagle")
    with pytest.raises(UsageError, match="pipeline parallelism"):
        convert(spec, root / "bad1", ConvertOptions(pp_size=2))
    with pytest.raises(UsageError, match="not divisible"):
        convert(spec, root / "bad2", ConvertOptions(tp_size=3))
    assert not (root / "bad1").exists() and not (root / "bad2").exists()


def test_draft_vocabulary_is_recorded_not_exported(root, caplog):
    """Engines draft over the full vocabulary: the rank files are the same with or without it."""
    import json
    from dataclasses import replace

    from trtspec.convert.core import META_FILE

    spec = make_spec(root / "mtp-single-dv", "mtp-single")
    plain_out, dv_out = root / "dv-plain", root / "dv-subset"
    convert(spec, plain_out, ConvertOptions(tp_size=1))
    with_dv = replace(spec, drafter=replace(spec.drafter, draft_vocab=torch.arange(7)))
    with caplog.at_level("WARNING", logger="trtspec"):
        convert(with_dv, dv_out, ConvertOptions(tp_size=1))
    assert "7-token draft vocabulary is used by the reference runtime only" in caplog.text
    a, b = read_ranks(plain_out, 1)[0], read_ranks(dv_out, 1)[0]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((dv_out / META_FILE).read_text())["source"]["draft_vocab_not_exported"] == 7
    assert json.loads((plain_out / META_FILE).read_text())["source"]["draft_vocab_not_exported"] is None
