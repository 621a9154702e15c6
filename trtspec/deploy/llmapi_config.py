"""The Triton ``llmapi`` model's config.pbtxt (TensorRT-LLM ``triton_backend/all_models/llmapi``).

The python model that serves it (``model.py``, ``helpers.py``) ships with TensorRT-LLM and its Triton image;
trtspec writes only the configuration: this config.pbtxt and ``1/model.yaml``. Tensor names, types and
shapes are TensorRT-LLM's; ``max_batch_size`` and ``decoupled`` are deliberately absent (the model reads
them from model.yaml's ``triton_config``).
"""

from __future__ import annotations

#: (name, Triton data type, dims) of every input; all but text_input are optional
INPUTS: tuple[tuple[str, str, tuple[int, ...]], ...] = (
    ("text_input", "TYPE_STRING", (-1,)),
    ("image_url", "TYPE_STRING", (-1,)),
    ("streaming", "TYPE_BOOL", (1,)),
    ("sampling_param_best_of", "TYPE_INT32", (1,)),
    ("sampling_param_temperature", "TYPE_FP32", (1,)),
    ("sampling_param_top_k", "TYPE_INT32", (1,)),
    ("sampling_param_top_p", "TYPE_FP32", (1,)),
    ("sampling_param_frequency_penalty", "TYPE_FP32", (1,)),
    ("sampling_param_presence_penalty", "TYPE_FP32", (1,)),
    ("sampling_param_max_tokens", "TYPE_INT32", (1,)),
    ("sampling_param_stop", "TYPE_STRING", (-1,)),
    ("sampling_param_seed", "TYPE_UINT64", (1,)),
    ("sampling_param_exclude_input_from_output", "TYPE_BOOL", (1,)),
    ("sampling_param_return_perf_metrics", "TYPE_BOOL", (1,)),
    ("return_finish_reason", "TYPE_BOOL", (1,)),
    ("return_stop_reason", "TYPE_BOOL", (1,)),
    ("return_cumulative_logprob", "TYPE_BOOL", (1,)),
    ("stop", "TYPE_BOOL", (1,)),
    ("lora_id", "TYPE_UINT64", (1,)),
    ("lora_name", "TYPE_STRING", (1,)),
    ("lora_path", "TYPE_STRING", (1,)),
    ("lora_ckpt_source", "TYPE_STRING", (1,)),
)
REQUIRED_INPUTS = ("text_input",)

#: every output; the last three carry the speculative decoding acceptance per request
OUTPUTS: tuple[tuple[str, str, tuple[int, ...]], ...] = (
    ("text_output", "TYPE_STRING", (-1,)),
    ("finish_reason", "TYPE_STRING", (-1,)),
    ("stop_reason", "TYPE_STRING", (-1,)),
    ("cumulative_logprob", "TYPE_FP32", (-1,)),
    ("kv_cache_reused_block", "TYPE_INT32", (-1,)),
    ("kv_cache_missed_block", "TYPE_INT32", (-1,)),
    ("kv_cache_alloc_new_blocks", "TYPE_INT32", (-1,)),
    ("kv_cache_alloc_total_blocks", "TYPE_INT32", (-1,)),
    ("kv_cache_hit_rate", "TYPE_FP32", (-1,)),
    ("arrival_time_ns", "TYPE_INT64", (1,)),
    ("first_scheduled_time_ns", "TYPE_INT64", (1,)),
    ("first_token_time_ns", "TYPE_INT64", (1,)),
    ("last_token_time_ns", "TYPE_INT64", (1,)),
    ("acceptance_rate", "TYPE_FP32", (1,)),
    ("total_accepted_draft_tokens", "TYPE_INT32", (1,)),
    ("total_draft_tokens", "TYPE_INT32", (1,)),
)


def _tensor(name: str, dtype: str, dims: tuple[int, ...], optional: bool) -> str:
    lines = [f'    name: "{name}"', f"    data_type: {dtype}", f"    dims: [ {', '.join(map(str, dims))} ]"]
    if optional:
        lines.append("    optional: true")
    return "  {\n" + "\n".join(lines) + "\n  }"


def llmapi_config_pbtxt(instances: int = 1) -> str:
    """The model's config.pbtxt: python backend, CPU instance group (the LLM API owns the GPUs)."""
    inputs = ",\n".join(_tensor(n, t, d, n not in REQUIRED_INPUTS) for n, t, d in INPUTS)
    outputs = ",\n".join(_tensor(n, t, d, False) for n, t, d in OUTPUTS)
    return (
        'name: "tensorrt_llm"\n'
        'backend: "python"\n'
        "# max_batch_size and decoupled come from 1/model.yaml (triton_config)\n"
        f"instance_group [\n  {{\n    count: {instances}\n    kind: KIND_CPU\n  }}\n]\n"
        f"input [\n{inputs}\n]\n"
        f"output [\n{outputs}\n]\n"
    )
