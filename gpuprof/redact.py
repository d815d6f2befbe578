"""Remove secret values from command lines, output lines and settings before they are stored.

One set of rules for everything a run keeps: the command (`redact_command`), every output
line of the watched command (`redact_text`) and knob values (`redact_knobs`). A value is
secret when its name says so (``--api-key V``, ``HF_TOKEN=V``, ``trainer.wandb_token=V``,
``"password": "V"``), when it sits in a URL's user-info (``https://user:pw@host``,
``redis://:pw@host``, ``https://TOKEN@host``), after an ``Authorization`` scheme (``Bearer V``),
or when it has the shape of a well-known token (``hf_…``, ``sk-…``, ``ghp_…``, ``AKIA…``).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from typing import Any

_SECRET_WORDS = frozenset(
    {
        "key",
        "apikey",
        "token",
        "secret",
        "password",
        "passwd",
        "passphrase",
        "pwd",
        "credential",
        "credentials",
        "auth",
        "authorization",
        "cookie",
        "signature",
    }
)
REDACTED = "***"
_URL_USERINFO = re.compile(
    r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^/\s:@]*)(?::(?P<pw>[^/\s@]*))?@"
)
"""A URL's user-info: ``user:password@`` (the user may be empty) or a lone ``token@``."""
_TOKEN_SHAPES = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"hf_[A-Za-z0-9]{30,}"  # Hugging Face
    r"|sk-(?:proj-|ant-)?[A-Za-z0-9_\-]{20,}"  # OpenAI, Anthropic
    r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}"  # GitHub
    r"|glpat-[A-Za-z0-9_\-]{20,}"  # GitLab
    r"|xox[abposr]-[A-Za-z0-9\-]{10,}"  # Slack
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"  # AWS access key ids
    r"|AIza[0-9A-Za-z_\-]{35}"  # Google API keys
    r"|wandb_v1_[A-Za-z0-9_]{20,}|[0-9a-f]{40}(?=\s*$)"  # W&B keys (a bare 40-hex line)
    r")"
)
_AUTH_SCHEME = re.compile(r"(?i)\b(?P<scheme>bearer|basic|token|digest)(?P<sep>\s+)[^\s\"',;]+")
_NAMED_VALUE = re.compile(
    r"(?P<name>[A-Za-z_][\w.\-]*)(?P<q1>[\"']?)(?P<sep>\s*[=:]\s*)(?P<q2>[\"']?)"
    r"(?P<value>[^\s\"',;}]+)"
)
_SHORT_FLAG = re.compile(r"^-[A-Za-z]$")
_QUOTED_ITEM = re.compile(r"(?P<q>[\"'])(?P<item>(?:\\.|(?!(?P=q)).)*)(?P=q)")
"""One quoted item of a printed argument list: a Python list or tuple repr (``'--api-key',
'V'``) or a JSON array (``"--api-key", "V"``)."""
_ITEM_SEP = re.compile(r"\s*,\s*")
_WORD = re.compile(r"\S+")
_BLANKS = re.compile(r"[ \t]+")
"""What lies between a flag and its value in a printed command line: any spaces or tabs."""


def is_secret_name(name: str) -> bool:
    """True when a flag or variable name says its value is a secret.

    The name is split on ``.``, ``_``, ``-`` and case changes, and a whole word must match:
    ``WANDB_API_KEY`` and ``--hf-token`` are secret, ``tokenizer`` and ``max_tokens`` are not.
    """
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name.lstrip("-+~"))
    words = [w.lower() for w in re.split(r"[._\-/\s]+", spaced) if w]
    return any(w in _SECRET_WORDS for w in words) or any(
        w.endswith(("apikey", "accesstoken", "authtoken", "password")) for w in words
    )


def _userinfo(match: re.Match[str]) -> str:
    user, pw = match.group("user"), match.group("pw")
    if pw is not None:
        return f"{match.group('head')}{user}:{REDACTED}@"
    return f"{match.group('head')}{REDACTED}@"  # a lone user-info is usually a token


