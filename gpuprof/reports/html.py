"""The self-contained HTML report: ``render_html(run) -> str`` and `write_html`.

One file that works offline (clusters are often air-gapped): plotly.js is embedded, nothing is
fetched. Every string that comes from the run (command, host, phase and process names,
finding summaries, knob values) is HTML-escaped; the figure data travels as JSON inside a
``<script type="application/json">`` block with ``<``, ``>`` and ``&`` written as ``\\u003c``…
so no run string can close the block or open a comment. The page sets
``window.__gpuprofRenderedMs`` (``performance.now()`` in ms) once every figure is drawn.

On several nodes the GPU picker groups its GPUs per node (``<optgroup>``) and, on many nodes
(`figures.node_groups`), a node picker narrows the heatmap and the GPU picker to one node.
"""

from __future__ import annotations

import html
import json
import os
import re
import shlex
import tempfile
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from plotly.offline import get_plotlyjs

from gpuprof.analyzers.diagnose import Diagnosis, diagnose, no_finding_sentence
from gpuprof.analyzers.findings import BUSY_LOSS_KINDS, AnalysisContext
from gpuprof.model import Run
from gpuprof.reports import fmt
from gpuprof.reports.figures import Budget, FigureSet, build_figures

_TEMPLATE_DIR = files("gpuprof.reports") / "html_assets"
_SLOT = re.compile(r"\{\{(\w+)\}\}")
_JSON_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


def render_html(
    run: Run,
    diagnosis: Diagnosis | None = None,
    *,
    phase_steps: pd.DataFrame | None = None,
    budget: Budget | None = None,
) -> str:
    """The report of ``run`` as one HTML document.

    ``diagnosis`` (from `gpuprof.analyzers.diagnose.diagnose`) and ``phase_steps``
    (`breakdown.phase_breakdown` by ``("phase", "step")``) are computed when not given; pass
    them for runs too big to align sample by sample in memory.
    """
    if diagnosis is None or phase_steps is None:
        ctx = AnalysisContext(run)  # one alignment for the diagnosis and the per-step table
        if diagnosis is None:
            diagnosis = diagnose(run, context=ctx)
        if phase_steps is None and len(run.spans) and len(run.gpu):
            phase_steps = ctx.by_phase_step
    budget = budget or Budget()
    intervals = _intervals_ns(diagnosis, budget.max_intervals)
    figs, axis = build_figures(run, diagnosis.summary, phase_steps, budget, intervals)
    data = {
        "figures": figs.figures,
        "evidence": {
            str(i): axis.of(np.array(pairs, dtype=np.int64)).round(6).tolist()
            for i, pairs in enumerate(intervals)
            if pairs
        },
        "selector": figs.gpu_selector,
        "unit": axis.unit,
        "end": axis.end,
    }
    if figs.nodes is not None:  # absent on one node: a single-node report stays as it was
        data["nodes"] = figs.nodes
    flames = _flames(run, diagnosis)
    if flames:  # absent without sampled stacks: such a report stays as it was
        data["flames"] = flames
    page = (_TEMPLATE_DIR / "report.html").read_text(encoding="utf-8")
    parts = {
        "title": html.escape(f"gpuprof report: {run.meta.run_id}"),
        "style": (_TEMPLATE_DIR / "report.css").read_text(encoding="utf-8"),
        "header": _header(run, diagnosis),
        "recommendations": _recommendations(diagnosis),
        "findings": _findings(diagnosis),
        "stacks": _stacks_section(diagnosis, flames),
        "notes": _notes(diagnosis, figs),
        "selector": _selector_html(figs),
        "sections": _sections(figs),
        "phase_table": _phase_table(diagnosis),
        "node_table": _node_table(diagnosis),
        "efficiency": _efficiency(diagnosis),
        "plotly": get_plotlyjs(),
        "data": json_for_script(data),
        "script": (_TEMPLATE_DIR / "report.js").read_text(encoding="utf-8"),
    }
    # one pass over the template: text from the run that looks like a slot stays text
    return _SLOT.sub(lambda m: parts[m.group(1)], page)


