"""`analyze` and `report` with plain arguments run without typer (`gpuprof.cli.plain_call`):
the same results as the typer app, anything unusual left to it, and none of typer, pydantic
or rich imported for ``analyze --json``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clean_env, run_gpuprof

from gpuprof import store
from gpuprof.cli import analyze_command, plain_call, report_command
from gpuprof.sim import SimConfig, simulate


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plain") / "run"
    store.save_run(simulate(SimConfig(gpus=2, steps=6, seed=3)).run, path)
    return path


@pytest.mark.parametrize(
    "argv, kwargs",
    [
        (["analyze", "R", "--json"], {"json_out": True}),
        (["analyze", "--json", "R"], {"json_out": True}),
        (["analyze", "R", "--top", "3", "--gpu-hour-price=2.5"], {"top": 3, "gpu_hour_price": 2.5}),
        (["analyze", "R", "--gpu", "H100", "--model-params", "7B"],
         {"gpu": "H100", "model_params": "7B"}),
        (["analyze", "--", "R"], {}),
        (["analyze", "R", "--workers", "2"], {"workers": 2}),
        (["report", "R", "--ray", "auto"], {"ray": "auto"}),
        (["analyze", "R", "--steps", "10:20"], {"steps": "10:20"}),
        (["report", "R", "--steps=-5:"], {"steps": "-5:"}),
        (["report", "R", "-o", "out.html"], {"output": Path("out.html")}),
        (["report", "R", "--output=out.html", "--gpu-hour-price", "0"],
         {"output": Path("out.html"), "gpu_hour_price": 0.0}),
    ],
)  # fmt: skip
def test_plain_arguments_are_parsed_here(argv, kwargs):
    body, parsed = plain_call(argv)
    assert body is (analyze_command if argv[0] == "analyze" else report_command)
    assert parsed == {**kwargs, "run_dir": Path("R")}


@pytest.mark.parametrize(
    "argv",
    [
        [], ["watch", "--", "true"], ["analyze"], ["analyze", "R", "S"], ["analyze", "--help"],
        ["analyze", "R", "--json", "--json"], ["analyze", "R", "--json=1"],
        ["analyze", "R", "--top", "0"], ["analyze", "R", "--top", "x"], ["analyze", "R", "--top"],
        ["analyze", "R", "--top", "-1"], ["analyze", "R", "--top", "007"],
        ["analyze", "R", "--gpu-hour-price", "-1"], ["analyze", "R", "--gpu-hour-price", "1e3"],
        ["analyze", "R", "--gpu", "no such gpu"], ["analyze", "R", "--model-params", "lots"],
        ["analyze", "R", "--unknown"], ["analyze", ""], ["report", "R", "-oX"],
        ["analyze", "R", "--workers", "0"], ["analyze", "R", "--steps", "x"],
        ["analyze", "R", "--steps", "-5:"],  # a value like an option: typer's rules decide
    ],
)  # fmt: skip
def test_anything_unusual_goes_to_typer(argv):
    assert plain_call(argv) is None


def test_analyze_json_needs_no_typer_pydantic_or_rich(run_dir):
    code = (
        "import sys; from gpuprof.cli import plain_call; "
        f"body, kwargs = plain_call(['analyze', {str(run_dir)!r}, '--json']); body(**kwargs); "
        "print(sorted(m for m in ('typer', 'click', 'pydantic', 'rich') if m in sys.modules), "
        "file=sys.stderr)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=clean_env(), timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["schema_version"] == 2
    assert proc.stderr.strip().splitlines()[-1] == "[]"


def test_plain_and_typer_give_the_same_output(run_dir, tmp_path):
    plain = run_gpuprof("analyze", str(run_dir), "--json", "--top", "2")
    code = "import sys; from gpuprof.commands import app; sys.argv[0] = 'gpuprof'; app()"
    typer = subprocess.run(
        [sys.executable, "-c", code, "analyze", str(run_dir), "--json", "--top", "2"],
        capture_output=True, text=True, env=clean_env(), timeout=300,
    )  # fmt: skip
    assert plain.returncode == typer.returncode == 0, plain.stderr + typer.stderr
    assert plain.stdout == typer.stdout
    out = tmp_path / "r.html"
    report = run_gpuprof("report", str(run_dir), "-o", str(out))
    assert report.returncode == 0, report.stderr
    assert report.stdout.strip() == str(out) and out.stat().st_size > 0


def test_bad_values_get_typers_message(run_dir):
    result = run_gpuprof("analyze", str(run_dir), "--json", "--top", "0")
    assert result.returncode == 2
    assert "--top" in result.stderr and not result.stdout
    missing = run_gpuprof("analyze", str(run_dir.parent / "none"), "--json")
    assert missing.returncode == 2 and "gpuprof: error:" in missing.stderr
