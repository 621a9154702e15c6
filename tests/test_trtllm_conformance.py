"""What we hand to TensorRT-LLM 1.2.1 checked against what 1.2.1 really has (recorded in the shared facts).

(b) every ``trtllm-build`` flag (and enumerated value) that plan.json / build_engines.sh use, for every kind
    and tp/pp setting, exists in 1.2.1's ``trtllm-build``;
(c) every subclass and constructor call in trtspec's TensorRT-LLM model file (parsed with ``ast``: it
    imports tensorrt_llm, which cannot be installed here) binds to the recorded 1.2.1 signatures.
The Triton side (a) is in tests/test_triton_conformance.py.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from convert_fixtures import make_spec
from trtllm_facts import facts

from trtspec.cli import main
from trtspec.engine import trtllm
from trtspec.engine.plan import TRTLLM_BUILD_FLAGS, parse_script_commands

REPO = Path(__file__).resolve().parents[1]
MODELS_FILE = REPO / "trtspec" / "engine" / "trtllm_models.py"
HEADS_DIR = {
    "medusa": "medusa",
    "mtp-linear": "mtp-linear",
    "eagle": "eagle",
    "mtp-single": "mtp-single",
    "draft-model": "draft",
}
#: (kind, tp, pp): every kind at tp 1/2; pp 2 only where the kind allows it (the others are refused, tested
#: in test_convert_roundtrip.py)
SETTINGS = [(k, tp, 1) for k in HEADS_DIR for tp in (1, 2)] + [("draft-model", 2, 2), ("none", 1, 2)]

needs_no_trtllm = pytest.mark.skipif(trtllm.available()[0], reason="TensorRT-LLM + GPU present: the real build runs")


def build_facts() -> dict[str, dict]:
    """flag (and alias) -> its recorded entry."""
    out = {}
    for f in facts()["trtllm_build_flags"]["flags"]:
        out[f["flag"]] = f
        for alias in f.get("aliases", []):
            out[alias] = f
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("conf-build")
    outs = {}
    for kind, tp, pp in SETTINGS:
        base = root / kind
        if not (base / "target").exists():
            make_spec(base, kind)
        out = root / f"out-{kind}-tp{tp}-pp{pp}"
        args = [
            "build",
            "--target",
            str(base / "target"),
            "--out",
            str(out),
            "--tp-size",
            str(tp),
            "--pp-size",
            str(pp),
            "--config",
            "demo",
            "--allow-no-gpu",
            "--no-progress",
        ]
        if kind != "none":
            args += ["--heads", str(base / HEADS_DIR[kind]), "--tree", "chain:3"]
        r = CliRunner().invoke(main, args, catch_exceptions=False)
        assert r.exit_code == 0, (kind, tp, pp, r.output)
        outs[(kind, tp, pp)] = out
    return outs


def test_our_flag_list_is_a_subset_of_trtllm_build_1_2_1():
    known = build_facts()
    assert TRTLLM_BUILD_FLAGS <= set(known), sorted(TRTLLM_BUILD_FLAGS - set(known))
    assert not TRTLLM_BUILD_FLAGS & set(facts()["trtllm_build_flags"]["not_flags"])


@needs_no_trtllm
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: f"{s[0]}-tp{s[1]}-pp{s[2]}")
def test_every_flag_in_plan_and_script_exists_in_trtllm_build(built, setting):
    out = built[setting]
    known = build_facts()
    not_flags = set(facts()["trtllm_build_flags"]["not_flags"])
    plan = json.loads((out / "plan.json").read_text())
    from_plan = [argv[1:] for argv in plan["commands"].values()]
    from_script = parse_script_commands((out / "build_engines.sh").read_text())
    assert from_script and len(from_plan) == len(from_script)
    for argv in from_plan + from_script:
        for i, a in enumerate(argv):
            if not a.startswith("--"):
                continue
            assert a in known and a not in not_flags, f"{a} is not a trtllm-build 1.2.1 flag"
            entry = known[a]
            if entry.get("action") == "store_true":
                assert i + 1 == len(argv) or argv[i + 1].startswith("--"), f"{a} takes no value"
                continue
            value = argv[i + 1]
            choices = entry.get("choices")
            if isinstance(choices, list):
                assert value in choices, f"{a} {value}: 1.2.1 accepts {choices}"
            if entry.get("type") == "int":
                assert re.fullmatch(r"-?\d+", value), f"{a} needs an int, got {value}"
        # ranks of a --model_cls_file class are built in one process (spawned workers cannot import it)
        if "--model_cls_file" in argv:
            assert argv[argv.index("--workers") + 1] == "1"


# (c) -------------------------------------------------------------------------------------------------
#: Signatures the facts file does not record, read from the TensorRT-LLM 1.2 sources (cited in the
#: project's notes): tensorrt_llm/layers/linear.py Linear.__init__ (ColumnLinear = Linear),
#: tensorrt_llm/module.py Module / ModuleList.__init__, tensorrt_llm/parameter.py Parameter.__init__ (the
#: parameters every 1.x version has; later ones add prefer_managed).
SUPPLEMENT = {
    "ModuleList": "(self, modules)",
    "Parameter": "(self, value=None, shape=None, dtype=None, is_buffer=False)",
    "ColumnLinear": "(self, in_features, out_features, bias=True, dtype=None, tp_group=None, tp_size=1, "
    "gather_output=True, share_weight=None, strict_dtype=False, pad_lda=0, pad_ldc=0, "
    "prefer_managed_weight=True, is_qkv=False)",
    "Module": "(self)",
}


def recorded_signatures() -> dict[str, str]:
    """Class (or Class.method) -> signature text, from every python_api entry of the facts."""
    out: dict[str, str] = {}
    for key, entry in facts()["python_api"].items():
        m = re.fullmatch(r"[\w.]*?\.(\w+)\.__init__", key)
        if m and isinstance(entry, dict) and "signature" in entry:
            out[m.group(1)] = entry["signature"]
        if isinstance(entry, dict):
            for sub, value in entry.items():
                m = re.fullmatch(r"(\w+)\.(__init__|forward)", sub)
                if m and isinstance(value, str) and value.startswith("("):
                    out[m.group(1) if m.group(2) == "__init__" else sub] = value
    return out


class Sig:
    """A parsed signature: positional names, keyword-only names, which have defaults, *args / **kwargs."""

    def __init__(self, text: str):
        depth = 0
        for end, ch in enumerate(text):  # the recorded text may go on after the closing parenthesis
            depth += (ch == "(") - (ch == ")")
            if depth == 0:
                break
        fn = ast.parse(f"def f{text[: end + 1]}: pass").body[0].args
        pos = [a.arg for a in fn.posonlyargs + fn.args]
        self.has_self = bool(pos) and pos[0] in ("self", "cls")
        self.pos = pos[1:] if self.has_self else pos
        n_def = len(fn.defaults)
        self.required = set(self.pos[: len(self.pos) - n_def] if n_def else self.pos)
        self.kwonly = [a.arg for a in fn.kwonlyargs]
        self.required |= {a.arg for a, d in zip(fn.kwonlyargs, fn.kw_defaults) if d is None}
        self.varargs, self.varkw = fn.vararg is not None, fn.kwarg is not None

    def bind_errors(self, call: ast.Call) -> list[str]:
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            return []  # *args / **kwargs at the call: not checkable statically
        errors = []
        n = len(call.args)
        if n > len(self.pos) and not self.varargs:
            errors.append(f"{n} positional arguments, the signature takes {len(self.pos)}")
        given = set(self.pos[:n])
        for k in call.keywords:
            if k.arg in given:
                errors.append(f"{k.arg} given twice")
            elif k.arg not in self.pos and k.arg not in self.kwonly and not self.varkw:
                errors.append(f"no parameter {k.arg!r}")
            given.add(k.arg)
        missing = self.required - given
        if missing:
            errors.append(f"missing {sorted(missing)}")
        return errors


def _name(node: ast.expr) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def check_model_file(source: str) -> list[str]:
    """Every problem found in ``source`` against the recorded signatures (empty = conforms)."""
    sigs = {k: Sig(v) for k, v in {**SUPPLEMENT, **recorded_signatures()}.items()}
    api = facts()["python_api"]
    tree = ast.parse(source)
    imported: dict[str, str] = {}  # name -> module, for names imported from tensorrt_llm
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tensorrt_llm"):
            for a in node.names:
                imported[a.asname or a.name] = node.module
    classes = {c.name: c for c in tree.body if isinstance(c, ast.ClassDef)}
    problems: list[str] = []

    def own_init(cls: ast.ClassDef):
        return next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)

    def ctor_sig(name: str) -> tuple[str, Sig | None]:
        """The constructor a call ``name(...)`` reaches: our own __init__ (None: checked by Python), or
        the first tensorrt_llm base with a recorded signature."""
        while name in classes:
            cls = classes[name]
            if own_init(cls) is not None:
                return name, None
            name = _name(cls.bases[0]) if cls.bases else "object"
        if name in imported and name not in sigs:
            problems.append(
                f"{name} (from {imported[name]}) is called or subclassed but no 1.2.1 signature is recorded for it"
            )
        return name, sigs.get(name)

    # every base from tensorrt_llm must be a recorded class, in the module the facts name
    modules = {k.rsplit(".", 2)[-2]: v.get("module") for k, v in api.items() if isinstance(v, dict) and v.get("module")}
    for cls in classes.values():
        for b in cls.bases:
            bname = _name(b)
            if bname in imported:
                if bname not in sigs:
                    problems.append(f"class {cls.name}: base {bname} has no recorded 1.2.1 signature")
                want = modules.get(bname)
                if want and want.removesuffix(".py").replace("/", ".") != imported[bname]:
                    problems.append(
                        f"class {cls.name}: {bname} is imported from {imported[bname]}, 1.2.1 defines it in {want}"
                    )
        # an overridden forward must keep the recorded forward's parameters (callers pass them by name)
        for f in cls.body:
            if isinstance(f, ast.FunctionDef) and f.name == "forward":
                for b in cls.bases:
                    rec = sigs.get(f"{_name(b)}.forward")
                    if rec is not None:
                        ours = [a.arg for a in f.args.args[1:]]
                        if ours != rec.pos:
                            problems.append(
                                f"{cls.name}.forward{tuple(ours)} differs from {_name(b)}.forward{tuple(rec.pos)}"
                            )
        for node in ast.walk(cls):
            if not isinstance(node, ast.Call):
                continue
            fn = node.func
            # super().__init__(...) -> the base's constructor
            if (
                isinstance(fn, ast.Attribute)
                and fn.attr == "__init__"
                and isinstance(fn.value, ast.Call)
                and _name(fn.value.func) == "super"
            ):
                base = _name(cls.bases[0]) if cls.bases else None
                target, sig = ctor_sig(base) if base else (None, None)
                if sig is not None:
                    problems += [f"{cls.name}: super().__init__ -> {target}: {e}" for e in sig.bind_errors(node)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name = node.func.id
            if name in classes or (name in imported and name[:1].isupper()):
                target, sig = ctor_sig(name)
                if sig is not None:
                    problems += [f"line {node.lineno}: {name}(...) -> {target}: {e}" for e in sig.bind_errors(node)]
    return problems


def test_model_file_calls_and_subclasses_match_trtllm_1_2_1():
    problems = check_model_file(MODELS_FILE.read_text())
    assert problems == [], "\n".join(problems)


def test_checker_catches_the_old_eagle_net_call():
    """The check is not vacuous: the 1.1-style EagleNet(config) call and a positional RmsNorm eps fail."""
    bad = """
