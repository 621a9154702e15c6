#!/usr/bin/env python
"""Load libtrtspec_plugins.so the way TensorRT's own tools do, and list the trtspec creators it registers.

Where TensorRT (Python package `tensorrt`, 10.x) is installed: IPluginRegistry::loadLibrary (the path
trtexec --dynamicPlugins and --setPluginsToSerialize take) dlopens the library, calls its exported
getCreators() and setLoggerFinder(), and registers the creators; this script then looks each trtspec
creator up by name/version/namespace and prints its fields. Exit 0 when both creators are there.

    python scripts/load_plugin_library.py [path/to/libtrtspec_plugins.so]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

NAMES = ("TrtspecRmsNormHeads", "TrtspecTreeVerify")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("library", nargs="?", help="libtrtspec_plugins.so [default: the trtspec build location]")
    args = ap.parse_args()
    try:
        import tensorrt as trt  # noqa: PLC0415 - only where TensorRT is installed
    except ImportError:
        print("error: the TensorRT Python package is not installed (run this where TensorRT 10 is)", file=sys.stderr)
        return 2
    from trtspec.kernels.trt_network import (
        PLUGIN_NAMESPACE,
        PLUGIN_VERSION,
        plugin_library_path,
    )

    lib = plugin_library_path(args.library).resolve()
    if not lib.is_file():
        print(f"error: {lib}: plugin library not found (build it with `trtspec plugins build`)", file=sys.stderr)
        return 2
    registry = trt.get_plugin_registry()
    handle = registry.load_library(str(lib))
    if handle is None:
        print(f"error: IPluginRegistry::loadLibrary({lib}) failed (see TensorRT's log above)", file=sys.stderr)
        return 1
    print(f"TensorRT {trt.__version__}: loadLibrary({lib}) ok")
    missing = []
    for name in NAMES:
        creator = registry.get_creator(name, PLUGIN_VERSION, PLUGIN_NAMESPACE)
        if creator is None:
            missing.append(name)
            continue
        fields = [f"{f.name}:{f.type}" for f in creator.field_names]
        print(f"  {PLUGIN_NAMESPACE}::{name} v{PLUGIN_VERSION}  fields: {', '.join(fields)}")
    if missing:
        print(f"error: creators not registered after loadLibrary: {', '.join(missing)}", file=sys.stderr)
        return 1
    registry.deregister_library(handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
