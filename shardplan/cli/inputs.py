"""Checks of CLI file arguments made before any work starts (so a bad path never costs a search).

`output_path(text, flag)` accepts a file path whose folder exists and that is not a folder; the
check is O(1) file-system calls. Errors are `ArgumentError` (exit 2) naming the flag.
"""

from __future__ import annotations

import os
from pathlib import Path

from shardplan.errors import ArgumentError


def output_path(text: str | None, flag: str = "--json") -> Path | None:
    """The path `flag` will write to, or ArgumentError if it cannot be written."""
    if text is None:
        return None
    path = Path(text)
    if path.is_dir():
        raise ArgumentError(f"{flag} {text!r} is a folder; give a file name, e.g. {text}/plan.json")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ArgumentError(f"{flag} {text!r}: folder {str(folder)!r} does not exist; create it")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ArgumentError(f"{flag} {text!r} is not writable")
    return path
