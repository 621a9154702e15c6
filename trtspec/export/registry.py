"""Every export format trtspec can write, by name. Adding one = a module defining ``EXPORTER`` + one line."""

from __future__ import annotations

import importlib

from trtspec.errors import UsageError
from trtspec.export.base import Exporter

_MODULES = (
    "trtspec.export.onnx",
    "trtspec.export.eagle",
    "trtspec.export.eagle3",
    "trtspec.export.speculators",
    "trtspec.export.medusa",
    "trtspec.export.dflash",
    "trtspec.export.deepseek_mtp",
)

EXPORTERS: dict[str, Exporter] = {}
for _name in _MODULES:
    _exp: Exporter = importlib.import_module(_name).EXPORTER
    EXPORTERS[_exp.name] = _exp


def names() -> tuple[str, ...]:
    return tuple(EXPORTERS)


def get(name: str) -> Exporter:
    if name not in EXPORTERS:
        raise UsageError(f"unknown export format {name!r}; choose one of {', '.join(EXPORTERS)}")
    return EXPORTERS[name]
