"""Remove secret values from a command line before it is stored."""

from __future__ import annotations

import re

_SECRET_WORDS = frozenset(
    {
        "key",
        "apikey",
        "token",
        "secret",
        "password",
        "passwd",
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
_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]+:)[^/\s@]+(?=@)")


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


def redact_command(argv: list[str]) -> list[str]:
    """A copy of ``argv`` with secret values replaced by ``***``.

    Redacts ``--api-key=V`` and ``--api-key V`` (the next argument, unless it is a flag),
    ``KEY=V`` assignments and Hydra overrides (``trainer.wandb_token=V``) whose name is
    secret, and passwords inside URLs (``https://user:pw@host``).
    """
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            hide_next = False
            if not arg.startswith("-"):
                out.append(REDACTED)
                continue
        if "=" in arg:
            name, _, value = arg.partition("=")
            if is_secret_name(name) and value:
                out.append(f"{name}={REDACTED}")
                continue
        elif arg.startswith("-") and is_secret_name(arg):
            hide_next = True
        out.append(_URL_PASSWORD.sub(rf"\g<head>{REDACTED}", arg))
    return out
