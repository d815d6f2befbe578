"""The HTML report on multi-node runs: heatmap rows and the GPU picker grouped by node, the
node picker (64+ nodes, or more GPUs than the heatmap can label), escaping of node names, and
the node picker driven in real headless Chromium.

The browser tests skip when Chromium is missing outside CI, like tests/test_report_browser.py;
under ``CI=true`` a missing browser fails.
"""

from __future__ import annotations

import json
import os
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from browser import Browser, chromium_path
from conftest import ROOT

from gpuprof.model import GpuSample, Run, RunMeta, columns
from gpuprof.reports.figures import Budget
from gpuprof.reports.html import render_html, write_html
from gpuprof.sim import SimConfig, simulate

ARTIFACTS = ROOT / "artifacts"
T0 = 1_700_000_000_000_000_000
HOSTILE = "<script>window.__pwned=1</script>"
HOSTILE_ATTR = "a\"b'c<img src=x onerror=window.__pwned=2>{{data}}"


def node_run(nodes: list[str], gpus_per_node: int, samples: int = 40, seed: int = 0) -> Run:
    """GPU samples at 10 Hz on ``nodes``, rows shuffled (the report must order them itself);
    GPU ``g`` of the ``k``-th listed node runs at a constant ``k * 10 + g`` % utilisation."""
    host = np.repeat(np.array(nodes, dtype=object), gpus_per_node * samples)
    gpu = np.tile(np.repeat(np.arange(gpus_per_node), samples), len(nodes))
    tick = np.tile(np.arange(samples), len(nodes) * gpus_per_node)
    util = np.repeat(np.arange(len(nodes)) * 10.0, gpus_per_node * samples) + gpu
    frame = pd.DataFrame({"host": host, "gpu": gpu, "uuid": [f"{h}-{g}" for h, g in zip(host, gpu)],
                          "t_ns": T0 + tick * 100_000_000, "util_gpu_pct": util})  # fmt: skip
    frame = frame.sample(frac=1.0, random_state=seed).reset_index(drop=True)
    meta = RunMeta(run_id="nodes", hosts=list(nodes), start_ns=T0,
                   end_ns=T0 + samples * 100_000_000)  # fmt: skip
    return Run(meta=meta, gpu=frame.reindex(columns=columns(GpuSample)))


