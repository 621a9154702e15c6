"""The engine build plan (plan.json) and the build_engines.sh that runs exactly that plan on a GPU machine.

The ``trtllm-build`` flags are TensorRT-LLM 1.2's (``tensorrt_llm/commands/build.py::parse_arguments``
plus the plugin flags generated from ``tensorrt_llm/plugin/plugin.py::cli_plugin_args``). Documented
per-mode requirements (``examples/draft_target_model/README.md``, ``examples/medusa/README.md``,
``examples/eagle/README.md``): every speculative target engine gets ``--speculative_decoding_mode`` and
``--max_draft_len``; the draft-target mode needs ``--use_paged_context_fmha enable`` on both engines (KV
cache reuse).

Plugin library: ``trtllm-build`` has no flag to load a plugin library. TensorRT finds plugin creators in
the process-wide registry, so the library must be loaded into the build process before the network is
built. trtspec does that from its model-class file (``--model_cls_file``, a documented flag), which
``ctypes.CDLL``-loads ``$TRTSPEC_PLUGIN_LIBRARY`` with RTLD_GLOBAL when imported; the script also sets
``LD_PRELOAD`` so that any other process started from it (and the Triton server) has the creators too.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trtspec import __version__

#: Every flag trtllm-build 1.2 accepts that trtspec may emit (checked by the tests against this list).
TRTLLM_BUILD_FLAGS = frozenset(
    {
        # tensorrt_llm/commands/build.py
        "--checkpoint_dir",
        "--model_config",
        "--build_config",
        "--model_cls_file",
        "--model_cls_name",
        "--output_dir",
        "--max_batch_size",
        "--max_input_len",
        "--max_seq_len",
        "--max_beam_width",
        "--max_num_tokens",
        "--opt_num_tokens",
        "--max_encoder_input_len",
        "--max_prompt_embedding_table_size",
        "--kv_cache_type",
        "--input_timing_cache",
        "--output_timing_cache",
        "--profiling_verbosity",
        "--strip_plan",
        "--weight_sparsity",
        "--weight_streaming",
        "--fast_build",
        "--workers",
        "--log_level",
        "--enable_debug_output",
        "--visualize_network",
        "--dry_run",
        "--monitor_memory",
        "--logits_dtype",
        "--gather_context_logits",
        "--gather_generation_logits",
        "--gather_all_token_logits",
        "--lora_dir",
        "--lora_ckpt_source",
        "--lora_target_modules",
        "--max_lora_rank",
        "--speculative_decoding_mode",
        "--max_draft_len",
        # (1.2 has no --auto_parallel / --gpus_per_node / --cluster_key: auto parallel was removed before 1.0)
        # tensorrt_llm/plugin/plugin.py cli_plugin_args
        "--bert_attention_plugin",
        "--gpt_attention_plugin",
        "--gemm_plugin",
        "--gemm_swiglu_plugin",
        "--fp8_rowwise_gemm_plugin",
        "--lora_plugin",
        "--dora_plugin",
        "--moe_plugin",
        "--mamba_conv1d_plugin",
        "--nccl_plugin",
        "--low_latency_gemm_plugin",
        "--low_latency_gemm_swiglu_plugin",
        "--gemm_allreduce_plugin",
        "--context_fmha",
        "--bert_context_fmha_fp32_acc",
        "--remove_input_padding",
        "--tokens_per_block",
        "--use_paged_context_fmha",
        "--use_fp8_context_fmha",
        "--fuse_fp4_quant",
        "--multiple_profiles",
        "--paged_state",
        "--streamingllm",
        "--norm_quant_fusion",
        "--reduce_fusion",
        "--user_buffer",
        "--use_fused_mlp",
        "--pp_reduce_scatter",
    }
)
SPEC_MODES = ("draft_tokens_external", "lookahead_decoding", "medusa", "explicit_draft_tokens", "eagle")
PLUGIN_LIBRARY_NAME = "libtrtspec_plugins.so"
MODEL_CLS_FILE = "model_cls/trtspec_trtllm_models.py"
TRTLLM_VERSION_PREFIX = "1.2"


@dataclass
class EngineBuild:
    """One ``trtllm-build`` invocation (paths relative to the build directory)."""

    name: str  # "target" | "draft"
    checkpoint_dir: str
    output_dir: str
    world_size: int
    speculative_decoding_mode: str | None
    max_draft_len: int
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int | None
    gemm_plugin: str
    use_paged_context_fmha: bool
    gpus_per_node: int = 8
    model_cls_name: str | None = None

    def workers(self) -> int:
        """trtllm-build --workers. With a --model_cls_file class, 1: trtllm-build loads that file under the
        module name ``models`` in its own process only, and its parallel workers (spawned processes that
        receive the class pickled by reference) cannot import it, so ranks are built one after another."""
        if self.model_cls_name:
            return 1
        return max(1, min(self.world_size, self.gpus_per_node))

    def argv(self, root: str = "$HERE") -> list[str]:
        """The trtllm-build arguments; ``root`` prefixes the relative paths (the script's own dir)."""
        a = [
            "--checkpoint_dir",
            f"{root}/{self.checkpoint_dir}",
            "--output_dir",
            f"{root}/{self.output_dir}",
            "--max_batch_size",
            str(self.max_batch_size),
            "--max_input_len",
            str(self.max_input_len),
            "--max_seq_len",
            str(self.max_seq_len),
        ]
        if self.max_num_tokens:
            a += ["--max_num_tokens", str(self.max_num_tokens)]
        a += [
            "--gemm_plugin",
            self.gemm_plugin,
            "--use_paged_context_fmha",
            "enable" if self.use_paged_context_fmha else "disable",
        ]
        if self.speculative_decoding_mode:
            a += [
                "--speculative_decoding_mode",
                self.speculative_decoding_mode,
                "--max_draft_len",
                str(self.max_draft_len),
            ]
        if self.model_cls_name:
            a += ["--model_cls_file", f"{root}/{MODEL_CLS_FILE}", "--model_cls_name", self.model_cls_name]
        a += ["--workers", str(self.workers()), "--log_level", "info"]
        unknown = [x for x in a if x.startswith("--") and x not in TRTLLM_BUILD_FLAGS]
        if unknown:  # guards against a typo in this file ever reaching a GPU machine
            raise RuntimeError(f"internal: not a trtllm-build 1.2 flag: {unknown}")
        return a


@dataclass
class BuildPlan:
    kind: str
    engines: list[EngineBuild]
    needs_plugin: bool
    plugin_library: str  # relative to the build dir unless absolute
    options: dict[str, Any] = field(default_factory=dict)
    trtspec_version: str = __version__
    trtllm_version: str = f"{TRTLLM_VERSION_PREFIX}.x"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["commands"] = {e.name: ["trtllm-build", *e.argv("<build dir>")] for e in self.engines}
        return d

    def write(self, directory: Path) -> tuple[Path, Path]:
        plan = directory / "plan.json"
        plan.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        script = directory / "build_engines.sh"
        script.write_text(render_script(self))
        script.chmod(0o755)
        return plan, script


def render_script(plan: BuildPlan) -> str:
    """A bash script that checks the machine, loads the plugin library and runs each trtllm-build."""
    lines = [
        "#!/usr/bin/env bash",
        f"# Generated by trtspec {plan.trtspec_version} (plan.json next to this file). Builds the {plan.kind} "
        "engines with",
        f"# TensorRT-LLM {plan.trtllm_version} on a GPU machine; copy this whole directory there and run it.",
        "set -euo pipefail",
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        "",
        "command -v trtllm-build >/dev/null || { echo 'error: trtllm-build not found (install TensorRT-LLM "
        f"{plan.trtllm_version})' >&2; exit 2; }}",
        "python3 - <<'PY'",
        "import sys",
        "import tensorrt_llm",
        f"if not tensorrt_llm.__version__.startswith('{TRTLLM_VERSION_PREFIX}'):",
        f"    sys.exit(f'error: need TensorRT-LLM {plan.trtllm_version}, found {{tensorrt_llm.__version__}}')",
        "PY",
        "nvidia-smi -L >/dev/null 2>&1 || { echo 'error: no NVIDIA GPU visible (nvidia-smi failed)' >&2; exit 2; }",
    ]
    if plan.needs_plugin:
        lib = plan.plugin_library if plan.plugin_library.startswith("/") else f"$HERE/{plan.plugin_library}"
        lines += [
            "",
            "# trtspec's TensorRT plugins (creators registered in namespace 'trtspec' when the library loads)",
            f'export TRTSPEC_PLUGIN_LIBRARY="${{TRTSPEC_PLUGIN_LIBRARY:-{lib}}}"',
            'if [ ! -f "$TRTSPEC_PLUGIN_LIBRARY" ]; then',
            '  echo "error: plugin library $TRTSPEC_PLUGIN_LIBRARY not found; build it on this machine with '
            '\\`trtspec plugins build\\` (plugins/CMakeLists.txt) and set TRTSPEC_PLUGIN_LIBRARY" >&2',
            "  exit 2",
            "fi",
            'export LD_PRELOAD="$TRTSPEC_PLUGIN_LIBRARY${LD_PRELOAD:+:$LD_PRELOAD}"',
        ]
    for e in plan.engines:
        args = e.argv("$HERE")
        pairs, i = [], 0
        while i < len(args):  # one "--flag value" per line
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                pairs.append(f"{_quote(args[i])} {_quote(args[i + 1])}")
                i += 2
            else:
                pairs.append(_quote(args[i]))
                i += 1
        rendered = " \\\n    ".join(pairs)
        lines += [
            "",
            f"# {e.name} engine: {e.world_size} rank(s)"
            f"{', mode ' + e.speculative_decoding_mode if e.speculative_decoding_mode else ''}",
            f"trtllm-build \\\n    {rendered}",
        ]
    lines += ["", 'echo "engines written under $HERE/engines"', ""]
    return "\n".join(lines)


def _quote(arg: str) -> str:
    """Quote for bash but keep $HERE expandable."""
    if arg.startswith("$HERE"):
        return '"' + arg.replace('"', '\\"') + '"'
    return shlex.quote(arg)


def parse_script_commands(script: str) -> list[list[str]]:
    """The trtllm-build argv lists in a rendered script ($HERE left literal): for tests and ``--dry-run``."""
    joined = script.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        if line.strip().startswith("trtllm-build "):
            out.append(shlex.split(line.strip(), posix=True)[1:])
    return out
