"""The trtspec CUDA kernels from Python: build them (build.py), call them on torch CUDA tensors
(bindings.py), check them against the PyTorch reference (reference.py), and add the TensorRT plugins that
wrap them to a network (trt_network.py)."""

from trtspec.kernels.build import (
    DEFAULT_ARCHS,
    KERNELS_LIB,
    PLUGINS_LIB,
    build_plugins,
    default_kernels_library,
    default_library_dir,
    default_plugins_library,
)

__all__ = [
    "DEFAULT_ARCHS",
    "KERNELS_LIB",
    "PLUGINS_LIB",
    "build_plugins",
    "default_library_dir",
    "default_kernels_library",
    "default_plugins_library",
]
