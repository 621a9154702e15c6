"""The error types users can fix, and the one base the CLI catches to print one line (never a traceback).

``CheckpointError`` (a file is wrong) and ``UsageError`` (an option is wrong) are siblings: a caller that
handles bad options must not swallow a corrupt file, and vice versa. Both name what to fix.
"""

from __future__ import annotations

from pathlib import Path


class TrtspecError(Exception):
    """A problem the user can fix; the message names the file (if any) and says how to fix it."""

    def __init__(self, message: str, path: str | Path | None = None, fix: str | None = None):
        self.path = Path(path) if path is not None else None
        self.fix = fix
        text = f"{path}: {message}" if path is not None else message
        if fix:
            text = f"{text} ({fix})"
        super().__init__(text)


class CheckpointError(TrtspecError):
    """A problem with user-supplied files: missing, corrupt, or not matching the target."""


class UsageError(TrtspecError):
    """Bad options or option combinations (not a file problem)."""
