"""vLLM (CPU build, ``.venv-vllm``) loads what ``trtspec export`` writes and speculates with it exactly as
trtspec's reference runtime does.

A tiny Llama (real HF files, a character tokenizer vLLM loads) gets EAGLE heads and a DFlash block
drafter trained by trtspec's trainer and random EAGLE-3 / Medusa demo heads; each is exported and run by ``vllm.LLM`` in its own
process (scripts/vllm_run.py). Checked: greedy output identical to vLLM without speculation and to
trtspec's, and vLLM's spec-decode counters (drafts, accepted tokens, per position) within 10% relative of
the reference runtime's on the same prompts and draft length. ``scripts/setup_vllm.sh`` builds the venv;
``scripts/test_interop.sh`` builds it and runs this file.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VLLM_PY = Path(os.environ.get("TRTSPEC_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))
RUNNER = REPO / "scripts" / "vllm_run.py"

pytestmark = [
    pytest.mark.interop,
    pytest.mark.slow,
    pytest.mark.skipif(not VLLM_PY.is_file(), reason=f"no vLLM venv at {VLLM_PY}: run scripts/setup_vllm.sh"),
]

K = 3  # num_speculative_tokens: a chain of K drafts per step on both sides
CHAIN = [[0] * d for d in range(1, K + 1)]
VOCAB = 128
NEW_TOKENS = 32
#: widths vLLM's CPU attention takes (head_dim 64); 8 layers so EAGLE-3's default capture layers differ
TARGET = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_attention_heads=4,
              num_key_value_heads=2, num_hidden_layers=8)  # fmt: skip


def run_vllm(tmp: Path, name: str, model: Path, spec: dict | None, prompts: list[list[int]]) -> dict:
    req, res = tmp / f"{name}.request.json", tmp / f"{name}.result.json"
    req.write_text(json.dumps({"model": str(model), "speculative_config": spec, "prompts": prompts,
                               "max_tokens": NEW_TOKENS}))  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PYTHONPATH", None)  # vLLM's own venv: nothing of trtspec's
    p = subprocess.run([str(VLLM_PY), str(RUNNER), str(req), str(res)], capture_output=True, text=True, env=env,
                       timeout=900, cwd=tmp)  # fmt: skip
    if p.returncode != 0:
        errors = [ln for ln in p.stderr.splitlines() if "Error" in ln or "error" in ln]
        raise AssertionError(f"vLLM {name} failed (rc {p.returncode}): " + "\n".join(errors[-8:] or p.stderr[-3000:]))
    return json.loads(res.read_text())


def reference(target: Path, heads: Path | None, prompts: list[list[int]]) -> dict:
    """trtspec's oracle on the same prompts: tokens and the same counters vLLM reports."""
    from trtspec.load import load_spec_model
    from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator

    spec = load_spec_model(target, heads, tree=CHAIN if heads else None, draft_vocab=0)
    out = SpeculativeGenerator(spec).generate(prompts, GenerationConfig(max_new_tokens=NEW_TOKENS))
    m = out.metrics
    per_pos = [sum(m.acceptance_histogram[d:]) for d in range(1, K + 1)] if heads else []
    return {"tokens": out.tokens, "drafts": m.sequence_steps, "draft_tokens": m.draft_tokens,
            "accepted": m.accepted_draft_tokens, "per_pos": per_pos}  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Target, prompts, trained EAGLE heads and DFlash drafter, demo EAGLE-3 / Medusa heads, all exported."""
    from trtspec.checkpoint.target import load_hf_causal_lm
    from trtspec.demo.tiny import make_tiny_llama
    from trtspec.demo.tokenizer import write_char_tokenizer
    from trtspec.drafters import registry
    from trtspec.export import export_draft
    from trtspec.train.cache import HiddenCache, build_cache
    from trtspec.train.heads import save_heads
    from trtspec.train.trainer import TrainConfig, train

    root = tmp_path_factory.mktemp("vllm")
    tdir = make_tiny_llama(root / "target", seed=0, **TARGET)
    write_char_tokenizer(tdir, VOCAB)
    target = load_hf_causal_lm(tdir)
    rng = random.Random(0)
    items = [[1] + [rng.randrange(3, VOCAB) for _ in range(rng.randrange(4, 12))] for _ in range(48)]
    build_cache(target, items, root / "cache", gen_tokens=NEW_TOKENS + 8, batch_size=16, progress=False)
    cfg = TrainConfig(kind="eagle", steps=300, batch_tokens=512, lr=3e-3, lm_dtype="float32", warmup=10,
                      ckpt_every=0)  # fmt: skip
    module, _ = train(target, HiddenCache(root / "cache"), cfg, progress=False)
    heads = {"eagle": save_heads("eagle", module, target, root / "heads-eagle", {})}
    cfg = TrainConfig(kind="dflash", num_heads=K, steps=300, batch_tokens=512, lr=3e-3, lm_dtype="float32", warmup=10,
                      ckpt_every=0)  # fmt: skip
    module, _ = train(target, HiddenCache(root / "cache"), cfg, progress=False)  # a block of K + 1: K drafts
    heads["dflash"] = save_heads("dflash", module, target, root / "heads-dflash", {})
    for kind in ("eagle3", "medusa"):
        heads[kind] = registry.get(kind).make_demo(target, root / f"heads-{kind}")
    exports = {
        fmt: export_draft(heads[kind], tdir, fmt, root / f"export-{fmt}", tree=CHAIN)
        for kind, fmt in (
            ("eagle", "eagle"),
            ("eagle3", "eagle3"),
            ("eagle3", "speculators"),
            ("medusa", "medusa"),
            ("dflash", "dflash"),
        )  # fmt: skip
    }
    prompts = items[:8]  # prompts the heads were trained on: acceptance well above zero
    plain = run_vllm(root, "plain", tdir, None, prompts)
    return {"root": root, "target": tdir, "heads": heads, "exports": exports, "prompts": prompts, "plain": plain}


def test_vllm_plain_greedy_is_trtspec_greedy(world):
    ref = reference(world["target"], None, world["prompts"])
    assert world["plain"]["tokens"] == ref["tokens"]


def _close(a: float, b: float, rel: float = 0.10) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b)) + 1e-9


@pytest.mark.parametrize(
    "fmt,method,kind",
    [("eagle", "eagle", "eagle"), ("eagle3", "eagle3", "eagle3"), ("speculators", None, "eagle3"),
     ("medusa", "medusa", "medusa"), ("dflash", "dflash", "dflash")],
)  # fmt: skip
def test_export_speculates_in_vllm_like_the_reference(world, fmt, method, kind):
    export = world["exports"][fmt]
    if method is None:  # speculators: vLLM reads method, draft length and the verifier from the config
        model, spec = export, None
    else:
        model, spec = world["target"], {"method": method, "model": str(export), "num_speculative_tokens": K}
    got = run_vllm(world["root"], fmt, model, spec, world["prompts"])
    ref = reference(world["target"], world["heads"][kind], world["prompts"])
    assert got["tokens"] == world["plain"]["tokens"] == ref["tokens"]
    s = got["spec"]
    drafts, accepted = s["vllm:spec_decode_num_drafts"], s["vllm:spec_decode_num_accepted_tokens"]
    assert s["vllm:spec_decode_num_draft_tokens"] == K * drafts
    report = (f"{fmt}: vLLM {accepted}/{drafts} accepted per draft {accepted / drafts:.3f} per-pos "
              f"{s['vllm:spec_decode_num_accepted_tokens_per_pos']}; trtspec {ref['accepted']}/{ref['drafts']} "
              f"{ref['accepted'] / ref['drafts']:.3f} per-pos {ref['per_pos']}; vLLM init {got['init_s']:.1f} s")  # fmt: skip
    print(report)
    assert _close(accepted / drafts, ref["accepted"] / ref["drafts"]), report
    assert _close(drafts, ref["drafts"]), report
    if kind in ("eagle", "dflash"):
        assert ref["accepted"] / ref["drafts"] > 0.5, report  # trained heads: the comparison means something


def test_vllm_reads_the_keys_the_docs_do_not_name():
    """medusa_fc_bias / MedusaModel (medusa) and the speculators norm_before_residual default are facts of
    vLLM's source the shared docs lack: read them from the installed vLLM, not from our own list."""
    src = subprocess.run([str(VLLM_PY), "-c", "import vllm, os; print(os.path.dirname(vllm.__file__))"],
                         capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    root = Path(src)
    medusa = (root / "model_executor/models/medusa.py").read_text()
    medusa_cfg = (root / "transformers_utils/configs/medusa.py").read_text()
    assert '"medusa_fc_bias"' in medusa and '"MedusaModel"' in medusa_cfg
    algos = (root / "transformers_utils/configs/speculators/algos.py").read_text()
    assert '"norm_before_residual", True' in algos.split('register_speculator("peagle")')[0]
    eagle = (root / "model_executor/models/llama_eagle.py").read_text()
    assert "bias=False" in eagle.split("self.fc = ")[1].split(")")[0]
