"""Framework settings read off a launch command line (no I/O, no dependencies).

The recommender reads the current value of a knob from the watched command; the log importers
read it from the launch command at the top of a framework's log. Both use `parse_knobs`.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

_HYDRA = re.compile(r"^(\+{1,2})?([A-Za-z_][\w\-]*(?:\.[\w\-]+)*)=(.*)$", re.S)
_SHELL_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def tokens(command: list[str]) -> list[str]:
    """argv with any whitespace-containing element (``bash -c "..."``) split shell-style."""
    out: list[str] = []
    for token in command:
        token = str(token)
        if any(c.isspace() for c in token.strip()) and ("=" in token or "--" in token):
            try:
                out.extend(shlex.split(token))
            except ValueError:
                out.extend(token.split())
        else:
            out.append(token)
    return out


def unquote(value: str) -> str:
    """``'a b'`` or ``"a b"`` → ``a b``; anything else stripped and kept."""
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def parse_knobs(command: list[str]) -> dict[str, str]:
    """Settings on a command line, keyed by name without dashes or Hydra ``+``/``++``.

    Understands Hydra overrides (``a.b=1``, ``+a.b=1``, ``++a.b=1``; deletions ``~a.b`` are
    skipped), ``--flag value``, ``--flag=value`` and bare switches (``--flag`` -> ``"true"``).
    Environment assignments before the program (``CUDA_VISIBLE_DEVICES=0 python …``) are the
    shell's, not knobs, and are skipped. Values stay strings (see `coerce`); a later setting
    wins.
    """
    knobs: dict[str, str] = {}
    toks = tokens(command)
    i = 0
    while i < len(toks) and _SHELL_ASSIGNMENT.match(toks[i]):
        i += 1
    while i < len(toks):
        token = toks[i]
        i += 1
        if token.startswith("--") and len(token) > 2:
            body = token[2:]
            if "=" in body:
                key, value = body.split("=", 1)
                knobs[key] = unquote(value)
            elif i < len(toks) and not toks[i].startswith("--"):
                knobs[body] = unquote(toks[i])
                i += 1
            else:
                knobs[body] = "true"
            continue
        if token.startswith("-"):
            continue  # single-dash options (python -m, -u …) carry no framework knobs
        match = _HYDRA.match(token)
        if match:
            knobs[match.group(2)] = unquote(match.group(3))
    return knobs


def coerce(value: Any) -> Any:
    """A command-line string as a Python value: bool, int, float, None (``null``) or str."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    low = text.lower()
    if low in ("true", "yes"):
        return True
    if low in ("false", "no"):
        return False
    if low in ("null", "none", "~"):
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text