def write_html(run: Run, path: Path, diagnosis: Diagnosis | None = None, **kwargs: Any) -> Path:
    """Render and write atomically (temp file in the same directory, then ``os.replace``):
    a failure leaves no half-written report. Returns ``path``."""
    return write_text(render_html(run, diagnosis, **kwargs), path)


def write_text(text: str, path: Path) -> Path:
    """``text`` written to ``path`` atomically (temp file in the same directory, then
    ``os.replace``), readable as the umask allows; returns ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; a report is for sharing
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def json_for_script(value: Any) -> str:
    """JSON safe to place inside a ``<script>`` element: no ``</script``, no ``<!--``."""
    text = json.dumps(value, allow_nan=False, separators=(",", ":"), default=_plain)
    for raw, escaped in _JSON_ESCAPES.items():
        text = text.replace(raw, escaped)
    return text


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


# ------------------------------------------------------------------------------------------
# Sections


def _header(run: Run, diagnosis: Diagnosis) -> str:
    meta, s = run.meta, diagnosis.summary
    command = shlex.join(str(a) for a in meta.command) if meta.command else "(not recorded)"
    hosts = list(meta.hosts)
    if not hosts and len(run.gpu):
        hosts = sorted(set(run.gpu["host"].astype(str)))
    host_text = ", ".join(hosts[:8]) + (f" … (+{len(hosts) - 8})" if len(hosts) > 8 else "")
    names = sorted({str(g.get("name")) for g in meta.gpus if isinstance(g, dict) and g.get("name")})
    gpus = s.get("gpus") or len(meta.gpus)
    if meta.exit_code is None and meta.command[:2] == ["gpuprof", "import"]:
        status = "not recorded (imported from files)"
    elif meta.exit_code is None:
        status = "unknown (still running, or the watcher was killed)"
    elif meta.exit_signal:
        status = f"{meta.exit_code} (killed by signal {meta.exit_signal})"
    else:
        status = f"{meta.exit_code}" + (" (success)" if meta.exit_code == 0 else " (failed)")
    rows = [
        ("command", f"<code>{_e(command)}</code>"),
        ("framework", _e(meta.framework or "not detected")),
        ("hosts", f"{len(hosts)}: {_e(host_text)}" if hosts else "–"),
        ("GPUs", f"{gpus}" + (f" × {_e(', '.join(names))}" if names else "")),
        ("duration", _e(fmt.seconds(run.duration_s))),
        ("exit status", _e(status)),
    ]
    if s.get("stretch"):
        rows.insert(0, ("read", f"<strong>{_e(fmt.stretch(s['stretch']))}</strong>"))
    table = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="meta">{table}</table>{_headline(s, diagnosis)}'


def _headline(s: dict[str, Any], diagnosis: Diagnosis) -> str:
    util, sm, idle = s.get("mean_util_gpu_pct"), s.get("mean_sm_active_pct"), s.get("idle_gpu_s")
    cards = []
    if util is not None:
        cards.append(("mean GPU utilization", fmt.percent(util), "kernel running (NVML)"))
    if sm is not None:
        cards.append(("mean SM active", fmt.percent(sm), "GPM SM activity"))
    if idle is not None:
        hours = f"{idle / 3600:.2f} GPU-h"
        share = f"of {s.get('gpu_hours', 0):.2f} GPU-h" if s.get("gpu_hours") else ""
        cards.append(("idle GPU time", hours, share))
    if s.get("step_time_p50_s") is not None:
        cards.append(
            (
                "step time p50",
                fmt.seconds(s["step_time_p50_s"]),
                f"p95 {fmt.seconds(s.get('step_time_p95_s'))}, {s.get('steps')} steps",
            )
        )
    cards.extend(_efficiency_cards(s.get("efficiency") or {}))
    out = "".join(
        f'<div class="card"><div class="k">{_e(k)}</div><div class="v">{_e(v)}</div>'
        f'<div class="d">{_e(d)}</div></div>'
        for k, v, d in cards
    )
    basis_line = (s.get("data_basis") or {}).get("line")
    if basis_line:
        out += f'<p class="cause basis">{_e(basis_line)}.</p>'
    bound = s.get("bound") or {}
    if bound.get("verdict"):
        out += f'<p class="cause bound">What bounds the step: {_e(bound["verdict"])}.</p>'
    idle_causes = [f for f in diagnosis.findings if f.kind not in BUSY_LOSS_KINDS][:3]
    busy_causes = [f for f in diagnosis.findings if f.kind in BUSY_LOSS_KINDS][:3]
    for label, causes in (
        ("Where the idle time went", idle_causes),
        ("What slowed the busy time", busy_causes),
    ):
        if causes:
            text = "; ".join(
                f"<b>{_e(f.kind)}</b> {_e(fmt.gpu_seconds(f.gpu_seconds_lost))} "
                f"({100 * f.share:.1f}% of GPU-time)"
                for f in causes
            )
            out += f'<p class="cause">{label}: {text}.</p>'
    if not diagnosis.findings:
        sentence, good = no_finding_sentence(diagnosis)
        out += f'<p class="cause{" ok" if good else ""}">{_e(sentence)}</p>'
    return f'<div class="cards">{out}</div>'


def _mfu(value: Any) -> str:
    if value is None:
        return "n/a"
    pct = 100.0 * float(value)
    return f"{pct:.1f}%" if pct < 10 else f"{pct:.0f}%"


def _rate(value: Any) -> str:
    return "–" if value is None else f"{float(value):,.0f}"


def _money(value: Any) -> str:
    return "–" if value is None else f"{float(value):,.2f}"


def _logged_mfu(entry: dict[str, Any], framework: str | None) -> str:
    return ", ".join(
        f"{_mfu(m.get('mean'))} ({m.get('key')})" for m in entry.get("framework_mfu") or []
    )


def _efficiency_cards(e: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Headline cards: run tokens/s, the update's MFU (with the framework's logged one) and
    the idle time's cost when a price was given."""
    cards = []
    run = e.get("run") or {}
    if run.get("tokens_per_s"):
        per_gpu = run.get("tokens_per_s_per_gpu")
        detail = f"{_rate(per_gpu)} per GPU" if per_gpu else "over the steps' wall time"
        cards.append(("tokens/s", _rate(run["tokens_per_s"]), detail))
    update = next((p for p in e.get("phases") or [] if p.get("phase") == "update_actor"), None)
    if update is not None and (update.get("mfu") is not None or update.get("framework_mfu")):
        logged = _logged_mfu(update, (e.get("framework") or {}).get("name"))
        detail = f"logged: {logged}" if logged else f"{(e.get('gpu') or {}).get('model') or ''}"
        cards.append(("update MFU", _mfu(update.get("mfu")), detail))
    cost = e.get("cost") or {}
    if cost.get("gpu_hour_price") is not None and cost.get("idle_cost") is not None:
        cards.append(
            (
                "cost of idle time",
                _money(cost["idle_cost"]),
                f"{cost.get('idle_gpu_hours', 0):.2f} GPU-h at {_money(cost['gpu_hour_price'])}"
                " per GPU-hour",
            )
        )
    return cards


