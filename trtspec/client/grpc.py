"""gRPC client: Triton's bidirectional ModelStreamInfer through ``tritonclient.grpc``.

A decoupled model can only be reached by the stream API over gRPC (unary ModelInfer refuses it), so both
streaming and non-streaming requests go over a stream; `stream=False` makes the model answer once. The
server is asked for an empty final response, which is how the end of a request is known for certain.
"""

from __future__ import annotations

import queue
import uuid

import numpy as np

from trtspec.client.common import (
    DEFAULT_MODEL,
    LIST_METRICS,
    METRIC_NAMES,
    GenerateParams,
    GenerateResult,
    ServerError,
    Timer,
)

_TYPES = {
    "text_input": "BYTES",
    "stop_words": "BYTES",
    "max_tokens": "INT32",
    "top_k": "INT32",
    "end_id": "INT32",
    "temperature": "FP32",
    "top_p": "FP32",
    "seed": "UINT64",
    "stream": "BOOL",
    "return_perf_metrics": "BOOL",
    "return_num_input_tokens": "BOOL",
    "return_num_output_tokens": "BOOL",
}
_NP = {"BYTES": object, "INT32": np.int32, "FP32": np.float32, "UINT64": np.uint64, "BOOL": np.bool_}


def build_inputs(fields: dict):
    """Ensemble fields -> tritonclient InferInput list ([1, n] tensors: batch of one)."""
    import tritonclient.grpc as grpcclient

    inputs = []
    for name, value in fields.items():
        dtype = _TYPES[name]
        values = value if isinstance(value, list) else [value]
        if dtype == "BYTES":
            values = [v.encode("utf-8") if isinstance(v, str) else v for v in values]
        arr = np.array([values], dtype=_NP[dtype])
        t = grpcclient.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        inputs.append(t)
    return inputs


class GrpcClient:
    def __init__(self, url: str = "127.0.0.1:8001", model: str = DEFAULT_MODEL, timeout_s: float = 600.0):
        import tritonclient.grpc as grpcclient

        self.url = url.removeprefix("grpc://")
        self.model = model
        self.timeout_s = timeout_s
        self.client = grpcclient.InferenceServerClient(self.url)
        self._responses: queue.Queue = queue.Queue()
        self._streaming = False

    def close(self) -> None:
        if self._streaming:
            self.client.stop_stream()
            self._streaming = False
        self.client.close()

    def __enter__(self) -> GrpcClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def is_ready(self, model: str | None = None) -> bool:
        try:
            return bool(self.client.is_server_ready() and self.client.is_model_ready(model or self.model))
        except Exception:
            return False

    def max_draft_len(self) -> int | None:
        try:
            cfg = self.client.get_model_config("tensorrt_llm", as_json=True)["config"]
            return int(cfg.get("parameters", {}).get("max_draft_len", {}).get("string_value", "0")) or None
        except Exception:
            return None

    def _ensure_stream(self) -> None:
        if not self._streaming:
            self.client.start_stream(callback=lambda result, error: self._responses.put((result, error)))
            self._streaming = True

    def _run(self, text: str, params: GenerateParams, stream: bool, on_piece=None) -> GenerateResult:
        self._ensure_stream()
        rid = uuid.uuid4().hex
        outputs = None  # all outputs the model produces
        timer = Timer()
        self.client.async_stream_infer(
            self.model,
            build_inputs(params.fields(text, stream)),
            request_id=rid,
            outputs=outputs,
            enable_empty_final_response=True,
        )
        result = GenerateResult(text="")
        while True:
            try:
                res, err = self._responses.get(timeout=self.timeout_s)
            except queue.Empty:
                raise ServerError(f"no response from {self.url} within {self.timeout_s:.0f} s") from None
            if err is not None:
                # the stream is unusable after an error in some grpc versions: start a fresh one next time
                self.client.stop_stream()
                self._streaming = False
                raise ServerError(f"server error: {err.message() if hasattr(err, 'message') else err}")
            resp = res.get_response()
            if resp.id and resp.id != rid:
                continue  # a late message of an earlier request on this stream
            t = timer()
            piece = res.as_numpy("text_output")
            if piece is not None and piece.size:
                s = piece.reshape(-1)[0]
                s = s.decode("utf-8", errors="replace") if isinstance(s, bytes) else str(s)
                if s:
                    result.pieces.append(s)
                    result.piece_times.append(t)
                    if on_piece:
                        on_piece(s)
            for name in METRIC_NAMES:
                v = res.as_numpy(name)
                if v is not None and v.size:
                    flat = v.reshape(-1)
                    result.metrics[name] = flat.tolist() if name in LIST_METRICS else flat[0].item()
            final = resp.parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                break
        result.text = "".join(result.pieces)
        result.latency_s = timer()
        return result

    def generate(self, text: str, params: GenerateParams | None = None) -> GenerateResult:
        return self._run(text, params or GenerateParams(), stream=False)

    def generate_stream(self, text: str, params: GenerateParams | None = None, on_piece=None) -> GenerateResult:
        return self._run(text, params or GenerateParams(), stream=True, on_piece=on_piece)
