"""Triton python-backend model `tensorrt_llm_bls`: text in, text out, driven from Python.

Calls `preprocessing`, then `tensorrt_llm` (decoupled, streaming or not), then `postprocessing`, like the
ensemble, but with accumulate_tokens=true it decodes all tokens so far at every step and sends only the
new text: concatenated stream pieces then equal the decoded full output exactly, even for tokenizers
whose pieces do not decode independently (SentencePiece spaces, UTF-8 characters split across tokens).

Self-contained (numpy only) so it also runs in NVIDIA's TensorRT-LLM container. Each request runs on its
own thread so one instance serves many concurrent streams.
"""

import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

# ensemble-style input name -> (model, that model's input name)
PRE_INPUTS = {"text_input": "QUERY", "max_tokens": "REQUEST_OUTPUT_LEN", "bad_words": "BAD_WORDS_DICT",
              "stop_words": "STOP_WORDS_DICT", "end_id": "END_ID", "pad_id": "PAD_ID"}
LLM_INPUTS = {"exclude_input_in_output": "exclude_input_in_output", "top_k": "runtime_top_k",
              "top_p": "runtime_top_p", "temperature": "temperature", "length_penalty": "len_penalty",
              "repetition_penalty": "repetition_penalty", "min_tokens": "min_tokens",
              "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty", "seed": "seed",
              "return_log_probs": "return_log_probs", "return_context_logits": "return_context_logits",
              "return_generation_logits": "return_generation_logits",
              "return_perf_metrics": "return_perf_metrics", "num_return_sequences": "num_return_sequences",
              "beam_width": "beam_width", "stream": "streaming"}
PRE_TO_LLM = {"INPUT_ID": "input_ids", "REQUEST_INPUT_LEN": "input_lengths",
              "REQUEST_OUTPUT_LEN": "request_output_len", "OUT_END_ID": "end_id", "OUT_PAD_ID": "pad_id",
              "STOP_WORDS_IDS": "stop_words_list", "BAD_WORDS_IDS": "bad_words_list"}
PASS_THROUGH = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens", "num_input_tokens",
                "num_output_tokens", "batch_index", "sequence_index", "cum_log_probs", "output_log_probs")
# tensors whose leading dim is the batch and carry a scalar per request: the LLM model reshapes them to []
SCALAR_LLM_INPUTS = {"input_lengths", "request_output_len", "end_id", "pad_id"}


def _param(cfg, key, default=""):
    value = cfg.get("parameters", {}).get(key, {}).get("string_value", default)
    return default if value.startswith("${") else value


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        self.accumulate = _param(cfg, "accumulate_tokens", "true").lower() in ("1", "true", "yes")
        self.llm_name = _param(cfg, "tensorrt_llm_model_name", "tensorrt_llm") or "tensorrt_llm"
        if _param(cfg, "tensorrt_llm_draft_model_name"):
            raise pb_utils.TritonModelException(
                "tensorrt_llm_bls: a separate draft model is not supported; the draft comes from the "
                "tensorrt_llm model's own heads (leave tensorrt_llm_draft_model_name empty)")
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
            responses = list(self._generate(request))
            return responses[-1]
        except Exception as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))

    def _call(self, model, inputs, outputs, decoupled=False):
        req = pb_utils.InferenceRequest(model_name=model, inputs=inputs, requested_output_names=outputs)
        if decoupled:
            return req.exec(decoupled=True)
        resp = req.exec()
        if resp.has_error():
            raise RuntimeError(resp.error().message())
        return resp

    def _detok(self, tokens):
        resp = self._call("postprocessing",
                          [pb_utils.Tensor("TOKENS_BATCH", np.array(tokens, np.int32).reshape(1, 1, -1)),
                           pb_utils.Tensor("SEQUENCE_LENGTH", np.array([[len(tokens)]], np.int32))], ["OUTPUT"])
        out = pb_utils.get_output_tensor_by_name(resp, "OUTPUT").as_numpy().reshape(-1)[0]
        return out.decode("utf-8", errors="replace") if isinstance(out, bytes) else str(out)

    def _generate(self, request):
        """Yield the outer responses (streaming: text pieces; otherwise one response with the whole text)."""
        pre_in = []
        for outer, inner in PRE_INPUTS.items():
            t = pb_utils.get_input_tensor_by_name(request, outer)
            if t is not None:
                pre_in.append(pb_utils.Tensor(inner, t.as_numpy()))
        pre = self._call("preprocessing", pre_in, list(PRE_TO_LLM))
        llm_in = []
        for inner, llm in PRE_TO_LLM.items():
            arr = pb_utils.get_output_tensor_by_name(pre, inner).as_numpy()
            llm_in.append(pb_utils.Tensor(llm, arr))
        stream = False
        for outer, inner in LLM_INPUTS.items():
            t = pb_utils.get_input_tensor_by_name(request, outer)
            if t is not None:
                arr = t.as_numpy()
                llm_in.append(pb_utils.Tensor(inner, arr.reshape(arr.shape[0], 1) if arr.ndim else arr))
                if outer == "stream":
                    stream = bool(arr.reshape(-1)[0])
        wanted = ["output_ids", "sequence_length", *PASS_THROUGH]
        tokens, emitted, extra = [], "", []
        for resp in self._call(self.llm_name, llm_in, wanted, decoupled=True):
            if resp.has_error():
                raise RuntimeError(resp.error().message())
            ids_t = pb_utils.get_output_tensor_by_name(resp, "output_ids")
            if ids_t is None:  # the empty final response of a decoupled model
                continue
            ids = ids_t.as_numpy()
            n = int(pb_utils.get_output_tensor_by_name(resp, "sequence_length").as_numpy().reshape(-1)[0])
            chunk = ids.reshape(-1)[:n].tolist()
            extra = [pb_utils.Tensor(name, pb_utils.get_output_tensor_by_name(resp, name).as_numpy())
                     for name in PASS_THROUGH if pb_utils.get_output_tensor_by_name(resp, name) is not None]
            if not stream:
                tokens = chunk
                continue
            if self.accumulate:
                tokens.extend(chunk)
                text = self._detok(tokens)
                if text.endswith("\ufffd"):  # an incomplete UTF-8 character: wait for its next token
                    piece = ""
                else:
                    piece, emitted = text[len(emitted):], text
            else:
                piece = self._detok(chunk)
            yield self._text_response(piece, extra)
        if not stream:
            yield self._text_response(self._detok(tokens), extra)

    @staticmethod
    def _text_response(text, extra):
        out = np.array([[text.encode("utf-8")]], dtype=object)
        return pb_utils.InferenceResponse([pb_utils.Tensor("text_output", out), *extra])

    def finalize(self):
        with self.lock:
            threads = list(self.threads)
        for t in threads:
            t.join(timeout=5)
