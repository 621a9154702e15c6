"""Write a loaded drafter in a layout another runtime loads (vLLM, SGLang, TensorRT-LLM, speculators).

One module per format (``trtspec/export/<format>.py`` defining ``EXPORTER``), listed in
``registry._MODULES``; which formats a drafter kind can be written as is the kind's own declaration
(``DrafterKind.export_formats``). ``export_draft`` is the one entry point.
"""

from trtspec.export.draft import export_draft

__all__ = ["export_draft"]
