"""Triton python-backend model `postprocessing`: output_ids -> text.

Self-contained (numpy + transformers only) so the same file serves NVIDIA's TensorRT-LLM container. Each
response of a streaming request is decoded on its own (what TensorRT-LLM's ensemble does); use the
`tensorrt_llm_bls` model with accumulate_tokens for text decoded over all tokens so far.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


def _param(cfg, key, default=""):
    value = cfg.get("parameters", {}).get(key, {}).get("string_value", default)
    return default if value.startswith("${") else value


def _resolve(path, model_dir):
    if not path or os.path.isabs(path):
        return path
    return os.path.normpath(os.path.join(os.path.dirname(model_dir), path))


class TritonPythonModel:
    def initialize(self, args):
        from transformers import AutoTokenizer

        cfg = json.loads(args["model_config"])
        tok_dir = _resolve(_param(cfg, "tokenizer_dir"), args["model_repository"])
        if not tok_dir or not os.path.isdir(tok_dir):
            raise pb_utils.TritonModelException(f"postprocessing: tokenizer_dir '{tok_dir}' is not a directory")
        self.tokenizer = AutoTokenizer.from_pretrained(tok_dir)
        self.skip_special = _param(cfg, "skip_special_tokens", "true").lower() in ("1", "true", "yes")

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
                lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
                if tokens.ndim == 2:  # [batch, tokens] -> one beam
                    tokens = tokens[:, None, :]
                lengths = lengths.reshape(tokens.shape[0], -1)
                texts = []
                for b in range(tokens.shape[0]):
                    for beam in range(tokens.shape[1]):
                        n = int(lengths[b, beam])
                        ids = tokens[b, beam, :n].tolist()
                        texts.append(self.tokenizer.decode(ids, skip_special_tokens=self.skip_special))
                # flat [batch * beams], as upstream's postprocessing sends it: the stock clients read
                # text_output[0] as one string
                out = np.array([t.encode("utf-8") for t in texts], dtype=object)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out)]))
            except Exception as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"postprocessing: {exc}")))
        return responses
