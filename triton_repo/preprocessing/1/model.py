"""Triton python-backend model `preprocessing`: text -> token ids for `tensorrt_llm`.

Self-contained (numpy + transformers only) because the same file runs inside NVIDIA's TensorRT-LLM container
for the `trtllm` runtime, where trtspec is not installed. Every request is checked here and answered with a
clear error (empty text, max_tokens <= 0, prompt + max_tokens beyond the model's length) so bad requests
never reach the generation model.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


def _param(cfg, key, default=""):
    value = cfg.get("parameters", {}).get(key, {}).get("string_value", default)
    return default if value.startswith("${") else value


def _resolve(path, model_dir):
    """Relative paths are relative to the model repository root (so the repository can move)."""
    if not path or os.path.isabs(path):
        return path
    return os.path.normpath(os.path.join(os.path.dirname(model_dir), path))


#: upstream preprocessing inputs for multimodal / encoder-decoder / embedding-bias / prompt-table models
UNSUPPORTED_INPUTS = (
    "DECODER_QUERY",
    "IMAGE_BYTES",
    "IMAGE_URL",
    "IMAGES",
    "VIDEO_BYTES",
    "EMBEDDING_BIAS_WORDS",
    "EMBEDDING_BIAS_WEIGHTS",
    "PROMPT_TABLE_EXTRA_ID",
)


def _first(request, name):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy()


def _words_to_ids(tokenizer, words_arr):
    """TensorRT-LLM's [2, L] word-list layout: row 0 the concatenated ids, row 1 the end offsets, -1 padded."""
    ids, offsets = [], []
    for w in [] if words_arr is None else list(words_arr.reshape(-1)):
        w = w.decode("utf-8") if isinstance(w, bytes) else str(w)
        if not w:
            continue
        toks = tokenizer.encode(w, add_special_tokens=False)
        if toks:
            ids.extend(toks)
            offsets.append(len(ids))
    if not ids:
        return np.array([[0], [-1]], dtype=np.int32)
    row1 = offsets + [-1] * (len(ids) - len(offsets))
    return np.array([ids, row1], dtype=np.int32)


class TritonPythonModel:
    def initialize(self, args):
        from transformers import AutoTokenizer

        cfg = json.loads(args["model_config"])
        model_dir = args["model_repository"]
        tok_dir = _resolve(_param(cfg, "tokenizer_dir"), model_dir)
        if not tok_dir or not os.path.isdir(tok_dir):
            raise pb_utils.TritonModelException(f"preprocessing: tokenizer_dir '{tok_dir}' is not a directory")
        self.tokenizer = AutoTokenizer.from_pretrained(tok_dir)
        self.add_special_tokens = _param(cfg, "add_special_tokens", "true").lower() in ("1", "true", "yes")
        self.max_seq_len = int(_param(cfg, "max_seq_len", "0") or 0)
        self.end_id = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else -1
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.end_id

    def _one(self, request):
        for name in UNSUPPORTED_INPUTS:  # accepted by the schema (upstream's), refused with a reason here
            arr = _first(request, name)
            if arr is not None and arr.size:
                raise ValueError(f"{name} is not supported by this text-only deployment")
        query = _first(request, "QUERY")
        out_len = _first(request, "REQUEST_OUTPUT_LEN")
        batch = query.shape[0]
        texts = [q.decode("utf-8") if isinstance(q, bytes) else str(q) for q in query.reshape(batch, -1)[:, 0]]
        lens = out_len.reshape(batch, -1)[:, 0].astype(np.int64)
        ids_list = []
        for text, n in zip(texts, lens):
            if not text.strip():
                raise ValueError("text_input is empty: send a non-empty prompt")
            if n <= 0:
                raise ValueError(f"max_tokens must be >= 1, got {int(n)}")
            ids = self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens)
            if not ids:
                raise ValueError("text_input tokenizes to no tokens")
            if self.max_seq_len and len(ids) >= self.max_seq_len:
                raise ValueError(
                    f"the prompt ({len(ids)} tokens) does not fit the model's max_seq_len {self.max_seq_len}: "
                    f"shorten it to at most {self.max_seq_len - 1} tokens"
                )
            if self.max_seq_len and len(ids) + int(n) > self.max_seq_len:
                raise ValueError(
                    f"prompt ({len(ids)} tokens) + max_tokens ({int(n)}) exceeds the model's "
                    f"max_seq_len {self.max_seq_len}: lower max_tokens to at most "
                    f"{max(self.max_seq_len - len(ids), 0)}"
                )
            ids_list.append(ids)
        width = max(len(i) for i in ids_list)
        end = _first(request, "END_ID")
        pad = _first(request, "PAD_ID")
        end_ids = (
            end.reshape(batch, -1)[:, :1].astype(np.int32)
            if end is not None
            else np.full((batch, 1), self.end_id, np.int32)
        )
        pad_ids = (
            pad.reshape(batch, -1)[:, :1].astype(np.int32)
            if pad is not None
            else np.full((batch, 1), self.pad_id, np.int32)
        )
        input_id = np.stack(
            [np.array(i + [int(pad_ids[k, 0])] * (width - len(i)), np.int32) for k, i in enumerate(ids_list)]
        )
        bad = _first(request, "BAD_WORDS_DICT")
        stop = _first(request, "STOP_WORDS_DICT")

        def words(arr):
            rows = [_words_to_ids(self.tokenizer, None if arr is None else arr[k]) for k in range(batch)]
            w = max(r.shape[1] for r in rows)
            padded = [
                np.concatenate(
                    [
                        np.pad(r[:1], ((0, 0), (0, w - r.shape[1]))),
                        np.pad(r[1:], ((0, 0), (0, w - r.shape[1])), constant_values=-1),
                    ]
                )
                for r in rows
            ]
            return np.stack(padded).astype(np.int32)

        return pb_utils.InferenceResponse(
            [
                pb_utils.Tensor("INPUT_ID", input_id),
                pb_utils.Tensor("REQUEST_INPUT_LEN", np.array([[len(i)] for i in ids_list], np.int32)),
                pb_utils.Tensor("BAD_WORDS_IDS", words(bad)),
                pb_utils.Tensor("STOP_WORDS_IDS", words(stop)),
                pb_utils.Tensor("REQUEST_OUTPUT_LEN", lens.reshape(batch, 1).astype(np.int32)),
                pb_utils.Tensor("OUT_END_ID", end_ids),
                pb_utils.Tensor("OUT_PAD_ID", pad_ids),
            ]
        )

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(self._one(request))
            except Exception as exc:  # one bad request must not fail the others in the batch
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"preprocessing: {exc}")))
        return responses
