"""Terminal rendering of a diagnosis and of a comparison (rich; plain text off a terminal)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text

from gpuprof.analyzers.diagnose import Diagnosis, no_finding_sentence
from gpuprof.reports import fmt
from gpuprof.reports.fmt import render_json  # noqa: F401  (its former home)


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def diagnosis_renderable(diagnosis: Diagnosis, top: int | None = None) -> Group:
    """Headline, findings, recommendations and notes as one rich renderable."""
    s = diagnosis.summary
    parts: list[Any] = [_headline(s)]
    if s.get("stretch"):
        parts.append(Text(fmt.stretch(s["stretch"]), style="bold"))
    if s.get("steps"):
        line = f"steps {s['steps']}  step time p50 {_fmt(s.get('step_time_p50_s'), 2)} s"
        line += f"  p95 {_fmt(s.get('step_time_p95_s'), 2)} s"
        if s.get("tokens_per_s"):
            line += f"  {s['tokens_per_s']:.0f} tokens/s"
        parts.append(Text(line))
    parts.extend(basis_parts(s))
    parts.extend(startup_parts(s.get("startup")))
    parts.extend(bound_parts(s.get("bound")))

    efficiency = s.get("efficiency")
    if efficiency:
        parts.extend(efficiency_parts(efficiency))
    parts.extend(nodes_parts(s.get("nodes")))

    parts.extend(_findings_parts(diagnosis, top))
    for note in diagnosis.notes:
        parts.append(Text(f"note: {note}", style="yellow"))
    return Group(*parts)


def _headline(s: dict[str, Any]) -> Text:
    """``gpuprof RUN  framework  GPUs  GPU-h  mean util  SM active  idle`` of a summary."""
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
    return head


def basis_parts(summary: dict[str, Any]) -> list[Any]:
    """The one line saying what the diagnosis is judged on (GPU samples, phase timing,
    framework counters), or that the run holds nothing to judge."""
    line = (summary.get("data_basis") or {}).get("line")
    return [Text(line, style="dim")] if line else []


def startup_parts(startup: dict[str, Any] | None) -> list[Any]:
    """One dim line on start-up / warm-up and wind-down, which no finding counts."""
    if not startup:
        return []
    bits = []
    if startup.get("seconds"):
        what = f"{fmt.seconds(startup['seconds'])} before the first step"
        if startup.get("warmup_steps"):
            steps = ", ".join(str(x) for x in startup["warmup_steps"])
            what = f"{fmt.seconds(startup['seconds'])} to the end of warm-up step {steps}"
        bits.append(f"start-up {what} (GPUs idle {fmt.gpu_seconds(startup['idle_gpu_s'])})")
    if startup.get("wind_down_s"):
        idle = fmt.gpu_seconds(startup["wind_down_idle_gpu_s"])
        bits.append(f"{fmt.seconds(startup['wind_down_s'])} after the last step (idle {idle})")
    if not bits:
        return []
    return [Text("; ".join(bits) + ": not counted as stalls", style="dim")]


def bound_parts(bound: dict[str, Any] | None) -> list[Any]:
    """What bounds the step: the verdict, the step's composition, and each busy phase that
    is slow for its tokens (the ``bound`` section of the summary)."""
    if not bound:
        return []
    if not bound.get("verdict"):
        why = bound.get("nothing_to_judge")
        return [Text(f"What bounds the step: {why}", style="dim")] if why else []
    head = Text("What bounds the step", style="bold")
    basis = {"phase_timing": "phase times, no GPU samples", "gpu_samples": "GPU samples"}
    head.append(f" (from {basis.get(bound.get('basis'), bound.get('basis'))})", style="dim")
    parts: list[Any] = [head, _indented(Text(str(bound["verdict"])))]
    shares = []
    for row in bound.get("composition") or []:
        if not row.get("share"):
            continue
        text = f"{fmt.phase_label(row['phase'])} {row['share']:.0%}"
        if row.get("activity") == "wait":
            text += " (waiting)"
        shares.append(text)
    if shares:
        parts.append(_indented(Text("step: " + ", ".join(shares[:8]))))
    for phase in bound.get("phases") or []:
        if phase.get("verdict") == "slow" and phase["phase"] not in bound.get("bound", []):
            parts.append(_indented(Text(f"{phase['phase']}: {phase['why']} — slow for its tokens")))
    return parts


def nodes_parts(nodes: dict[str, Any] | None, limit: int = 16) -> list[Any]:
    """The per-node table, collective traffic per link type and the straggler node of a
    multi-node run (the summary's ``nodes`` entry); nothing for a single node. Beyond
    ``limit`` nodes, the idlest are shown."""
    if not nodes or not nodes.get("nodes"):
        return []
    rows = sorted(nodes["nodes"], key=lambda n: -(n.get("idle_gpu_s") or 0.0))
    table = Table(title="Nodes", title_justify="left", box=None, pad_edge=False)
    table.add_column("node", overflow="fold")
    for col in ("GPUs", "ranks", "util", "idle GPU-s", "idle while others busy", "clock"):
        table.add_column(col, justify="right", no_wrap=True)
    accounted = any(n.get("recorded") for n in rows)
    if accounted:  # a Ray cluster run: how each node was recorded
        table.add_column("recorded", overflow="fold")
    for n in sorted(rows[:limit], key=lambda n: n["node"]):
        ranks = n.get("ranks") or []
        rank_text = f"{ranks[0]}–{ranks[-1]}" if len(ranks) > 2 else ",".join(map(str, ranks))
        clock = n.get("clock") or {}
        clock_text = (
            "ref" if clock.get("method") == "reference"
            else f"{clock['offset_ns'] / 1e6:+.1f} ms" if clock.get("offset_ns") is not None
            else "—"
        )  # fmt: skip
        util = n.get("util_gpu_pct")
        cells = [n["node"], str(n.get("gpus", 0)), rank_text or "—",
                 "—" if util is None else f"{util:.0f}%",
                 fmt.gpu_seconds(n.get("idle_gpu_s") or 0.0),
                 fmt.gpu_seconds(n.get("idle_while_others_busy_gpu_s") or 0.0),
                 clock_text]  # fmt: skip
        if accounted:
            cells.append(fmt.node_recorded(n.get("recorded")))
        table.add_row(*cells)
    parts: list[Any] = [table]
    if len(rows) > limit:
        parts.append(Text(f"… {len(rows) - limit} more nodes (the idlest {limit} shown)"))
    for link in nodes.get("links") or []:
        bw = link.get("bandwidth_bytes_s")
        parts.append(Text(
            f"{link['link']} collectives: {link['calls']} calls, "
            f"{link['bytes'] / 1e9:.2f} GB in {link['seconds']:.2f} s"
            + (f" ({bw / 1e9:.2f} GB/s effective)" if bw else "")
        ))  # fmt: skip
    straggler = nodes.get("straggler_node")
    if straggler:
        parts.append(Text(
            f"straggler node {straggler['node']}: last in {straggler['phase_steps']} of "
            f"{straggler['of_phase_steps']} phase-steps, {straggler['delay_s']:.1f} s late in "
            f"all; the other nodes' GPUs wait {fmt.gpu_seconds(straggler['gpu_s'])}",
            style="yellow",
        ))  # fmt: skip
    if nodes.get("weight_sync_crosses_nodes"):
        parts.append(Text("weight sync crosses nodes (reshard moves weights between nodes)"))
    return parts


def efficiency_renderable(efficiency: dict[str, Any] | None) -> Group:
    """Tokens/s and MFU per phase, the framework's logged MFU beside them, and the cost of
    idle time when a price was given (the summary's ``efficiency`` entry)."""
    return Group(*efficiency_parts(efficiency or {}))


def _mfu(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    pct = 100.0 * float(value)
    return f"{pct:.1f}%" if pct < 10 else f"{pct:.0f}%"


def _rate(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    value = float(value)
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e4:
        return f"{value / 1e3:.0f}k"
    return f"{value:,.0f}"


def _money(value: Any) -> str:
    return "–" if value is None else f"{float(value):,.2f}"


def efficiency_parts(e: dict[str, Any]) -> list[Any]:
    """The renderables of `efficiency_renderable` (empty when there is nothing to show)."""
    parts: list[Any] = []
    phases = [p for p in e.get("phases") or [] if p.get("tokens_per_s") or p.get("framework_mfu")]
    run = e.get("run") or {}
    framework = e.get("framework") or {}
    metrics = framework.get("metrics") or {}
    throughput = metrics.get("perf/throughput")
    if phases or run.get("tokens_per_s") or throughput:
        gpu = e.get("gpu") or {}
        model = e.get("model") or {}
        title = Text("Efficiency", style="bold")
        if gpu.get("model"):
            peak = gpu.get("peak_flops_per_gpu")
            title.append(f"  {gpu['model']} {gpu.get('dtype')} peak {peak / 1e12:.4g} TFLOP/s")
        if model.get("flops_params"):
            flops_params = float(model["flops_params"])
            title.append(f"  model {flops_params / 1e9:.3g}B ({model.get('source')})")
        parts.append(title)
        rows = []
        for p in phases:
            logged = ", ".join(
                f"{_mfu(m.get('mean'))} ({str(m.get('key', '')).rsplit('/', 1)[-1]})"
                for m in p.get("framework_mfu") or []
            )
            rows.append([p["phase"], _rate(p.get("tokens_per_s")),
                         _rate(p.get("tokens_per_s_per_gpu")), _mfu(p.get("mfu")),
                         logged])  # fmt: skip
        logged_run = f"{_rate(throughput.get('mean'))}/GPU" if throughput else ""
        rows.append(["run (steps)", _rate(run.get("tokens_per_s")),
                     _rate(run.get("tokens_per_s_per_gpu")), _mfu(run.get("mfu")),
                     logged_run])  # fmt: skip
        with_logged = any(row[-1] for row in rows)
        table = Table(box=None, pad_edge=False, show_edge=False)
        table.add_column("phase", no_wrap=True)
        for col in ("tokens/s", "per GPU", "MFU"):
            table.add_column(col, justify="right", no_wrap=True)
        if with_logged:
            name = framework.get("name") or "framework"
            table.add_column(f"{name} logged", overflow="fold")
        for row in rows:
            table.add_row(*(row if with_logged else row[:-1]))
        parts.append(table)
    cost = e.get("cost") or {}
    price = cost.get("gpu_hour_price")
    if price is not None and (cost.get("idle_gpu_hours") is not None or cost.get("gpu_hours")):
        pieces = []
        if cost.get("idle_gpu_hours") is not None:
            pieces.append(
                f"idle {cost['idle_gpu_hours']:.2f} GPU-h = {_money(cost.get('idle_cost'))}"
            )
        if cost.get("gpu_hours"):
            pieces.append(f"run {cost['gpu_hours']:.2f} GPU-h = {_money(cost.get('run_cost'))}")
        lost = [f for f in cost.get("findings") or [] if f.get("cost") is not None][:3]
        if lost:
            pieces.append(", ".join(f"{f['kind']} {_money(f['cost'])}" for f in lost))
        parts.append(Text(f"at {_money(price)} per GPU-hour: " + "; ".join(pieces)))
    if metrics.get("perf/mfu/from_throughput"):  # Megatron's own TFLOP/s against the peak
        parts.extend(Text(n) for n in framework.get("notes") or [] if n.startswith("MFU "))
    if parts:
        for note in [*(e.get("notes") or []), *(framework.get("warnings") or [])]:
            parts.append(Text(f"note: {note}", style="yellow"))
    return parts


def findings_renderable(diagnosis: Diagnosis, top: int | None = None) -> Group:
    """Only the findings and recommendations (the end of ``gpuprof watch``)."""
    return Group(*_findings_parts(diagnosis, top))


def _findings_parts(diagnosis: Diagnosis, top: int | None) -> list[Any]:
    parts: list[Any] = []
    findings = diagnosis.findings[:top] if top else diagnosis.findings
    if findings:
        parts.append(Text("Findings, by GPU-time lost", style="bold"))
        for i, f in enumerate(findings, 1):
            head = Text(f"{i:2d}. ")
            head.append(f.kind, style="bold red" if f.share >= 0.1 else "bold yellow")
            lost = fmt.gpu_seconds(f.gpu_seconds_lost)
            detail = Text(f"{lost}  {100 * f.share:.1f}% of GPU-time")
            detail.append(f"  confidence {f.confidence:.2f}")
            parts.append(HeadLine(head, detail))
            parts.append(_indented(Text(f.summary)))
            parts.extend(stack_parts(getattr(f, "stacks", None)))
    else:
        sentence, good = no_finding_sentence(diagnosis)
        parts.append(Text(sentence, style="green" if good else "yellow"))

    recs = diagnosis.recommendations[:top] if top else diagnosis.recommendations
    if recs:
        parts.append(Text("Recommendations, by expected gain", style="bold"))
        for i, r in enumerate(recs, 1):
            head = Text(f"{i:2d}. ")
            head.append(str(r.knob), style="bold cyan")
            change = Text(f"{fmt.knob_value(r.current, getattr(r, 'default', None))} → ")
            change.append(fmt.knob_value(r.suggested), style="bold")
            change.append(f"  ~{100 * r.expected_gain_share:.1f}% of GPU-time  [{r.kind}]")
            parts.append(HeadLine(head, change, joiner=": "))
            parts.append(_indented(Text(str(r.rationale))))
    return parts


def stack_parts(stacks: Any, top: int = 3) -> list[Any]:
    """A finding's Python stacks, indented under it: the top groups by busy time (share,
    user function → the library function it was in, where), and what the main thread was
    blocked in."""
    if stacks is None:
        return []
    out = []
    what = "busy" if stacks.activity == "thread_cpu" else "sampled"
    for k, g in enumerate(stacks.top[:top]):
        line = Text("Python: " if k == 0 else "        ", style="dim")
        line.append(f"{100 * g.share:3.0f}% ", style="bold")
        line.append(g.where(), style="cyan")
        if g.calls:
            line.append(f" → {g.calls}")
        line.append(f"  [{', '.join(g.processes[:2])}]" if g.processes else "", style="dim")
        if k == 0:
            line.append(f"  of {stacks.busy_s:.1f} s {what}", style="dim")
        out.append(_indented(line))
    if stacks.blocked:
        g = stacks.blocked[0]
        line = Text(f"main thread blocked {100 * (stacks.main_blocked_share or 0):.0f}% of "
                    "the time, ", style="dim")  # fmt: skip
        line.append(f"{100 * g.share:.0f}% of it in ", style="bold")
        line.append(g.where(), style="cyan")
        if g.calls:
            line.append(f" → {g.calls}")
        out.append(_indented(line))
    return out


INDENT = 4
"""Columns by which details and rationale sit under their numbered line."""


def _indented(text: Text) -> Indented:
    return Indented(text)


class Indented:
    """``text`` wrapped to the width left after `INDENT` blanks, every line indented; a word
    longer than that (a knob name, a path) is folded, never spilled past the width."""

    def __init__(self, text: Text) -> None:
        self.text = text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(8, options.max_width - INDENT)
        for line in self.text.wrap(console, width, overflow="fold"):
            line.rstrip()  # no trailing blanks in plain-text output
            yield Text.assemble(" " * INDENT, line, end="\n")


class HeadLine:
    """``head`` and ``detail`` on one line when they fit the width, else ``detail`` on an
    indented line of its own (a long knob name never drags its figures into a ragged wrap)."""

    def __init__(self, head: Text, detail: Text, joiner: str = "  ") -> None:
        self.head, self.detail, self.joiner = head, detail, joiner

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        one_line = Text.assemble(self.head, self.joiner, self.detail)
        if one_line.cell_len <= options.max_width:
            yield one_line
            return
        head = self.head.copy()
        head.overflow = "fold"
        yield head
        yield _indented(self.detail.copy())


_BARS = " ▁▂▃▄▅▆▇█"


def _bars(values: list[float]) -> str:
    """One character per value, its height against the largest (a blank for nothing)."""
    top = max(values, default=0.0)
    if top <= 0:
        return " " * len(values)
    return "".join(_BARS[0 if v <= 0 else max(1, round(8 * v / top))] for v in values)


_STRETCH_COLUMNS = (("steps", "left"), ("wall", "right"), ("GPU-h", "right"),
                    ("step p50 s", "right"), ("util", "right"), ("idle", "right"),
                    ("largest findings", "left"))  # fmt: skip


def by_steps_renderable(doc: dict[str, Any], top: int | None = None) -> Group:
    """A run diagnosed stretch by stretch (`gpuprof.by_steps`): the sums, each kind's
    GPU-time per stretch, the stretches, the merged recommendations and the notes."""
    s, how = doc["summary"], doc["by_steps"]
    parts: list[Any] = [_headline(s)]
    parts.append(
        Text(
            f"steps {how['run_first']}–{how['run_last']} ({how['run_steps']} recorded) in "
            f"{fmt.stretches(how['stretches'], how['steps_per_stretch'])}, each diagnosed "
            "alone (--by-steps); figures are the stretches' sums",
            style="bold",
        )
    )
    kinds = doc["kinds"][:top] if top else doc["kinds"]
    if kinds:
        parts.append(Text("Findings over the stretches, by GPU-time lost", style="bold"))
        table = Table(box=None, pad_edge=False, show_edge=False)
        for name, justify in (("kind", "left"), ("lost", "right"), ("share", "right"),
                              ("found in", "right"), ("steps", "left"),
                              ("per stretch", "left")):  # fmt: skip
            table.add_column(name, justify=justify)  # type: ignore[arg-type]
        for k in kinds:
            share = k.get("share")
            table.add_row(
                k["kind"],
                fmt.gpu_seconds(k["gpu_seconds_lost"]),
                "–" if share is None else f"{100 * share:.1f}%",
                f"{k['stretches_found']}/{how['stretches']}",
                f"{k['first_step']}–{k['last_step']}",
                _bars(k["per_stretch_gpu_s"]),
            )
        parts.append(table)
    else:
        said = dict.fromkeys(r["no_finding"] for r in doc["stretches"] if r.get("no_finding"))
        parts.append(Text("No finding in any stretch: " + " / ".join(list(said)[:3]),
                          style="yellow"))  # fmt: skip
    table = Table(box=None, pad_edge=False, show_edge=False)
    for name, justify in _STRETCH_COLUMNS:
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in doc["stretches"]:
        found = ", ".join(
            f"{f['kind']} {100 * f['share']:.0f}%" for f in row["findings"][: top or 3]
        )
        util = row.get("mean_util_gpu_pct")
        table.add_row(
            str(row["first"]) if row["first"] == row["last"] else f"{row['first']}–{row['last']}",
            "–" if row.get("duration_s") is None else f"{row['duration_s']:,.0f} s",
            _fmt(row.get("gpu_hours"), 2),
            _fmt(row.get("step_time_p50_s"), 1),
            "–" if util is None else f"{util:.0f}%",
            fmt.gpu_seconds(row.get("idle_gpu_s")),
            found or "–",
        )
    parts.append(Text("Stretches", style="bold"))
    parts.append(table)
    recs = doc["recommendations"][:top] if top else doc["recommendations"]
    if recs:
        parts.append(Text("Recommendations, by expected gain over the stretches", style="bold"))
        for i, r in enumerate(recs, 1):
            line = Text(f"{i:2d}. ")
            line.append(str(r.get("knob")), style="bold cyan")
            line.append(f": {fmt.knob_value(r.get('current'), r.get('default'))} → ")
            line.append(fmt.knob_value(r.get("suggested")), style="bold")
            line.append(
                f"  ~{fmt.gpu_seconds(r.get('expected_gain_gpu_s'))} over "
                f"{r.get('stretches_given')} stretch(es)  [{r.get('kind')}]"
            )
            parts.append(line)
    for note in doc.get("notes", []):
        parts.append(Text(f"note: {note}", style="yellow"))
    return Group(*parts)


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
