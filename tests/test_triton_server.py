"""A real tritonserver (from the nvidia-pytriton wheel) on 127.0.0.1 serving the emitted `reference`
repository: every answer must equal offline greedy decoding of the same prompt.

The server is started once for the module and stopped by the fixture's finalizer, also when a test fails
(the launcher kills the whole process group, python stubs included).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from triton_support import PROMPTS, Oracle, make_model

from trtspec.errors import UsageError
from trtspec.load import load_spec_model
from trtspec.triton.emit import emit_repository

pytest.importorskip("pytriton")
pytest.importorskip("tritonclient.grpc")

from trtspec.client.common import GenerateParams, ServerError  # noqa: E402
from trtspec.client.grpc import GrpcClient  # noqa: E402
from trtspec.client.http import HttpClient  # noqa: E402
from trtspec.triton.server import TritonServer  # noqa: E402

pytestmark = pytest.mark.slow

MODELS = ("ensemble", "tensorrt_llm_bls")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("triton_server_model"))


@pytest.fixture(scope="module")
def oracle(model):
    return Oracle(model["target"], model["heads"])


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    root = tmp_path_factory.mktemp("triton_server")
    spec = load_spec_model(model["target"], model["heads"])
    repo = emit_repository(
        spec, "reference", root / "repo", options={"max_batch_size": 8, "device": "cpu", "torch_threads": 1}
    )
    srv = TritonServer(repo, log_path=root / "tritonserver.log", startup_timeout_s=120)
    srv.start()
    yield srv
    pid = srv.proc.pid if srv.proc else None
    srv.stop()
    if pid is not None:  # stopped for real: the process and its group are gone
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_all_models_ready(server):
    for m in ("preprocessing", "tensorrt_llm", "postprocessing", "ensemble", "tensorrt_llm_bls"):
        assert _get(f"http://{server.http_url}/v2/models/{m}/ready") == 200, m
    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(server.grpc_url)
    index = {m.name: m.state for m in c.get_model_repository_index().models}
    assert index and all(state == "READY" for state in index.values()), index
    assert server.http_url.startswith("127.0.0.1:") and server.grpc_url.startswith("127.0.0.1:")


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_text_equals_offline_greedy(server, oracle, model_name, protocol, stream):
    client = HttpClient(server.http_url, model_name) if protocol == "http" else GrpcClient(server.grpc_url, model_name)
    prompt, n = PROMPTS[0], 20
    params = GenerateParams(max_tokens=n)
    res = client.generate_stream(prompt, params) if stream else client.generate(prompt, params)
    expected = oracle.text(prompt, n, speculative=False)
    assert res.text == expected
    assert res.text == oracle.text(prompt, n, speculative=True)  # speculative == plain, also served
    assert res.num_output_tokens == len(oracle.tokens(prompt, n))
    # speculative counters: drafts verified per step = the tree size, accepted <= drafted
    drafts, accepted = res.metrics["total_draft_tokens"], res.metrics["total_accepted_draft_tokens"]
    assert drafts > 0 and drafts % oracle.spec.tree.num_nodes == 0 and 0 <= accepted <= drafts
    assert res.metrics["acceptance_rate"] == pytest.approx(accepted / drafts, rel=1e-5)
    if stream:
        assert len(res.pieces) > 1 and res.ttft_s <= res.latency_s
    if protocol == "grpc":
        client.close()


def test_32_concurrent_streams(server, oracle):
    jobs = [
        (PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)), 6 + (i * 5) % 11, "http" if i % 2 else "grpc")
        for i in range(32)
    ]
    results: dict[int, str] = {}
    errors: list[str] = []
    barrier = threading.Barrier(len(jobs))

    def run(i: int) -> None:
        prompt, n, proto = jobs[i]
        try:
            client = HttpClient(server.http_url) if proto == "http" else GrpcClient(server.grpc_url)
            barrier.wait(timeout=30)
            results[i] = client.generate_stream(prompt, GenerateParams(max_tokens=n)).text
            if proto == "grpc":
                client.close()
        except Exception as exc:
            errors.append(f"{i}: {exc}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert sorted(results) == list(range(32))  # none lost
    for i, (prompt, n, _) in enumerate(jobs):  # none mixed up, all correct
        assert results[i] == oracle.text(prompt, n), (i, prompt, n)


@pytest.mark.parametrize(
    "body, message",
    [
        ({"text_input": "", "max_tokens": 8}, "text_input is empty"),
        ({"text_input": "   ", "max_tokens": 8}, "text_input is empty"),
        ({"text_input": "hi", "max_tokens": 0}, "max_tokens must be >= 1"),
        ({"text_input": "hi", "max_tokens": -3}, "max_tokens must be >= 1"),
        ({"text_input": "hi", "max_tokens": 2_000_000_000}, "exceeds the model's max_seq_len"),
        ({"text_input": "hi", "max_tokens": "eight"}, "Unable to parse"),
        ({"text_input": "hi", "max_tokens": 8, "temperature": "hot"}, "Unable to parse"),
        ({"text_input": "hi", "max_tokens": 8, "beam_width": 4}, "beam_width=4 is not supported"),
        ({"max_tokens": 8}, "text_input"),
    ],
)
def test_bad_requests_get_clear_errors(server, oracle, body, message):
    req = urllib.request.Request(
        f"http://{server.http_url}/v2/models/ensemble/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=30)
    assert 400 <= info.value.code < 600
    assert message in info.value.read().decode()
    # ... and the server keeps serving
    assert HttpClient(server.http_url).generate("abc", GenerateParams(max_tokens=6)).text == oracle.text("abc", 6)


def test_bad_requests_over_grpc_and_stream(server, oracle):
    with GrpcClient(server.grpc_url) as c:
        with pytest.raises(ServerError, match="max_tokens must be >= 1"):
            c.generate_stream("hello", GenerateParams(max_tokens=0))
        assert c.generate_stream("hello", GenerateParams(max_tokens=5)).text == oracle.text("hello", 5)
    with pytest.raises(ServerError, match="text_input is empty"):
        HttpClient(server.http_url, "tensorrt_llm_bls").generate_stream("", GenerateParams(max_tokens=5))
    # a tensor of the wrong type is refused by Triton itself, before any model runs
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    text = grpcclient.InferInput("QUERY", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"hello"]], dtype=object))
    wrong = grpcclient.InferInput("REQUEST_OUTPUT_LEN", [1, 1], "FP32")
    wrong.set_data_from_numpy(np.array([[4.0]], dtype=np.float32))
    c = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match="(?i)data.?type|TYPE_INT32|INT32"):
        c.infer("preprocessing", [text, wrong])
    with GrpcClient(server.grpc_url) as again:
        assert again.generate("hello", GenerateParams(max_tokens=5)).text == oracle.text("hello", 5)
    assert server.is_alive()


def test_server_stops_on_error_and_reports_load_failures(tmp_path):
    """A model that fails to load: a clear error quoting the log, and nothing left running."""
    bad = tmp_path / "repo" / "broken"
    (bad / "1").mkdir(parents=True)
    (bad / "config.pbtxt").write_text(
        'name: "broken"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "x" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    )
    (bad / "1" / "model.py").write_text("raise RuntimeError('deliberately broken model')\n")
    srv = TritonServer(tmp_path / "repo", log_path=tmp_path / "log.txt", startup_timeout_s=60)
    with pytest.raises(UsageError, match="deliberately broken model"):
        srv.start()
    assert srv.proc is None and not srv.is_alive()


def test_bench_acceptance_length_is_the_offline_runtimes(model, tmp_path):
    """`client bench` pools acceptance over requests (all accepted tokens over all steps), as the offline
    runtime and vLLM report it: at concurrency 1 it equals the offline runtime's on the same prompts, exactly
    where the model reports its steps (tensorrt_llm_bls), nearly where steps are inferred from token counts
    (the stock ensemble's outputs). A suffix drafter, whose steps draft less than the most, and prompts
    that differ in acceptance."""
    from trtspec.client.bench import run_bench
    from trtspec.runtime.generate import GenerationConfig, SpecMetrics

    suffix = Oracle(model["target"], "suffix")
    prompts = ["one two three one two three one two", "the cat the cat the", "a b c d e f g", PROMPTS[0]]
    n = 24
    offline = SpecMetrics()
    for p in prompts:
        cfg = GenerationConfig(max_new_tokens=n, eos_token_id=suffix.tok.eos_token_id)
        offline = offline.merge(suffix.gen.generate([suffix.tok.encode(p)], cfg).metrics)
    repo = emit_repository(suffix.spec, "reference", tmp_path / "repo", options={"device": "cpu", "torch_threads": 1})
    params = GenerateParams(max_tokens=n)
    with TritonServer(repo, log_path=tmp_path / "log.txt", startup_timeout_s=120) as srv:
        bls, ens = (
            run_bench(srv.http_url, model=m, prompts=prompts, num_requests=4, params=params) for m in MODELS[::-1]
        )
    per_request = {r.mean_acceptance_length() for r in bls.results}
    assert len(per_request) > 1  # requests differ, so pooling is not the mean of their ratios
    exact, inferred = bls.summary(), ens.summary()
    assert exact["acceptance_length_exact"] and not inferred["acceptance_length_exact"]
    assert exact["mean_acceptance_length"] == pytest.approx(offline.mean_acceptance_length)
    assert inferred["mean_acceptance_length"] == pytest.approx(offline.mean_acceptance_length, rel=0.1)


def test_a_rejected_command_line_is_quoted_without_the_usage(tmp_path):
    """The server refuses one port for HTTP and metrics: the error gives its reason, not its 400-line usage."""
    from trtspec.triton.server import free_ports

    (tmp_path / "repo").mkdir()
    (port,) = free_ports(1)
    srv = TritonServer(tmp_path / "repo", http_port=port, metrics_port=port, log_path=tmp_path / "log.txt")
    with pytest.raises(UsageError, match="cannot listen") as err:
        srv.start()
    assert "Usage:" not in str(err.value) and len(str(err.value).splitlines()) < 6
    assert srv.proc is None


def test_client_cli(server, oracle):
    from click.testing import CliRunner

    from trtspec.cli import main

    r = CliRunner()
    res = r.invoke(main, ["client", "stream", "--url", server.http_url, "--max-tokens", "12", PROMPTS[2]])
    assert res.exit_code == 0, res.output
    assert oracle.text(PROMPTS[2], 12) in res.output and "mean acceptance length" in res.output
    res = r.invoke(
        main,
        [
            "client",
            "generate",
            "--protocol",
            "grpc",
            "--url",
            server.grpc_url,
            "--model",
            "tensorrt_llm_bls",
            "--max-tokens",
            "12",
            PROMPTS[3],
        ],
    )
    assert res.exit_code == 0, res.output
    assert oracle.text(PROMPTS[3], 12) in res.output
    res = r.invoke(
        main, ["client", "bench", "--url", server.http_url, "-c", "1", "-c", "4", "-n", "8", "--max-tokens", "8"]
    )
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("concurrency")]
    assert len(lines) == 2 and all("(0 errors)" in ln and "TTFT p50" in ln for ln in lines)
    out = server.log_path.parent if server.log_path else Path(".")
    res = r.invoke(
        main,
        ["client", "bench", "--url", server.http_url, "--plain-url", server.http_url, "-c", "1", "-c", "2"]
        + ["-n", "2", "--max-tokens", "4", "--json-out", str(out / "sweep.json"), "--plot", str(out / "sweep.png")],
    )
    assert res.exit_code == 0, res.output
    rows = json.loads((out / "sweep.json").read_text())
    assert [(r["label"], r["concurrency"]) for r in rows] == [
        ("speculative", 1),
        ("plain", 1),
        ("speculative", 2),
        ("plain", 2),
    ]
    assert all(r["errors"] == 0 and r["output_tokens_per_s"] > 0 for r in rows)
    assert "concurrency 2: speculative / plain tokens/s =" in res.output
    assert (out / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    res = r.invoke(main, ["client", "generate", "--url", server.http_url, "--max-tokens", "0", "hi"])
    assert res.exit_code == 2 and "max_tokens must be >= 1" in res.output


ECHO_CONFIG = """name: "echo"
backend: "python"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
ECHO_MODEL = """import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x")
                .as_numpy() + 1)]) for r in requests]
"""


def test_a_server_whose_python_stub_dies_is_stopped(tmp_path):
    """Triton neither reaps nor restarts a python stub that died (a segfault seen in a BLS stub under
    concurrent streams): its model fails from then on and decoupled BLS calls hang. The watchdog stops
    such a server and says which model's stub died."""
    import time

    from trtspec.triton.server import python_stubs

    (tmp_path / "repo" / "echo" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "echo" / "config.pbtxt").write_text(ECHO_CONFIG)
    (tmp_path / "repo" / "echo" / "1" / "model.py").write_text(ECHO_MODEL)
    with TritonServer(tmp_path / "repo", log_path=tmp_path / "log.txt", watch_every_s=0.2) as srv:
        stubs = python_stubs(srv.proc.pid)
        assert list(stubs.values()) == ["echo"]
        os.kill(next(iter(stubs)), signal.SIGSEGV)
        deadline = time.monotonic() + 20
        while srv.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not srv.is_alive()
        assert "'echo'" in (srv.failure or "")
    with TritonServer(tmp_path / "repo", log_path=tmp_path / "log2.txt", watch_every_s=0.2) as srv:
        time.sleep(1.0)  # a healthy server is left alone, and a normal stop is not a failure
        assert srv.is_alive() and srv.failure is None
    assert srv.failure is None


def test_serve_command_starts_prints_and_stops_on_ctrl_c(tmp_path):
    """`trtspec serve` in a subprocess, on free ports: ready line with the endpoints, SIGINT stops it, also
    when it was started with SIGINT ignored, as a shell starts a background job (`trtspec serve repo &`).
    (A torch-free echo model keeps this quick; the real repository is served by the fixture.)"""
    import subprocess
    import sys
    import time

    from trtspec.triton.server import free_ports

    (tmp_path / "repo" / "echo" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "echo" / "config.pbtxt").write_text(ECHO_CONFIG)
    (tmp_path / "repo" / "echo" / "1" / "model.py").write_text(ECHO_MODEL)
    hp, gp, mp = free_ports(3)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trtspec.cli",
            "serve",
            str(tmp_path / "repo"),
            "--http-port",
            str(hp),
            "--grpc-port",
            str(gp),
            "--metrics-port",
            str(mp),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        ready = ""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("ready:"):
                ready = line
                break
        assert f"http://127.0.0.1:{hp}" in ready and f"127.0.0.1:{gp}" in ready, ready
        body = json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "INT32", "data": [41]}]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{hp}/v2/models/echo/infer", data=body)
        assert json.loads(urllib.request.urlopen(req, timeout=10).read())["outputs"][0]["data"] == [42]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) in (0, 130)
        assert not _port_open(hp) and not _port_open(gp)  # the server went with it
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_server_is_stopped_when_a_test_fails(tmp_path):
    """A pytest session whose test fails, with the same fixture pattern as this module: the server it started
    is gone when the session ends."""
    import subprocess
    import sys

    repo = tmp_path / "repo"
    (repo / "echo" / "1").mkdir(parents=True)
    (repo / "echo" / "config.pbtxt").write_text(ECHO_CONFIG)
    (repo / "echo" / "1" / "model.py").write_text(ECHO_MODEL)
    pid_file = tmp_path / "pid"
    (tmp_path / "test_inner.py").write_text(f"""
import pytest
from trtspec.triton.server import TritonServer

@pytest.fixture(scope="module")
def server():
    with TritonServer({str(repo)!r}) as s:
        yield s

def test_fails(server):
    open({str(pid_file)!r}, "w").write(str(server.proc.pid))
    assert False, "deliberate failure"
""")
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_inner.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1 and "deliberate failure" in res.stdout, res.stdout[-2000:]
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


