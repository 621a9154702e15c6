"""Requests built the way TensorRT-LLM 1.2.1's own clients build them, against the reference runtime served
by a real tritonserver (nvidia-pytriton wheel) on 127.0.0.1.

- end_to_end_grpc_client (triton_backend/inflight_batcher_llm/client/end_to_end_grpc_client.py): ensemble /
  BLS over gRPC ModelStreamInfer, [1, 1] tensors text_input / max_tokens / stream / beam_width / temperature /
  num_return_sequences / exclude_input_in_output / return_perf_metrics, the perf outputs requested by name
  and read as ``[0][0]``, ``text_output`` read as ``[0].decode()``;
- inflight_batcher_llm_client: token ids straight to ``tensorrt_llm``;
- a plain tritonclient HTTP ``infer`` on ``ensemble`` / ``tensorrt_llm_bls`` of a not-decoupled repository
  (no streaming support needed): the text equals offline greedy decoding;
- draft-target through ``tensorrt_llm_bls`` with ``num_draft_tokens`` (the BLS drives tensorrt_llm_draft).
"""

from __future__ import annotations

import queue
from functools import partial

import numpy as np
import pytest
from convert_fixtures import make_spec
from triton_support import PROMPTS, Oracle

from trtspec.triton.emit import emit_repository

pytest.importorskip("pytriton")
grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")

from tritonclient.utils import np_to_triton_dtype  # noqa: E402

from trtspec.triton.server import TritonServer  # noqa: E402

pytestmark = pytest.mark.slow

#: the outputs end_to_end_grpc_client requests with --return-perf-metrics
PERF_OUTPUTS = (
    "kv_cache_alloc_new_blocks",
    "kv_cache_reused_blocks",
    "kv_cache_alloc_total_blocks",
    "arrival_time_ns",
    "first_scheduled_time_ns",
    "first_token_time_ns",
    "last_token_time_ns",
    "acceptance_rate",
    "total_accepted_draft_tokens",
    "total_draft_tokens",
)
REF_OPTIONS = {"max_batch_size": 8, "device": "cpu", "torch_threads": 1}


def _serve(repo, log):
    srv = TritonServer(repo, log_path=log, startup_timeout_s=180)
    srv.start()
    return srv


@pytest.fixture(scope="module")
def draft_setup(tmp_path_factory):
    """A draft-model deployment (decoupled): target + separate draft model, served."""
    root = tmp_path_factory.mktemp("stock_draft")
    spec = make_spec(root / "m", "draft-model")
    repo = emit_repository(spec, "reference", root / "repo", options=REF_OPTIONS)
    srv = _serve(repo, root / "tritonserver.log")
    try:
        yield srv, Oracle(spec.target.path, None)
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def unary_setup(tmp_path_factory):
    """The same kind of deployment emitted --no-decoupled."""
    root = tmp_path_factory.mktemp("stock_unary")
    spec = make_spec(root / "m", "draft-model")
    repo = emit_repository(spec, "reference", root / "repo", options={**REF_OPTIONS, "decoupled": False})
    srv = _serve(repo, root / "tritonserver.log")
    try:
        yield srv, Oracle(spec.target.path, None)
    finally:
        srv.stop()


def _tensor(name, arr):
    t = grpcclient.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
    t.set_data_from_numpy(arr)
    return t


def stock_inputs(prompt: str, output_len: int, streaming: bool, temperature: float = 0.0, **extra) -> dict:
    """The ensemble/BLS request of end_to_end_grpc_client: every tensor [1, 1], its dtypes."""
    inputs = {
        "text_input": np.array([[prompt]]).astype(object),
        "max_tokens": np.ones_like([[prompt]]).astype(np.int32) * output_len,
        "stream": np.array([[streaming]], dtype=bool),
        "beam_width": np.array([[1]], dtype=np.int32),
        "temperature": np.array([[temperature]], dtype=np.float32),
        "num_return_sequences": np.array([[1]], dtype=np.int32),
        "exclude_input_in_output": np.array([[False]], dtype=bool),
        "return_perf_metrics": np.array([[True]], dtype=bool),
    }
    inputs.update(extra)
    return inputs


