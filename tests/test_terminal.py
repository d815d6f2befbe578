"""The terminal summary and diagnosis read well at 80 columns and are plain text off a terminal."""

from __future__ import annotations

import io
import re

import pytest
from conftest import clean_env, run_gpuprof
from rich.cells import cell_len
from rich.console import Console

from gpuprof import store
from gpuprof.analyzers.diagnose import diagnose
from gpuprof.api import DEMO_SCENARIOS
from gpuprof.reports.summary import summary_renderable
from gpuprof.reports.terminal import diagnosis_renderable, findings_renderable
from gpuprof.sim import Pathology, SimConfig, simulate

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
BOX_DRAWING = re.compile("[\u2500-\u257f]")
LONG_NAME = "NVIDIA GH200 480GB Grace Hopper Superchip (a name longer than its column)"


@pytest.fixture(scope="module")
def demo_run():
    """The demo's default scenario, on two hosts, with a lost GPU and a very long GPU name."""
    pathologies = [Pathology(k, s) for k, s in DEMO_SCENARIOS["default"]]
    config = SimConfig(gpus=16, gpus_per_host=8, steps=3, time_scale=0.2,
                       pathologies=pathologies)  # fmt: skip
    run = simulate(config).run
    run.meta.gpus[3]["lost"] = True
    run.meta.gpus[3]["name"] = LONG_NAME
    return run


@pytest.fixture(scope="module")
def demo_diagnosis(demo_run):
    return diagnose(demo_run)


def render(renderable, width: int = 80, terminal: bool = True) -> str:
    """What a user sees: rendered for a colour terminal of ``width`` columns, codes removed."""
    console = Console(width=width, file=io.StringIO(), force_terminal=terminal,
                      color_system="truecolor" if terminal else None)  # fmt: skip
    console.print(renderable)
    return console.file.getvalue()


def words(text: str) -> str:
    return " ".join(ANSI.sub("", text).split())


def squashed(text: str) -> str:
    """Text without any whitespace: a long word folded over two lines reads back whole."""
    return re.sub(r"\s+", "", ANSI.sub("", text))


def assert_fits(text: str, width: int = 80) -> None:
    plain = ANSI.sub("", text)
    too_long = [line for line in plain.splitlines() if cell_len(line) > width]
    assert not too_long, too_long


def test_diagnosis_fits_80_columns_and_says_everything(demo_diagnosis):
    out = render(diagnosis_renderable(demo_diagnosis))
    assert "\x1b[" in out  # a terminal gets colour
    assert_fits(out)
    text = words(out)
    assert len(demo_diagnosis.findings) >= 3 and demo_diagnosis.recommendations
    for finding in demo_diagnosis.findings:
        assert finding.kind in text and " ".join(finding.summary.split()) in text
    for rec in demo_diagnosis.recommendations:
        # the knob, its change and the whole rationale survive the folding, in one piece
        assert str(rec.knob) in ANSI.sub("", out)
        assert f"→ {rec.suggested}" in text or f"→ {str(rec.suggested).lower()}" in text
        assert squashed(str(rec.rationale)) in squashed(out)
    # a knob that does not fit with its figures puts them on an indented line of its own
    lines = ANSI.sub("", out).splitlines()
    long_knob = max((str(r.knob) for r in demo_diagnosis.recommendations), key=len)
    (i,) = [n for n, line in enumerate(lines) if line.rstrip().endswith(long_knob)]
    assert lines[i + 1].startswith("    ") and "→" in lines[i + 1]
    assert not any(line.endswith(" ") for line in lines if line.startswith("    "))


def test_wide_terminals_keep_each_recommendation_on_one_line(demo_diagnosis):
    out = ANSI.sub("", render(findings_renderable(demo_diagnosis), width=160))
    assert_fits(out, 160)
    rec = demo_diagnosis.recommendations[0]
    line = next(line for line in out.splitlines() if str(rec.knob) in line)
    assert "→" in line and "% of GPU-time" in line


def test_summary_fits_80_columns_without_cutting_figures(demo_run):
    out = render(summary_renderable(demo_run, "/tmp/run"))
    assert_fits(out)
    plain = ANSI.sub("", out)
    lines = plain.splitlines()
    header = next(line for line in lines if line.startswith("gpu "))
    # the long name wraps under itself in its column, the row's figures stay on its first line
    (row,) = [n for n, line in enumerate(lines) if line.startswith("node0:3 (lost)")]
    start, end = header.index("name"), header.index("util") - 1
    below = [line for line in lines[row + 1 :] if line[:start].strip() == "" and line.strip()]
    name_lines = [lines[row], *below[:3]]
    assert " ".join(line[start:end].strip() for line in name_lines).startswith(LONG_NAME[:40])
    assert squashed(LONG_NAME) in squashed(" ".join(line[start:end] for line in name_lines))
    assert re.search(r"\d+%\s+\d+%\s+[\d.]+\s+\d+\s*$", lines[row])
    assert header.rstrip().endswith("power W") and "peak mem GiB" in header  # not cut
    for phase in demo_run.spans["phase"].unique():
        assert phase in plain


def test_narrow_terminals_still_fit(demo_run, demo_diagnosis):
    for width in (60, 48):
        assert_fits(render(diagnosis_renderable(demo_diagnosis), width=width), width)


@pytest.fixture(scope="module")
def demo_dir(demo_run, tmp_path_factory):
    path = tmp_path_factory.mktemp("terminal") / "run"
    store.save_run(demo_run, path)
    return path


@pytest.mark.parametrize("command", ["analyze", "summary"])
def test_piped_output_is_plain_text(demo_dir, command):
    env = {k: v for k, v in clean_env().items() if k not in ("COLUMNS", "FORCE_COLOR", "TERM")}
    result = run_gpuprof(command, str(demo_dir), env=env)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "\x1b" not in out and not BOX_DRAWING.search(out)
    assert_fits(out)
    assert ("Findings, by GPU-time lost" in out) == (command == "analyze")
    assert "reward_bound" in out or command == "summary"
