"""The HTML report opened in real headless Chromium (Debian's ``chromium``).

Skipped only when Chromium is missing outside CI; under ``CI=true`` a missing browser fails.
Screenshots go to ``artifacts/`` at the repository root (kept by CI, ignored by git).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path

import pandas as pd
import pytest
from browser import Browser, chromium_path
from conftest import ROOT, run_gpuprof

from gpuprof import store
from gpuprof.model import Run, RunMeta
from gpuprof.reports.html import write_html
from gpuprof.sim import Pathology, SimConfig, simulate

ARTIFACTS = ROOT / "artifacts"

if chromium_path() is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("chromium is required under CI (.ci/run installs it)")
    pytest.skip("chromium is not installed", allow_module_level=True)

FIGURES_DRAWN = (
    "Array.from(document.querySelectorAll('.fig'))"
    ".map(d => [d.id, d.querySelectorAll('.main-svg').length])"
)
X_RANGE = "document.getElementById('gp-timeline').layout.xaxis.range"


def wait_until(check, timeout_s: float = 10.0):
    """Poll ``check()`` (a Python callable reading the page) until it is truthy."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


@pytest.fixture(scope="module")
def browser():
    with Browser() as b:
        yield b


def open_report(browser: Browser, path: Path):
    page = browser.open(path.resolve().as_uri())
    page.wait_for("window.__gpuprofRenderedMs", timeout_s=60)
    return page


@pytest.fixture(scope="module")
def demo(tmp_path_factory, browser):
    """`gpuprof demo` run end to end, its report opened once for the tests below."""
    run_dir = tmp_path_factory.mktemp("demo") / "run"
    result = run_gpuprof("demo", "-o", str(run_dir))
    assert result.returncode == 0, result.stderr
    page = open_report(browser, run_dir / "report.html")
    return run_dir, page


