"""A format fuzz over real variants: real third-party files, mutated the way files get mangled
between a GPU node and a user's paste (CRLF, UTF-16, a BOM, ANSI colour, trailing blanks,
stray lines, CSV columns reordered or respelled, a column missing, a cut-off last line).

A mutation that keeps the data must import to the same samples and phases; one that loses
data must import what is left or fail with one clear line — never a traceback, never a
silent wrong read.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED_FIXTURES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuprof.collectors.importers import Imported, ImportFormatError, detect

PUBLIC = Path(__file__).parent / "labelled" / "public"

CSV_FILES = [
    SHARED_FIXTURES / "nvidia_smi" / "rtx4090_inference.csv",
    SHARED_FIXTURES / "nvidia_smi" / "repeated_header.csv",
    SHARED_FIXTURES / "nvidia_smi" / "epoch_custom_header.csv",
]
LOG_FILES = [
    SHARED_FIXTURES / "verl" / "gemma2b_ppo_2gpu_old_format.log",
    SHARED_FIXTURES / "verl" / "issue_excerpt_16xh100.txt",
    SHARED_FIXTURES / "verl" / "issue_excerpt_gh200_sglang.txt",
    PUBLIC / "verl_data_qwen05b_ppo_1gpu_resp256_excerpt.log",
    PUBLIC / "verl_issue7412_long_tail_agent_loop.log",
    PUBLIC / "trl_openr1_issue161_grpo_8xa100.log",
]
STACKS = Path(__file__).parent / "fixtures_logs" / "stacks"
STACK_FILES = [
    STACKS / "console_gemma3_1b_g4_grpo_one_step_L124-158.txt",
    STACKS / "slime_actor_perf_dict_zh_doc.txt",
    STACKS / "areal_pr656_logs_1xA100_fastest_completed_lines93-410_steps1-4.log",
    STACKS / "dschat_step3_official_opt1.3b_lines1-120.log",
    STACKS / "skyrl_phase_timers_yottalabs_doc_excerpt.log",
    STACKS / "roll_mooncake_report_step_level_means.md",
]
"""The stacks read by the tolerant step-timings reader (issue 42)."""
LOG_FILES += STACK_FILES
TEXT_FILES = [*LOG_FILES, SHARED_FIXTURES / "dcgm" / "v100_node_scrape_excerpt.txt"]

pytestmark = pytest.mark.skipif(not SHARED_FIXTURES.exists(), reason="shared fixtures absent")


# ------------------------------------------------------------------------------ what is read


def digest(imported: Imported) -> dict[str, object]:
    """What a reader made of a file, independent of row order: per GPU the sample count and
    the rounded sums of utilisation and memory; every span's phase, step and duration."""
    out: dict[str, object] = {}
    gpu = imported.frames.get("gpu")
    if gpu is not None and len(gpu):
        per = gpu.groupby(["host", "gpu"], dropna=False)
        out["gpu"] = sorted(
            (
                str(host),
                int(index),
                len(rows),
                _sum(rows, "util_gpu_pct"),
                _sum(rows, "mem_used_bytes") // 2**20 if _sum(rows, "mem_used_bytes") else None,
            )
            for (host, index), rows in per
        )
    spans = imported.frames.get("spans")
    if spans is not None and len(spans):
        out["spans"] = sorted(
            (str(p), int(s) if s == s else -1, round((e - b) / 1e9, 3))
            for p, s, b, e in zip(spans["phase"], spans["step"], spans["start_ns"], spans["end_ns"])
        )
    return out


def _sum(rows, column: str):
    if column not in rows or rows[column].isna().all():
        return None
    return round(float(np.nansum(rows[column].to_numpy(dtype=float))), 1)


def read(path: Path) -> Imported:
    return detect(path).parse(path)


def write(path: Path, data: str | bytes) -> Path:
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_bytes(data.encode("utf-8"))
    return path


# ------------------------------------------------------------------------------ mutations


def crlf(text: str, rng: random.Random) -> str | bytes:
    return text.replace("\r\n", "\n").replace("\n", "\r\n")


