"""The Grafana dashboard for `watch --metrics-port` (gpuprof/reports/dashboards/grafana.json).

Grafana itself is not installable here (Debian has none and it is AGPL), so the dashboard is
checked against Grafana's dashboard schema as the grafana-foundation-sdk models it: decoded
with the SDK's models (panel options and queries by plugin type), nothing of it dropped on the
way back, every value of the type and enum the schema gives. Then a real Prometheus scrapes a
real `gpuprof watch --metrics-port` of a hooked child on simulated GPUs, beside a real
dcgm-exporter scrape (the excerpt in ../shared/fixtures, whose GPUs the simulated ones are) and
a scrape in Ray's format, and every panel's query must return data, and the joins
docs/DASHBOARDS.md gives must pair each GPU once, with no `label_replace`.
"""

from __future__ import annotations

import contextlib
import enum
import http.server
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import typing
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT, SHARED_FIXTURES, clean_env, gpuprof_cmd, run_gpuprof
from simnvml import simnvml_env, write_scenario

from gpuprof.nodes import ENV_NODE_IP, node_ip
from gpuprof.reports.dashboards import grafana_json

pytest_plugins = ["simnvml.fixtures"]

DASHBOARD = json.loads(grafana_json())
DCGM_SCRAPE = SHARED_FIXTURES / "dcgm" / "v100_node_scrape_excerpt.txt"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
RATE_INTERVAL = "4s"
"""What Grafana makes of ``$__rate_interval`` for a data source scraped every second: four
scrape intervals."""
GIB = 2**30
NO_SDK = "grafana-foundation-sdk is not installed (the test extra; it needs Python 3.11+)"


def _panels(panels: list[dict] | None = None) -> list[dict]:
    """Every panel that is not a row, rows' own panels included."""
    out = []
    for p in DASHBOARD["panels"] if panels is None else panels:
        if p["type"] == "row":
            out.extend(_panels(p.get("panels") or []))
        else:
            out.append(p)
    return out


def _variables() -> dict[str, dict]:
    return {v["name"]: v for v in DASHBOARD["templating"]["list"]}


# ----- the dashboard on its own


def test_the_cli_prints_the_dashboard():
    done = run_gpuprof("dashboard")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == DASHBOARD


