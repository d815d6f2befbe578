"""The HTML report without a browser: content, escaping, downsampling, sizes, the CLI."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import clean_env, run_gpuprof
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuprof import api, store
from gpuprof.model import Run, RunMeta
from gpuprof.reports.downsample import bin_stats, keep_shape
from gpuprof.reports.figures import Budget
from gpuprof.reports.html import json_for_script, render_html, write_html
from gpuprof.sim import Pathology, SimConfig, simulate

XSS_SCRIPT = "<script>window.__pwned=1</script>"
XSS_IMG = "<img src=x onerror=window.__pwned=2>"


class _Tags(HTMLParser):
    """Every start tag with its attributes, and the text of each <script>."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"
        if self._in_script:
            self.scripts.append("")

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts[-1] += data


def parse(page: str) -> _Tags:
    parser = _Tags()
    parser.feed(page)
    return parser


def report_data(page: str) -> dict:
    match = re.search(r'<script type="application/json" id="gp-data">(.*?)</script>', page, re.S)
    assert match, "no data block"
    return json.loads(match.group(1))


def sim_run(**overrides) -> Run:
    config = dict(
        gpus=4,
        steps=3,
        time_scale=0.3,
        seed=1,
        pathologies=[Pathology("reward_bound", 0.7), Pathology("reshard_idle", 0.6)],
    )
    config.update(overrides)
    return simulate(SimConfig(**config)).run


@pytest.fixture(scope="module")
def demo_page() -> tuple[Run, str]:
    run = sim_run()
    return run, render_html(run)


def test_report_is_self_contained_and_has_every_part(demo_page):
    _, page = demo_page
    tags = parse(page)
    # nothing is loaded from anywhere: no external script, stylesheet, image or frame
    assert not [t for t, a in tags.tags if a.get("src") or (t == "link" and a.get("href"))]
    assert len(tags.scripts) == 3  # plotly.js, the data, the page logic
    assert "Plotly" in tags.scripts[0] and len(tags.scripts[0]) > 1_000_000
    data = report_data(page)
    assert set(data["figures"]) == {"gp-timeline", "gp-heatmap", "gp-steps", "gp-idle",
                                    "gp-steptime"}  # fmt: skip
    ids = {a.get("id") for _, a in tags.tags}
    assert set(data["figures"]) <= ids
    for name in ("Recommendations", "Findings", "Timeline", "Phases", "reward_bound"):
        assert name in page
    # phases appear as bands on the timeline, one trace per phase of the owner's spans
    timeline = data["figures"]["gp-timeline"]["data"]
    bands = [t["name"] for t in timeline if t.get("legendgroup") == "phases"]
    assert {"rollout", "reward", "reshard", "update_actor"} <= set(bands)
    # the heatmap has a row per GPU
    assert len(data["figures"]["gp-heatmap"]["data"][0]["z"]) == 4


def test_headline_and_recommendations_come_from_the_diagnosis(demo_page):
    run, page = demo_page
    diagnosis = api.analyze(run)
    assert diagnosis.findings and diagnosis.recommendations
    util = diagnosis.summary["mean_util_gpu_pct"]
    assert f"{util:.0f}%" in page
    first = diagnosis.recommendations[0]
    knob = str(first.knob).replace(".", ".<wbr>")
    assert knob in page
    data = report_data(page)
    # every finding with intervals can zoom; its intervals are run-relative in the axis unit
    assert page.count('data-evidence="0"') >= 1
    intervals = data["evidence"]["0"]
    start_ns = diagnosis.findings[0].evidence["intervals"][0][0]
    scale = {"s": 1e9, "min": 60e9, "h": 3600e9}[data["unit"]]
    assert intervals[0][0] == pytest.approx((start_ns - run.meta.start_ns) / scale, abs=1e-5)


def test_run_strings_are_escaped_and_json_cannot_close_the_script():
    run = sim_run(gpus=2)
    run.meta.command = ["python", XSS_SCRIPT, XSS_IMG, "--x=</script><!--"]
    run.meta.run_id = XSS_IMG
    run.spans["phase"] = run.spans["phase"].replace("reward", XSS_IMG)
    page = render_html(run)
    tags = parse(page)
    assert [t for t, _ in tags.tags].count("script") == 3
    assert not [t for t, _ in tags.tags if t == "img"]
    assert XSS_SCRIPT not in page and XSS_IMG not in page
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in page
    data = report_data(page)  # the phase name survives, as data
    names = {t.get("name") for t in data["figures"]["gp-timeline"]["data"]}
    assert XSS_IMG in names


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.text() | st.floats(allow_nan=False, allow_infinity=False) | st.integers(),
        lambda c: st.lists(c) | st.dictionaries(st.text(), c),
        max_leaves=10,
    )
)
def test_json_for_script_round_trips_and_never_ends_the_script(value):
    text = json_for_script(value)
    assert "</" not in text and "<!--" not in text and "<" not in text
    assert json.loads(text) == value


