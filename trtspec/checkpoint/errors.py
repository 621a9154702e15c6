"""The one error type every loader raises, so the CLI can print one line and exit non-zero."""

from __future__ import annotations

from pathlib import Path


class CheckpointError(Exception):
    """A problem with user-supplied files: names the file and says how to fix it.

    The CLI catches this (and only this family) and prints ``error: <message>`` without a traceback.
    """

    def __init__(self, message: str, path: str | Path | None = None, fix: str | None = None):
        self.path = Path(path) if path is not None else None
        self.fix = fix
        text = f"{path}: {message}" if path is not None else message
        if fix:
            text = f"{text} ({fix})"
        super().__init__(text)


class UsageError(CheckpointError):
    """Bad options or option combinations (not a file problem)."""
