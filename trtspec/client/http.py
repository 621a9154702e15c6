"""HTTP client: Triton's generate extension (`/generate`, and `/generate_stream` as server-sent events).

Triton's generate endpoints are the only HTTP way to talk to a decoupled (streaming) model, and
``tritonclient.http`` has no API for them, so requests go through the standard library's http.client
(one connection per client, usable from one thread); ``tritonclient.http`` answers readiness and the
model configuration.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

from trtspec.client.common import DEFAULT_MODEL, METRIC_NAMES, GenerateParams, GenerateResult, ServerError, Timer


def _split_url(url: str) -> tuple[str, int]:
    url = url.removeprefix("http://")
    host, _, port = url.partition(":")
    return host or "127.0.0.1", int(port or 8000)


class HttpClient:
    def __init__(self, url: str = "127.0.0.1:8000", model: str = DEFAULT_MODEL, timeout_s: float = 600.0):
        self.url = url.removeprefix("http://")
        self.model = model
        self.host, self.port = _split_url(url)
        self.timeout_s = timeout_s

    # server state through tritonclient ---------------------------------------------------------
    def _triton(self):
        import tritonclient.http as httpclient

        return httpclient.InferenceServerClient(self.url, connection_timeout=10, network_timeout=60)

    def is_ready(self, model: str | None = None) -> bool:
        c = self._triton()
        try:
            return bool(c.is_server_ready() and c.is_model_ready(model or self.model))
        except Exception:
            return False
        finally:
            c.close()

    def model_config(self, model: str) -> dict:
        c = self._triton()
        try:
            return c.get_model_config(model)
        finally:
            c.close()

    def max_draft_len(self) -> int | None:
        """Draft tokens verified per step, from the tensorrt_llm model's `max_draft_len` parameter."""
        try:
            params = self.model_config("tensorrt_llm").get("parameters", {})
            return int(params.get("max_draft_len", {}).get("string_value", "0")) or None
        except Exception:
            return None

    # generate ----------------------------------------------------------------------------------
    def _post(self, path: str, body: dict) -> http.client.HTTPResponse:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            conn.request(
                "POST",
                f"/v2/models/{self.model}/{path}",
                body=json.dumps(body),
                headers={"Content-Type": "application/json", "Connection": "close"},
            )
            return conn.getresponse()
        except OSError as exc:
            conn.close()
            raise ServerError(
                f"cannot reach a Triton server at {self.host}:{self.port} ({exc})",
                fix="start one with `trtspec serve REPO` or pass --url",
            ) from None

    @staticmethod
    def _error(status: int, raw: str) -> ServerError:
        text = raw.strip().removeprefix("data:").strip()
        try:
            text = json.loads(text).get("error", text)
        except (json.JSONDecodeError, AttributeError):
            pass
        return ServerError(f"server error (HTTP {status}): {text}")

    def generate(self, text: str, params: GenerateParams | None = None) -> GenerateResult:
        """One request, one response: the whole text and the acceptance metrics."""
        params = params or GenerateParams()
        timer = Timer()
        resp = self._post("generate", params.fields(text, stream=False))
        raw = resp.read().decode("utf-8", errors="replace")
        if resp.status != 200:
            raise self._error(resp.status, raw)
        out = json.loads(raw)
        latency = timer()
        return GenerateResult(
            text=str(out.get("text_output", "")),
            pieces=[str(out.get("text_output", ""))],
            piece_times=[latency],
            metrics=_metrics(out),
            latency_s=latency,
        )

    def stream_events(self, text: str, params: GenerateParams | None = None) -> Iterator[tuple[float, dict]]:
        """Yield (seconds since sent, event dict) for each server-sent event of /generate_stream."""
        params = params or GenerateParams()
        timer = Timer()
        resp = self._post("generate_stream", params.fields(text, stream=True))
        if resp.status != 200:
            raise self._error(resp.status, resp.read().decode("utf-8", errors="replace"))
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.decode("utf-8", errors="replace").strip()
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if "error" in event:
                raise ServerError(f"server error: {event['error']}")
            yield timer(), event

    def generate_stream(self, text: str, params: GenerateParams | None = None, on_piece=None) -> GenerateResult:
        """Stream the text piece by piece (``on_piece(str)`` sees each as it arrives)."""
        timer = Timer()
        result = GenerateResult(text="")
        for t, event in self.stream_events(text, params):
            piece = str(event.get("text_output", ""))
            result.metrics.update(_metrics(event))
            if piece:
                result.pieces.append(piece)
                result.piece_times.append(t)
                if on_piece:
                    on_piece(piece)
        result.text = "".join(result.pieces)
        result.latency_s = timer()
        return result


def _metrics(event: dict) -> dict[str, float]:
    return {k: event[k] for k in METRIC_NAMES if k in event}
