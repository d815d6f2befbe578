"""The short summary printed at the end of ``gpuprof watch`` and by ``gpuprof summary``."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from gpuprof.analyzers.basic import run_summary
from gpuprof.model import Run
from gpuprof.reports import fmt


def summary_renderable(run: Run, run_dir: str | None = None) -> Group:
    """A rich renderable: headline, per-GPU table, per-phase table, notices."""
    s = run_summary(run)
    parts: list[Any] = []
    head = Text()
    head.append("gpuprof ", style="bold")
    head.append(f"{s['run_id']}  ")
    head.append(f"duration {fmt.seconds(s['duration_s'])}  ")
    head.append(f"GPUs {s['n_gpus']}  ")
    if s["mean_util_gpu_pct"] is not None:
        head.append(f"mean GPU util {fmt.percent(s['mean_util_gpu_pct'])}  ")
    if s["exit_code"] is not None:
        head.append(f"exit {s['exit_code']}")
    parts.append(head)
    if s["steps"]:
        line = f"steps {s['steps']}  step time p50 {fmt.seconds(s['step_time_p50_s'])}"
        line += f"  p95 {fmt.seconds(s['step_time_p95_s'])}"
        if s["tokens_per_s"]:
            line += f"  {s['tokens_per_s']:.0f} tokens/s"
        parts.append(Text(line))

    if s["gpus"]:
        table = Table(title="GPUs", title_justify="left", box=None, pad_edge=False)
        # when the width runs short only the text columns give way (wrapping under
        # themselves); figures never wrap or get cut
        table.add_column("gpu")
        table.add_column("name")
        for col in ("util", "SM active", "peak mem GiB", "power W"):
            table.add_column(col, justify="right", no_wrap=True)
        for g in s["gpus"]:
            label = f"{g['host']}:{g['gpu']}" if len(run.meta.hosts) > 1 else str(g["gpu"])
            if g.get("lost"):
                label += " (lost)"
            power = g.get("power_w")
            power_txt = "n/a" if power is None or math.isnan(power) else f"{power:.0f}"
            table.add_row(label, str(g.get("name") or ""), fmt.percent(g.get("util_gpu_pct")),
                          fmt.percent(g.get("sm_active_pct")), fmt.gib(g.get("mem_peak_bytes")),
                          power_txt)  # fmt: skip
        parts.append(table)

    if s["phases"]:
        parts.append(phase_table_renderable(s["phases"], s["steps"]))
    else:
        parts.append(Text("no phases recorded (use gpuprof.phase() in the training loop)"))

    parts.extend(node_lines(s["nodes"]))
    said = {n["notice"] for n in s["nodes"] if n.get("notice")}
    for notice in s["notices"]:
        if notice not in said:  # a node's own line above says it
            parts.append(Text(f"note: {notice}", style="yellow"))
    if run_dir and run.meta.stopped:
        parts.append(Text(f"incomplete run in {run_dir} (recording stopped before the command "
                          "ended)", no_wrap=True, overflow="ignore", style="yellow"))  # fmt: skip
    elif run_dir:
        parts.append(Text(f"run saved to {run_dir}", no_wrap=True, overflow="ignore"))
    return Group(*parts)


def phase_table_renderable(phases: list[dict[str, Any]], steps: int) -> Table:
    """The phases by self time (a phase nested in another counts once, in the innermost): count,
    time per process, per step, share of the steps' time (when the run records steps) and of
    the run's wall time. The step-share column adds up to 100% over its rows."""
    with_steps = steps > 0 and any(_finite(p.get("step_share")) for p in phases)
    title = "Phases (self time per process"
    title += ", share of the steps' time)" if with_steps else ")"
    table = Table(title=title, title_justify="left", box=None, pad_edge=False)
    table.add_column("phase", overflow="fold")
    columns = ["count", "time"] + (["per step", "of steps"] if with_steps else []) + ["of run"]
    for col in columns:
        table.add_column(col, justify="right", no_wrap=True)
    for p in phases:
        label = fmt.phase_label(p["phase"])
        row = [label, str(p["spans"]), fmt.seconds(p["per_process_s"])]
        if with_steps:
            share = p.get("step_share")
            row += [fmt.seconds(p["per_process_s"] / steps),
                    fmt.percent(100 * share) if _finite(share) else "–"]  # fmt: skip
        row.append(fmt.percent(100 * p["share"]))
        table.add_row(*row)
    return table


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


MAX_RECORDED_LINES = 8
"""Nodes recorded in full shown one per line at most; the rest are counted (a node lost or
never recorded always gets its line)."""


def node_lines(accounts: list[dict[str, Any]]) -> list[Text]:
    """One line per node of a Ray cluster run: recorded from when, lost (when, why), or
    never recorded (why) — so a run that misses a node never reads as complete."""
    if not accounts:
        return []
    recorded = [a for a in accounts if a["state"] == "recorded"]
    missing = len(accounts) - len(recorded)
    head = f"nodes: {len(recorded)} of {len(accounts)} recorded"
    if missing:
        head += f"; {missing} lost or never recorded"
    lines = [Text(head, style="yellow" if missing else "")]
    for a in accounts:
        if a["state"] == "recorded" and recorded.index(a) >= MAX_RECORDED_LINES:
            continue
        lines.append(Text(f"  {a['node']}: {node_state_text(a)}",
                          style="" if a["state"] == "recorded" else "yellow"))  # fmt: skip
    if len(recorded) > MAX_RECORDED_LINES:
        lines.append(Text(f"  … {len(recorded) - MAX_RECORDED_LINES} more nodes recorded"))
    return lines


def node_state_text(a: dict[str, Any]) -> str:
    """How one node was recorded, in words (a `node_accounts` entry)."""
    since = "" if a.get("from_s") is None else f" from {fmt.seconds(a['from_s'])} into the run"
    if a.get("watcher"):
        return "recorded from the start (the watcher's node)"
    if a["state"] == "recorded":
        return f"recorded{since}"
    if a["state"] == "lost":
        when = "" if a.get("lost_s") is None else f" {fmt.seconds(a['lost_s'])} into the run"
        why = f" ({a['why']})" if a.get("why") else ""
        return f"lost{when}{why}; recorded{since} until then"
    return f"never recorded: {a.get('why') or 'no sampler started there'}"


def render_summary(run: Run, run_dir: str | None = None, width: int = 100) -> str:
    """The summary as plain text (for tests and non-terminal output)."""
    console = Console(width=width, record=True, color_system=None, force_terminal=False)
    with console.capture() as capture:
        console.print(summary_renderable(run, run_dir), crop=False)
    return capture.get()
