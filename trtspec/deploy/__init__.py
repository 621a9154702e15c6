"""Deployments on runtimes other than TensorRT-LLM 1.2.1 engines (one module per runtime)."""
