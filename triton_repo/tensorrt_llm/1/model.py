"""Triton python-backend model `tensorrt_llm` for trtspec's `reference` runtime.

Same tensors as TensorRT-LLM's tensorrtllm backend (see config.pbtxt), served by trtspec's PyTorch
reference runtime on CPU or GPU. Decoupled (decoupled_mode true): a streaming request gets one response per
target step with the tokens committed in that step; a non-streaming request gets one response with all of
them. Not decoupled: execute answers every request of the batch with one response, so plain unary requests
(HTTP /infer, /generate) work. With return_perf_metrics each response carries the perf outputs the C++
backend sends (KV-cache block counts, timestamps, speculative counters so far); with
return_num_input_tokens / return_num_output_tokens the token counts. batch_index and sequence_index are
always sent, as the C++ backend does.

The heavy lifting is in trtspec.triton.reference_backend (no Triton imports, tested in-process); this file
only converts tensors to requests and replies to responses, and turns bad requests into clear errors.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

UNSUPPORTED_FLAGS = ("return_log_probs", "return_context_logits", "return_generation_logits")
PENALTIES = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


def _param(cfg, key, default=""):
    value = cfg.get("parameters", {}).get(key, {}).get("string_value", default)
    return default if value.startswith("${") else value


def _get(request, name):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy()


def _scalar(request, name, default=None, cast=float):
    arr = _get(request, name)
    if arr is None or arr.size == 0:
        return default
    return cast(arr.reshape(-1)[0])


def requested_only(tensors, wanted):
    """The tensors the request asked for (all of them when it names none).

    Why not send the rest and let Triton drop them: the stub's ``ResponseSender.send`` releases the GIL and
    then prunes the outputs the request did not ask for (python_backend ``src/response_sender.cc``,
    ``PruneOutputTensors``), so a pruned tensor's numpy array is freed on the sending thread without the
    GIL. Under concurrent streams that corrupted the stub's heap (``malloc(): unaligned tcache chunk``,
    or a segfault in pymalloc) within a dozen rounds of 32 streams asking for output_ids with perf metrics.
    """
    if not wanted:
        return tensors
    return [t for t in tensors if t.name() in wanted]


class _Metrics:
    """Prometheus metrics on Triton's metrics port (custom metric families of the python backend): the
    updates come from trtspec.triton.metrics, and are applied on a thread of their own (each one is an IPC
    round trip to the server; the decoding loop never waits for them)."""

    def __init__(self, model_name, max_depth):
        import queue
        import threading

        from trtspec.triton.metrics import COUNTER, FAMILIES, GAUGE, StepMetrics

        kinds = {
            COUNTER: pb_utils.MetricFamily.COUNTER,
            GAUGE: pb_utils.MetricFamily.GAUGE,
            "histogram": pb_utils.MetricFamily.HISTOGRAM,
        }
        self.step_metrics = StepMetrics(model_name, max_depth)
        self.families = {
            f.name: pb_utils.MetricFamily(name=f.name, description=f.description, kind=kinds[f.kind]) for f in FAMILIES
        }
        self.kinds = {f.name: f.kind for f in FAMILIES}
        self.metrics = {}
        self.backend = None
        self.queue = queue.Queue()
        # the metrics exist (at 0) from the start, so a scrape before the first request finds them
        for name in self.kinds:
            if name.startswith("trtspec_position"):
                for d in range(1, max_depth + 1):
                    self._metric(name, (("model", model_name), ("position", str(d))))
            elif name == "trtspec_requests_total":
                for reason in ("cancelled", "failed", "finished"):
                    self._metric(name, (("model", model_name), ("reason", reason)))
            else:
                self._metric(name, (("model", model_name),))
        self.thread = threading.Thread(target=self._apply_forever, name="trtspec-metrics", daemon=True)
        self.thread.start()

    def _metric(self, name, labels):
        key = (name, labels)
        if key not in self.metrics:
            extra = {"buckets": self.step_metrics.buckets()} if self.kinds[name] == "histogram" else {}
            self.metrics[key] = self.families[name].Metric(labels=dict(labels), **extra)
        return self.metrics[key]

    def on_step(self, info, outputs):
        """Called by the worker after every target step (cheap: the updates are applied elsewhere)."""
        accepted = [o.accepted for o in outputs if o.accepted is not None]
        in_flight = self.backend.in_flight if self.backend is not None else info.batch_size
        self.queue.put(self.step_metrics.step(info.batch_size, info.draft_nodes, info.draft_depth, accepted, in_flight))

    def on_finish(self, reply, reason):
        """Called by the worker when a request leaves its slot (finished, cancelled or failed)."""
        in_flight = self.backend.in_flight if self.backend is not None else 0
        self.queue.put(self.step_metrics.finished(reason, in_flight))

    def _apply_forever(self):
        while True:
            updates = self.queue.get()
            if updates is None:
                return
            for u in updates:
                try:
                    metric = self._metric(u.family, u.labels)
                    getattr(metric, u.op)(u.value)
                except Exception as exc:  # a metric must never take serving down
                    print(f"tensorrt_llm (reference): metric {u.family} not updated: {exc}")

    def close(self):
        """Stop applying updates, then drop the metric objects while the stub's shared memory is still
        there: left to interpreter shutdown, a MetricFamily's destructor writes to freed shared memory
        (a segfault and a core file at every server stop)."""
        self.queue.put(None)
        self.thread.join(timeout=5)
        self.metrics.clear()
        self.families.clear()


class TritonPythonModel:
    def initialize(self, args):
        import torch

        from trtspec.load import load_spec_model
        from trtspec.runtime.batch_policy import default_schedule, parse_schedule
        from trtspec.runtime.generate import SpeculativeGenerator
        from trtspec.triton.reference_backend import ReferenceBackend, parse_bool, serving_compute

        cfg = json.loads(args["model_config"])
        self.model_config = cfg
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(cfg)
        target = _param(cfg, "trtspec_target_dir")
        heads = _param(cfg, "trtspec_heads_dir") or None
        also = _param(cfg, "trtspec_also_draft") or None
        kind = _param(cfg, "trtspec_drafter_kind") or None
        tree = _param(cfg, "trtspec_tree_choices") or None
        dtype = _param(cfg, "trtspec_dtype") or None
        device = _param(cfg, "trtspec_device", "auto") or "auto"
        threads = int(_param(cfg, "trtspec_torch_threads", "0") or 0)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda"):
            ids = _param(cfg, "gpu_device_ids")
            if ids and device == "cuda":
                device = f"cuda:{ids.split(',')[0].strip()}"
        choice = serving_compute(dtype, device, threads, echo=lambda line: print(f"tensorrt_llm (reference): {line}"))
        spec = load_spec_model(
            target,
            heads,
            heads_format=kind if heads else None,
            tree=tree if heads else None,
            dtype=choice.dtype,
            also_draft=also if heads else None,
        )
        self.generator = SpeculativeGenerator(spec, device=device, dtype=choice.dtype)
        self.max_seq_len = int(_param(cfg, "max_seq_len", "0") or 0) or spec.target.arch.max_position_embeddings
        self.default_exclude_input = parse_bool(_param(cfg, "exclude_input_in_output", "true"), True)
        eos = spec.target.arch.eos_token_id
        self.default_end_id = eos if isinstance(eos, int) else (eos[0] if eos else None)
        speculative = parse_bool(_param(cfg, "trtspec_speculative", "true"), True)
        adaptive = parse_bool(_param(cfg, "trtspec_adaptive", "false"), False)
        window_ms = float(_param(cfg, "trtspec_batch_window_ms", "0") or 0)
        depth = self.generator.tree.max_depth if self.generator.drafter is not None and speculative else 0
        schedule_text = _param(cfg, "trtspec_draft_len_schedule")
        schedule = parse_schedule(schedule_text, depth) if schedule_text else default_schedule(depth)
        self.metrics = _Metrics(args.get("model_name", "tensorrt_llm"), depth)
        self.backend = ReferenceBackend(
            self.generator,
            speculative=speculative,
            adaptive=adaptive,
            max_batch_size=max(1, int(cfg.get("max_batch_size", 1) or 1)),
            batch_window_s=window_ms / 1000.0,
            schedule=schedule,
            max_seq_len=self.max_seq_len,
            on_step=self.metrics.on_step,
            on_finish=self.metrics.on_finish,
        )
        self.metrics.backend = self.backend
        self.perf_outputs = {o["name"] for o in cfg.get("output", [])}
        # KV-cache block size for the perf outputs: trtllm-build's --tokens_per_block default
        self.tokens_per_block = 32

    # request -> GenRequest -----------------------------------------------------------------------
    def _parse(self, request, sender):
        from trtspec.triton.reference_backend import GenRequest

        ids = _get(request, "input_ids")
        if ids is None:
            raise ValueError("input_ids is required")
        ids = ids.reshape(ids.shape[0], -1) if ids.ndim > 1 else ids.reshape(1, -1)
        if ids.shape[0] != 1:
            raise ValueError(
                f"one sequence per request, got a batch of {ids.shape[0]}: send them as separate "
                f"requests (they are batched on the server)"
            )
        n_in = _scalar(request, "input_lengths", ids.shape[1], int)
        if not 1 <= n_in <= ids.shape[1]:
            raise ValueError(f"input_lengths {n_in} does not fit input_ids of length {ids.shape[1]}")
        prompt = [int(x) for x in ids[0, :n_in]]
        max_new = _scalar(request, "request_output_len", None, int)
        if max_new is None or max_new <= 0:
            raise ValueError(f"request_output_len (max_tokens) must be >= 1, got {max_new}")
        if n_in >= self.max_seq_len:
            raise ValueError(
                f"the prompt ({n_in} tokens) does not fit max_seq_len {self.max_seq_len}: "
                f"shorten it to at most {self.max_seq_len - 1} tokens"
            )
        if n_in + max_new > self.max_seq_len:
            raise ValueError(
                f"prompt ({n_in} tokens) + max_tokens ({max_new}) exceeds max_seq_len "
                f"{self.max_seq_len}: lower max_tokens to at most {max(self.max_seq_len - n_in, 0)}"
            )
        for name, limit in (("beam_width", 1), ("num_return_sequences", 1)):
            v = _scalar(request, name, 1, int)
            if v > limit:
                raise ValueError(f"{name}={v} is not supported by the reference runtime (use 1)")
        for name in UNSUPPORTED_FLAGS:
            if _scalar(request, name, False, bool):
                raise ValueError(f"{name} is not supported by the reference runtime")
        for name, neutral in PENALTIES.items():
            v = _scalar(request, name, neutral, float)
            if abs(v - neutral) > 1e-6:
                raise ValueError(f"{name}={v} is not supported by the reference runtime (use {neutral})")
        if _scalar(request, "min_tokens", 0, int) > 1:
            raise ValueError("min_tokens is not supported by the reference runtime")
        # draft_input_ids (a separate draft model, driven by tensorrt_llm_bls) are accepted: the target's
        # greedy output does not depend on which tokens were proposed, so the reference decodes on its own
        bad = _get(request, "bad_words_list")
        if bad is not None and bad.size and (bad.reshape(-1, 2, bad.shape[-1])[0, 1] > 0).any():
            raise ValueError("bad_words is not supported by the reference runtime")
        stops = []
        sw = _get(request, "stop_words_list")
        if sw is not None and sw.size:
            sw = sw.reshape(-1, 2, sw.shape[-1])[0]
            start = 0
            for end in sw[1]:
                if end < 0:
                    break
                stops.append([int(t) for t in sw[0, start:end]])
                start = int(end)
        temperature = _scalar(request, "temperature", 0.0, float)
        top_k = _scalar(request, "runtime_top_k", 0, int)
        top_p = _scalar(request, "runtime_top_p", 1.0, float)
        if temperature < 0 or not 0 < top_p <= 1 or top_k < 0:
            raise ValueError(f"bad sampling parameters temperature={temperature} top_k={top_k} top_p={top_p}")
        if top_k == 1:
            temperature = 0.0  # top-1 sampling is greedy
        end_id = _scalar(request, "end_id", self.default_end_id, int)
        if end_id is not None and end_id < 0:
            end_id = None
        self_exclude = _scalar(request, "exclude_input_in_output", self.default_exclude_input, bool)
        streaming = _scalar(request, "streaming", False, bool)
        perf = _scalar(request, "return_perf_metrics", False, bool)
        state = {
            "prompt": prompt,
            "exclude": self_exclude or streaming,
            "perf": perf,
            "n_in": _scalar(request, "return_num_input_tokens", False, bool),
            "n_out": _scalar(request, "return_num_output_tokens", False, bool),
            "block": self.tokens_per_block,
            "wanted": set(request.requested_output_names()),
        }
        req = GenRequest(
            prompt=prompt,
            max_new_tokens=max_new,
            streaming=streaming,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=_scalar(request, "seed", 0, int),
            end_id=end_id,
            stop_sequences=stops,
            emit=lambda reply: self._send(sender, reply, state),
            cancelled=getattr(sender, "is_cancelled", lambda: False),
        )
        req.state = state  # the unary path builds its response from it
        return req

    # Reply -> response ---------------------------------------------------------------------------
    def _response(self, reply, state):
        """The InferenceResponse for one Reply (tensors [1, ...]: a batch of one, as the C++ backend sends)."""
        if reply.error:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(reply.error))
        tokens = reply.tokens if state["exclude"] else state["prompt"] + reply.tokens
        out = [
            pb_utils.Tensor("output_ids", np.array(tokens, np.int32).reshape(1, 1, -1)),
            pb_utils.Tensor("sequence_length", np.array([[len(tokens)]], np.int32)),
            pb_utils.Tensor("batch_index", np.array([[0]], np.int32)),
            pb_utils.Tensor("sequence_index", np.array([[0]], np.int32)),
        ]
        if state["perf"]:
            # the reference runtime keeps no paged KV cache: report the blocks a paged cache of
            # tokens_per_block would hold for this sequence, none of them reused
            blocks = -(-(len(state["prompt"]) + reply.num_output_tokens) // state["block"])
            i32 = {
                "kv_cache_alloc_new_blocks": blocks,
                "kv_cache_reused_blocks": 0,
                "kv_cache_alloc_total_blocks": blocks,
                "total_accepted_draft_tokens": reply.accepted_draft_tokens,
                "total_draft_tokens": reply.draft_tokens,
            }
            i64 = {
                "arrival_time_ns": reply.arrival_ns,
                "first_scheduled_time_ns": reply.scheduled_ns,
                "first_token_time_ns": reply.first_token_ns,
                "last_token_time_ns": reply.last_token_ns,
            }
            out += [pb_utils.Tensor(k, np.array([[v]], np.int32)) for k, v in i32.items()]
            out += [pb_utils.Tensor(k, np.array([[v]], np.int64)) for k, v in i64.items()]
            out.append(pb_utils.Tensor("acceptance_rate", np.array([[reply.acceptance_rate]], np.float32)))
            # per request: tokens per step = 1 + accepted / steps; per-position acceptance from the histogram
            out.append(pb_utils.Tensor("trtspec_target_steps", np.array([[reply.target_steps]], np.int32)))
            hist = reply.acceptance_histogram or [0]
            out.append(pb_utils.Tensor("trtspec_acceptance_histogram", np.array([hist], np.int32)))
        if state["n_in"]:
            out.append(pb_utils.Tensor("num_input_tokens", np.array([[len(state["prompt"])]], np.int32)))
        if state["n_out"]:
            out.append(pb_utils.Tensor("num_output_tokens", np.array([[reply.num_output_tokens]], np.int32)))
        return pb_utils.InferenceResponse(requested_only(out, state["wanted"]))

    def _send(self, sender, reply, state):
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if reply.final else 0
        if reply.final and not reply.tokens and state.get("sent") and not reply.error:
            sender.send(flags=flags)  # streaming: everything was sent already
            return
        state["sent"] = True
        sender.send(self._response(reply, state), flags=flags)

    def execute(self, requests):
        if not self.decoupled:
            return self._execute_unary(requests)
        for request in requests:
            sender = request.get_response_sender()
            try:
                if _scalar(request, "stop", False, bool):
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    continue
                self.backend.submit(self._parse(request, sender))
            except Exception as exc:
                sender.send(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(f"tensorrt_llm: {exc}")),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
        return None

    def _execute_unary(self, requests):
        """Not decoupled: one response per request, returned from execute (requests still batch together)."""
        import threading

        class _Collect:  # stands in for a response sender: keeps the final reply of a non-streaming run
            def __init__(self):
                self.done = threading.Event()
                self.reply = None

        slots, responses = [], [None] * len(requests)
        for i, request in enumerate(requests):
            try:
                if _scalar(request, "streaming", False, bool):
                    raise ValueError("streaming needs the decoupled model (emit with --decoupled)")
                slot = _Collect()
                gen = self._parse(request, slot)

                def emit(reply, slot=slot):
                    if reply.final:
                        slot.reply = reply
                        slot.done.set()

                gen.emit = emit
                slots.append((i, slot, gen))
            except Exception as exc:
                responses[i] = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"tensorrt_llm: {exc}"))
        for _, _, gen in slots:
            self.backend.submit(gen)
        for i, slot, gen in slots:
            slot.done.wait()
            responses[i] = self._response(slot.reply, gen.state)
        return responses

    def finalize(self):
        backend = getattr(self, "backend", None)
        if backend is not None:
            backend.close()
        metrics = getattr(self, "metrics", None)
        if metrics is not None:
            metrics.close()