def _scrape(server) -> dict[str, float]:
    """The trtspec_* samples of the metrics endpoint: 'name{labels}' -> value."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("trtspec_"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def _wait_metrics(server, done, timeout_s: float = 30.0) -> dict[str, float]:
    """Scrape until ``done(samples)`` (the backend applies metric updates on a thread of its own)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        m = _scrape(server)
        if done(m) or time.monotonic() > deadline:
            return m
        time.sleep(0.2)


M = '{model="tensorrt_llm"}'


def test_prometheus_metrics_on_the_metrics_port(server, oracle):
    before = _scrape(server)
    assert f"trtspec_draft_tokens_total{M}" in before  # registered at load, before any request here
    steps0 = before[f"trtspec_target_steps_total{M}"]
    res = HttpClient(server.http_url).generate_stream(PROMPTS[4], GenerateParams(max_tokens=16))
    assert res.text == oracle.text(PROMPTS[4], 16)
    after = _wait_metrics(
        server, lambda m: m[f"trtspec_target_steps_total{M}"] > steps0 and m[f"trtspec_requests_in_flight{M}"] == 0
    )

    def delta(key: str) -> float:
        return after[key] - before.get(key, 0.0)

    drafted, accepted = delta(f"trtspec_draft_tokens_total{M}"), delta(f"trtspec_accepted_draft_tokens_total{M}")
    spec_steps = delta(f"trtspec_speculative_steps_total{M}")
    assert drafted > 0 and 0 <= accepted <= drafted and spec_steps > 0
    assert drafted == res.metrics["total_draft_tokens"] and accepted == res.metrics["total_accepted_draft_tokens"]
    # one request alone: one acceptance-length sample per speculative step, each = accepted + 1
    assert delta(f"trtspec_acceptance_length_count{M}") == spec_steps
    assert delta(f"trtspec_acceptance_length_sum{M}") == accepted + spec_steps
    for d in (1, 2):  # per depth: accepted / drafted at that depth, over the steps whose tree reached it
        labels = f'{{model="tensorrt_llm",position="{d}"}}'
        hits, n = after[f"trtspec_position_accepted_total{labels}"], after[f"trtspec_position_drafted_total{labels}"]
        assert n > 0 and after[f"trtspec_position_acceptance{labels}"] == pytest.approx(hits / n)
    assert after[f"trtspec_batch_size{M}"] == 1 and after[f"trtspec_speculation_active{M}"] in (0, 1)
    assert after[f"trtspec_draft_depth{M}"] <= oracle.spec.tree.depth


