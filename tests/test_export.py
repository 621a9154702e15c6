"""trtspec export: every declared (kind, format) writes files trtspec reads back into the same tensors and
the same drafted tokens, and every key written is one the shared deploy docs (or Hugging Face's config
class) name. That vLLM loads them is tests/interop/test_vllm.py."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from click.testing import CliRunner
from deploy_docs import documented_names, name_patterns, section
from safetensors import safe_open

from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.cli import main
from trtspec.demo.tiny import make_tiny_llama
from trtspec.demo.tokenizer import write_char_tokenizer
from trtspec.drafters import registry
from trtspec.errors import CheckpointError
from trtspec.export import export_draft
from trtspec.export.registry import EXPORTERS
from trtspec.load import load_spec_model
from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator

CHAIN = [[0], [0, 0], [0, 0, 0]]
VOCAB = 128
PAIRS = [(k, f) for k, rec in registry.KINDS.items() for f in rec.export_formats if f != "onnx"]


def _tensors(path):
    files = sorted(path.glob("*.safetensors"))
    assert len(files) == 1, files
    with safe_open(str(files[0]), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _config(path) -> dict:
    return json.loads((path / "config.json").read_text())


@pytest.fixture(scope="module")
def demo8(tmp_path_factory):
    """Demo heads of every exportable kind on an 8-layer tiny target: EAGLE-3's default capture layers
    (2, L//2, L-3) are distinct from 7 layers on (the session demo target has 4)."""
    root = tmp_path_factory.mktemp("demo8")
    tdir = make_tiny_llama(root / "target", seed=0, vocab_size=VOCAB, num_hidden_layers=8)
    write_char_tokenizer(tdir, VOCAB)
    target = load_hf_causal_lm(tdir)
    paths = {"target": tdir}
    for kind in {k for k, _ in PAIRS}:
        paths[kind] = registry.get(kind).make_demo(target, root / kind)
    return paths


@pytest.fixture(scope="module")
def exported(demo8, tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    return {(k, f): export_draft(demo8[k], demo8["target"], f, root / f"{k}-{f}", tree=CHAIN) for k, f in PAIRS}


def _drafted(spec, prompts):
    """The trees the drafter proposed at every step (recorded around the real drafter) and the output."""
    gen = SpeculativeGenerator(spec)
    seen = []
    propose = gen.drafter.propose

    def recording(tree, root):
        out = propose(tree, root)
        seen.append(out.clone())
        return out

    gen.drafter.propose = recording
    res = gen.generate(prompts, GenerationConfig(max_new_tokens=12))
    return seen, res


def test_formats_are_declared_by_kinds():
    assert PAIRS, "no kind declares a checkpoint export format"
    for _, fmt in PAIRS:
        assert fmt in EXPORTERS


@pytest.mark.parametrize("kind,fmt", PAIRS)
def test_round_trip_same_tensors_and_same_drafts(kind, fmt, exported, demo8):
    out = exported[kind, fmt]
    reader = registry.detect(out)  # the kind itself, or the kind that declares it reads this format
    assert reader == kind or fmt in registry.get(reader).formats, (reader, fmt)
    a = load_spec_model(demo8["target"], demo8[kind], tree=CHAIN, draft_vocab=0)
    b = load_spec_model(demo8["target"], out, tree=CHAIN, draft_vocab=0)
    for name in a.drafter.tensors:
        assert torch.equal(a.drafter.tensors.load(name), b.drafter.tensors.load(name)), name
    extra = set(b.drafter.tensors) - set(a.drafter.tensors)
    for name in extra:  # only copies of the target's own tensors may be added (speculators' embed_tokens)
        assert torch.equal(b.drafter.tensors.load(name), a.target.tensors.load("model." + name)), name
    prompts = [[1, 40, 50, 60, 70], [1, 45, 46, 47]]
    seen_a, res_a = _drafted(a, prompts)
    seen_b, res_b = _drafted(b, prompts)
    assert len(seen_a) == len(seen_b) > 3
    assert all(torch.equal(x, y) for x, y in zip(seen_a, seen_b))
    assert res_a.tokens == res_b.tokens
    assert res_a.metrics.accepted_draft_tokens == res_b.metrics.accepted_draft_tokens


def _hf_standard(key: str, value, config_class=transformers.LlamaConfig) -> bool:
    """A config key Hugging Face reads: a field of ``config_class``, or a legacy key it absorbs."""
    if key in config_class().to_dict():
        return True
    try:
        return key not in config_class(**{key: value}).to_dict()
    except Exception:
        return False


def _undocumented(cfg: dict, words: set[str]) -> list[str]:
    bad = []
    for k, v in cfg.items():
        if isinstance(v, dict):
            bad += [f"{k}.{x}" for x in _undocumented(v, words)]
        if k not in words and not _hf_standard(k, v):
            bad.append(k)
    return bad


def test_eagle3_follows_the_exporter_checklist(exported):
    """DEPLOY_FORMATS §7: config keys/values of item 1, tensors of item 2, d2t int64 (item 2), capture
    layers in vLLM indexing (item 4), nothing written that the docs or HF do not name."""
    out = exported["eagle3", "eagle3"]
    cfg, t = _config(out), _tensors(out)
    checklist = section("DEPLOY_FORMATS.md", "7.")
    assert '`model_type: "llama"`' in checklist and cfg["model_type"] == "llama"
    assert '`architectures: ["LlamaForCausalLMEagle3"]`' in checklist
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert "`num_hidden_layers: 1`" in checklist and cfg["num_hidden_layers"] == 1
    assert "`tie_word_embeddings: false`" in checklist and cfg["tie_word_embeddings"] is False
    for key in ("vocab_size", "draft_vocab_size", "hidden_size", "target_hidden_size"):
        assert f"`{key}`" in checklist and key in cfg, key
    assert cfg["norm_before_residual"] is False  # item 3: the only form TensorRT-LLM implements
    assert "`eagle_aux_hidden_state_layer_ids`" in checklist
    assert len(set(cfg["eagle_aux_hidden_state_layer_ids"])) == 3
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == cfg["eagle_aux_hidden_state_layer_ids"]
    for pat in name_patterns(checklist.split("2. Tensors")[1].split("\n3.")[0]):
        assert any(pat.match(n) for n in t), pat.pattern
    assert t["d2t"].dtype == torch.int64 and "int64" in checklist
    assert t["lm_head.weight"].shape[0] == cfg["draft_vocab_size"] == t["d2t"].shape[0]
    assert t["t2d"].dtype == torch.bool and int(t["t2d"].sum()) == cfg["draft_vocab_size"]
    heads3 = section("HEAD_FORMATS.md", "3. EAGLE-3")
    pats = name_patterns(heads3)
    assert [n for n in t if n not in ("d2t", "t2d") and not any(p.match(n) for p in pats)] == []
    words = (
        documented_names(checklist) | documented_names(heads3) | documented_names(section("DEPLOY_FORMATS.md", "3."))
    )
    assert _undocumented(cfg, words) == []


def test_eagle_is_the_layout_vllm_eagle_loads(exported):
    """HEAD_FORMATS §2 names; §5: vLLM's EAGLE-1 fc has no bias, so none is written and bias is false."""
    out = exported["eagle", "eagle"]
    cfg, t = _config(out), _tensors(out)
    eagle12 = section("HEAD_FORMATS.md", "2. EAGLE-1")
    pats = name_patterns(eagle12)
    assert [n for n in t if not any(p.match(n) for p in pats)] == []
    assert "fc.weight" in t and "fc.bias" not in t and not any("input_layernorm" in n for n in t)
    assert "bias=False" in section("HEAD_FORMATS.md", "5.") and cfg["bias"] is False
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_hidden_layers"] == 1
    assert _undocumented(cfg, documented_names(eagle12)) == []


def test_speculators_config_is_what_vllm_validates(exported):
    """DEPLOY_FORMATS §3 (what vLLM requires of a speculators config) and §4 (the schema); the layer
    tensors are the Llama-draft ones under layers.0. (§4: the converter rewrites midlayer.* to layers.0.*)."""
    out = exported["eagle3", "speculators"]
    cfg, t = _config(out), _tensors(out)
    s3, s4 = section("DEPLOY_FORMATS.md", "3."), section("DEPLOY_FORMATS.md", "4.")
    for path in ("speculators_model_type", "speculators_config.proposal_methods[0].speculative_tokens",
                 "speculators_config.verifier.name_or_path", "transformer_layer_config"):  # fmt: skip
        assert f"`{path}`" in s3 or path.split(".")[-1] in documented_names(s3), path
    assert cfg["speculators_model_type"] == "eagle3"
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == len(CHAIN)
    assert cfg["speculators_config"]["default_proposal_method"] == "greedy"
    assert cfg["transformer_layer_config"]["model_type"] == "llama"
    assert "model_type" not in cfg  # §4: to_dict removes model_type
    assert cfg["norm_before_residual"] is False  # §3: vLLM defaults it to true when absent
    words = documented_names(s3) | documented_names(s4)
    assert _undocumented(cfg, words) == []
    pats = name_patterns(section("HEAD_FORMATS.md", "3. EAGLE-3")) + name_patterns(s4)
    renamed = [n.replace("layers.0.", "midlayer.") for n in t if n not in ("d2t", "t2d")]
    assert [n for n in renamed if not any(p.match(n) for p in pats)] == []
    assert t["d2t"].dtype == torch.int64 and t["t2d"].dtype == torch.bool  # §4: d2t int64, t2d bool


def test_medusa_keeps_fasterdecoding_names(exported):
    """HEAD_FORMATS §1 names and config fields (vLLM's own config keys are checked against its source in
    tests/interop)."""
    out = exported["medusa", "medusa"]
    cfg, t = _config(out), _tensors(out)
    s1 = section("HEAD_FORMATS.md", "1. Medusa")
    pats = name_patterns(s1)
    assert [n for n in t if not any(p.match(n) for p in pats)] == []
    for key in ("medusa_num_heads", "medusa_num_layers", "base_model_name_or_path"):
        assert f"`{key}`" in s1 and key in cfg
    assert (out / "medusa_lm_head.safetensors").is_file()


def test_dflash_is_the_zlab_layout(exported):
    """DEPLOY_FORMATS §5 (z-lab DFlash): config keys and values, tensor names, no embed_tokens or lm_head
    (the target's are shared); layer_types all full_attention, which vLLM's qwen3_dflash reads as a
    non-causal block. Every other key is a Qwen3 config field or trtspec's own provenance."""
    out = exported["dflash", "dflash"]
    cfg, t = _config(out), _tensors(out)
    s5 = section("DEPLOY_FORMATS.md", "5.")
    zlab = s5.split("**DSpark**")[0]
    assert '`architectures ["DFlashDraftModel"]`' in zlab and cfg["architectures"] == ["DFlashDraftModel"]
    assert '`model_type "qwen3"`' in zlab and cfg["model_type"] == "qwen3"
    for key in ("block_size", "num_target_layers"):
        assert f"`{key}`" in zlab and isinstance(cfg[key], int), key
    assert "`dflash_config {mask_token_id, target_layer_ids}`" in zlab
    assert set(cfg["dflash_config"]) == {"mask_token_id", "target_layer_ids"}
    assert all(-1 <= i < cfg["num_target_layers"] for i in cfg["dflash_config"]["target_layer_ids"])
    assert set(cfg["layer_types"]) == {"full_attention"} and len(cfg["layer_types"]) == cfg["num_hidden_layers"]
    pats = name_patterns(zlab.split("**Tensors**")[1].split("**Serving.**")[0])
    assert [n for n in t if not any(p.match(n) for p in pats)] == []
    assert not any(n.startswith(("embed_tokens", "lm_head")) for n in t)
    assert t["fc.weight"].shape[1] == t["fc.weight"].shape[0] * len(cfg["dflash_config"]["target_layer_ids"])
    odd = [
        k
        for k, v in cfg.items()
        if not _hf_standard(k, v, transformers.Qwen3Config)
        and k not in documented_names(zlab)
        and not k.startswith("trtspec_")
    ]
    assert odd == []


def test_deepseek_mtp_is_the_documented_layout(exported, demo8, tmp_path):
    """HEAD_FORMATS §4: mtp-single heads written into a copy of the target as DeepSeek-V3's MTP layer
    (num_nextn_predict_layers 1, model.layers.{L}.{enorm, hnorm, eh_proj, shared_head.*}, the shared head a
    copy of the main one); the directory is a target that drafts with its own module when no --heads
    is given, token for token as the heads it came from."""
    out = exported["mtp-single", "deepseek-v3-mtp"]
    cfg, t = _config(out), _tensors(out)
    s4 = section("HEAD_FORMATS.md", "4.")
    assert "`num_nextn_predict_layers = 1`" in s4 and cfg["num_nextn_predict_layers"] == 1
    L, H = cfg["num_hidden_layers"], cfg["hidden_size"]
    documented = s4.split("Keys under")[1].split("The layer also")[0]
    for key in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight", "shared_head.head.weight"):
        assert f"`{key}`" in documented and f"model.layers.{L}.{key}" in t, key
    assert t[f"model.layers.{L}.eh_proj.weight"].shape == (H, 2 * H)
    head = t.get("lm_head.weight", t["model.embed_tokens.weight"])
    assert torch.equal(t[f"model.layers.{L}.shared_head.head.weight"], head)
    main_tensors = _tensors(demo8["target"])
    assert all(torch.equal(t[n], v) for n, v in main_tensors.items())  # the target itself is untouched
    assert not any(n.startswith(f"model.layers.{L + 1}.") for n in t)
    own = load_spec_model(out, None, tree=CHAIN, draft_vocab=0)  # no --heads: the target's own module
    heads = load_spec_model(demo8["target"], demo8["mtp-single"], tree=CHAIN, draft_vocab=0)
    assert own.drafter.kind == registry.detect(out)
    prompts = [[1, 40, 50, 60, 70], [1, 45, 46, 47]]
    seen_own, res_own = _drafted(own, prompts)
    seen_heads, res_heads = _drafted(heads, prompts)
    assert all(torch.equal(x, y) for x, y in zip(seen_own, seen_heads)) and res_own.tokens == res_heads.tokens


def test_deepseek_mtp_refuses_heads_without_their_norms(demo8, tmp_path):
    """The layout has enorm/hnorm/shared_head.norm: mtp-single heads trained with --no-rmsnorm are one
    error line naming the switch, and nothing is written."""
    from trtspec.drafters.mtp_single import new_module, save
    from trtspec.errors import UsageError

    target = load_hf_causal_lm(demo8["target"])
    bare = save(new_module(target, rmsnorm=False), target, tmp_path / "bare", rmsnorm=False)
    with pytest.raises(UsageError, match="--no-rmsnorm"):
        export_draft(bare, demo8["target"], "deepseek-v3-mtp", tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def test_refusals_are_one_clear_line_and_leave_nothing(demo_paths, tmp_path):
    """An undeclared format names the kind's formats; EAGLE heads with a bias are refused for vLLM;
    EAGLE-3 heads whose capture layers repeat (a 4-layer target) are refused for every peer."""
    r = CliRunner().invoke(
        main,
        ["export", "-t", str(demo_paths["target"]), "-H", str(demo_paths["eagle"]), "--format", "medusa",
         "-o", str(tmp_path / "x")],
    )  # fmt: skip
    assert r.exit_code == 2 and "error:" in r.output and "formats for eagle: eagle" in r.output
    assert not (tmp_path / "x").exists() and "Traceback" not in r.output
    from trtspec.drafters.eagle import save
    from trtspec.models.heads import EagleHead, layer_arch

    target = load_hf_causal_lm(demo_paths["target"])
    head = EagleHead(layer_arch(target.arch), fc_bias=True)
    with torch.no_grad():
        head.fc.bias.fill_(0.5)
    biased = save(head, target, tmp_path / "biased", dtype=torch.float32)
    with pytest.raises(CheckpointError, match="fc.bias"):
        export_draft(biased, demo_paths["target"], "eagle", tmp_path / "y")
    repeats = tmp_path / "repeats"  # capture layers that name one layer twice
    shutil.copytree(demo_paths["eagle3"], repeats)
    cfg = json.loads((repeats / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [2, 2, 1]
    (repeats / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="repeat"):
        export_draft(repeats, demo_paths["target"], "eagle3", tmp_path / "z")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["biased", "repeats"]


def test_cli_writes_and_refuses_to_overwrite(demo8, tmp_path):
    args = ["export", "-t", str(demo8["target"]), "-H", str(demo8["eagle3"]), "--format", "eagle3",
            "-o", str(tmp_path / "e3"), "--dtype", "float16"]  # fmt: skip
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert _tensors(tmp_path / "e3")["fc.weight"].dtype == torch.float16
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 2 and "--overwrite" in again.output
    assert CliRunner().invoke(main, [*args, "--overwrite"]).exit_code == 0


def test_medusa_heads_sharing_the_target_lm_head_export_with_copies(demo8, tmp_path):
    """Medusa "version 2" heads (no lm_head of their own, what train-heads writes): each exported head
    carries a copy of the target's lm_head (vLLM's per-head layout), and the drafts stay the same."""
    from trtspec.drafters.medusa import new_module, save
    from trtspec.drafters.weights import demo_init

    target = load_hf_causal_lm(demo8["target"])
    v2 = save(demo_init(new_module(target, 2), 5, scale=0.2), target, tmp_path / "v2", dtype=torch.float32)
    assert _config(v2)["version"] == "2"
    out = export_draft(v2, demo8["target"], "medusa", tmp_path / "exp", tree=[[0], [0, 0]])
    lm = target.tensors.load(target.lm_head_name)
    t = _tensors(out)
    assert torch.equal(t["0.1.weight"], lm) and torch.equal(t["1.1.weight"], lm)
    a = load_spec_model(demo8["target"], v2, tree=[[0], [0, 0]], draft_vocab=0)
    b = load_spec_model(demo8["target"], out, tree=[[0], [0, 0]], draft_vocab=0)
    seen_a, res_a = _drafted(a, [[1, 40, 50, 60, 70]])
    seen_b, res_b = _drafted(b, [[1, 40, 50, 60, 70]])
    assert all(torch.equal(x, y) for x, y in zip(seen_a, seen_b)) and res_a.tokens == res_b.tokens


def test_trtllm_capture_layers_are_vllm_ids_minus_one():
    """DEPLOY_FORMATS §0: vLLM captures the input of layer a, TensorRT-LLM the output of layer i; the
    defaults (2, L//2, L-3) and {1, L//2-1, L-4} are the same layers."""
    from trtspec.export.eagle3 import trtllm_layers_to_capture

    s0 = section("DEPLOY_FORMATS.md", "0.")
    assert "`(2, L//2, L-3)`" in s0 and "`{1, L//2-1, L-4}`" in s0
    assert "`eagle3_layers_to_capture = {a - 1 for a in eagle_aux_hidden_state_layer_ids}`" in s0
    for L in (8, 30, 32):
        assert trtllm_layers_to_capture([2, L // 2, L - 3]) == sorted({1, L // 2 - 1, L - 4})
