"""One conformance test over the drafter registry: every registered kind goes through the same checks.

For each kind: its demo files are detected as that kind and load; a trainable kind's save -> load gives
back the same tensors; on the tiny demo target greedy speculative output is token-identical to plain
greedy; sampling at temperature 1 keeps the target's distribution (chi-square on a 12-token vocab, with
a power check that a biased sampler fails); its deployment declarations are consistent and each declared
path produces output that validates, or refuses with a clear error.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from trtspec.checkpoint.target import load_hf_causal_lm
from trtspec.demo.tiny import make_tiny_llama
from trtspec.drafters import registry
from trtspec.drafters.base import DrafterKind
from trtspec.errors import UsageError
from trtspec.load import load_spec_model
from trtspec.models.llama import causal_mask
from trtspec.runtime.generate import GenerationConfig, SpeculativeGenerator

KINDS = list(registry.names())
PROMPTS = [[5, 9, 17, 3], [60, 61, 62, 63, 64, 65, 66], [2, 40, 2, 40, 2]]


def test_registry_lists_every_kind_module():
    """Each kind module under trtspec/drafters/ that defines KIND is registered, under its own name."""
    import importlib
    import pkgutil

    import trtspec.drafters as pkg

    found = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        kind = getattr(importlib.import_module(f"trtspec.drafters.{info.name}"), "KIND", None)
        if isinstance(kind, DrafterKind):
            found[kind.name] = kind
    assert found and found == registry.KINDS


def test_unknown_kind_is_a_usage_error():
    with pytest.raises(UsageError, match="choose one of"):
        registry.get("no-such-kind")


@pytest.mark.parametrize("kind", KINDS)
def test_demo_files_are_detected_and_load(kind, demo_paths):
    assert registry.detect(demo_paths[kind]) == kind
    spec = load_spec_model(demo_paths["target"], demo_paths[kind])
    assert spec.drafter.kind == kind
    assert set(registry.get(kind).formats), f"{kind} declares no public format"


@pytest.mark.parametrize("kind", registry.trainable())
def test_save_then_load_round_trips(kind, demo_paths, tmp_path):
    """A trained module written by the kind's recipe loads back as the same tensors under the same names."""
    from trtspec.train.heads import make_module, save_heads

    target = load_hf_causal_lm(demo_paths["target"])
    module = make_module(kind, target, num_heads=2, seed=7)
    with torch.no_grad():  # make every tensor distinct from its init, so a dropped tensor cannot pass
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.1)
    out = save_heads(kind, module, target, tmp_path / kind, {"steps": 1})
    spec = load_spec_model(demo_paths["target"], out)
    assert spec.drafter.kind == kind
    state = {k: v for k, v in module.state_dict().items() if "inv_freq" not in k}
    assert set(spec.drafter.tensors) == set(state)
    for name, value in state.items():
        assert torch.equal(spec.drafter.tensors.load(name), value.to(target.dtype)), name


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tree", ["chain:2", None])
def test_greedy_is_token_identical(kind, tree, demo_paths):
    spec = load_spec_model(demo_paths["target"], demo_paths[kind], tree=tree)
    gen = SpeculativeGenerator(spec)
    plain = gen.generate(PROMPTS, GenerationConfig(max_new_tokens=12, speculative=False))
    spec_run = gen.generate(PROMPTS, GenerationConfig(max_new_tokens=12))
    assert spec_run.tokens == plain.tokens
    m = spec_run.metrics
    if registry.get(kind).model_free:  # verifies only the nodes it matched (the repetitive prompt matches)
        assert 0 < m.draft_tokens <= m.sequence_steps * spec.tree.num_nodes
    else:
        assert m.draft_tokens == m.sequence_steps * spec.tree.num_nodes


@pytest.fixture(scope="module")
def tiny_vocab(tmp_path_factory) -> dict[str, Path]:
    """A 12-token target (so the exact next-token distribution can be enumerated) with every kind's demo heads."""
    root = tmp_path_factory.mktemp("tinyvocab")
    tdir = make_tiny_llama(root / "target", vocab_size=12, num_hidden_layers=4, seed=3)
    target = load_hf_causal_lm(tdir)
    return {"target": tdir, **{n: k.make_demo(target, root / n) for n, k in registry.KINDS.items()}}