def stream_infer(url: str, model: str, inputs: dict, outputs: list[str]) -> list:
    """start_stream / async_stream_infer / stop_stream, as the stock client does; the results in order."""
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)

    def callback(q, result, error):
        q.put(error if error else result)

    client.start_stream(callback=partial(callback, got))
    client.async_stream_infer(
        model,
        [_tensor(k, v) for k, v in inputs.items()],
        outputs=[grpcclient.InferRequestedOutput(o) for o in outputs],
        request_id="1",
    )
    client.stop_stream()  # waits for the server to close the stream
    client.close()
    results = []
    while not got.empty():
        results.append(got.get())
    return results


@pytest.mark.parametrize("model_name", ["ensemble", "tensorrt_llm_bls"])
@pytest.mark.parametrize("streaming", [False, True], ids=["unary", "stream"])
def test_end_to_end_grpc_client_request(draft_setup, model_name, streaming):
    srv, oracle = draft_setup
    prompt, n = PROMPTS[1], 12
    # (+ batch_index / sequence_index: what the stock client requests with --batch-inputs / -n)
    results = stream_infer(
        srv.grpc_url,
        model_name,
        stock_inputs(prompt, n, streaming),
        ["text_output", "batch_index", "sequence_index", *PERF_OUTPUTS],
    )
    errors = [r for r in results if isinstance(r, Exception)]
    assert not errors, errors
    text = ""
    for r in results:
        out = r.as_numpy("text_output")
        piece = out[0].decode("utf-8")  # what the stock client does: a flat text_output
        text = text + piece if streaming else piece
        assert r.as_numpy("batch_index")[0][0] == 0 and r.as_numpy("sequence_index")[0][0] == 0
    last = results[-1]
    perf = {k: last.as_numpy(k)[0][0] for k in PERF_OUTPUTS}  # every perf output is there, [1, 1]
    greedy = oracle.text(prompt, n)
    # not streaming and exclude_input_in_output false: the prompt comes back too (the client's check)
    assert text == (
        greedy
        if streaming
        else oracle.tok.decode(oracle.tok.encode(prompt) + list(oracle.tokens(prompt, n)), skip_special_tokens=True)
    )
    assert (
        perf["arrival_time_ns"]
        <= perf["first_scheduled_time_ns"]
        <= perf["first_token_time_ns"]
        <= perf["last_token_time_ns"]
    )
    assert perf["kv_cache_alloc_total_blocks"] >= 1 and perf["kv_cache_reused_blocks"] == 0
    assert 0 <= perf["total_accepted_draft_tokens"] <= perf["total_draft_tokens"]


def test_draft_target_through_bls(draft_setup):
    """num_draft_tokens: the BLS asks tensorrt_llm_draft for drafts and the target verifies them."""
    srv, oracle = draft_setup
    prompt, n = PROMPTS[2], 14
    inputs = stock_inputs(prompt, n, True, num_draft_tokens=np.array([[3]], dtype=np.int32))
    results = stream_infer(srv.grpc_url, "tensorrt_llm_bls", inputs, ["text_output", *PERF_OUTPUTS[-3:]])
    assert not [r for r in results if isinstance(r, Exception)]
    text = "".join(r.as_numpy("text_output")[0].decode("utf-8") for r in results)
    assert text == oracle.text(prompt, n)
    last = results[-1]
    drafted = last.as_numpy("total_draft_tokens")[0][0]
    assert drafted > 0 and 0 <= last.as_numpy("total_accepted_draft_tokens")[0][0] <= drafted
    assert len(results) > 1  # one piece per verification step


