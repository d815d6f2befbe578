"""The HTML page of a run diagnosed stretch by stretch (``report RUN --by-steps N``).

One self-contained file, as the run's report is (`html`): plotly.js embedded, every string
from the run escaped, the figure's data as escaped JSON in a ``<script type="application/
json">`` block. It shows the stretches' GPU-time lost per stall kind as stacked bars with the
stretches' mean utilisation, then the kinds, the merged recommendations, the stretches and the
notes (`gpuprof.by_steps`, `analyzers.over_steps`).
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

from plotly.offline import get_plotlyjs

from gpuprof.reports import fmt
from gpuprof.reports.html import _TEMPLATE_DIR, _e, json_for_script, write_text

_SLOT = re.compile(r"\{\{(\w+)\}\}")


def render_by_steps_html(doc: dict[str, Any]) -> str:
    """The page of ``doc`` (`by_steps.diagnose`'s document)."""
    s, how = doc["summary"], doc["by_steps"]
    title = f"gpuprof report: {s.get('run_id')}, {how['steps_per_stretch']} steps at a time"
    page = (_TEMPLATE_DIR / "by_steps.html").read_text(encoding="utf-8")
    parts = {
        "title": html.escape(title),
        "style": (_TEMPLATE_DIR / "report.css").read_text(encoding="utf-8"),
        "header": _header(doc),
        "kinds": _kinds(doc),
        "recommendations": _recommendations(doc),
        "stretches": _stretches(doc),
        "notes": _notes(doc),
        "plotly": get_plotlyjs(),
        "data": json_for_script(figure(doc)),
    }
    return _SLOT.sub(lambda m: parts[m.group(1)], page)


def write_by_steps_html(doc: dict[str, Any], path: Path) -> Path:
    """Render and write atomically (`html.write_text`); returns ``path``."""
    return write_text(render_by_steps_html(doc), path)


def _label(row: dict[str, Any]) -> str:
    return str(row["first"]) if row["first"] == row["last"] else f"{row['first']}–{row['last']}"


def figure(doc: dict[str, Any]) -> dict[str, Any]:
    """Plotly traces and layout: a bar per stretch and kind (GPU-hours lost, stacked), and
    the stretches' mean utilisation (%) on a second axis."""
    labels = [_label(row) for row in doc["stretches"]]
    traces: list[dict[str, Any]] = [
        {
            "type": "bar",
            "name": k["kind"],
            "x": labels,
            "y": [round(v / 3600.0, 4) for v in k["per_stretch_gpu_s"]],
            "hovertemplate": "steps %{x}: %{y:.2f} GPU-h<extra>%{fullData.name}</extra>",
        }
        for k in doc["kinds"]
    ]
    util = [row.get("mean_util_gpu_pct") for row in doc["stretches"]]
    if any(u is not None for u in util):
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": "mean utilization",
                "x": labels,
                "y": util,
                "yaxis": "y2",
                "hovertemplate": "steps %{x}: %{y:.0f}%<extra></extra>",
            }
        )
    layout = {
        "barmode": "stack",
        "height": 360,
        "margin": {"l": 60, "r": 60, "t": 10, "b": 60},
        "xaxis": {"title": {"text": "steps"}, "type": "category"},
        "yaxis": {"title": {"text": "GPU-h lost"}, "rangemode": "tozero"},
        "yaxis2": {"title": {"text": "utilization %"}, "overlaying": "y", "side": "right",
                   "range": [0, 100], "showgrid": False},
        "legend": {"orientation": "h", "y": -0.25},
    }  # fmt: skip
    return {"traces": traces, "layout": layout}


def _header(doc: dict[str, Any]) -> str:
    s, how = doc["summary"], doc["by_steps"]
    rows = [
        ("read", f"<strong>steps {_e(how['run_first'])}–{_e(how['run_last'])} "
                 f"({_e(how['run_steps'])} recorded) in "
                 f"{_e(fmt.stretches(how['stretches'], how['steps_per_stretch']))}, each "
                 "diagnosed alone (--by-steps)</strong>"),
        ("framework", _e(s.get("framework") or "not detected")),
        ("GPUs", _e(s.get("gpus"))),
        ("GPU-time", _e(fmt.gpu_seconds((s.get("gpu_hours") or 0.0) * 3600.0))),
        ("mean utilization", _e(fmt.percent(s.get("mean_util_gpu_pct")))),
        ("idle", _e(fmt.gpu_seconds(s.get("idle_gpu_s")))),
        ("figures", "the stretches' own, added up: not a one-pass diagnosis of the whole run"),
    ]  # fmt: skip
    table = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="meta">{table}</table>'


def _table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="phases"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _kinds(doc: dict[str, Any]) -> str:
    if not doc["kinds"]:
        said = dict.fromkeys(r["no_finding"] for r in doc["stretches"] if r.get("no_finding"))
        return f"<p>No finding in any stretch: {_e(' / '.join(list(said)[:3]))}</p>"
    n = doc["by_steps"]["stretches"]
    rows = [
        [
            _e(k["kind"]),
            _e(fmt.gpu_seconds(k["gpu_seconds_lost"])),
            "–" if k.get("share") is None else _e(f"{100 * k['share']:.1f}%"),
            _e(f"{k['stretches_found']}/{n}"),
            _e(f"{k['first_step']}–{k['last_step']}"),
        ]
        for k in doc["kinds"]
    ]
    return _table(["kind", "GPU-time lost", "share", "found in", "steps"], rows)


def _recommendations(doc: dict[str, Any]) -> str:
    if not doc["recommendations"]:
        return "<p>None.</p>"
    rows = [
        [
            f"<code>{_e(r.get('knob'))}</code>",
            _e(fmt.knob_value(r.get("current"), r.get("default"))),
            f"<strong>{_e(fmt.knob_value(r.get('suggested')))}</strong>",
            _e(fmt.gpu_seconds(r.get("expected_gain_gpu_s"))),
            _e(r.get("stretches_given")),
            _e(r.get("kind")),
            _e(r.get("rationale")),
        ]
        for r in doc["recommendations"]
    ]
    head = ["knob", "current", "suggested", "expected gain", "stretches", "kind", "why"]
    return _table(head, rows)


def _stretches(doc: dict[str, Any]) -> str:
    rows = []
    for row in doc["stretches"]:
        found = ", ".join(f"{f['kind']} {100 * f['share']:.0f}%" for f in row["findings"][:3])
        duration, p50 = row.get("duration_s"), row.get("step_time_p50_s")
        rows.append(
            [
                _e(_label(row)),
                "–" if duration is None else _e(fmt.seconds(duration)),
                _e(fmt.gpu_seconds((row.get("gpu_hours") or 0.0) * 3600.0)),
                "–" if p50 is None else _e(f"{p50:.1f} s"),
                _e(fmt.percent(row.get("mean_util_gpu_pct"))),
                _e(fmt.gpu_seconds(row.get("idle_gpu_s"))),
                _e(found or "–"),
                f"<code>gpuprof report RUN --steps {_e(row['first'])}:{_e(row['last'] + 1)}</code>",
            ]
        )
    head = ["steps", "wall", "GPU-time", "step p50", "util", "idle", "largest findings",
            "the stretch alone"]  # fmt: skip
    return _table(head, rows)


def _notes(doc: dict[str, Any]) -> str:
    if not doc.get("notes"):
        return ""
    items = "".join(f"<li>{_e(n)}</li>" for n in doc["notes"])
    return f'<ul class="notes">{items}</ul>'