def _efficiency(diagnosis: Diagnosis) -> str:
    """The efficiency table: per phase tokens, wall time, tokens/s, FLOPs per token, MFU and
    the framework's logged MFU; then where the peak and the model size came from, the cost
    of each finding at the given price, and the notes."""
    e = diagnosis.summary.get("efficiency") or {}
    phases = e.get("phases") or []
    run = e.get("run") or {}
    framework = e.get("framework") or {}
    out = []
    if phases or run.get("tokens_per_s"):
        rows = []
        for p in phases:
            flops = p.get("flops_per_token")
            rows.append(
                f"<tr><td>{_e(p.get('phase'))}</td><td>{_e(p.get('token_kind'))}</td>"
                f"<td>{_e(_rate(p.get('tokens')))}</td>"
                f"<td>{_e(fmt.seconds(p.get('wall_s')))}</td>"
                f"<td>{_e(_rate(p.get('tokens_per_s')))}</td>"
                f"<td>{_e(_rate(p.get('tokens_per_s_per_gpu')))}</td>"
                f"<td>{_e(p.get('gpus') if p.get('gpus') is not None else '–')}</td>"
                f"<td>{_e('–' if flops is None else f'{flops / 1e9:,.1f} G')}</td>"
                f"<td><b>{_e(_mfu(p.get('mfu')))}</b></td>"
                f"<td>{_e(_logged_mfu(p, framework.get('name')) or '–')}</td></tr>"
            )
        throughput = (framework.get("metrics") or {}).get("perf/throughput")
        logged_run = f"{_rate(throughput['mean'])} tokens/s per GPU" if throughput else "–"
        rows.append(
            f"<tr><td><b>run</b></td><td>steps</td><td>{_e(_rate(run.get('tokens')))}</td>"
            f"<td>–</td><td>{_e(_rate(run.get('tokens_per_s')))}</td>"
            f"<td>{_e(_rate(run.get('tokens_per_s_per_gpu')))}</td>"
            f"<td>{_e(run.get('gpus') if run.get('gpus') is not None else '–')}</td><td>–</td>"
            f"<td><b>{_e(_mfu(run.get('mfu')))}</b></td><td>{_e(logged_run)}</td></tr>"
        )
        head = (
            "<tr><th>phase</th><th>tokens</th><th>count</th><th>wall time</th>"
            "<th>tokens/s</th><th>per GPU</th><th>GPUs</th><th>FLOPs per token</th>"
            f"<th>MFU</th><th>logged by {_e(framework.get('name') or 'the framework')}</th></tr>"
        )
        out.append(f'<table class="phases efficiency">{head}{"".join(rows)}</table>')
    facts = []
    gpu, model = e.get("gpu") or {}, e.get("model") or {}
    if gpu.get("model"):
        facts.append(
            f"peak: {_e(gpu['model'])} ({_e(gpu.get('name'))}), {_e(gpu.get('dtype'))} dense "
            f"{gpu['peak_flops_per_gpu'] / 1e12:,.1f} TFLOP/s per GPU, {_e(gpu.get('source'))}"
        )
    if model.get("flops_params"):
        facts.append(
            f"model: {float(model['flops_params']) / 1e9:,.3g} B parameters per token from "
            f"{_e(model.get('source'))}: {_e(model.get('method'))}"
        )
    cost = e.get("cost") or {}
    if cost.get("gpu_hour_price") is not None:
        priced = [f for f in cost.get("findings") or [] if f.get("cost") is not None]
        text = f"at {_e(_money(cost['gpu_hour_price']))} per GPU-hour: "
        parts = []
        if cost.get("run_cost") is not None:
            parts.append(f"the run {_e(_money(cost['run_cost']))}")
        if cost.get("idle_cost") is not None:
            parts.append(f"its idle time {_e(_money(cost['idle_cost']))}")
        parts.extend(f"{_e(f['kind'])} {_e(_money(f['cost']))}" for f in priced)
        if parts:
            facts.append(text + ", ".join(parts))
    if facts:
        out.append("<p>" + "<br>".join(facts) + "</p>")
    notes = [*(e.get("notes") or []), *(framework.get("warnings") or []),
             *(framework.get("notes") or [])]  # fmt: skip
    if notes:
        items = "".join(f"<li>{_e(n)}</li>" for n in dict.fromkeys(notes))
        out.append(f'<ul class="notes">{items}</ul>')
    if not out:
        return "<p>No efficiency figures: the run records no tokens per step.</p>"
    return "".join(out)