def test_inflight_batcher_llm_client_request(draft_setup):
    """Token ids straight to tensorrt_llm, with the perf and token-count outputs."""
    srv, oracle = draft_setup
    prompt, n = PROMPTS[3], 10
    ids = oracle.tok.encode(prompt)
    inputs = {
        "input_ids": np.array([ids], dtype=np.int32),
        "input_lengths": np.array([[len(ids)]], dtype=np.int32),
        "request_output_len": np.array([[n]], dtype=np.int32),
        "streaming": np.array([[False]], dtype=bool),
        "beam_width": np.array([[1]], dtype=np.int32),
        "end_id": np.array([[oracle.tok.eos_token_id if oracle.tok.eos_token_id is not None else -1]], dtype=np.int32),
        "exclude_input_in_output": np.array([[True]], dtype=bool),
        "return_perf_metrics": np.array([[True]], dtype=bool),
        "return_num_input_tokens": np.array([[True]], dtype=bool),
        "return_num_output_tokens": np.array([[True]], dtype=bool),
    }
    results = stream_infer(
        srv.grpc_url,
        "tensorrt_llm",
        inputs,
        ["output_ids", "sequence_length", "num_input_tokens", "num_output_tokens", *PERF_OUTPUTS],
    )
    assert not [r for r in results if isinstance(r, Exception)]
    r = results[0]
    length = r.as_numpy("sequence_length")[0][0]
    assert r.as_numpy("output_ids")[0][0][:length].tolist() == list(oracle.tokens(prompt, n))
    assert r.as_numpy("num_input_tokens")[0][0] == len(ids) and r.as_numpy("num_output_tokens")[0][0] == length


@pytest.mark.parametrize("model_name", ["ensemble", "tensorrt_llm_bls"])
def test_plain_http_infer_when_not_decoupled(unary_setup, model_name):
    """The request that gets "[501] ... decoupled transaction policy" from a decoupled repository."""
    srv, oracle = unary_setup
    client = httpclient.InferenceServerClient(srv.http_url)
    assert not client.get_model_config("tensorrt_llm")["model_transaction_policy"].get("decoupled", False)
    for prompt, n in ((PROMPTS[0], 16), (PROMPTS[4], 9)):
        inputs = []
        for name, arr in (
            ("text_input", np.array([[prompt]], dtype=object)),
            ("max_tokens", np.array([[n]], dtype=np.int32)),
        ):
            t = httpclient.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
            t.set_data_from_numpy(arr)
            inputs.append(t)
        res = client.infer(model_name, inputs)
        out = res.as_numpy("text_output")
        assert out.shape == (1,) and out[0].decode("utf-8") == oracle.text(prompt, n)
    client.close()


def test_draft_target_through_bls_over_plain_http(unary_setup):
    srv, oracle = unary_setup
    client = httpclient.InferenceServerClient(srv.http_url)
    prompt, n = PROMPTS[5], 11
    inputs = []
    for name, arr in (
        ("text_input", np.array([[prompt]], dtype=object)),
        ("max_tokens", np.array([[n]], dtype=np.int32)),
        ("num_draft_tokens", np.array([[2]], dtype=np.int32)),
        ("return_perf_metrics", np.array([[True]], dtype=bool)),
    ):
        t = httpclient.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
        t.set_data_from_numpy(arr)
        inputs.append(t)
    res = client.infer("tensorrt_llm_bls", inputs)
    assert res.as_numpy("text_output")[0].decode("utf-8") == oracle.text(prompt, n)
    assert res.as_numpy("total_draft_tokens")[0][0] > 0
    client.close()


def test_streaming_on_a_not_decoupled_repository_is_refused_clearly(unary_setup):
    srv, _ = unary_setup
    results = stream_infer(srv.grpc_url, "tensorrt_llm_bls", stock_inputs(PROMPTS[0], 4, True), ["text_output"])
    assert len(results) == 1 and isinstance(results[0], Exception)
    assert "decoupled" in str(results[0])