class _Tags(HTMLParser):
    """Start tags with attributes (unescaped by the parser), the text inside each <option>,
    and the scripts."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.stack: list[tuple[str, dict]] = []
        self.options: list[tuple[str | None, str, str]] = []  # select id, value, text
        self.scripts = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        self.scripts += tag == "script"
        if tag in ("select", "optgroup", "option"):
            self.stack.append((tag, attrs))

    def handle_endtag(self, tag):
        if self.stack and self.stack[-1][0] == tag:
            self.stack.pop()

    def handle_data(self, data):
        if self.stack and self.stack[-1][0] == "option":
            select = next(a.get("id") for t, a in reversed(self.stack) if t == "select")
            self.options.append((select, self.stack[-1][1]["value"], data))

    def groups(self) -> list[str]:
        return [a["label"] for t, a in self.tags if t == "optgroup"]

    def texts(self, select: str) -> list[str]:
        return [text for s, _, text in self.options if s == select]


def parse(page: str) -> _Tags:
    tags = _Tags()
    tags.feed(page)
    return tags


def report_data(page: str) -> dict:
    match = re.search(r'<script type="application/json" id="gp-data">(.*?)</script>', page, re.S)
    assert match, "no data block"
    return json.loads(match.group(1))


# ------------------------------------------------------------------------------------------
# Without a browser


def test_heatmap_rows_go_by_node_then_gpu_with_rules_between_nodes():
    run = node_run(["node10", "node2", "node1"], 3)  # lexical order would put node10 second
    data = report_data(render_html(run))
    heat = data["figures"]["gp-heatmap"]
    order = ["node1", "node2", "node10"]
    assert heat["data"][0]["y"] == [f"{n}/gpu{g}" for n in order for g in range(3)]
    # each row is its own GPU's samples: node k (as listed) GPU g runs at k * 10 + g %
    listed = {"node10": 0, "node2": 1, "node1": 2}
    want = [listed[n] * 10 + g for n in order for g in range(3)]
    assert [row[0] for row in heat["data"][0]["z"]] == want
    rules = heat["layout"]["shapes"]
    assert [(s["y0"], s["y1"], s["xref"]) for s in rules] == [
        (2.5, 2.5, "paper"),
        (5.5, 5.5, "paper"),
    ]
    assert heat["layout"]["yaxis"]["title"]["text"] == "9 GPUs on 3 nodes"
    assert heat["layout"]["yaxis"]["showticklabels"] is True
    assert data["nodes"]["names"] == order and data["nodes"]["bounds"] == [0, 3, 6, 9]
    assert data["nodes"]["picker"] is False


def test_gpu_picker_groups_gpus_by_node_and_keeps_the_selector_indices():
    run = node_run(["b", "a", "c"], 8)  # 24 GPUs: above 16 the timeline has a GPU picker
    page = render_html(run)
    tags, data = parse(page), report_data(page)
    assert tags.groups() == ["a", "b", "c"]
    options = [(v, t) for s, v, t in tags.options if s == "gp-gpu"]
    assert [t for _, t in options] == [f"{n}/gpu{g}" for n in "abc" for g in range(8)]
    labels = data["selector"]["labels"]
    for value, text in options:  # option value i is the selector's GPU i, the same GPU
        node, gpu = text.split("/gpu")
        assert labels[int(value)] == f"{node}:{gpu}"
    assert 'id="gp-node"' not in page  # 3 nodes, 24 GPUs: every row fits with its label


def test_a_single_node_report_has_no_node_grouping():
    run = node_run(["only"], 24)
    page = render_html(run)
    data = report_data(page)
    heat = data["figures"]["gp-heatmap"]
    assert "nodes" not in data and "shapes" not in heat["layout"]
    assert heat["data"][0]["y"] == [f"GPU {g}" for g in range(24)]
    assert heat["layout"]["yaxis"]["title"]["text"] == "24 GPUs"
    assert "<optgroup" not in page and 'id="gp-node"' not in page
    assert parse(page).texts("gp-gpu") == [f"GPU {g}" for g in range(24)]


@pytest.mark.parametrize(
    ("nodes", "per_node", "picker"),
    [(63, 1, False), (9, 8, True), (64, 1, True)],
    ids=["63-nodes-63-gpus", "9-nodes-72-gpus", "64-nodes"],
)
def test_a_node_picker_from_64_nodes_or_more_gpus_than_labelled_rows(nodes, per_node, picker):
    names = [f"n{k}" for k in range(nodes)]
    page = render_html(node_run(names, per_node, samples=20))
    data, tags = report_data(page), parse(page)
    assert data["nodes"]["picker"] is picker and data["nodes"]["all"] is True
    if not picker:
        assert 'id="gp-node"' not in page
        return
    texts = tags.texts("gp-node")
    assert texts == [f"all {nodes} nodes ({nodes * per_node} GPUs)", *names]
    assert [v for s, v, _ in tags.options if s == "gp-node"] == ["all", *map(str, range(nodes))]
    yaxis = data["figures"]["gp-heatmap"]["layout"]["yaxis"]
    if nodes * per_node > 64:  # too many rows to label each: one node name per node
        assert yaxis["ticktext"] == names and yaxis["tickvals"][:2] == [3.5, 11.5]


def test_hostile_node_names_are_escaped_everywhere():
    names = [HOSTILE, HOSTILE_ATTR, *(f"node{k}" for k in range(62))]  # 64 nodes: a node picker
    run = node_run(names, 1, samples=20)
    page = render_html(run)
    tags = parse(page)
    assert HOSTILE not in page and "<img" not in page
    assert tags.scripts == 3 and not [t for t, _ in tags.tags if t == "img"]
    # what the browser will show is the names, as text, in both pickers and the node table
    assert set(tags.groups()) == set(names)
    assert set(tags.texts("gp-node")[1:]) == set(names)
    assert {HOSTILE + "/gpu0", HOSTILE_ATTR + "/gpu0"} <= set(tags.texts("gp-gpu"))
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in page
    data = report_data(page)  # the JSON block keeps them as data
    assert {HOSTILE, HOSTILE_ATTR} <= set(data["nodes"]["names"])
    assert HOSTILE_ATTR + "/gpu0" in data["figures"]["gp-heatmap"]["data"][0]["y"]


def test_512_gpus_on_64_nodes_stay_within_the_budgets():
    run = simulate(SimConfig(gpus=512, gpus_per_host=8, steps=2, time_scale=0.15)).run
    budget = Budget()
    page = render_html(run, budget=budget)
    data = report_data(page)
    assert len(page.encode()) < 10_000_000
    timeline = data["figures"]["gp-timeline"]["data"]
    assert not [t for t in timeline if str(t.get("name", "")).startswith("node")]  # no GPU lines
    assert any(t.get("name") == "utilization: mean" for t in timeline)
    z = data["figures"]["gp-heatmap"]["data"][0]["z"]
    assert len(z) == 512 and len(z) * len(z[0]) <= budget.heatmap_cells
    assert sum(len(x) for x in data["selector"]["x_deltas"]) <= budget.selector_points * 1.1
    assert data["nodes"]["names"][:3] == ["node0", "node1", "node2"]  # natural order
    assert data["nodes"]["names"][-1] == "node63"
    assert len(json.dumps(data["nodes"])) < 2_000  # the grouping itself costs next to nothing


def test_more_gpus_than_heatmap_pixels_show_one_node_at_a_time():
    names = [f"gpu-host-{k:03d}" for k in range(126)]  # 1008 GPUs: over 1000 px of rows
    page = render_html(node_run(names, 8, samples=10))
    data, tags = report_data(page), parse(page)
    assert data["nodes"]["all"] is False
    assert tags.texts("gp-node") == names  # no "all nodes" entry
    assert "the heatmap shows one node at a time" in page


# ------------------------------------------------------------------------------------------
# In Chromium


@pytest.fixture(scope="module")
def browser():
    if chromium_path() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is required under CI (.ci/run installs it)")
        pytest.skip("chromium is not installed")
    with Browser() as b:
        yield b


def open_report(browser: Browser, path: Path):
    page = browser.open(path.resolve().as_uri())
    page.wait_for("window.__gpuprofRenderedMs", timeout_s=60)
    return page


HEAT_Y = "Array.from(document.getElementById('gp-heatmap').data[0].y)"
PICKER = "Array.from(document.getElementById('gp-gpu').options).map(o => [o.value, o.text])"


def pick_node(page, value: str) -> None:
    page.evaluate(f"(() => {{ const s = document.getElementById('gp-node'); s.value = "
                  f"{json.dumps(value)}; s.dispatchEvent(new Event('change')); }})()")  # fmt: skip
    page.wait_for(
        f"document.getElementById('gp-heatmap').getAttribute('data-node') === {json.dumps(value)}"
    )


def _rename_host(run: Run, old: str, new: str) -> None:
    for frame in (run.gpu, run.host, run.procs, run.gpu_procs, run.spans, run.events):
        if "host" in frame:
            frame["host"] = frame["host"].replace(old, new)
    run.meta.hosts = [new if h == old else h for h in run.meta.hosts]


def test_node_picker_narrows_the_heatmap_and_the_gpu_picker(tmp_path, browser):
    run = simulate(SimConfig(gpus=512, gpus_per_host=8, steps=2, time_scale=0.15)).run
    _rename_host(run, "node40", HOSTILE)
    page = open_report(browser, write_html(run, tmp_path / "r.html"))
    assert page.errors == []
    data = page.evaluate("JSON.parse(document.getElementById('gp-data').textContent)")
    names = data["nodes"]["names"]
    assert len(names) == 64 and len(page.evaluate(HEAT_Y)) == 512  # "all nodes" to start
    assert page.evaluate("document.getElementById('gp-node').value") == "all"
    selected = f"document.getElementById('gp-timeline').data[{data['selector']['trace_index']}]"

    k = names.index("node13")
    pick_node(page, str(k))
    assert page.evaluate(HEAT_Y) == [f"node13/gpu{g}" for g in range(8)]
    first = data["nodes"]["bounds"][k]
    assert page.evaluate(PICKER) == [[str(first + g), f"node13/gpu{g}"] for g in range(8)]
    page.wait_for(f"{selected}.name === 'selected: node13:0'")  # the red line moved there
    height = page.evaluate("document.getElementById('gp-heatmap').layout.height")
    assert height < 400  # sized for 8 rows, not 512
    page.evaluate("document.getElementById('gp-heatmap').scrollIntoView()")
    page.screenshot(ARTIFACTS / "report-64nodes-node13.png", full_page=False)

    # the timeline's zoom (a drag: range[0], range[1]) still drives the heatmap, and a new
    # node keeps the zoomed range
    zoom = "Plotly.relayout('gp-timeline', {'xaxis.range[0]': 2, 'xaxis.range[1]': 4})"
    page.evaluate(zoom + ".then(() => 1)", await_promise=True)
    page.wait_for("document.getElementById('gp-heatmap').layout.xaxis.range[1] === 4")
    pick_node(page, str(names.index(HOSTILE)))
    assert page.evaluate(HEAT_Y) == [f"{HOSTILE}/gpu{g}" for g in range(8)]
    assert [t for _, t in page.evaluate(PICKER)] == [f"{HOSTILE}/gpu{g}" for g in range(8)]
    assert page.evaluate("document.getElementById('gp-heatmap').layout.xaxis.range") == [2, 4]
    assert page.evaluate("window.__pwned === undefined")

    pick_node(page, "all")  # back to every GPU; the selected GPU stays where it was
    assert len(page.evaluate(HEAT_Y)) == 512 and len(page.evaluate(PICKER)) == 512
    assert page.evaluate("document.getElementById('gp-gpu').value") == str(
        data["nodes"]["bounds"][names.index(HOSTILE)]
    )
    assert page.errors == []


def test_too_many_gpus_for_one_heatmap_start_on_the_first_node(tmp_path, browser):
    names = [f"gpu-host-{k:03d}" for k in range(126)]
    page = open_report(browser, write_html(node_run(names, 8, samples=10), tmp_path / "r.html"))
    assert page.evaluate(HEAT_Y) == [f"gpu-host-000/gpu{g}" for g in range(8)]
    assert [t for _, t in page.evaluate(PICKER)] == [f"gpu-host-000/gpu{g}" for g in range(8)]
    pick_node(page, "125")
    assert page.evaluate(HEAT_Y) == [f"gpu-host-125/gpu{g}" for g in range(8)]
    assert page.errors == []