def _knob(name: Any) -> str:
    """A knob name, escaped, that may wrap after its dots (long dotted config paths)."""
    return "<wbr>".join(_e(part) + "." for part in str(name).split("."))[:-1]


def _finding_index(diagnosis: Diagnosis) -> dict[str, int]:
    return {f.kind: i for i, f in reversed(list(enumerate(diagnosis.findings)))}


def _zoom_button(index: int | None, diagnosis: Diagnosis) -> str:
    if index is None or not diagnosis.findings[index].evidence.get("intervals"):
        return ""
    return f'<button class="zoom" data-evidence="{index}" type="button">zoom to evidence</button>'


def _recommendations(diagnosis: Diagnosis) -> str:
    recs = diagnosis.recommendations
    if not recs:
        return "<p>No recommendation: nothing above the noise threshold to act on.</p>"
    index = _finding_index(diagnosis)
    rows = []
    for i, r in enumerate(recs, 1):
        rows.append(
            "<tr>"
            f"<td>{i}</td><td class=knob><code>{_knob(r.knob)}</code>"
            f"<div class=sub>{_e(r.framework)}"
            f"{' · ' + _e(r.versions) if r.versions else ''}</div></td>"
            f"<td>{_e(fmt.knob_value(r.current, r.default))}</td>"
            f"<td><b>{_e(fmt.knob_value(r.suggested))}</b></td>"
            f"<td>~{100 * r.expected_gain_share:.1f}%<div class=sub>"
            f"{_e(fmt.gpu_seconds(r.expected_gain_gpu_s))}</div></td>"
            f"<td>{_e(r.kind)}<div class=sub>confidence {r.confidence:.2f}</div></td>"
            f"<td>{_e(r.rationale)}</td>"
            f"<td>{_zoom_button(index.get(r.kind), diagnosis)}</td>"
            "</tr>"
        )
    head = (
        "<tr><th>#</th><th>knob</th><th>current</th><th>suggested</th>"
        "<th>expected gain</th><th>for</th><th>why</th><th></th></tr>"
    )
    return f'<table class="recs">{head}{"".join(rows)}</table>'