def test_keep_shape_keeps_a_single_sample_dip_in_a_million():
    rng = np.random.default_rng(0)
    t = np.arange(1_000_000, dtype=np.float64) * 0.1
    y = 90 + rng.normal(0, 2, len(t))
    y[123_457] = 0.0  # one 100 ms stall in a day of samples
    y[700_001] = np.nan  # not measured: never drawn, never chosen
    keep = keep_shape(t, y, 2000)
    assert len(keep) <= 2000
    assert 123_457 in keep and 700_001 not in keep
    assert np.all(np.diff(keep) > 0)
    short = keep_shape(t[:50], y[:50], 2000)
    assert list(short) == list(range(50))


def test_bin_stats_matches_a_direct_computation():
    rng = np.random.default_rng(1)
    t = rng.uniform(0, 100, 5000)
    y = rng.uniform(0, 100, 5000)
    group = rng.integers(0, 3, 5000)
    b = bin_stats(t, y, 0.0, 100.0, 10, group=group)
    for g in range(3):
        for k in range(10):
            mask = (group == g) & (t >= 10 * k) & (t < 10 * (k + 1))
            assert b.mean[g, k] == pytest.approx(y[mask].mean())
            assert b.min[g, k] == y[mask].min() and b.max[g, k] == y[mask].max()
    empty = bin_stats(np.array([1.0]), np.array([5.0]), 0.0, 100.0, 4)
    assert empty.mean[0] == 5.0 and np.isnan(empty.mean[1:]).all()


def test_many_gpus_switch_to_aggregate_lines_and_a_gpu_selector():
    run = sim_run(gpus=24, gpus_per_host=8, steps=2, time_scale=0.15)
    page = render_html(run)
    data = report_data(page)
    timeline = data["figures"]["gp-timeline"]["data"]
    gpu_lines = [t for t in timeline if str(t.get("name", "")).startswith("node")]
    assert gpu_lines == []  # no per-GPU line above 16 GPUs
    sel = data["selector"]
    assert len(sel["labels"]) == 24 and sel["labels"][0] == "node0:0"
    assert timeline[sel["trace_index"]]["name"] == "selected: node0:0"
    # the picker's data decodes to that GPU's own samples (times as integer steps)
    x = np.cumsum(sel["x_deltas"][13]) / sel["x_scale"]
    assert np.all(np.diff(x) > 0) and x[0] >= 0 and x[-1] <= data["end"] + 1e-6
    scale = {"s": 1e9, "min": 60e9, "h": 3600e9}[data["unit"]]
    gpu = run.gpu[(run.gpu["host"] == "node1") & (run.gpu["gpu"] == 5)]  # node1:5 is the 14th
    t = (gpu["t_ns"].to_numpy() - run.meta.start_ns) / scale
    nearest = np.abs(t[None, :] - x[:, None]).argmin(axis=1)
    assert np.allclose(gpu["util_gpu_pct"].to_numpy()[nearest], sel["y"][13], atol=0.51)
    assert 'id="gp-gpu"' in page and page.count("<option") == 24
    assert "24 GPUs: the timeline shows the mean and the min–max band" in page
    assert len(data["figures"]["gp-heatmap"]["data"][0]["z"]) == 24


def test_downsampling_is_said_and_bounded():
    run = sim_run(gpus=2, steps=4, time_scale=1.0)
    budget = Budget(line_points=300, bins=200, evidence_windows=0)
    page = render_html(run, budget=budget)
    data = report_data(page)
    timeline = data["figures"]["gp-timeline"]["data"]
    util = [t for t in timeline if t.get("name") == "GPU 0" and t["yaxis"] == "y"]
    assert len(util) == 1 and len(util[0]["x"]) <= 300
    match = re.search(r"Downsampled: ([\d,]+) GPU samples are drawn as ([\d,]+) points", page)
    assert match, "the report must say that it downsampled"
    assert int(match.group(1).replace(",", "")) == len(run.gpu)
    # the time axis is relative to the run start
    assert min(util[0]["x"]) < 1.0


def test_evidence_windows_keep_full_resolution_where_the_buttons_zoom():
    run = sim_run(gpus=2, steps=6, time_scale=1.0, pathologies=[Pathology("reward_bound", 0.8)])
    budget = Budget(line_points=200, bins=100)
    page = render_html(run, budget=budget)
    data = report_data(page)
    assert "the timeline keeps full resolution" in page
    scale = {"s": 1e9, "min": 60e9, "h": 3600e9}[data["unit"]]
    gpu0 = run.gpu[run.gpu["gpu"] == 0]
    t = (gpu0["t_ns"].to_numpy() - run.meta.start_ns) / scale
    timeline = data["figures"]["gp-timeline"]["data"]
    util = next(tr for tr in timeline if tr.get("name") == "GPU 0" and tr["yaxis"] == "y")
    xs = np.array(util["x"])
    lo, hi = data["evidence"]["0"][0]
    pad = max((hi - lo) * 0.5, data["end"] * 0.002)  # report.js zooms to exactly this
    raw = int(((t >= lo - pad) & (t <= hi + pad)).sum())
    drawn = int(((xs >= lo - pad) & (xs <= hi + pad)).sum())
    assert raw > 20 and drawn >= min(raw, budget.window_points) - 2  # every sample, not buckets
    far = (xs > hi + 10 * (hi - lo) + pad) & (xs < hi + 20 * (hi - lo))  # coarse elsewhere
    assert far.sum() < ((t > hi + 10 * (hi - lo) + pad) & (t < hi + 20 * (hi - lo))).sum() / 3