def _disconnect_mid_stream(server, text: str, max_tokens: int) -> int:
    """Open a /generate_stream, read the first event, then drop the connection; returns the events read."""
    import http.client
    import socket

    host, port = server.http_url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body = json.dumps({"text_input": text, "max_tokens": max_tokens, "stream": True})
    conn.request("POST", "/v2/models/ensemble/generate_stream", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    events = 0
    while events < 1:
        line = resp.readline()
        if not line:
            break
        events += line.startswith(b"data:")
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    return events


def _llm_stream_inputs(oracle, text: str, max_tokens: int, perf: bool = False) -> list:
    """The tensors of one streaming request straight to tensorrt_llm (token ids of ``text``)."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    ids = np.array([oracle.tok.encode(text)], dtype=np.int32)
    tensors = {
        "input_ids": ids,
        "input_lengths": np.array([[ids.shape[1]]], np.int32),
        "request_output_len": np.array([[max_tokens]], np.int32),
        "streaming": np.array([[True]], bool),
    }
    if perf:
        tensors["return_perf_metrics"] = np.array([[True]], bool)
    inputs = []
    for name, value in tensors.items():
        t = grpcclient.InferInput(name, list(value.shape), "BOOL" if value.dtype == bool else "INT32")
        t.set_data_from_numpy(value)
        inputs.append(t)
    return inputs


def _cancel_mid_stream(server, oracle, text: str, max_tokens: int) -> int:
    """Stream from tensorrt_llm over gRPC, cancel after the first response (Triton passes a gRPC client's
    cancellation to the model; an HTTP hang-up or a cancel through the ensemble is not passed on, see
    Triton's request_cancellation docs). Returns the responses received before cancelling."""
    import tritonclient.grpc as grpcclient

    got = threading.Event()
    count = [0]

    def callback(result, error):
        count[0] += 1
        got.set()

    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=callback)
    client.async_stream_infer("tensorrt_llm", _llm_stream_inputs(oracle, text, max_tokens))
    got.wait(60)
    client.stop_stream(cancel_requests=True)
    client.close()
    return min(count[0], 1)


def test_faults_mixed_into_32_concurrent_streams(server, oracle):
    """32 concurrent streaming requests, a third of them bad (empty prompt, max_tokens 0 or huge, a wrong
    dtype, a prompt longer than the context, a client that disconnects mid-stream): the good ones equal
    offline greedy decoding, each bad one gets its clear error, and the server serves on."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    def wrong_dtype():  # REQUEST_OUTPUT_LEN must be INT32: Triton itself refuses the request
        c = grpcclient.InferenceServerClient(server.grpc_url)
        text = grpcclient.InferInput("QUERY", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"hello"]], dtype=object))
        n = grpcclient.InferInput("REQUEST_OUTPUT_LEN", [1, 1], "FP32")
        n.set_data_from_numpy(np.array([[4.0]], dtype=np.float32))
        return c.infer("preprocessing", [text, n])

    too_long = "x" * 600  # the tiny model's max_seq_len is 512 (one token per character)
    bad = {
        3: (
            lambda: HttpClient(server.http_url).generate_stream("", GenerateParams(max_tokens=8)),
            "text_input is empty",
        ),
        7: (
            lambda: HttpClient(server.http_url).generate_stream("hi", GenerateParams(max_tokens=0)),
            "max_tokens must be >= 1",
        ),
        11: (
            lambda: GrpcClient(server.grpc_url).generate_stream("hi", GenerateParams(max_tokens=2_000_000_000)),
            "exceeds the model's max_seq_len",
        ),
        15: (wrong_dtype, "(?i)data.?type|TYPE_INT32|INT32"),
        19: (
            lambda: HttpClient(server.http_url).generate_stream(too_long, GenerateParams(max_tokens=4)),
            "shorten it to at most 511 tokens",
        ),
        23: (lambda: _disconnect_mid_stream(server, PROMPTS[2], 60), None),
        27: (lambda: _cancel_mid_stream(server, oracle, PROMPTS[5], 400), None),
    }
    results: dict[int, object] = {}
    errors: dict[int, str] = {}
    barrier = threading.Barrier(32)
    cancelled = '{model="tensorrt_llm",reason="cancelled"}'
    cancelled0 = _scrape(server)[f"trtspec_requests_total{cancelled}"]

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            if i in bad:
                results[i] = bad[i][0]()
            else:
                client = HttpClient(server.http_url) if i % 2 else GrpcClient(server.grpc_url)
                results[i] = client.generate_stream(
                    PROMPTS[i % len(PROMPTS)], GenerateParams(max_tokens=6 + i % 9)
                ).text
        except Exception as exc:
            errors[i] = f"{exc.__class__.__name__}: {exc}"

    threads = [threading.Thread(target=run, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    import re

    for i in range(32):
        if i in bad and bad[i][1] is not None:
            assert i in errors and re.search(bad[i][1], errors[i]), (i, errors.get(i), results.get(i))
        elif i in bad:
            assert results.get(i) == 1, (i, errors.get(i))  # read one event, then hung up
        else:
            assert i not in errors, (i, errors[i])
            assert results[i] == oracle.text(PROMPTS[i % len(PROMPTS)], 6 + i % 9), i
    assert server.is_alive()
    # the cancelled stream left its slot at once (not after its 400 tokens); the HTTP client that hung up is
    # not told to the model by Triton, so it runs to its 60 tokens: then nothing is in flight
    m = _wait_metrics(server, lambda m: m[f"trtspec_requests_in_flight{M}"] == 0, timeout_s=60)
    assert m[f"trtspec_requests_in_flight{M}"] == 0
    assert m[f"trtspec_requests_total{cancelled}"] - cancelled0 == 1
    assert HttpClient(server.http_url).generate("abc", GenerateParams(max_tokens=6)).text == oracle.text("abc", 6)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_per_request_acceptance_comes_with_the_response(server, oracle, protocol):
    """tensorrt_llm_bls passes on the reference runtime's per-request steps and acceptance histogram: tokens
    per step and per-position acceptance of this request, not a server-wide average."""
    from trtspec.client.common import per_position_acceptance

    client = (
        HttpClient(server.http_url, "tensorrt_llm_bls")
        if protocol == "http"
        else GrpcClient(server.grpc_url, "tensorrt_llm_bls")
    )
    res = client.generate_stream(PROMPTS[6], GenerateParams(max_tokens=24))
    assert res.text == oracle.text(PROMPTS[6], 24)
    m = res.metrics
    hist, steps = m["trtspec_acceptance_histogram"], m["trtspec_target_steps"]
    assert sum(hist) == steps > 0
    assert sum(a * n for a, n in enumerate(hist)) == m["total_accepted_draft_tokens"]
    assert res.mean_acceptance_length() == pytest.approx(1 + m["total_accepted_draft_tokens"] / steps)
    pos = per_position_acceptance(hist)
    assert all(1 >= a >= b >= 0 for a, b in zip(pos, pos[1:]))
    if protocol == "grpc":
        client.close()


def _stream_one_output(url: str, model: str, inputs: list, output: str, timeout_s: float = 120.0) -> list:
    """Stream one request over gRPC asking for ``output`` only; its value from every response, in order."""
    import queue

    import tritonclient.grpc as grpcclient

    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        client.async_stream_infer(
            model, inputs, outputs=[grpcclient.InferRequestedOutput(output)], enable_empty_final_response=True
        )
        values = []
        while True:
            result, error = got.get(timeout=timeout_s)
            if error is not None:
                raise ServerError(str(error))
            value = result.as_numpy(output)
            if value is not None:
                values.append(value)
            if result.get_response().parameters["triton_final_response"].bool_param:
                return values
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize("model_name", ["tensorrt_llm", "tensorrt_llm_bls"])
def test_streams_asking_for_one_output_leave_the_stub_alive(server, oracle, model_name):
    """Rounds of 32 concurrent streams straight to a python model, asking for one output while requesting
    perf metrics: the model sends only what was asked (the stub would drop the rest without the GIL; before
    the fix this crashed the tensorrt_llm stub in 2 of 3 runs of 36 rounds), every stream equals
    offline greedy decoding, and the server stays up."""

    from trtspec.client.grpc import build_inputs

    def inputs(prompt: str, n: int) -> list:
        if model_name == "tensorrt_llm_bls":
            return build_inputs(GenerateParams(max_tokens=n).fields(prompt, True))
        return _llm_stream_inputs(oracle, prompt, n, perf=True)

    output = "text_output" if model_name == "tensorrt_llm_bls" else "output_ids"
    jobs = [(PROMPTS[i % len(PROMPTS)], 8 + i % 13) for i in range(32)]
    for round_ in range(12):
        results: dict[int, list] = {}
        errors: list[str] = []

        def run(i: int) -> None:
            prompt, n = jobs[i]
            try:
                results[i] = _stream_one_output(server.grpc_url, model_name, inputs(prompt, n), output)
            except Exception as exc:
                errors.append(f"{i}: {exc}")

        threads = [threading.Thread(target=run, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=180)
        assert not errors, (round_, errors[:3])
        assert server.proc.poll() is None, f"the server died in round {round_}"
        for i, (prompt, n) in enumerate(jobs):
            if model_name == "tensorrt_llm_bls":
                text = "".join(v.reshape(-1)[0].decode("utf-8") for v in results[i])
                assert text == oracle.text(prompt, n), (round_, i)
            else:
                tokens = [int(t) for v in results[i] for t in v.reshape(-1)]
                assert tuple(tokens) == oracle.tokens(prompt, n), (round_, i)