def _findings(diagnosis: Diagnosis) -> str:
    if not diagnosis.findings:
        sentence, good = no_finding_sentence(diagnosis)
        return f'<p class="{"ok" if good else "cause"}">{_e(sentence)}</p>'
    rows = []
    for i, f in enumerate(diagnosis.findings):
        ev = f.evidence or {}
        gpus = ev.get("gpus") or []
        where = ", ".join(str(p) for p in ev.get("phases") or [])
        intervals = ev.get("intervals") or []
        detail = f"{len(intervals)} interval(s)" if intervals else "no intervals"
        if gpus:
            detail += f" · {len(gpus)} GPU(s)"
        rows.append(
            f'<tr><td><b class="{"bad" if f.share >= 0.1 else "warn"}">{_e(f.kind)}</b></td>'
            f"<td>{_e(fmt.gpu_seconds(f.gpu_seconds_lost))}</td><td>{100 * f.share:.1f}%</td>"
            f"<td>{f.confidence:.2f}</td><td>{_e(f.summary)}"
            f"<div class=sub>{_e(where)}{' · ' if where else ''}{_e(detail)}</div>"
            f"{_stack_line(i, f)}</td>"
            f"<td>{_zoom_button(i, diagnosis)}</td></tr>"
        )
    head = (
        "<tr><th>kind</th><th>GPU-time lost</th><th>share</th><th>confidence</th>"
        "<th>what</th><th></th></tr>"
    )
    return f'<table class="findings">{head}{"".join(rows)}</table>'


def _stack_line(index: int, finding: Any) -> str:
    """Under a finding's summary: its top Python stack, linked to its flame graph."""
    stacks = getattr(finding, "stacks", None)
    if stacks is None:
        return ""
    return (f'<div class="sub stackline">Python: <a href="#gp-flame-{index}">'
            f"{_e(stacks.headline())}</a></div>")  # fmt: skip


FLAME_MIN_SHARE = 0.005
"""Frames under this share of a flame graph's time are left out of it (kept in the parent)."""
FLAME_MAX_NODES = 400