def test_run_without_gpu_samples_or_spans_still_renders_with_notes():
    run = Run(RunMeta(run_id="cpu-only", command=["python", "train.py"], hosts=["h"],
                      start_ns=1_000_000_000, end_ns=61_000_000_000, exit_code=0))  # fmt: skip
    page = render_html(run)
    assert "no GPU samples" in page
    assert "No phase spans were recorded" in page
    data = report_data(page)
    assert "gp-timeline" in data["figures"]
    assert "gp-heatmap" not in data["figures"]


def test_write_html_is_atomic_and_readable(tmp_path):
    run = sim_run(gpus=1, steps=2)
    out = write_html(run, tmp_path / "r.html")
    assert out.stat().st_mode & 0o044  # readable by others, like any shared report
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]
    (tmp_path / "dir.html").mkdir()
    with pytest.raises(OSError):
        write_html(run, tmp_path / "dir.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.html", "r.html"]  # no temp left


def test_cli_report_writes_the_file_and_prints_its_path(tmp_path):
    run_dir = tmp_path / "run"
    store.save_run(sim_run(gpus=2, steps=2), run_dir)
    result = run_gpuprof("report", str(run_dir))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(run_dir / "report.html")
    assert (run_dir / "report.html").stat().st_size > 1_000_000
    out = tmp_path / "elsewhere.html"
    result = run_gpuprof("report", str(run_dir), "-o", str(out))
    assert result.returncode == 0 and out.exists()


@pytest.mark.parametrize("kind", ["missing", "empty", "junk"])
def test_cli_report_on_a_bad_dir_is_one_line_exit_2_and_writes_nothing(tmp_path, kind):
    target = tmp_path / "run"
    if kind != "missing":
        target.mkdir()
    if kind == "junk":
        (target / "node0.sqlite").write_bytes(b"not a database" * 100)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    result = run_gpuprof("report", str(target))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("gpuprof: error:") and "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_cli_report_to_an_unwritable_place_is_one_line_exit_2(tmp_path):
    run_dir = tmp_path / "run"
    store.save_run(sim_run(gpus=1, steps=2), run_dir)
    result = run_gpuprof("report", str(run_dir), "-o", str(tmp_path / "no" / "such" / "r.html"))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1


def test_demo_writes_the_report(tmp_path):
    result = run_gpuprof("demo", "-o", str(tmp_path / "d"), "--gpus", "2", "--duration", "120")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "d" / "report.html").exists()
    assert f"report: {tmp_path / 'd' / 'report.html'}" in result.stdout


def test_watch_writes_the_report_and_keeps_the_exit_code(tmp_path):
    run_dir = tmp_path / "w"
    result = run_gpuprof("watch", "--no-nvml", "-o", str(run_dir), "--",
                         "python", "-c", "import sys, time; time.sleep(0.6); sys.exit(3)",
                         env=clean_env())  # fmt: skip
    assert result.returncode == 3
    assert (run_dir / "report.html").exists()
    assert f"report: {run_dir / 'report.html'}" in result.stderr


def test_a_failed_report_at_the_end_of_watch_is_one_line(tmp_path, capsys):
    from gpuprof import watch_end

    run_dir = tmp_path / "w"
    store.save_run(sim_run(gpus=1, steps=2), run_dir)
    (run_dir / "report.html").mkdir()  # the report can't be put there
    # must not raise: watch's exit code is the command's
    made = watch_end.finish(Path(run_dir), quiet=True)
    assert made.report is None and made.document["findings"] is not None
    made = watch_end.finish(Path(run_dir), quiet=False)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("gpuprof: error: report not written")
    assert sum("gpuprof: error:" in line for line in err) == 1


def test_precomputed_diagnosis_and_phase_steps_are_used_as_given():
    run = sim_run(gpus=2, steps=2)
    diagnosis = api.analyze(run)
    diagnosis.summary["mean_util_gpu_pct"] = 12.345
    steps = pd.DataFrame({"phase": ["rollout"], "step": [0.0], "wall_s": [7.0]})
    page = render_html(run, diagnosis, phase_steps=steps)
    assert "12%" in page
    bars = report_data(page)["figures"]["gp-steps"]["data"]
    assert [(b["name"], b["y"]) for b in bars] == [("rollout", [7.0])]