from tensorrt_llm.layers import RmsNorm
from tensorrt_llm.models.eagle.model import EagleNet

class MtpNet(EagleNet):
    def __init__(self, config):
        super().__init__(config)
        self.norm = RmsNorm(64, 1e-6, 1, 2, "float16", "extra")
"""
    problems = check_model_file(bad)
    assert any("super().__init__ -> EagleNet: missing ['logits_dtype']" in p for p in problems), problems
    assert any("RmsNorm(...)" in p and "positional" in p for p in problems), problems


@needs_no_trtllm
def test_build_without_gpu_keeps_the_plugin_preload_and_the_engine_limits(built):
    """mtp-linear built here (no GPU, no plugin library yet): the Triton repository still names the library
    the server must preload, and max_seq_len is the build's, not max_position_embeddings."""
    out = built[("mtp-linear", 2, 1)]
    repo = out / "triton_repo"
    manifest = json.loads((repo / "trtspec_repo.json").read_text())
    assert manifest["plugin_library"] == "tensorrt_llm/1/plugins/libtrtspec_plugins.so"
    assert "PLUGIN_LIBRARY=tensorrt_llm/1/plugins/libtrtspec_plugins.so" in (repo / "launch.sh").read_text()
    plan = json.loads((out / "plan.json").read_text())
    assert manifest["max_seq_len"] == plan["engines"][0]["max_seq_len"] == 512  # the demo preset's
    assert manifest["engine_dir"] == str((out / "engines" / "target").resolve())