def _flames(run: Run, diagnosis: Diagnosis) -> dict[str, dict[str, Any]]:
    """Per finding with stacks (by its index), its flame graphs: ``busy`` (the time Python
    threads ran or were ready to) and ``blocked`` (the main threads' blocked time), each
    filtered to the finding's intervals (`analyzers.stacks.StackIndex.tree`)."""
    if not any(getattr(f, "stacks", None) is not None for f in diagnosis.findings):
        return {}
    from gpuprof.analyzers.stacks import StackIndex

    index = StackIndex(run)
    out: dict[str, dict[str, Any]] = {}
    for i, f in enumerate(diagnosis.findings):
        if getattr(f, "stacks", None) is None:
            continue
        intervals = (f.evidence or {}).get("intervals") or []
        trees = {}
        for which, blocked in (("busy", False), ("blocked", True)):
            tree = index.tree(intervals, blocked=blocked, min_share=FLAME_MIN_SHARE,
                              max_nodes=FLAME_MAX_NODES)  # fmt: skip
            if tree is not None:
                trees[which] = tree
        if trees:
            out[str(i)] = trees
    return out


def _stacks_section(diagnosis: Diagnosis, flames: dict[str, dict[str, Any]]) -> str:
    """The section of Python stacks per finding: its top stacks as a table, and flame graphs
    (icicles: outermost call on top, width = time; click a frame to zoom into it, click the
    top frame to zoom out) drawn by the page's script from the JSON data."""
    parts = []
    for i, f in enumerate(diagnosis.findings):
        stacks = getattr(f, "stacks", None)
        if stacks is None:
            continue
        rows = "".join(
            f"<tr><td>{100 * g.share:.0f}%</td><td>{g.seconds:.1f} s</td>"
            f"<td><code>{_e(g.where())}</code>"
            f"{f'<div class=sub>in {_e(g.calls)}</div>' if g.calls else ''}</td>"
            f"<td class=sub>{_e(' → '.join(g.chain))}</td>"
            f"<td class=sub>{_e(', '.join(g.processes))}<br>{_e(', '.join(g.threads))}</td></tr>"
            for g in stacks.top
        )
        table = (
            "<table class=stacks><tr><th>share</th><th>time</th><th>user code</th><th>chain</th>"
            f"<th>processes · threads</th></tr>{rows}</table>" if rows else ""
        )  # fmt: skip
        what = "busy (running or ready to run)" if stacks.activity == "thread_cpu" else "sampled"
        basis = (f"{stacks.threads} Python thread(s) of {stacks.processes} process(es), "
                 f"{stacks.busy_s:.1f} s {what}, {stacks.blocked_s:.1f} s blocked"
                 + (f", sampled at {stacks.rate_hz:g} Hz" if stacks.rate_hz else ""))  # fmt: skip
        trees = flames.get(str(i), {})
        flame = (f'<div class="flame" data-flame="{i}" data-which="busy"></div>'
                 if "busy" in trees else "")  # fmt: skip
        blocked = ""
        if "blocked" in trees:
            first = stacks.blocked[0].phrase() if stacks.blocked else ""
            blocked = (f"<details><summary>where the main thread was blocked"
                       f"{': ' + _e(first) if first else ''}</summary>"
                       f'<div class="flame" data-flame="{i}" data-which="blocked"></div>'
                       "</details>")  # fmt: skip
        parts.append(
            f'<div class="stackfinding" id="gp-flame-{i}"><h3>{_e(f.kind)}: '
            f"{_e(stacks.headline())}</h3><div class=sub>{_e(basis)}</div>{table}{flame}"
            f"{blocked}</div>"
        )
    if not parts:
        return ""
    return (
        '<section id="gp-stacks-section"><h2>Python stacks in the findings\' intervals</h2>'
        "<p class=sub>Sampled by py-spy from the watcher. Flame graphs: the outermost call on "
        "top, width is time; user code in orange, libraries in blue; click a frame to zoom "
        "into it, the top frame to zoom out.</p>" + "".join(parts) + "</section>"
    )


def _notes(diagnosis: Diagnosis, figs: FigureSet) -> str:
    notes = [*figs.notes, *diagnosis.notes]
    if not notes:
        return ""
    items = "".join(f"<li>{_e(n)}</li>" for n in dict.fromkeys(notes))
    return f'<ul class="notes">{items}</ul>'


