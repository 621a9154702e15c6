"""Triton python-backend model `tensorrt_llm_bls`: text in, text out, driven from Python.

Calls `preprocessing`, then `tensorrt_llm` (streaming or not), then `postprocessing`, like the ensemble, but
with accumulate_tokens=true it decodes all tokens so far at every step and sends only the new text:
concatenated stream pieces then equal the decoded full output exactly, even for tokenizers whose pieces do
not decode independently (SentencePiece spaces, UTF-8 characters split across tokens).

With `tensorrt_llm_draft_model_name` set (draft-model deployments) and a request's `num_draft_tokens` > 0,
it runs draft-target speculative decoding the way TensorRT-LLM's BLS does: the draft model proposes
num_draft_tokens greedily, the target verifies them in one request (`draft_input_ids`) and returns the
accepted tokens plus one of its own, until max_tokens or the end token.

Works decoupled (one response per piece) or not (one response per request), like upstream's BLS, and
answers every request with batch_index / sequence_index and the perf outputs the target sends.
Self-contained (numpy only) so it also runs in NVIDIA's TensorRT-LLM container. Each decoupled request runs
on its own thread so one instance serves many concurrent streams.
"""

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

# ensemble-style input name -> preprocessing input
PRE_INPUTS = {
    "text_input": "QUERY",
    "max_tokens": "REQUEST_OUTPUT_LEN",
    "bad_words": "BAD_WORDS_DICT",
    "stop_words": "STOP_WORDS_DICT",
    "end_id": "END_ID",
    "pad_id": "PAD_ID",
    "decoder_text_input": "DECODER_QUERY",
    "embedding_bias_words": "EMBEDDING_BIAS_WORDS",
    "embedding_bias_weights": "EMBEDDING_BIAS_WEIGHTS",
    "prompt_table_extra_id": "PROMPT_TABLE_EXTRA_ID",
    "image_bytes_input": "IMAGE_BYTES",
    "image_url_input": "IMAGE_URL",
    "video_bytes_input": "VIDEO_BYTES",
}
# ensemble-style input name -> tensorrt_llm input
LLM_INPUTS = {
    "exclude_input_in_output": "exclude_input_in_output",
    "top_k": "runtime_top_k",
    "top_p": "runtime_top_p",
    "temperature": "temperature",
    "length_penalty": "len_penalty",
    "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_tokens",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
    "return_log_probs": "return_log_probs",
    "return_context_logits": "return_context_logits",
    "return_generation_logits": "return_generation_logits",
    "return_perf_metrics": "return_perf_metrics",
    "return_num_input_tokens": "return_num_input_tokens",
    "return_num_output_tokens": "return_num_output_tokens",
    "num_return_sequences": "num_return_sequences",
    "beam_width": "beam_width",
    "stream": "streaming",
    "prompt_embedding_table": "prompt_embedding_table",
    "prompt_vocab_size": "prompt_vocab_size",
    "lora_task_id": "lora_task_id",
    "lora_weights": "lora_weights",
    "lora_config": "lora_config",
    "guided_decoding_guide_type": "guided_decoding_guide_type",
    "guided_decoding_guide": "guided_decoding_guide",
}
PRE_TO_LLM = {
    "INPUT_ID": "input_ids",
    "REQUEST_INPUT_LEN": "input_lengths",
    "REQUEST_OUTPUT_LEN": "request_output_len",
    "OUT_END_ID": "end_id",
    "OUT_PAD_ID": "pad_id",
    "STOP_WORDS_IDS": "stop_words_list",
    "BAD_WORDS_IDS": "bad_words_list",
}
PERF = (
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
PASS_THROUGH = (
    *PERF,
    "num_input_tokens",
    "num_output_tokens",
    "trtspec_target_steps",
    "trtspec_acceptance_histogram",
    "cum_log_probs",
    "output_log_probs",
    "batch_index",
    "sequence_index",
    "context_logits",
    "generation_logits",
)


def _param(cfg, key, default=""):
    value = cfg.get("parameters", {}).get(key, {}).get("string_value", default)
    return default if value.startswith("${") else value


def _scalar(request, name, default):
    t = pb_utils.get_input_tensor_by_name(request, name)
    if t is None or t.as_numpy().size == 0:
        return default
    return t.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        self.accumulate = _param(cfg, "accumulate_tokens", "true").lower() in ("1", "true", "yes")
        self.llm_name = _param(cfg, "tensorrt_llm_model_name", "tensorrt_llm") or "tensorrt_llm"
        self.draft_name = _param(cfg, "tensorrt_llm_draft_model_name") or None
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(cfg)
        self.threads = set()
        self.lock = threading.Lock()

    def execute(self, requests):
        if not self.decoupled:
            return [self._run_sync(r) for r in requests]
        for request in requests:
            sender = request.get_response_sender()
            t = threading.Thread(target=self._run_async, args=(request, sender), daemon=True)
            with self.lock:
                self.threads.add(t)
            t.start()
        return None

    # --------------------------------------------------------------------------------------------
    def _run_async(self, request, sender):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            last = None
            for response in self._generate(request):
                if last is not None:
                    sender.send(last)
                last = response
            sender.send(last, flags=final) if last is not None else sender.send(flags=final)
        except Exception as exc:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))), flags=final)
        finally:
            with self.lock:
                self.threads.discard(threading.current_thread())

    def _run_sync(self, request):
        try:
            if bool(_scalar(request, "stream", False)):
                raise ValueError("stream=true needs the decoupled model (emit with --decoupled)")
            return list(self._generate(request))[-1]
        except Exception as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))

    def _call(self, model, inputs, outputs):
        """One request to another model; yields its responses (a decoupled model may send several)."""
        req = pb_utils.InferenceRequest(model_name=model, inputs=inputs, requested_output_names=outputs)
        for resp in req.exec(decoupled=True):
            if resp.has_error():
                raise RuntimeError(resp.error().message())
            yield resp

    def _call_single(self, model, inputs, outputs):
        """One request to a model that is not decoupled (preprocessing, postprocessing), as upstream's BLS
        calls them. Not through the decoupled path: Triton 2.51's stub builds a decoupled BLS response's
        tensors on its own thread without the GIL (Stub::ProcessBLSResponseDecoupled), which corrupts the
        Python heap while request threads run here (seen: a segfault in pymalloc under 32 streams); a
        response to a plain exec is built on the calling thread."""
        resp = pb_utils.InferenceRequest(model_name=model, inputs=inputs, requested_output_names=outputs).exec()
        if resp.has_error():
            raise RuntimeError(resp.error().message())
        return resp

    def _call_one(self, model, inputs, outputs):
        """The one response of a non-streaming request (a decoupled model ends with an empty final one)."""
        found = None
        for resp in self._call(model, inputs, outputs):
            if resp.output_tensors():
                found = resp
        if found is None:
            raise RuntimeError(f"{model} sent no response")
        return found

    def _detok(self, tokens):
        resp = self._call_single(
            "postprocessing",
            [
                pb_utils.Tensor("TOKENS_BATCH", np.array(tokens, np.int32).reshape(1, 1, -1)),
                pb_utils.Tensor("SEQUENCE_LENGTH", np.array([[len(tokens)]], np.int32)),
            ],
            ["OUTPUT"],
        )
        out = pb_utils.get_output_tensor_by_name(resp, "OUTPUT").as_numpy().reshape(-1)[0]
        return out.decode("utf-8", errors="replace") if isinstance(out, bytes) else str(out)

    def _generate(self, request):
        """Yield the outer responses (streaming: text pieces; otherwise one response with the whole text)."""
        pre_in = []
        for outer, inner in PRE_INPUTS.items():
            t = pb_utils.get_input_tensor_by_name(request, outer)
            if t is not None:
                pre_in.append(pb_utils.Tensor(inner, t.as_numpy()))
        pre = self._call_single("preprocessing", pre_in, list(PRE_TO_LLM))
        pre_out = {inner: pb_utils.get_output_tensor_by_name(pre, inner).as_numpy() for inner in PRE_TO_LLM}
        llm_in = [pb_utils.Tensor(llm, pre_out[inner]) for inner, llm in PRE_TO_LLM.items()]
        stream = bool(_scalar(request, "stream", False))
        wanted = set(request.requested_output_names())
        for outer, inner in LLM_INPUTS.items():
            t = pb_utils.get_input_tensor_by_name(request, outer)
            if t is not None:
                arr = t.as_numpy()
                llm_in.append(pb_utils.Tensor(inner, arr.reshape(arr.shape[0], 1) if arr.ndim == 1 else arr))
        num_draft = int(_scalar(request, "num_draft_tokens", 0))
        if num_draft > 0 and self.draft_name is None:
            raise ValueError("num_draft_tokens needs a draft model (tensorrt_llm_draft_model_name is not set)")
        if num_draft > 0:
            chunks = self._speculate(pre_out, llm_in, num_draft, request)
        else:
            chunks = self._plain(llm_in, [n for n in PASS_THROUGH if not wanted or n in wanted])
        tokens, emitted, extra = [], "", []
        for chunk, extra in chunks:
            if not stream:
                tokens.extend(chunk)
                continue
            if self.accumulate:
                tokens.extend(chunk)
                text = self._detok(tokens)
                if text.endswith("\ufffd"):  # an incomplete UTF-8 character: wait for its next token
                    piece = ""
                else:
                    piece, emitted = text[len(emitted) :], text
            else:
                piece = self._detok(chunk)
            yield self._text_response(piece, extra, wanted)
        if not stream:
            yield self._text_response(self._detok(tokens), extra, wanted)

    def _plain(self, llm_in, passed):
        """(tokens, pass-through tensors) per response of the target. Only the pass-through outputs the
        request asked for (``passed``) are asked of the target: Triton 2.51's stub builds each tensor of a
        decoupled BLS response without the GIL (see ``_call_single``), so fewer tensors, fewer chances."""
        for resp in self._call(self.llm_name, llm_in, ["output_ids", "sequence_length", *passed]):
            ids_t = pb_utils.get_output_tensor_by_name(resp, "output_ids")
            if ids_t is None:  # the empty final response of a decoupled model
                continue
            n = int(pb_utils.get_output_tensor_by_name(resp, "sequence_length").as_numpy().reshape(-1)[0])
            extra = [
                pb_utils.Tensor(name, pb_utils.get_output_tensor_by_name(resp, name).as_numpy())
                for name in passed
                if pb_utils.get_output_tensor_by_name(resp, name) is not None
            ]
            yield ids_t.as_numpy().reshape(-1)[:n].tolist(), extra

    def _speculate(self, pre_out, llm_in, num_draft, request):
        """Draft-target loop: (accepted tokens, perf tensors) per verification step."""
        n_in = int(pre_out["REQUEST_INPUT_LEN"].reshape(-1)[0])
        prompt = pre_out["INPUT_ID"].reshape(-1)[:n_in].tolist()
        max_new = int(pre_out["REQUEST_OUTPUT_LEN"].reshape(-1)[0])
        end_id = int(pre_out["OUT_END_ID"].reshape(-1)[0])
        # per-request options for the target (sampling, perf flags), minus what the loop sets itself
        fixed = {"input_ids", "input_lengths", "request_output_len", "streaming", "exclude_input_in_output"}
        options = [t for t in llm_in if t.name() not in fixed]
        perf = bool(_scalar(request, "return_perf_metrics", False))
        arrival = time.time_ns()
        first_token_ns = 0
        generated, drafted, accepted = [], 0, 0

        def inputs(seq, n_out):
            return [
                pb_utils.Tensor("input_ids", np.array([seq], np.int32)),
                pb_utils.Tensor("input_lengths", np.array([[len(seq)]], np.int32)),
                pb_utils.Tensor("request_output_len", np.array([[n_out]], np.int32)),
                pb_utils.Tensor("streaming", np.array([[False]], bool)),
                pb_utils.Tensor("exclude_input_in_output", np.array([[True]], bool)),
            ]

        def tokens_of(resp):
            n = int(pb_utils.get_output_tensor_by_name(resp, "sequence_length").as_numpy().reshape(-1)[0])
            return pb_utils.get_output_tensor_by_name(resp, "output_ids").as_numpy().reshape(-1)[:n].tolist()

        while len(generated) < max_new:
            seq = prompt + generated
            remaining = max_new - len(generated)
            draft = []
            if remaining > 1:
                end = [t for t in options if t.name() in ("end_id", "pad_id")]
                d = self._call_one(
                    self.draft_name, inputs(seq, min(num_draft, remaining - 1)) + end, ["output_ids", "sequence_length"]
                )
                draft = tokens_of(d)
            verify = inputs(seq, len(draft) + 1) + options
            if draft:
                verify.append(pb_utils.Tensor("draft_input_ids", np.array([draft], np.int32)))
            new = tokens_of(self._call_one(self.llm_name, verify, ["output_ids", "sequence_length"]))[:remaining]
            if not new:
                break
            drafted += len(draft)
            accepted += sum(1 for a, b in zip(draft, new) if a == b) if draft else 0
            first_token_ns = first_token_ns or time.time_ns()
            stop = end_id in new
            if stop:
                new = new[: new.index(end_id) + 1]
            generated += new
            extra = []
            if perf:
                now = time.time_ns()
                extra = [
                    pb_utils.Tensor("total_draft_tokens", np.array([[drafted]], np.int32)),
                    pb_utils.Tensor("total_accepted_draft_tokens", np.array([[accepted]], np.int32)),
                    pb_utils.Tensor(
                        "acceptance_rate", np.array([[accepted / drafted if drafted else 0.0]], np.float32)
                    ),
                    pb_utils.Tensor("arrival_time_ns", np.array([[arrival]], np.int64)),
                    pb_utils.Tensor("first_token_time_ns", np.array([[first_token_ns]], np.int64)),
                    pb_utils.Tensor("last_token_time_ns", np.array([[now]], np.int64)),
                ]
            yield new, extra
            if stop:
                break

    @staticmethod
    def _text_response(text, extra, wanted):
        """Only the outputs the request asked for (all when it names none): the stub's sender drops the
        others with the GIL released (python_backend ``ResponseSender::Send``), freeing their numpy arrays
        off the GIL, which corrupts the stub's heap under concurrent streams."""
        # flat [1] (one sequence), as upstream's BLS sends it: clients read text_output[0]
        out = np.array([text.encode("utf-8")], dtype=object)
        index = [
            pb_utils.Tensor("batch_index", np.array([[0]], np.int32)),
            pb_utils.Tensor("sequence_index", np.array([[0]], np.int32)),
        ]
        names = {t.name() for t in extra}
        tensors = [pb_utils.Tensor("text_output", out), *extra, *[t for t in index if t.name() not in names]]
        return pb_utils.InferenceResponse([t for t in tensors if not wanted or t.name() in wanted])

    def finalize(self):
        with self.lock:
            threads = list(self.threads)
        for t in threads:
            t.join(timeout=5)
