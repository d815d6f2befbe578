"""Property: no secret on a command line survives any printed form of it.

Argument lists are generated with secret flags (``--api-key V``, ``--password=V``, ``--hf_token
V``…) at any position among ordinary flags, values and positionals, and printed the ways
programs print them: a Python list or tuple repr (``print(sys.argv)``), JSON, ``shlex.join``,
words joined by spaces or tabs, an ``argparse`` error, ``NAME=value`` environment lines.
Every form, line by line, goes through `redact_text` (what `watch` stores of each output
line), and the list through `redact_command` (the stored command): the secret values never
come out. Thousands of cases; the run directory end to end is `test_redact.py`'s.
"""

from __future__ import annotations

import itertools
import json
import shlex

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpuprof.redact import redact_command, redact_text

SECRET_FLAGS = [
    "--api-key", "--api_key", "--apikey", "--hf-token", "--hf_token", "--token",
    "--password", "--passwd", "--secret", "--client-secret", "--wandb-api-key",
    "--auth-token", "--access-token", "--passphrase", "--credentials", "--private-key",
]  # fmt: skip
ORDINARY = [
    ["-c", "import sys; print(sys.argv)"], ["--lr", "1e-5"], ["--model", "Qwen/Qwen2.5-7B"],
    ["--max_tokens", "512"], ["--tokenizer", "gpt2"], ["-v"], ["--bf16"], ["train.py"],
    ["--output-dir", "/tmp/out"], ["-n", "4"], ["trainer.total_epochs=2"], ["--"],
    ["--num-workers", "-1"], ["--seed", "42"],
]  # fmt: skip
_VALUE_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./+"


@st.composite
def argv_with_secrets(draw) -> tuple[list[str], list[str]]:
    """An argument list and the secret values it holds."""
    parts = draw(st.lists(st.sampled_from(ORDINARY), max_size=8))
    secrets = []
    for _ in range(draw(st.integers(1, 3))):
        flag = draw(st.sampled_from(SECRET_FLAGS))
        body = draw(st.text(alphabet=_VALUE_CHARS, min_size=6, max_size=30))
        value = "Zq7" + body  # distinctive: never a piece of an ordinary argument
        secrets.append(value)
        joined = draw(st.booleans())
        item = [f"{flag}={value}"] if joined else [flag, value]
        parts.insert(draw(st.integers(0, len(parts))), item)
    return [a for part in parts for a in part], secrets


def printed_forms(argv: list[str]) -> dict[str, str]:
    return {
        "list repr": repr(argv),
        "print('args', sys.argv)": f"args {argv!r}",
        "tuple repr": repr(tuple(argv)),
        "json": json.dumps(argv),
        "json object": json.dumps({"argv": argv, "cwd": "/work"}),
        "shlex.join": shlex.join(argv),
        "spaces": " ".join(argv),
        "two spaces": "  ".join(argv),
        "tabs": "\t".join(argv),
        "argparse error": (
            "usage: train.py [-h] [--lr LR]\n"
            f"train.py: error: unrecognized arguments: {' '.join(argv)}"
        ),
        "environment": "\n".join(
            f"{a.lstrip('-').replace('-', '_').upper()}={b}"
            for a, b in itertools.pairwise(argv)
            if a.startswith("--")
        ),
    }


@settings(max_examples=2000, deadline=None)
@example(  # the case of issue 43: '-c', '--api-key' read as an ordinary pair hid the flag
    (["-c", "import sys; print(sys.argv)", "--api-key", "Zq7SECRET123", "--password=Zq7hunter2"],
     ["Zq7SECRET123", "Zq7hunter2"])
)  # fmt: skip
@given(argv_with_secrets())
def test_no_secret_survives_any_printed_form_of_a_command_line(case):
    argv, secrets = case
    stored_command = " ".join(redact_command(argv))
    for secret in secrets:
        assert secret not in stored_command, (argv, stored_command)
    for form, text in printed_forms(argv).items():
        stored = "\n".join(redact_text(line) for line in text.split("\n"))
        for secret in secrets:
            assert secret not in stored, (form, text, stored)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(ORDINARY), max_size=8))
def test_a_command_line_without_secrets_prints_unchanged(parts):
    argv = [a for part in parts for a in part]
    assert redact_command(argv) == argv
    for form in ("list repr", "json", "shlex.join", "spaces"):
        text = printed_forms(argv)[form]
        assert redact_text(text) == text, form