def _selector_html(figs: FigureSet) -> str:
    """The toolbar's pickers: a node picker where `node_groups` asks for one, and the GPU
    picker (above `Budget.max_gpu_lines` GPUs), its GPUs grouped by node on several nodes."""
    sel = figs.gpu_selector
    if not sel:
        return ""
    nodes = figs.nodes
    if nodes is None:
        options = "".join(
            f'<option value="{i}">{_e(label)}</option>' for i, label in enumerate(sel["labels"])
        )
    else:
        options = _grouped_options(nodes, figs.rows)
    gpus = (
        f'<label class="picker">selected GPU (red line): <select id="gp-gpu">'
        f"{options}</select></label>"
    )
    return _node_picker(nodes) + gpus if nodes is not None and nodes["picker"] else gpus


def _grouped_options(nodes: dict[str, Any], rows: list[str]) -> str:
    """One ``<optgroup>`` per node; option values stay the GPU's index in the selector data."""
    groups = []
    for k, name in enumerate(nodes["names"]):
        lo, hi = nodes["bounds"][k], nodes["bounds"][k + 1]
        options = "".join(f'<option value="{i}">{_e(rows[i])}</option>' for i in range(lo, hi))
        groups.append(f'<optgroup label="{_e(name)}" data-node="{k}">{options}</optgroup>')
    return "".join(groups)


def _node_picker(nodes: dict[str, Any]) -> str:
    """The node ``<select>``: "all nodes" first where the heatmap can draw every GPU."""
    total = nodes["bounds"][-1]
    every = f'<option value="all">all {len(nodes["names"])} nodes ({total} GPUs)</option>'
    options = "".join(f'<option value="{k}">{_e(n)}</option>' for k, n in enumerate(nodes["names"]))
    return (
        f'<label class="picker">node: <select id="gp-node">{every if nodes["all"] else ""}'
        f"{options}</select></label>"
    )


_SECTION_TITLES = {
    "gp-heatmap": "GPU × time",
    "gp-steps": "Phase breakdown per step",
    "gp-idle": "Idle GPU time by cause",
    "gp-steptime": "Step-time distribution",
}


def _sections(figs: FigureSet) -> str:
    out = []
    for key, title in _SECTION_TITLES.items():
        if key in figs.figures:
            out.append(f'<section><h2>{_e(title)}</h2><div class="fig" id="{key}"></div></section>')
    return "".join(out)


def _phase_table(diagnosis: Diagnosis) -> str:
    phases = diagnosis.summary.get("phases") or []
    if not phases:
        return "<p>No phase table: the run has no phase spans or no GPU samples.</p>"
    rows = []
    for p in phases:
        label = fmt.phase_label(p["phase"])
        share = p.get("share")
        rows.append(
            f"<tr><td>{_e(label)}</td><td>{_e(fmt.seconds(p.get('wall_s')))}</td>"
            f"<td>{_e(fmt.gpu_seconds(p.get('gpu_s')))}</td>"
            f"<td>{_e(fmt.gpu_seconds(p.get('idle_gpu_s')))}</td>"
            f"<td>{_e(fmt.percent(p.get('util_gpu_pct')))}</td>"
            f"<td>{_e(fmt.percent(None if share is None else 100 * share))}</td></tr>"
        )
    of = "GPU-time" if diagnosis.summary.get("basis") == "gpu_samples" else "the steps' time"
    head = (
        "<tr><th>phase</th><th>wall time</th><th>GPU time</th><th>idle GPU time</th>"
        f"<th>mean util</th><th>share of {of}</th></tr>"
    )
    note = (
        "<p>Each phase by its self time: a phase nested in another (generation inside a "
        "training step) counts in the innermost one only.</p>"
    )
    return f'{note}<table class="phases">{head}{"".join(rows)}</table>'


def _recorded_html(recorded: dict[str, Any] | None) -> str:
    """How a node was recorded, in the report's words (with the why of a missing node)."""
    text = fmt.node_recorded(recorded)
    if recorded and recorded.get("state") in ("lost", "never_recorded") and recorded.get("why"):
        text += f" ({recorded['why']})"
    return text