def utf16(text: str, rng: random.Random) -> str | bytes:
    return text.encode("utf-16")  # with a BOM, as Windows tools write it


def utf8_bom(text: str, rng: random.Random) -> str | bytes:
    return "\ufeff" + text


def trailing_blanks(text: str, rng: random.Random) -> str | bytes:
    return "\n".join(line + " " * rng.randint(0, 3) for line in text.split("\n"))


def blank_lines(text: str, rng: random.Random) -> str | bytes:
    lines = text.split("\n")
    for _ in range(rng.randint(1, 4)):
        lines.insert(rng.randint(1, len(lines)), "")
    return "\n".join(lines)


def ansi_colour(text: str, rng: random.Random) -> str | bytes:
    # Ray and rich colour the prefix or the whole line of what a terminal shows
    colour = rng.choice(["\x1b[36m", "\x1b[1;32m", "\x1b[33m"])
    return "\n".join(
        f"{colour}{line}\x1b[0m" if line.strip() else line for line in text.split("\n")
    )


STRAY = [
    "WARNING: something unrelated happened 12.5 -1 nan",
    "Traceback (most recent call last): a warning a library printed",
    "(WorkerDict pid=4242) INFO 06-01 12:00:00 model_runner.py:1008] Loading model weights",
    "100%|██████████| 64/64 [00:03<00:00, 18.2it/s]",
    "[2025-06-01 12:00:00,000] [INFO] [real_accelerator.py:222:get_accelerator] cuda",
]


_LINE_START = re.compile(
    r"^(?:$|\(|\[|\{|\||-|step:|Epoch|iteration|timing|Training|INFO|WARN|\d{4}[-/]\d\d|"
    r"DCGM_|# )"
)
"""Where a new console line can begin: other processes' output lands between whole lines,
never inside a line a terminal or a paste wrapped (the verl #7412 paste is one line)."""


def stray_lines(text: str, rng: random.Random) -> str | bytes:
    lines = text.split("\n")
    starts = [i for i in range(1, len(lines) + 1) if i == len(lines) or _LINE_START.match(lines[i])]
    for _ in range(rng.randint(1, 3)):
        at = rng.choice(starts)
        lines.insert(at, rng.choice(STRAY))
        starts = [j + 1 if j >= at else j for j in starts]
    return "\n".join(lines)


def _csv_rows(text: str) -> list[list[str]]:
    return [line.split(",") for line in text.strip("\n").split("\n")]


def column_order(text: str, rng: random.Random) -> str | bytes:
    rows = _csv_rows(text)
    width = len(rows[0])
    order = list(range(width))
    rng.shuffle(order)
    return (
        "\n".join(",".join(r[i] for i in order) if len(r) == width else ",".join(r) for r in rows)
        + "\n"
    )


def header_spelling(text: str, rng: random.Random) -> str | bytes:
    head, _, rest = text.partition("\n")
    fields = [f.strip() for f in head.split(",")]
    style = rng.choice(["upper", "nospace", "padded"])
    if style == "upper":
        fields = [f.upper() for f in fields]
    elif style == "padded":
        fields = [f"  {f}  " for f in fields]
    return ",".join(fields) + "\n" + rest


def value_units_dropped(text: str, rng: random.Random) -> str | bytes:
    # nvidia-smi's --format=csv,nounits: the header keeps "[%]", the values lose " %"
    head, _, rest = text.partition("\n")
    return head + "\n" + re.sub(r"(\d) ?(?:%|MiB|W|MHz)(?=\s*(?:,|$))", r"\1", rest, flags=re.M)


def wrapped_lines(text: str, rng: random.Random) -> str | bytes:
    # a paste wraps long lines at a fixed width, inside keys and numbers alike
    width = rng.randint(60, 420)
    out = []
    for line in text.split("\n"):
        if len(line) > width and " - " in line:
            out.extend(line[i : i + width] for i in range(0, len(line), width))
        else:
            out.append(line)
    return "\n".join(out)


