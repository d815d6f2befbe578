"""The error every reader raises for input it cannot use (one line naming the file)."""

from __future__ import annotations


class RunError(Exception):
    """A run directory or file that cannot be read; the message is one line naming the file."""