def _node_table(diagnosis: Diagnosis) -> str:
    """A multi-node run's nodes (the summary's ``nodes``): per node GPUs, ranks, utilisation,
    idle GPU-time, idle while another node worked and the clock offset applied; how well the
    clocks were aligned; collective traffic per link type; the straggler node."""
    nodes = diagnosis.summary.get("nodes") or {}
    rows_in = nodes.get("nodes") or []
    if not rows_in:
        return ""
    alignment = nodes.get("alignment")
    if alignment:
        worst = alignment.get("worst_error_ns")
        said = (
            f"Node clocks aligned: worst error ±{worst / 1e6:.1f} ms ({alignment.get('method')})"
            if worst is not None
            else f"Node clocks aligned ({alignment.get('method')})"
        )
        if alignment.get("nodes_unaligned"):
            said += f"; {alignment['nodes_unaligned']} node(s) not aligned"
    else:
        said = "Node clocks not aligned: no stored offsets and no collectives shared by all ranks"
    rows = []
    accounted = any(n.get("recorded") for n in rows_in)  # a Ray cluster run
    for n in rows_in:
        ranks = n.get("ranks") or []
        rank_text = f"{ranks[0]}–{ranks[-1]}" if len(ranks) > 2 else ", ".join(map(str, ranks))
        clock = n.get("clock") or {}
        if clock.get("method") == "reference":
            clock_text = "reference"
        elif clock.get("offset_ns") is not None:
            err = clock.get("error_ns")
            clock_text = f"{clock['offset_ns'] / 1e6:+.1f} ms" + (
                f" ± {err / 1e6:.1f}" if err is not None else ""
            )
        else:
            clock_text = "—"
        rows.append(
            f"<tr><td>{_e(n.get('node'))}</td><td>{_e(n.get('gpus'))}</td>"
            f"<td>{_e(rank_text or '—')}</td><td>{_e(fmt.percent(n.get('util_gpu_pct')))}</td>"
            f"<td>{_e(fmt.gpu_seconds(n.get('idle_gpu_s') or 0.0))}</td>"
            f"<td>{_e(fmt.gpu_seconds(n.get('idle_while_others_busy_gpu_s') or 0.0))}</td>"
            f"<td>{_e(clock_text)}</td>"
            + (f"<td>{_e(_recorded_html(n.get('recorded')))}</td>" if accounted else "")
            + "</tr>"
        )
    head = (
        "<tr><th>node</th><th>GPUs</th><th>ranks</th><th>mean util</th><th>idle GPU time</th>"
        "<th>idle while another node worked</th><th>clock offset</th>"
        + ("<th>recorded</th>" if accounted else "")
        + "</tr>"
    )
    extra = []
    for link in nodes.get("links") or []:
        bw = link.get("bandwidth_bytes_s")
        extra.append(
            f"{link['link']} collectives: {link['calls']} calls, {link['bytes'] / 1e9:.2f} GB "
            f"in {link['seconds']:.2f} s" + (f" ({bw / 1e9:.2f} GB/s effective)" if bw else "")
        )
    straggler = nodes.get("straggler_node")
    if straggler:
        extra.append(
            f"Straggler node {straggler['node']}: last in {straggler['phase_steps']} of "
            f"{straggler['of_phase_steps']} phase-steps; the other nodes' GPUs wait "
            f"{fmt.gpu_seconds(straggler['gpu_s'])}"
        )
    if nodes.get("weight_sync_crosses_nodes"):
        extra.append("Weight sync crosses nodes.")
    lines = "".join(f"<p>{_e(line)}</p>" for line in extra)
    return (
        f'<section><h2>Nodes</h2><p>{_e(said)}</p><table class="phases nodes">{head}'
        f"{''.join(rows)}</table>{lines}</section>"
    )


def _intervals_ns(diagnosis: Diagnosis, limit: int) -> list[list[tuple[int, int]]]:
    """Per finding (in order), its first ``limit`` evidence intervals as (start_ns, end_ns);
    malformed entries are skipped and an end before its start is clamped to the start."""
    out = []
    for f in diagnosis.findings:
        pairs = []
        for item in ((f.evidence or {}).get("intervals") or [])[:limit]:
            try:
                start, end = int(item[0]), int(item[1])
            except (TypeError, ValueError, IndexError):
                continue
            pairs.append((start, max(start, end)))
        out.append(pairs)
    return out