PRESERVING_TEXT = [crlf, utf16, utf8_bom, trailing_blanks, blank_lines]
PRESERVING_LOG = [*PRESERVING_TEXT, ansi_colour, stray_lines, wrapped_lines]
PRESERVING_CSV = [*PRESERVING_TEXT, column_order, header_spelling, value_units_dropped]


def drop_column(text: str, rng: random.Random) -> str | bytes:
    rows = _csv_rows(text)
    width = len(rows[0])
    gone = rng.randrange(width)
    return "\n".join(",".join(c for i, c in enumerate(r) if i != gone) for r in rows) + "\n"


def cut_last_line(text: str, rng: random.Random) -> str | bytes:
    body = text.rstrip("\n")
    last = body.rfind("\n")
    if last < 0:
        return body
    tail = body[last + 1 :]
    return body[: last + 1 + rng.randint(0, max(0, len(tail) - 1))]


def stray_values(text: str, rng: random.Random) -> str | bytes:
    # one data value replaced by something that is not a value
    lines = text.split("\n")
    index = rng.randint(1, max(1, len(lines) - 2))
    cells = lines[index].split(",")
    cells[rng.randrange(len(cells))] = rng.choice(
        [" [N/A]", " ERR!", " -1", " nan", " 1e309", " ?"]
    )
    lines[index] = ",".join(cells)
    return "\n".join(lines)


LOSSY_CSV = [drop_column, cut_last_line, stray_values]
LOSSY_LOG = [cut_last_line]


# ------------------------------------------------------------------------------ properties

_SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _original(path: Path) -> dict[str, object]:
    return digest(read(path))


@_SETTINGS
@given(st.sampled_from(CSV_FILES), st.sampled_from(PRESERVING_CSV), st.integers(0, 2**16))
def test_csv_mutations_that_keep_the_data_read_the_same_samples(tmp_path, path, mutate, seed):
    text = path.read_text(encoding="utf-8")
    mutant = write(tmp_path / path.name, mutate(text, random.Random(seed)))
    assert digest(read(mutant)) == _original(path), mutate.__name__


@_SETTINGS
@given(st.sampled_from(TEXT_FILES), st.sampled_from(PRESERVING_LOG), st.integers(0, 2**16))
def test_log_mutations_that_keep_the_data_read_the_same_phases(tmp_path, path, mutate, seed):
    if "dcgm" in str(path) and mutate in (ansi_colour, stray_lines, wrapped_lines):
        return  # a Prometheus scrape is not a console log: colour or prose make it another file
    if path in STACK_FILES and mutate is wrapped_lines:
        return  # only verl's reader rejoins a line a paste wrapped inside a key or number
    text = path.read_text(encoding="utf-8")
    mutant = write(tmp_path / path.name, mutate(text, random.Random(seed)))
    assert digest(read(mutant)) == _original(path), mutate.__name__


@_SETTINGS
@given(
    st.sampled_from(CSV_FILES + LOG_FILES),
    st.sampled_from(LOSSY_CSV + LOSSY_LOG),
    st.integers(0, 2**16),
)
def test_mutations_that_lose_data_import_what_is_left_or_say_why_in_one_line(
    tmp_path, path, mutate, seed
):
    if path.suffix != ".csv" and mutate in (drop_column, stray_values):
        return
    text = path.read_text(encoding="utf-8")
    mutant = write(tmp_path / path.name, mutate(text, random.Random(seed)))
    try:
        imported = read(mutant)
    except ImportFormatError as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith(str(mutant)), message
        return
    got, want = digest(imported), _original(path)
    # what is left is the original's data, never something else: no GPU or phase appears
    # that the file did not have, and no GPU gains samples
    if "gpu" in got:
        before = {(h, i): n for h, i, n, *_ in want.get("gpu", [])}
        for host, index, count, *_ in got["gpu"]:
            assert (host, index) in before or not before, (host, index)
            assert count <= max(before.values(), default=count)
    if "spans" in got:
        phases_before = {p for p, _, _ in want.get("spans", [])}
        assert {p for p, _, _ in got["spans"]} <= phases_before | {"step"}
