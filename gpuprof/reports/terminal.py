"""Terminal rendering of a diagnosis and of a comparison (rich; plain text off a terminal)."""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd
from rich.console import Console, Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from gpuprof.analyzers.diagnose import Diagnosis
from gpuprof.reports import fmt


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _value(value: Any, default: Any = None) -> str:
    """A knob value as the user would type it; an unset knob shows its default."""
    if value is None:
        return "?" if default is None else f"{_value(default)} (default)"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def diagnosis_renderable(diagnosis: Diagnosis, top: int | None = None) -> Group:
    """Headline, findings, recommendations and notes as one rich renderable."""
    s = diagnosis.summary
    parts: list[Any] = []
    head = Text()
    head.append("gpuprof ", style="bold")
    head.append(f"{s.get('run_id')}  ")
    if s.get("framework"):
        head.append(f"{s['framework']}  ")
    head.append(f"{s.get('gpus', 0)} GPUs  {_fmt(s.get('gpu_hours'), 2)} GPU-h  ")
    if s.get("mean_util_gpu_pct") is not None:
        head.append(f"mean util {s['mean_util_gpu_pct']:.0f}%  ")
    if s.get("mean_sm_active_pct") is not None:
        head.append(f"SM active {s['mean_sm_active_pct']:.0f}%  ")
    if s.get("idle_gpu_s") is not None:
        head.append(f"idle {fmt.gpu_seconds(s['idle_gpu_s'])}")
    parts.append(head)
    if s.get("steps"):
        line = f"steps {s['steps']}  step time p50 {_fmt(s.get('step_time_p50_s'), 2)} s"
        line += f"  p95 {_fmt(s.get('step_time_p95_s'), 2)} s"
        if s.get("tokens_per_s"):
            line += f"  {s['tokens_per_s']:.0f} tokens/s"
        parts.append(Text(line))

    parts.extend(_findings_parts(diagnosis, top))
    for note in diagnosis.notes:
        parts.append(Text(f"note: {note}", style="yellow"))
    return Group(*parts)


def findings_renderable(diagnosis: Diagnosis, top: int | None = None) -> Group:
    """Only the findings and recommendations (the end of ``gpuprof watch``)."""
    return Group(*_findings_parts(diagnosis, top))


def _findings_parts(diagnosis: Diagnosis, top: int | None) -> list[Any]:
    parts: list[Any] = []
    findings = diagnosis.findings[:top] if top else diagnosis.findings
    if findings:
        parts.append(Text("Findings, by GPU-time lost", style="bold"))
        for i, f in enumerate(findings, 1):
            line = Text(f"{i:2d}. ")
            line.append(f.kind, style="bold red" if f.share >= 0.1 else "bold yellow")
            lost = fmt.gpu_seconds(f.gpu_seconds_lost)
            line.append(f"  {lost}  {100 * f.share:.1f}% of GPU-time")
            line.append(f"  confidence {f.confidence:.2f}")
            parts.append(line)
            parts.append(Padding(Text(f.summary), (0, 0, 0, 4)))
    else:
        parts.append(Text("No stall above the noise threshold was found.", style="green"))

    recs = diagnosis.recommendations[:top] if top else diagnosis.recommendations
    if recs:
        parts.append(Text("Recommendations, by expected gain", style="bold"))
        for i, r in enumerate(recs, 1):
            line = Text(f"{i:2d}. ")
            line.append(str(r.knob), style="bold cyan")
            line.append(f": {_value(r.current, getattr(r, 'default', None))} → ")
            line.append(_value(r.suggested), style="bold")
            line.append(f"  ~{100 * r.expected_gain_share:.1f}% of GPU-time  [{r.kind}]")
            parts.append(line)
            parts.append(Padding(Text(str(r.rationale)), (0, 0, 0, 4)))
    return parts


def compare_renderable(table: pd.DataFrame, before: str, after: str) -> Group:
    """The before/after table with deltas."""
    out = Table(title=f"{before} → {after}", title_justify="left", box=None, pad_edge=False)
    for col, justify in (("metric", "left"), ("before", "right"), ("after", "right"),
                         ("delta", "right"), ("", "left")):  # fmt: skip
        out.add_column(col, justify=justify)
    for row in table.itertuples(index=False):
        unit = f" {row.unit}" if row.unit else ""
        delta = "–" if row.delta is None or pd.isna(row.delta) else f"{row.delta:+.2f}{unit}"
        if row.delta_pct is not None and not pd.isna(row.delta_pct):
            delta += f" ({row.delta_pct:+.0f}%)"
        mark = {True: "better", False: "worse"}.get(row.better, "")
        out.add_row(row.metric, _fmt(row.before, 2), _fmt(row.after, 2), delta, mark)
    return Group(out)


def render_text(renderable: Any, width: int = 100) -> str:
    """A renderable as plain text (tests, and output that is not a terminal)."""
    console = Console(width=width, record=True, color_system=None, force_terminal=False)
    with console.capture() as capture:
        console.print(renderable)
    return capture.get()


def render_json(document: dict[str, Any]) -> str:
    """A JSON document with NaN written as null."""
    return json.dumps(fmt.json_safe(document), indent=2, sort_keys=False)