TRTLLM_BUILDER = REPO / "trtspec" / "engine" / "trtllm.py"


def test_build_api_calls_match_trtllm_1_2_1():
    """trtspec/engine/trtllm.py (the in-process trtllm-build): BuildConfig keys, from_dict and
    from_checkpoint calls against the recorded BuildConfig dataclass and PretrainedModel.from_checkpoint."""
    api = facts()["python_api"]
    fields = {f[0] for f in api["tensorrt_llm.builder.BuildConfig"]["fields"]}
    tree = ast.parse(TRTLLM_BUILDER.read_text())
    dicts = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "fields" for t in n.targets)
    ]
    keys = {k.value for d in dicts for k in d.value.keys}
    keys |= {
        n.slice.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Subscript)
        and isinstance(n.value, ast.Name)
        and n.value.id == "fields"
        and isinstance(n.slice, ast.Constant)
    }
    assert keys and keys <= fields, keys - fields  # BuildConfig.update_from_dict raises on an unknown key
    from_ckpt = Sig(api["tensorrt_llm.models.modeling_utils.PretrainedModel.from_checkpoint"]["signature"])
    from_dict = Sig(
        "(cls, "
        + next(m for m in api["tensorrt_llm.builder.BuildConfig"]["methods"] if m.startswith("from_dict(")).split(
            "(", 1
        )[1]
    )
    checked = 0
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)):
        sig = {"from_checkpoint": from_ckpt, "from_dict": from_dict}.get(call.func.attr)
        if sig is not None:
            assert sig.bind_errors(call) == [], (call.func.attr, sig.bind_errors(call))
            checked += 1
    assert checked == 2


@needs_no_trtllm
def test_checkpoint_architectures_and_modes_are_known_to_1_2_1(built):
    """config.json's architecture must be a MODEL_MAP key (from_json_file looks it up) and the plan's
    speculative mode one trtllm-build / SpeculativeDecodingMode.from_arguments accepts."""
    model_map = set(facts()["python_api"]["tensorrt_llm.models.MODEL_MAP (relevant keys)"]) - {"commit_read"}
    modes = set(
        facts()["python_api"]["tensorrt_llm.models.modeling_utils.SpeculativeDecodingMode"]["from_arguments_strings"]
    )
    for out in built.values():
        plan = json.loads((out / "plan.json").read_text())
        for e in plan["engines"]:
            cfg = json.loads((out / e["checkpoint_dir"] / "config.json").read_text())
            assert cfg["architecture"] in model_map, cfg["architecture"]
            assert e["speculative_decoding_mode"] is None or e["speculative_decoding_mode"] in modes