def _second_token_counts(gen: SpeculativeGenerator, prompt: list[int], n: int) -> torch.Tensor:
    counts = torch.zeros(12)
    rows = 250
    for seed in range(n // rows):
        res = gen.generate([prompt] * rows, GenerationConfig(max_new_tokens=2, temperature=1.0, seed=seed))
        for toks in res.tokens:
            counts[toks[1]] += 1
    return counts


def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Upper-tail p-value of Pearson's chi-square (Wilson-Hilferty approximation; cells with tiny
    expectation are pooled)."""
    n = counts.sum()
    expected = probs.double() * n
    keep = expected >= 5
    obs = torch.cat([counts.double()[keep], counts.double()[~keep].sum()[None]])
    exp = torch.cat([expected[keep], expected[~keep].sum()[None]])
    obs, exp = obs[exp > 0], exp[exp > 0]
    stat, dof = float(((obs - exp) ** 2 / exp).sum()), len(exp) - 1
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


@pytest.mark.parametrize("kind", KINDS)
def test_sampling_keeps_the_target_distribution(kind, tiny_vocab):
    """The second token's marginal under speculative sampling equals the target's own (exact, by
    enumeration over the first token); the same test rejects a sampler biased towards the drafts."""
    spec = load_spec_model(tiny_vocab["target"], tiny_vocab[kind], tree="[[0],[1],[0,0]]")
    gen = SpeculativeGenerator(spec)
    prompt = [1, 5, 7]
    with torch.no_grad():
        m = gen.target

        def dist(ids):
            c = m.new_cache(1, 8)
            h, _ = m(torch.tensor([ids]), torch.arange(len(ids))[None], c, causal_mask(len(ids)))
            return torch.softmax(m.logits(h[0, -1]).double(), -1)

        p1 = dist(prompt)
        exact = sum(p1[a] * dist(prompt + [a]) for a in range(12))
    counts = _second_token_counts(gen, prompt, 1500)
    assert _chi_square_p(counts, exact) > 1e-3, f"{kind}: counts {counts.tolist()} vs {exact.tolist()}"
    biased = (exact + torch.nn.functional.one_hot(exact.argmax(), 12) * 0.2) / 1.2  # the test has power
    assert _chi_square_p(counts, biased) < 1e-6


@pytest.mark.parametrize("kind", KINDS)
def test_deployment_declarations(kind, demo_paths, tmp_path):
    """Engine route: a supported layout has a checkpoint writer whose trtllm-build mode is the declared one
    and whose config passes convert's validation; an unsupported one refuses with its reason. Triton: the
    emitted decoding_mode is the declared one."""
    from trtspec.convert.modes import ConvertOptions, select_mode
    from trtspec.triton.emit import speculative_values

    record = registry.get(kind)
    spec = load_spec_model(demo_paths["target"], demo_paths[kind], tree="chain:2")
    route = record.engine
    if not route.supported:
        assert route.refusal and len(route.refusal) > 40
        with pytest.raises(UsageError, match="TensorRT"):
            select_mode(spec)
        with pytest.raises(UsageError):
            speculative_values(spec, "trtllm")
        return
    mode = select_mode(spec)
    plans = mode.checkpoints(spec, ConvertOptions())
    assert plans[0].engine_mode == route.mode
    assert all(p.jobs.jobs for p in plans)
    vals = speculative_values(spec, "trtllm")
    assert vals["decoding_mode"] == route.triton_decoding_mode
    assert vals["max_draft_len"] == (spec.tree.depth if route.draft_len == "depth" else spec.tree.num_nodes)


def test_kind_names_live_only_in_their_modules():
    """No string literal outside trtspec/drafters/ is a kind's name (docstrings excepted). TensorRT-LLM's
    own words that happen to equal a kind's name ('medusa', 'eagle': trtllm-build modes and Triton
    decoding modes, declared in the records' EngineRoute) are upstream vocabulary, not kind names; so are,
    inside trtspec/export/ only, the export format names the records declare (vLLM method names)."""
    import ast

    root = Path(__file__).resolve().parent.parent / "trtspec"
    upstream = {w for k in registry.KINDS.values() for w in (k.engine.mode, k.engine.triton_decoding_mode)}
    formats = {f for k in registry.KINDS.values() for f in k.export_formats}
    offenders = []
    for f in root.rglob("*.py"):
        if f.parent.name == "drafters":
            continue
        names = set(registry.names()) - upstream - (formats if f.parent.name == "export" else set())
        tree = ast.parse(f.read_text())
        docstrings = {
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
            and n.body
            and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value in names
                and id(node) not in docstrings
            ):
                offenders.append(f"{f.relative_to(root.parent)}:{node.lineno} {node.value!r}")
    assert not offenders, offenders


@pytest.mark.parametrize("kind", KINDS)
def test_export_formats_are_declared_and_refusals_are_clear(kind, demo_paths, tmp_path):
    """Each declared export format writes a file that validates (ONNX: onnx.checker inside the exporter);
    an undeclared one is one error line naming the formats the kind has."""
    from click.testing import CliRunner

    from trtspec.cli import main

    record = registry.get(kind)
    for fmt in ("onnx",):
        out = tmp_path / f"{kind}.{fmt}"
        r = CliRunner().invoke(
            main,
            [
                "export",
                "-t",
                str(demo_paths["target"]),
                "-H",
                str(demo_paths[kind]),
                "--format",
                fmt,
                "-o",
                str(out),
                "--tree",
                "chain:2",
            ],
        )
        if fmt in record.export_formats:
            assert r.exit_code == 0, r.output
            import onnx

            onnx.checker.check_model(onnx.load(str(out)))
        else:
            assert r.exit_code == 2 and "error:" in r.output and f"formats for {kind}" in r.output
            assert "Traceback" not in r.output and not out.exists()