def test_panels_queries_and_variables_are_what_the_issue_asks():
    titles = {p["title"] for p in _panels()}
    assert {"Utilization per GPU", "Utilization per node", "Idle GPU-time by phase",
            "Step time per process", "Steps per second", "Top finding so far",
            "GPU memory used"} <= titles  # fmt: skip
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    assert set(_variables()) == {"datasource", "node", "gpu"}
    assert _variables()["datasource"]["query"] == "prometheus"
    # the idle GPU-time by phase is stacked
    (idle,) = [p for p in _panels() if p["title"] == "Idle GPU-time by phase"]
    assert idle["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    cells: set[tuple[int, int]] = set()
    for p in DASHBOARD["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}  # fmt: skip
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
    for p in _panels():
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"]
            expr = t["expr"]
            # a rate over $__rate_interval, never a fixed window Grafana cannot adapt
            for window in re.findall(r"\b(?:rate|irate|increase)\([^\[]*\[([^\]]+)\]", expr):
                assert window == "$__rate_interval", (p["title"], expr)
            assert set(re.findall(r"\$\w+", expr)) <= {"$node", "$gpu", "$__rate_interval"}


def _type_errors(value: typing.Any, hint: typing.Any, path: str) -> list[str]:
    """Where ``value`` (decoded by the SDK) is not of the type the schema gives."""
    from grafana_foundation_sdk.cog import variants

    if hint is typing.Any or hint is object:  # panel options and custom field config
        return _model_errors(value, path) if _is_model(value) else []
    if hint is type(None):
        return [] if value is None else [f"{path}: {value!r} where null is expected"]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        if value is None:
            return [] if type(None) in args else [f"{path}: null where {hint} is expected"]
        arms = [a for a in args if a is not type(None)]
        arms = [a for a in arms if isinstance(a, type) and isinstance(value, a)] or arms
        tries = [_type_errors(value, arm, path) for arm in arms]
        return [] if any(not t for t in tries) else tries[0]
    if value is None:
        return [f"{path}: null where {hint} is expected"]
    if origin is typing.Literal:
        return [] if value in args else [f"{path}: {value!r} is not one of {args}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: {type(value).__name__} where a list is expected"]
        return [e for i, v in enumerate(value) for e in _type_errors(v, args[0], f"{path}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: {type(value).__name__} where an object is expected"]
        return [e for k, v in value.items() for e in _type_errors(v, args[1], f"{path}.{k}")]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        known = isinstance(value, hint) or value in {m.value for m in hint}
        return [] if known else [f"{path}: {value!r} is not a {hint.__name__}"]
    if hint is bool:
        return [] if isinstance(value, bool) else [f"{path}: {value!r} is not a bool"]
    if hint in (int, float):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if number and (hint is float or float(value).is_integer()):
            return []
        return [f"{path}: {value!r} is not a {hint.__name__}"]
    if hint is str:
        return [] if isinstance(value, str) else [f"{path}: {value!r} is not a string"]
    if isinstance(hint, type) and (hasattr(hint, "to_json") or hint is variants.Dataquery):
        if isinstance(value, dict) and hasattr(hint, "from_json"):  # left as JSON by the SDK
            decoded = hint.from_json(value)
            return _dropped(value, _encoded(decoded), path) + _model_errors(decoded, path)
        if not isinstance(value, hint):
            return [f"{path}: {type(value).__name__} where {hint.__name__} is expected"]
        return _model_errors(value, path)
    return [f"{path}: nothing checks {hint}"]


def _is_model(value: typing.Any) -> bool:
    return hasattr(type(value), "to_json") and not isinstance(value, type)


def _model_errors(model: typing.Any, path: str) -> list[str]:
    from grafana_foundation_sdk.cog.runtime import UnknownDataquery

    if isinstance(model, UnknownDataquery):
        return [f"{path}: a query of no data source the schema knows"]
    hints = typing.get_type_hints(type(model))
    return [e for name, hint in hints.items()
            for e in _type_errors(getattr(model, name), hint, f"{path}.{name}")]  # fmt: skip


def _encoded(model: typing.Any) -> typing.Any:
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    return json.loads(json.dumps(model, cls=JSONEncoder))


def _dropped(original: typing.Any, back: typing.Any, path: str = "$") -> list[str]:
    """What of ``original`` the SDK's models did not keep: keys the schema does not know."""
    if isinstance(original, dict):
        if not isinstance(back, dict):
            return [path]
        return [p for k, v in original.items()
                for p in (_dropped(v, back[k], f"{path}.{k}") if k in back
                          else [f"{path}.{k}"])]  # fmt: skip
    if isinstance(original, list):
        if not isinstance(back, list) or len(back) != len(original):
            return [path]
        return [p for i, (a, b) in enumerate(zip(original, back))
                for p in _dropped(a, b, f"{path}[{i}]")]  # fmt: skip
    return [] if original == back else [f"{path}: {original!r} read back as {back!r}"]


def _schema_errors(doc: dict) -> list[str]:
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard

    register_default_plugins()
    model = Dashboard.from_json(doc)
    errors = _dropped(doc, _encoded(model)) + _model_errors(model, "dashboard")
    for i, panel in enumerate(model.panels or []):
        # a panel type the schema knows: its options were decoded into that type's model
        if panel.type_val != "row" and isinstance(panel.options, dict):
            errors.append(f"dashboard.panels[{i}]: no schema for a {panel.type_val} panel")
    return errors


def test_the_dashboard_is_valid_against_grafanas_dashboard_schema():
    pytest.importorskip("grafana_foundation_sdk", reason=NO_SDK)
    from grafana_foundation_sdk.models.dashboard import Dashboard

    assert _schema_errors(DASHBOARD) == []
    # the schema version of the Grafana release the SDK models (11.6); Grafana 12 and later
    # migrate it on import (v42: hidden series leave tooltips, v43: formatTime transformations
    # become convertFieldType; the dashboard has neither)
    assert DASHBOARD["schemaVersion"] == Dashboard().schema_version == 41


@pytest.mark.parametrize(
    ("where", "change", "error"),
    [
        ("a query", lambda d: d["panels"][7]["targets"][0].update(legnedFormat="x"),
         "$.panels[7].targets[0].legnedFormat"),
        ("an enum", lambda d: d["panels"][7]["options"]["legend"].update(displayMode="lst"),
         "'lst' is not a LegendDisplayMode"),
        ("a type", lambda d: d["panels"][7]["gridPos"].update(w="12"), "'12' is not a int"),
        ("a field", lambda d: d["panels"][7]["fieldConfig"]["defaults"]["custom"].update(
            fillOpacty=10), "custom.fillOpacty"),
        ("a transformation", lambda d: d["panels"][5]["transformations"][0].update(optons={}),
         "transformations[0].optons"),
        ("a variable", lambda d: d["templating"]["list"][1].update(sort=11),
         "11 is not a VariableSort"),
        ("a panel type", lambda d: d["panels"][7].update(type="timeseriess"),
         "no schema for a timeseriess panel"),
    ],
)  # fmt: skip
def test_the_schema_check_finds_a_mistake(where, change, error):
    pytest.importorskip("grafana_foundation_sdk", reason=NO_SDK)
    doc = json.loads(grafana_json())
    assert DASHBOARD["panels"][7]["type"] == "timeseries" and DASHBOARD["panels"][5]["type"] == (
        "table")  # fmt: skip
    change(doc)
    errors = _schema_errors(doc)
    assert any(error in e for e in errors), (where, errors)


def test_the_nodes_ip_is_rays_or_the_one_given(monkeypatch):
    monkeypatch.delenv(ENV_NODE_IP, raising=False)
    found = node_ip()
    assert found == "" or ipaddress.ip_address(found)
    monkeypatch.setenv(ENV_NODE_IP, "10.1.2.3")
    assert node_ip() == "10.1.2.3"


# ----- a real Prometheus scraping a real watch, dcgm-exporter's and Ray's series beside it

CHILD = textwrap.dedent(
    """
    import os, sys, time, gpuprof
    for step in range(1000):
        with gpuprof.phase("rollout"):
            time.sleep(0.02)
        with gpuprof.phase("reward"):
            time.sleep(0.1)
        gpuprof.step(n=step)
        if os.path.exists(sys.argv[1]):
            break
    """
)
_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)\{([^{}]*)\} (\S+)$")


def _dcgm_lines() -> list[str] | None:
    """The excerpt's complete lines (it is cut at both ends), None when it is absent."""
    if not DCGM_SCRAPE.exists():
        return None
    lines = DCGM_SCRAPE.read_text().splitlines()
    return [ln for ln in lines if ln.startswith(("# HELP ", "# TYPE ")) or _SAMPLE.match(ln)]


def _labels(text: str) -> dict[str, str]:
    return dict(re.findall(r'(\w+)="([^"]*)"', text))


def _dcgm_gpus() -> list[dict[str, str]]:
    """The GPUs of the dcgm-exporter excerpt (index order), or made-up ones without it."""
    lines = _dcgm_lines()
    if not lines:
        return [{"gpu": str(i), "UUID": f"GPU-{i:08d}-0000-0000-0000-00000000dash",
                 "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "dashnode"}
                for i in range(4)]  # fmt: skip
    gpus = {}
    for line in lines:
        m = _SAMPLE.match(line)
        if m:
            labels = _labels(m.group(2))
            gpus[labels["gpu"]] = {k: labels[k] for k in ("gpu", "UUID", "modelName", "Hostname")}
    return [gpus[k] for k in sorted(gpus, key=int)]


UTIL = (3, 85, 3, 85)
"""Simulated utilization of GPUs 0-3: 0 and 2 idle, 1 and 3 busy."""


def _ray_scrape(ip: str, gpus: list[dict[str, str]]) -> str:
    """Node and GPU series as Ray's metrics agent exports them: the node's labels (Ray's
    ``NODE_TAG_KEYS``), and the GPU's after them."""
    node = {"ip": ip, "Version": "2.60.0", "SessionName": "session_2026_01_01_00-00-00_0_1",
            "IsHeadNode": "true", "RayNodeType": "head"}  # fmt: skip

    def sample(name: str, labels: dict[str, str], value: float) -> str:
        return f"{name}{{{','.join(f'{k}={json.dumps(v)}' for k, v in labels.items())}}} {value}"

    lines = ["# HELP ray_node_mem_used Memory usage on a ray node",
             "# TYPE ray_node_mem_used gauge", sample("ray_node_mem_used", node, 8e9)]  # fmt: skip
    for name, values in (("ray_node_gpus_utilization", UTIL),
                         ("ray_node_gram_used", (1e9, 2e9, 3e9, 4e9))):  # fmt: skip
        lines += [f"# HELP {name} GPU metric of a ray node", f"# TYPE {name} gauge"]
        for g, value in zip(gpus, values):
            gpu = {"GpuDeviceName": g["modelName"], "GpuIndex": g["gpu"]}
            lines.append(sample(name, {**node, **gpu}, value))
    return "\n".join(lines) + "\n"


class _Scrapes(http.server.BaseHTTPRequestHandler):
    pages: typing.ClassVar[dict[str, str]] = {}
    """Path → exposition text served."""

    def do_GET(self):
        page = self.pages.get(self.path)
        body = (page or "").encode()
        self.send_response(200 if page is not None else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 2.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return reply.read().decode()


class Stack:
    """A `gpuprof watch --metrics-port` on simulated GPUs, a server of dcgm-exporter's and
    Ray's scrapes, and a real Prometheus scraping the three every second."""

    def __init__(self, lib: Path, tmp: Path) -> None:
        self.gpus = _dcgm_gpus()
        self.node = self.gpus[0]["Hostname"]
        self.ip = node_ip()  # what the watcher finds on this machine, as Ray's agent would
        scenario = {"gpus": [
            {"name": g["modelName"], "uuid": g["UUID"], "gpm": True,
             "series": {"util_gpu_pct": u, "mem_used_bytes": (4 + 4 * i) * GIB,
                        "sm_active_pct": u / 2}}
            for i, (g, u) in enumerate(zip(self.gpus, UTIL))
        ]}  # fmt: skip
        self.port = _free_port()
        self.stop_file = tmp / "stop"
        env = simnvml_env(lib, write_scenario(tmp / "scenario.txt", scenario),
                          base=clean_env(GPUPROF_HOST=self.node, RANK="0"))  # fmt: skip
        argv = gpuprof_cmd("watch", "--interval", "0.1", "--metrics-port", str(self.port),
                           "-o", str(tmp / "run"), "--quiet", "--", sys.executable, "-c",
                           CHILD, str(self.stop_file))  # fmt: skip
        self.watch = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True)  # fmt: skip
        dcgm = _dcgm_lines()
        _Scrapes.pages = {"/ray": _ray_scrape(self.ip, self.gpus)}
        if dcgm is not None:
            _Scrapes.pages["/dcgm"] = "\n".join(dcgm) + "\n"
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Scrapes)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        scrapes = f"127.0.0.1:{self.server.server_address[1]}"
        config = tmp / "prometheus.yml"
        config.write_text(textwrap.dedent(f"""\
            global:
              scrape_interval: 1s
              scrape_timeout: 1s
            scrape_configs:
              - job_name: gpuprof
                static_configs: [{{targets: ["127.0.0.1:{self.port}"]}}]
              - job_name: dcgm
                metrics_path: /dcgm
                static_configs: [{{targets: ["{scrapes}"]}}]
              - job_name: ray
                metrics_path: /ray
                static_configs: [{{targets: ["{scrapes}"]}}]
            """))  # fmt: skip
        self.api = f"http://127.0.0.1:{_free_port()}"
        self.log = (tmp / "prometheus.log").open("w")
        self.prometheus = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address={self.api.removeprefix('http://')}"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def query(self, expr: str) -> list[dict]:
        url = f"{self.api}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        answer = json.loads(_get(url))
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def label_values(self, selector: str, label: str) -> set[str]:
        url = f"{self.api}/api/v1/series?" + urllib.parse.urlencode({"match[]": selector})
        answer = json.loads(_get(url))
        assert answer["status"] == "success", answer
        return {s[label] for s in answer["data"] if label in s}

    def alive(self) -> None:
        assert self.watch.poll() is None, self.watch.communicate()[1]
        assert self.prometheus.poll() is None, "prometheus exited"

    def close(self) -> None:
        self.stop_file.touch()
        try:
            self.watch.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.watch.kill()
            self.watch.communicate()
        self.prometheus.terminate()
        try:
            self.prometheus.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.prometheus.kill()
            self.prometheus.wait()
        self.server.shutdown()
        self.server.server_close()
        self.log.close()


@pytest.fixture(scope="module")
def stack(simnvml_lib, tmp_path_factory):
    if not os.path.exists(PROMETHEUS):
        if os.environ.get("CI"):
            pytest.fail("the prometheus binary is missing (CI installs Debian's prometheus)")
        pytest.skip("the prometheus binary is missing (apt-get install prometheus)")
    running = Stack(simnvml_lib, tmp_path_factory.mktemp("dashboards"))
    try:
        yield running
    finally:
        running.close()


def _expr(expr: str, node: str, gpu: str) -> str:
    """A panel's query as Grafana sends it: variables replaced (a multi-value or All
    selection of a Prometheus variable is a regex)."""
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    return expr.replace("$node", node).replace("$gpu", gpu)


def _queries() -> list[tuple[str, str]]:
    return [(f"{p['title']} / {t['refId']}", t["expr"]) for p in _panels() for t in p["targets"]]


def _wait_for_every_query(stack: Stack, node: str, gpu: str, timeout: float = 40.0) -> dict:
    """Each query's result once every one returns data (or the last results at ``timeout``)."""
    deadline, got = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        stack.alive()
        with contextlib.suppress(OSError):
            got = {name: stack.query(_expr(expr, node, gpu)) for name, expr in _queries()}
            if all(got.values()):
                return got
        time.sleep(0.5)
    return got


def test_every_panel_query_returns_data_from_a_real_prometheus(stack):
    # every node and GPU (the All value of a variable is .*)
    got = _wait_for_every_query(stack, ".*", ".*")
    assert [name for name, result in got.items() if not result] == []
    per_gpu = got["Utilization per GPU / A"]
    assert {s["metric"]["gpu"] for s in per_gpu} == {"0", "1", "2", "3"}
    assert {s["metric"]["node"] for s in per_gpu} == {stack.node}
    (top_share,) = got["Top finding so far / A"]
    assert (top_share["metric"]["kind"], top_share["metric"]["phase"]) == ("reward_bound",
                                                                           "reward")  # fmt: skip
    phases = {s["metric"]["phase"] for s in got["Share of GPU-time idle, by phase / A"]}
    assert "reward" in phases
    (step,) = got["Step time per process / A"]
    assert step["metric"]["rank"] == "0" and 0.1 < float(step["value"][1]) < 0.5
    (gpus,) = got["GPUs / A"]
    assert float(gpus["value"][1]) == 4
    # the variables' own queries (label_values) list the node and its GPUs
    variables = _variables()
    for name, want in (("node", {stack.node}), ("gpu", {"0", "1", "2", "3"})):
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", variables[name]["query"])
        assert m, variables[name]["query"]
        selector = _expr(m.group(1), ".*", ".*")
        assert stack.label_values(selector, m.group(2)) == want
    # a selection: one node, GPUs 0 and 2 (Grafana's regex for two values)
    got = _wait_for_every_query(stack, stack.node, "(0|2)", timeout=5)
    assert [name for name, result in got.items() if not result] == []
    assert {s["metric"]["gpu"] for s in got["Utilization per GPU / A"]} == {"0", "2"}
    (gpus,) = got["GPUs / A"]
    assert float(gpus["value"][1]) == 2


def _wait_for(stack: Stack, expr: str, count: int, timeout: float = 30.0) -> list[dict]:
    deadline, result = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        stack.alive()
        with contextlib.suppress(OSError):
            result = stack.query(expr)
            if len(result) >= count:
                return result
        time.sleep(0.3)
    return result


def _documented_joins(section: str) -> list[str]:
    """The PromQL queries of a section of docs/DASHBOARDS.md (one a line, comments left out)."""
    text = (ROOT / "docs" / "DASHBOARDS.md").read_text()
    part = text.split(f"### {section}\n", 1)[1].split("\n### ", 1)[0]
    blocks = re.findall(r"```promql\n(.*?)```", part, re.S)
    return [ln.strip() for b in blocks for ln in b.splitlines() if ln.strip() and ln[0] != "#"]


def test_the_documented_joins_with_dcgm_exporter_pair_each_gpu_once(stack):
    lines = _dcgm_lines()
    if lines is None:
        pytest.skip(f"{DCGM_SCRAPE} is absent")
    covers: dict[str, set[str]] = {}  # DCGM field -> UUIDs the excerpt has it for
    for line in lines:
        m = _SAMPLE.match(line)
        if m:
            covers.setdefault(m.group(1), set()).add(_labels(m.group(2))["UUID"])
    assert len(covers["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"]) == 4 == len(stack.gpus)
    joins = _documented_joins("dcgm-exporter")
    assert len(joins) >= 5
    for doc_expr in joins:
        # a field the excerpt lacks (it has a few): one it has for every GPU instead
        expr = re.sub(r"DCGM_FI_\w+", lambda m: m.group(0) if m.group(0) in covers
                      else "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", doc_expr)  # fmt: skip
        (field,) = set(re.findall(r"DCGM_FI_\w+", expr))
        if expr.startswith("avg by (node)"):
            result = _wait_for(stack, expr, 1)
            assert [s["metric"] for s in result] == [{"node": stack.node}], doc_expr
            continue
        result = _wait_for(stack, expr, len(covers[field]))
        # one series per GPU the field covers, each carrying its UUID or its host and index
        assert len(result) == len(covers[field]), (doc_expr, result)
        if "on(UUID)" in expr:
            assert {s["metric"]["UUID"] for s in result} == covers[field], doc_expr
        else:
            assert {s["metric"]["gpu"] for s in result} == {"0", "1", "2", "3"}, doc_expr
        if "group_left(node" in expr:  # dcgm-exporter's series, labelled with gpuprof's node
            assert {(s["metric"]["node"], s["metric"]["job"]) for s in result} == {
                (stack.node, "dcgm")}, doc_expr  # fmt: skip
            assert {s["metric"]["device"] for s in result} == {f"nvidia{i}" for i in range(4)}


def test_the_documented_joins_with_rays_metrics_pair_each_gpu_once(stack):
    assert stack.ip, "no IP address found for this machine"
    joins = _documented_joins("Ray")
    assert len(joins) == 3
    for expr in joins:
        host = "GpuIndex" not in expr  # a node's series: one per node
        result = _wait_for(stack, expr, 1 if host else 4)
        assert len(result) == (1 if host else 4), (expr, result)
        if not host:
            assert sorted(s["metric"]["GpuIndex"] for s in result) == ["0", "1", "2", "3"]
        if expr.startswith("100 * gpuprof_gpu_utilization_ratio -"):
            # the same readings (the Ray scrape mirrors the simulated utilization)
            assert all(abs(float(s["value"][1])) < 1e-9 for s in result), result
        if "group_left(node)" in expr:
            assert {(s["metric"]["node"], s["metric"]["ip"]) for s in result} == {
                (stack.node, stack.ip)}  # fmt: skip