def test_demo_report_renders_every_figure_without_errors(demo):
    _, page = demo
    drawn = dict(page.evaluate(FIGURES_DRAWN))
    assert set(drawn) == {"gp-timeline", "gp-heatmap", "gp-steps", "gp-idle", "gp-steptime"}
    assert all(n >= 1 for n in drawn.values()), drawn
    assert page.errors == []
    # offline: the page asked for nothing but itself (plotly inlines a few data: images)
    assert page.requests and all(
        u.split(":")[0] in ("file", "data", "about") for u in page.requests
    )
    shot = page.screenshot(ARTIFACTS / "report-demo.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000


def test_recommendation_evidence_link_zooms_the_timeline(demo):
    _, page = demo
    before = page.evaluate(X_RANGE)
    evidence = page.evaluate("JSON.parse(document.getElementById('gp-data').textContent).evidence")
    button = "table.recs [data-evidence]"
    key = page.evaluate(f"document.querySelector({json.dumps(button)}).dataset.evidence")
    page.click(button)
    after = wait_until(lambda: (r := page.evaluate(X_RANGE)) != before and r)
    lo, hi = evidence[key][0]
    assert after[0] <= lo < hi <= after[1]  # the evidence interval is in view…
    assert after[1] - after[0] < (before[1] - before[0]) / 3  # …and the view is zoomed in
    heat = page.evaluate("document.getElementById('gp-heatmap').layout.xaxis.range")
    assert heat == pytest.approx(after)
    page.click(button)  # a second click goes to the next interval
    second = wait_until(lambda: (r := page.evaluate(X_RANGE)) != after and r)
    assert second[0] <= evidence[key][1][0] <= second[1]
    page.screenshot(ARTIFACTS / "report-demo-zoomed.png", full_page=False)
    page.click("#gp-reset")
    reset = wait_until(lambda: (r := page.evaluate(X_RANGE)) != second and r)
    assert reset == pytest.approx(before)
    assert page.errors == []


def test_hostile_run_strings_do_not_execute(tmp_path, browser):
    run = simulate(SimConfig(gpus=2, steps=2, time_scale=0.3,
                             pathologies=[Pathology("reward_bound", 0.7)])).run  # fmt: skip
    payload_script = "<script>window.__pwned=1</script>"
    payload_img = "<img src=x onerror=window.__pwned=2>"
    run.meta.command = ["python", payload_script, payload_img]
    run.meta.run_id = payload_img
    run.meta.knobs = {"reward_model.reward_manager": payload_script}
    run.spans["phase"] = run.spans["phase"].replace("reward", payload_img)
    run.spans["name"] = run.spans["phase"]
    run_dir = tmp_path / "run"
    store.save_run(run, run_dir)
    result = run_gpuprof("report", str(run_dir))
    assert result.returncode == 0, result.stderr
    page = open_report(browser, run_dir / "report.html")
    assert page.evaluate("window.__pwned === undefined")
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    assert payload_script in page.evaluate("document.querySelector('table.meta code').textContent")
    legend = page.evaluate("document.getElementById('gp-timeline').textContent")
    assert payload_img in legend  # the phase is shown, as text
    assert page.errors == []


def test_run_without_gpu_samples_or_spans_renders_with_a_note(tmp_path, browser):
    run = Run(RunMeta(run_id="cpu-only", command=["python", "train.py"], hosts=["h"],
                      start_ns=10**18, end_ns=10**18 + 90 * 10**9, exit_code=1))  # fmt: skip
    path = write_html(run, tmp_path / "r.html")
    page = open_report(browser, path)
    assert dict(page.evaluate(FIGURES_DRAWN))["gp-timeline"] >= 1
    text = page.evaluate("document.body.innerText")
    assert "no GPU samples" in text and "No phase spans were recorded" in text
    assert page.errors == []


def test_many_gpus_selector_switches_the_selected_trace(tmp_path, browser):
    run = simulate(SimConfig(gpus=32, gpus_per_host=8, steps=2, time_scale=0.15)).run
    path = write_html(run, tmp_path / "r.html")
    page = open_report(browser, path)
    assert page.errors == []
    index = page.evaluate("JSON.parse(document.getElementById('gp-data').textContent)"
                          ".selector.trace_index")  # fmt: skip
    name = f"document.getElementById('gp-timeline').data[{index}].name"
    assert page.evaluate(name) == "selected: node0:0"
    page.evaluate("(() => { const s = document.getElementById('gp-gpu'); s.value = '17';"
                  " s.dispatchEvent(new Event('change')); })()")  # fmt: skip
    page.wait_for(f"{name} === 'selected: node2:1'", timeout_s=10)
    x = page.evaluate(f"Array.from(document.getElementById('gp-timeline').data[{index}].x)")
    deltas = page.evaluate("JSON.parse(document.getElementById('gp-data').textContent)"
                           ".selector.x_deltas[17]")  # fmt: skip
    assert len(x) == len(deltas) > 10 and all(b > a for a, b in itertools.pairwise(x))
    page.screenshot(ARTIFACTS / "report-32gpus.png")
    assert page.errors == []


def _run_with_stacks(function_name: str) -> Run:
    """A simulated reward-bound run whose reward spans the main process spent in
    ``function_name`` (user code) → a library call, with a blocked helper stack beside."""
    from gpuprof.collectors.stacks import frame_id, stack_id
    from gpuprof.model import StackSample

    run = simulate(SimConfig(gpus=2, steps=3, time_scale=0.3,
                             pathologies=[Pathology("reward_bound", 0.8)])).run  # fmt: skip
    sympy = "/venv/lib/python3.11/site-packages/sympy/simplify.py"
    frames = [("main", "/home/u/train.py", 10), (function_name, "/home/u/reward.py", 87),
              ("simplify", sympy, 600)]  # fmt: skip
    fids = [frame_id(*f) for f in frames]
    sid = stack_id(fids)
    run.stack_frames = pd.DataFrame([(i, *f) for i, f in zip(fids, frames)],
                                    columns=["frame_id", "name", "file", "line"])  # fmt: skip
    run.stacks = pd.DataFrame([(sid, " ".join(map(str, fids)))], columns=["stack_id", "frames"])
    reward = run.spans[run.spans["phase"] == "reward"]
    run.stack_samples = pd.DataFrame(
        [("h0", int(s), (e - s) / 1e9, 1.0, 1, None, "MainThread", "main", sid, (e - s) / 1e9,
          20.0) for s, e in zip(reward["start_ns"], reward["end_ns"])],
        columns=list(StackSample.__slots__),
    )  # fmt: skip
    return run


FLAME = "document.querySelector('.flame[data-which=busy]')"


def test_flame_graph_per_finding_draws_offline_and_zooms(tmp_path, browser):
    hostile = "<img src=x onerror=window.__pwned=3>"
    run_dir = tmp_path / "run"
    store.save_run(_run_with_stacks(hostile), run_dir)
    result = run_gpuprof("report", str(run_dir))
    assert result.returncode == 0, result.stderr
    page = open_report(browser, run_dir / "report.html")
    assert page.errors == [] and page.evaluate("window.__pwned === undefined")
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    assert all(u.split(":")[0] in ("file", "data", "about") for u in page.requests)
    drawn = int(page.evaluate(f"{FLAME}.getAttribute('data-drawn')"))
    assert drawn == 4  # all → main → the user function → the library call
    labels = page.evaluate(f"Array.from({FLAME}.querySelectorAll('g')).map(g => g.dataset.name)")
    assert labels == ["all", "main", hostile, "simplify"]  # the name, as text
    tips = page.evaluate(f"Array.from({FLAME}.querySelectorAll('title')).map(t => t.textContent)")
    assert "(reward.py:87)" in tips[2] and "100.0%" in tips[2]
    # the finding's line and the section's table name it too, as text
    heading = page.evaluate("document.querySelector('#gp-stacks-section h3').textContent")
    assert heading.startswith("reward_bound: 100% of the sampled Python time in reward.py:87 ")
    assert hostile in heading
    line = page.evaluate("document.querySelector('table.findings .stackline').textContent")
    assert hostile in line
    # click a frame: it becomes the root; click the root: back to the whole graph
    frame = ".flame[data-which=busy] svg > g:nth-of-type({})"
    page.click(frame.format(3))
    page.wait_for(f"{FLAME}.getAttribute('data-root') !== 'all'", timeout_s=10)
    assert page.evaluate(f"{FLAME}.getAttribute('data-drawn')") == "2"
    page.click(frame.format(1))
    page.wait_for(f"{FLAME}.getAttribute('data-root') === 'all'", timeout_s=10)
    page.evaluate("document.getElementById('gp-stacks-section').scrollIntoView()")
    page.screenshot(ARTIFACTS / "report-flame.png", full_page=False)
    assert page.errors == []


def test_report_without_stacks_has_no_flame_section(demo):
    _, page = demo
    assert page.evaluate("document.getElementById('gp-stacks-section')") is None
    assert page.evaluate("document.querySelectorAll('.flame').length") == 0


def test_the_report_stretch_by_stretch_draws_offline_and_escapes(tmp_path, browser):
    """``report --by-steps N``: the stacked bars per stretch and kind, drawn offline, with
    the run's strings shown as text."""
    run = simulate(SimConfig(gpus=4, steps=6, seed=2,
                             pathologies=[Pathology("reward_bound", 0.8)])).run  # fmt: skip
    payload_img = "<img src=x onerror=window.__pwned=2>"
    run.meta.run_id = payload_img
    run.meta.knobs = {**run.meta.knobs, "reward_model.reward_manager": payload_img}
    run_dir = tmp_path / "run"
    store.save_run(run, run_dir)
    result = run_gpuprof("report", str(run_dir), "--by-steps", "2")
    assert result.returncode == 0, result.stderr
    path = run_dir / "report-by-steps-2.html"
    assert result.stdout.strip() == str(path)
    page = open_report(browser, path)
    assert page.evaluate("window.__pwned === undefined")
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    assert payload_img in page.evaluate("document.querySelector('h1').textContent")
    bars = page.evaluate(
        "document.getElementById('gp-by-steps').data.filter(t => t.type === 'bar')"
        ".map(t => [t.name, t.x])"
    )
    assert ["reward_bound", ["0–1", "2–3", "4–5"]] in bars
    drawn = dict(page.evaluate(FIGURES_DRAWN))
    assert set(drawn) == {"gp-by-steps"} and drawn["gp-by-steps"] >= 1
    assert page.requests and all(
        u.split(":")[0] in ("file", "data", "about") for u in page.requests
    )
    assert page.errors == []
    page.screenshot(ARTIFACTS / "report-by-steps.png")
