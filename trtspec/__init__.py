"""trtspec: speculative decoding from Hugging Face checkpoints to TensorRT-LLM engines and Triton."""

__version__ = "0.1.0"