def _named(match: re.Match[str]) -> str:
    g = match.group
    if not is_secret_name(g("name")):
        # the "value" may itself hold an assignment ("A: HF_TOKEN=V"): the match consumed it
        inner = _NAMED_VALUE.sub(_named, g("value"))
        return f"{g('name')}{g('q1')}{g('sep')}{g('q2')}{inner}"
    if g("value") == REDACTED:
        return match.group(0)
    if match.group("value").lower() in ("bearer", "basic", "token", "digest"):
        return match.group(0)  # "Authorization: Bearer X": the scheme rule hides X
    return f"{g('name')}{g('q1')}{g('sep')}{g('q2')}{REDACTED}"


def redact_text(text: str) -> str:
    """``text`` (an output line, a log line) with every secret value replaced by ``***``."""
    if not text:
        return text
    out = _URL_USERINFO.sub(_userinfo, text)
    out = _AUTH_SCHEME.sub(lambda m: f"{m.group('scheme')}{m.group('sep')}{REDACTED}", out)
    out = _NAMED_VALUE.sub(_named, out)
    out = _TOKEN_SHAPES.sub(REDACTED, out)
    if "'" in out or '"' in out:
        out = _quoted_items(out)
    # "--api-key V" inside a printed command line: the word after a secret flag
    return _flag_then_value(out)


def _quoted_items(text: str) -> str:
    """The item after a quoted secret flag in a printed argument list, replaced: each quoted
    item is looked at as a flag in turn, so that a pair of ordinary items (``'-c',
    '--api-key'``) never hides the secret flag that follows from being seen."""
    items = list(_QUOTED_ITEM.finditer(text))
    hide: list[re.Match[str]] = []
    for flag, value in itertools.pairwise(items):
        name = flag.group("item")
        if not (name.startswith("-") and is_secret_name(name) and "=" not in name):
            continue
        between = text[flag.end() : value.start()]
        item = value.group("item")
        if _ITEM_SEP.fullmatch(between) and item and not _is_flag(item) and item != REDACTED:
            hide.append(value)
    for value in reversed(hide):
        q = value.group("q")
        text = f"{text[: value.start()]}{q}{REDACTED}{q}{text[value.end() :]}"
    return text


def _flag_then_value(text: str) -> str:
    """The word after a secret flag (``--api-key V``) replaced, each word looked at as a flag
    in turn (a pair of ordinary words, ``-v --api-key``, never hides the flag after it)."""
    words = list(_WORD.finditer(text))
    hide: list[re.Match[str]] = []
    for flag, value in itertools.pairwise(words):
        name, word = flag.group(0), value.group(0)
        if not _BLANKS.fullmatch(text[flag.end() : value.start()]):
            continue
        if not name.startswith("-") or "=" in name or not is_secret_name(name):
            continue
        if not _is_flag(word) and word != REDACTED:
            hide.append(value)
    for value in reversed(hide):
        text = f"{text[: value.start()]}{REDACTED}{text[value.end() :]}"
    return text


def _is_flag(arg: str) -> bool:
    """A next argument that is another option, not a value (values may start with ``-``)."""
    return arg.startswith("--") or bool(_SHORT_FLAG.match(arg))


def redact_command(argv: list[str]) -> list[str]:
    """A copy of ``argv`` with secret values replaced by ``***``.

    Redacts ``--api-key=V`` and ``--api-key V`` (the next argument, unless it is another
    option: a value may itself start with ``-``), ``KEY=V`` assignments and Hydra overrides
    (``trainer.wandb_token=V``) whose name is secret, URL user-info, and token-shaped values.
    """
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            hide_next = False
            if not _is_flag(arg):
                out.append(REDACTED)
                continue
        if "=" in arg:
            name, _, value = arg.partition("=")
            if is_secret_name(name) and value:
                out.append(f"{name}={REDACTED}")
                continue
        elif arg.startswith("-") and is_secret_name(arg):
            hide_next = True
        out.append(_TOKEN_SHAPES.sub(REDACTED, _URL_USERINFO.sub(_userinfo, arg)))
    return out


def redact_knobs(knobs: Mapping[str, Any] | None) -> dict[str, Any]:
    """Knob values with secret names (or secret-looking string values) replaced by ``***``."""
    out: dict[str, Any] = {}
    for key, value in (knobs or {}).items():
        if is_secret_name(str(key)):
            out[key] = REDACTED
        elif isinstance(value, str):
            out[key] = redact_text(value)
        else:
            out[key] = value
    return out
