"""The plotly figures of the HTML report, as plain JSON-able dicts (``{"data", "layout"}``).

Numbers come from the analyzers (`gpuprof.analyzers`); this module only chooses what to draw
and how much of it: per-GPU lines up to `Budget.max_gpu_lines` GPUs, an aggregate (mean and
min–max band over GPUs) plus a GPU selector above that, and MinMaxLTTB / binned reductions
(`gpuprof.reports.downsample`) so that a day-long run on hundreds of GPUs stays a file a browser
opens in seconds. Every time on an axis is relative to the run start, in s, min or h.
On several nodes the GPUs go by node (natural order) then index, and `node_groups` says how
they group for the heatmap's node rules and the report's node and GPU pickers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from plotly.colors import qualitative

from gpuprof.analyzers.basic import step_times
from gpuprof.analyzers.spans import NO_PHASE, STEP_PHASE, owned_segments, valid_spans
from gpuprof.intervals import union
from gpuprof.model import Run
from gpuprof.nodes import natural_key
from gpuprof.reports import fmt
from gpuprof.reports.downsample import Binned, bin_stats, keep_shape

PHASE_COLORS: dict[str, str] = {
    "rollout": "#1f77b4",
    "reward": "#d62728",
    "ref_logprob": "#9467bd",
    "old_logprob": "#8c564b",
    "values": "#e377c2",
    "advantage": "#7f7f7f",
    "reshard": "#ff7f0e",
    "update_actor": "#2ca02c",
    "update_critic": "#17becf",
    "dataload": "#bcbd22",
    "checkpoint": "#393b79",
    "eval": "#637939",
    STEP_PHASE: "#c7c7c7",
    NO_PHASE: "#e7e7e7",
}
"""Colour of each canonical phase; other names take colours from `_EXTRA_COLORS` in order."""
_EXTRA_COLORS = qualitative.Dark2  # none of them close to a canonical phase colour
_GPU_COLORS = qualitative.Dark24 if len(qualitative.Dark24) >= 16 else qualitative.Plotly

GIB = 2**30
GB = 1e9


@dataclass(frozen=True)
class Budget:
    """How much the report may draw (sizes that keep a 24 h × 64 GPU run under 10 MB).

    ``line_points``: points per individually drawn series; ``selector_points``: points over
    all GPUs of the GPU-selector data (above ``max_gpu_lines`` GPUs; hosts above
    ``max_host_lines`` get a mean and max CPU line instead of one each); ``bins``: columns of the
    aggregate grid; ``heatmap_cells``: GPU × time cells; ``max_bands``: phase spans drawn as
    bands (the shortest are left out above it); ``max_intervals``: evidence intervals kept per
    finding.
    """

    line_points: int = 2000
    selector_points: int = 160_000
    bins: int = 1200
    heatmap_cells: int = 200_000
    max_gpu_lines: int = 16
    max_host_lines: int = 4
    max_bands: int = 12_000
    max_intervals: int = 500
    evidence_windows: int = 3
    """Evidence intervals per finding drawn at full resolution (the first ones)."""
    window_points: int = 600
    """Points per series inside one evidence window."""


@dataclass
class TimeAxis:
    """Run-relative time: ``t0_ns`` is zero; values are in ``unit`` (``s``, ``min`` or ``h``)."""

    t0_ns: int
    unit: str
    ns_per_unit: float
    end: float
    """Run length in ``unit``."""

    @classmethod
    def for_run(cls, run: Run) -> TimeAxis:
        starts, ends = [], []
        for frame, lo, hi in (
            (run.gpu, "t_ns", "t_ns"),
            (run.host, "t_ns", "t_ns"),
            (run.spans, "start_ns", "end_ns"),
        ):
            if frame is not None and len(frame) and lo in frame:
                starts.append(int(pd.to_numeric(frame[lo]).min()))
                ends.append(int(pd.to_numeric(frame[hi]).max()))
        t0 = run.meta.start_ns if run.meta.start_ns is not None else min(starts, default=0)
        t1 = run.meta.end_ns if run.meta.end_ns is not None else max(ends, default=t0)
        t1 = max([t1, *ends]) if ends else t1
        duration_s = max(0.0, (t1 - t0) / 1e9)
        if duration_s <= 600:
            unit, scale = "s", 1e9
        elif duration_s <= 3 * 3600:
            unit, scale = "min", 60e9
        else:
            unit, scale = "h", 3600e9
        return cls(int(t0), unit, scale, (t1 - t0) / scale)

    def of(self, t_ns: Any) -> np.ndarray:
        """``t_ns`` (array of epoch ns) in run-relative units."""
        t = np.asarray(t_ns)
        if t.dtype.kind in "iu":
            return (t - self.t0_ns).astype(np.float64) / self.ns_per_unit
        return (t.astype(np.float64) - self.t0_ns) / self.ns_per_unit

    @property
    def title(self) -> str:
        return f"time since start ({self.unit})"

    @property
    def decimals(self) -> int:
        """Decimals that resolve 50 ms on this axis (half a 10 Hz sampling interval)."""
        return max(0, math.ceil(math.log10(self.ns_per_unit / 5e7)))


@dataclass
class FigureSet:
    """The report's figures and what the renderer needs to say about them."""

    figures: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    """Visible remarks: downsampling, bands left out, missing data."""
    gpu_selector: dict[str, Any] | None = None
    """``labels``, ``x``, ``y`` per GPU and the timeline ``trace`` index to restyle."""
    nodes: dict[str, Any] | None = None
    """On several nodes, how the GPUs group (see `node_groups`); None on one node."""
    rows: list[str] = field(default_factory=list)
    """Each GPU's name in the heatmap and the GPU picker (``node/gpuN`` on several nodes)."""
    samples: int = 0
    points: int = 0


def _col(frame: pd.DataFrame, name: str) -> np.ndarray:
    """A numeric column as float64; a missing column reads as all-NaN (never 0)."""
    if frame is None or name not in frame:
        return np.full(0 if frame is None else len(frame), np.nan)
    return pd.to_numeric(frame[name], errors="coerce").to_numpy(np.float64, na_value=np.nan)


def _rounded(values: np.ndarray, decimals: int) -> list[float | None]:
    """A JSON-ready list: rounded floats, NaN and ±inf → None (JSON has neither)."""
    arr = np.round(np.asarray(values, dtype=np.float64), decimals)
    out = arr.tolist()
    bad = ~np.isfinite(arr)
    if bad.any():
        for i in np.flatnonzero(bad).tolist():
            out[i] = None
    return out


def gpu_label(host: str, gpu: int, multi_host: bool) -> str:
    return f"{host}:{gpu}" if multi_host else f"GPU {gpu}"


def row_label(host: str, gpu: int, multi_host: bool) -> str:
    """A heatmap row and GPU picker entry: ``node/gpuN`` when the run has several nodes."""
    if not multi_host:
        return gpu_label(host, gpu, False)
    return f"{host}/gpu{gpu if gpu >= 0 else '?'}"


def _naturally(codes: np.ndarray, names: list[str]) -> tuple[np.ndarray, list[str]]:
    """Factorized ``codes`` (-1: missing) renumbered so that ``names`` are in natural order."""
    ranked = sorted(range(len(names)), key=lambda i: natural_key(names[i]))
    if ranked == list(range(len(names))):  # already in order: skip a pass over every sample
        return codes, names
    new_code = np.empty(len(names) + 1, dtype=np.int64)
    new_code[ranked] = np.arange(len(names))
    new_code[-1] = -1  # codes of -1 index the last slot and stay -1
    return new_code[codes], [names[i] for i in ranked]


@dataclass
class _GpuSeries:
    """The run's GPU samples grouped per GPU (ordered by node, naturally sorted, then GPU
    index), sorted by time within each GPU."""

    labels: list[str]
    bounds: np.ndarray  # start offset of each GPU's rows in the sorted arrays (len G + 1)
    t: np.ndarray  # run-relative units
    code: np.ndarray  # GPU index 0..G-1 per sorted row
    order: np.ndarray  # sorted position → row of run.gpu
    hosts: list[str] = field(default_factory=list)  # node of each GPU
    indices: list[int] = field(default_factory=list)  # GPU index on its node (-1: unknown)

    @classmethod
    def of(cls, run: Run, axis: TimeAxis) -> _GpuSeries:
        gpu = run.gpu
        if gpu is None or gpu.empty or "t_ns" not in gpu:
            e = np.zeros(0, dtype=np.int64)
            return cls([], np.zeros(1, dtype=np.int64), np.zeros(0), e, e)
        host_codes, hosts = pd.factorize(gpu["host"], sort=True)  # categorical stays cheap
        hosts = [str(h) for h in hosts]
        host_codes, hosts = _naturally(np.asarray(host_codes), hosts)
        if (host_codes < 0).any():  # a sample without a host still has a GPU to draw
            host_codes = np.where(host_codes < 0, len(hosts), host_codes)
            hosts.append("?")
        index = _col(gpu, "gpu")
        index = np.where(np.isfinite(index), index, -1).astype(np.int64)
        # the indices by rank, so that the key stays small whatever a file says an index is
        index_codes, index_values = pd.factorize(index, sort=True)
        width = len(index_values)
        key = host_codes.astype(np.int64) * width + index_codes
        code, keys = pd.factorize(key, sort=True)
        code = code.astype(np.int16 if len(keys) < 2**15 else np.int64)
        order = np.argsort(code, kind="stable")  # radix sort on int16: fast at 10^7 rows
        t_ns = pd.to_numeric(gpu["t_ns"]).to_numpy(np.int64)[order]
        sorted_code = code[order]
        same = sorted_code[1:] == sorted_code[:-1]
        if (np.diff(t_ns)[same] < 0).any():  # rows not in time order within a GPU
            order = np.lexsort((pd.to_numeric(gpu["t_ns"]).to_numpy(np.int64), code))
            t_ns = pd.to_numeric(gpu["t_ns"]).to_numpy(np.int64)[order]
            sorted_code = code[order]
        counts = np.bincount(sorted_code, minlength=len(keys))
        bounds = np.concatenate([[0], np.cumsum(counts)])
        multi = len(hosts) > 1
        gpu_hosts = [hosts[k // width] for k in keys]
        indices = [int(index_values[k % width]) for k in keys]
        labels = [gpu_label(h, i, multi) for h, i in zip(gpu_hosts, indices)]
        return cls(labels, bounds, axis.of(t_ns), sorted_code.astype(np.int64), order,
                   gpu_hosts, indices)  # fmt: skip

    def row_labels(self) -> list[str]:
        """Heatmap rows and GPU picker entries, ``node/gpuN`` on several nodes."""
        multi = len(set(self.hosts)) > 1
        return [row_label(h, i, multi) for h, i in zip(self.hosts, self.indices)]

    def __len__(self) -> int:
        return len(self.labels)

    def values(self, run: Run, column: str, scale: float = 1.0) -> np.ndarray:
        """A GPU column in sorted order, divided by ``scale``."""
        return _col(run.gpu, column)[self.order] / scale

    def slice(self, i: int) -> slice:
        return slice(int(self.bounds[i]), int(self.bounds[i + 1]))


def build_figures(
    run: Run,
    diagnosis_summary: dict[str, Any],
    phase_steps: pd.DataFrame | None,
    budget: Budget | None = None,
    evidence_ns: list[list[tuple[int, int]]] | None = None,
) -> tuple[FigureSet, TimeAxis]:
    """Every figure of the report. ``phase_steps`` is `breakdown.phase_breakdown` by
    ``("phase", "step")`` (None or empty: no per-step chart). ``evidence_ns``: per finding,
    its evidence intervals in epoch ns; the timeline keeps full resolution around the first
    few of each, which is where the report's evidence buttons zoom."""
    budget = budget or Budget()
    axis = TimeAxis.for_run(run)
    out = FigureSet()
    series = _GpuSeries.of(run, axis)
    out.samples = len(series.t)
    windows = evidence_windows(
        [
            [tuple(axis.of(np.array(p, dtype=np.int64)).tolist()) for p in f]
            for f in evidence_ns or []
        ],
        axis.end,
        budget.evidence_windows,
    )
    out.figures["gp-timeline"] = _timeline(run, series, axis, budget, out, windows)
    out.nodes = node_groups(series)
    out.rows = series.row_labels()
    if len(series):
        out.figures["gp-heatmap"] = _heatmap(run, series, axis, budget, out)
    steps = _phase_steps(phase_steps)
    if steps is not None:
        out.figures["gp-steps"] = steps
    idle = _idle_by_cause(diagnosis_summary)
    if idle is not None:
        out.figures["gp-idle"] = idle
    hist = _step_hist(run, diagnosis_summary)
    if hist is not None:
        out.figures["gp-steptime"] = hist
    if out.samples and out.points < out.samples:
        out.notes.insert(
            0,
            f"Downsampled: {out.samples:,} GPU samples are drawn as {out.points:,} points "
            f"({out.samples / max(out.points, 1):,.0f}:1). Per-GPU lines keep every bucket's "
            "minimum and maximum (MinMaxLTTB), so short dips stay visible; aggregate rows and "
            "the heatmap are means over time bins.",
        )
    return out, axis


# ------------------------------------------------------------------------------------------
# Evidence windows


EVIDENCE_PAD_FRAC = 0.5
"""Each side of an evidence interval shown when zoomed, as a fraction of its length…"""
EVIDENCE_PAD_MIN_FRAC = 0.002
"""…and at least this fraction of the run (report.js zooms with the same two numbers)."""


def evidence_windows(
    per_finding: list[list[tuple[float, float]]], end: float, first: int
) -> list[tuple[float, float]]:
    """The zoom windows of the first ``first`` evidence intervals of every finding (run-time
    units), merged where they overlap and sorted."""
    spans = []
    for pairs in per_finding:
        for lo, hi in pairs[:first]:
            pad = max((hi - lo) * EVIDENCE_PAD_FRAC, end * EVIDENCE_PAD_MIN_FRAC)
            spans.append((max(0.0, lo - pad), hi + pad))
    merged: list[tuple[float, float]] = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _inside(x: np.ndarray, windows: list[tuple[float, float]]) -> np.ndarray:
    mask = np.zeros(len(x), dtype=bool)
    for lo, hi in windows:
        mask |= (x >= lo) & (x <= hi)
    return mask


def _with_windows(
    t: np.ndarray, y: np.ndarray, keep: np.ndarray, windows: list[tuple[float, float]], n: int
) -> np.ndarray:
    """``keep`` (indices into time-sorted ``t``) plus up to ``n`` samples of every window: the
    real samples, so zooming onto evidence shows what happened rather than a bucket."""
    if not windows or len(t) == 0:
        return keep
    parts = [keep]
    for lo, hi in windows:
        a, b = np.searchsorted(t, [lo, hi])
        if b > a:
            parts.append(a + keep_shape(t[a:b], y[a:b], n))
    return np.unique(np.concatenate(parts))


# ------------------------------------------------------------------------------------------
# Timeline


@dataclass
class _Rows:
    """Stacked y-axes of the timeline sharing one x-axis."""

    names: list[tuple[str, str, float]] = field(default_factory=list)  # key, title, weight

    def layout(self) -> tuple[dict[str, Any], dict[str, str]]:
        gap = 0.03
        total = sum(w for _, _, w in self.names)
        span = 1.0 - gap * (len(self.names) - 1)
        top, axes, refs = 1.0, {}, {}
        for i, (key, title, weight) in enumerate(self.names):
            height = span * weight / total
            name = "yaxis" if i == 0 else f"yaxis{i + 1}"
            axes[name] = {
                "domain": [max(0.0, top - height), top],
                "title": {"text": title, "font": {"size": 11}},
                "zeroline": False,
                "fixedrange": True,
            }
            refs[key] = "y" if i == 0 else f"y{i + 1}"
            top -= height + gap
        return axes, refs


def _timeline(
    run: Run,
    series: _GpuSeries,
    axis: TimeAxis,
    budget: Budget,
    out: FigureSet,
    windows: list[tuple[float, float]],
) -> dict[str, Any]:
    rows = _Rows()
    traces: list[dict[str, Any]] = []
    has_gpu = len(series) > 0
    sm_present = has_gpu and np.isfinite(series.values(run, "sm_active_pct")).any()
    mem_present = has_gpu and np.isfinite(series.values(run, "mem_used_bytes")).any()
    links = {}
    for name in ("pcie", "nvlink") if has_gpu else ():
        tx = series.values(run, f"{name}_tx_bytes_s", GB)
        rx = series.values(run, f"{name}_rx_bytes_s", GB)
        both = np.where(np.isnan(tx) & np.isnan(rx), np.nan, np.nan_to_num(tx) + np.nan_to_num(rx))
        if np.isfinite(both).any():  # a link never measured gets no line (missing is not 0)
            links[name] = both
    cpu_present = (
        run.host is not None and len(run.host) and np.isfinite(_col(run.host, "cpu_pct")).any()
    )

    rows.names.append(("util", "GPU utilization %", 3.0))
    if sm_present:
        rows.names.append(("sm", "SM active %", 1.6))
    if mem_present:
        rows.names.append(("mem", "memory used GiB", 1.6))
    if links:
        rows.names.append(("link", "PCIe / NVLink GB/s per GPU", 1.6))
    if cpu_present:
        rows.names.append(("cpu", "host CPU %", 1.4))
    yaxes, ref = rows.layout()
    yaxes["yaxis"]["range"] = [0, 104]
    if "sm" in ref:
        yaxes["yaxis" + ref["sm"][1:]]["range"] = [0, 104]
    if "cpu" in ref:
        yaxes["yaxis" + ref["cpu"][1:]]["range"] = [0, 104]

    traces.extend(_phase_bands(run, axis, budget, out, ref["util"]))
    bins = max(10, min(budget.bins, len(series.t) // max(len(series), 1) or 10))
    start, end = 0.0, max(axis.end, float(series.t.max()) if len(series.t) else 0.0, 1e-9)
    dec = axis.decimals
    individual = 0 < len(series) <= budget.max_gpu_lines
    # windows only matter where a drawn point stands for several samples
    step_units = (end - start) / max(len(series.t) / max(len(series), 1), 1)
    coarse = bool(windows) and (end - start) / min(bins, budget.line_points) > 4 * step_units
    if coarse:
        out.notes.append(
            f"Around the first {budget.evidence_windows} evidence intervals of each finding "
            f"({len(windows)} windows) the timeline keeps full resolution: zoom there with "
            "the evidence buttons."
        )

    def add_lines(key: str, column: str, scale: float, legend: bool, unit: str) -> None:
        y_all = series.values(run, column, scale)
        for i, label in enumerate(series.labels):
            part = series.slice(i)
            t, y = series.t[part], y_all[part]
            keep = keep_shape(t, y, budget.line_points)
            if coarse:
                keep = _with_windows(t, y, keep, windows, budget.window_points)
            out.points += len(keep)
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": label,
                    "legendgroup": label,
                    "showlegend": legend,
                    "x": _rounded(t[keep], dec),
                    "y": _rounded(y[keep], 1),
                    "line": {"width": 1, "color": _GPU_COLORS[i % len(_GPU_COLORS)]},
                    "yaxis": ref[key],
                    "hovertemplate": f"{label}: %{{y:.1f}} {unit}<extra></extra>",
                }
            )

    def add_band(
        key: str, values: np.ndarray, label: str, color: str, unit: str, show_band: bool = True
    ) -> Binned:
        b = _binned_with_windows(series, values, start, end, bins, windows if coarse else [],
                                 budget.window_points)  # fmt: skip
        x = _rounded(b.centers, dec)
        out.points += len(b.centers) * (3 if show_band else 2)
        if show_band:
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "x": x,
                    "y": _rounded(b.max, 1),
                    "line": {"width": 0},
                    "showlegend": False,
                    "hoverinfo": "skip",
                    "yaxis": ref[key],
                    "legendgroup": label,
                }
            )
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "x": x,
                    "y": _rounded(b.min, 1),
                    "fill": "tonexty",
                    "fillcolor": _alpha(color, 0.18),
                    "line": {"width": 0},
                    "name": f"{label}: min–max over GPUs",
                    "yaxis": ref[key],
                    "legendgroup": label,
                    "hovertemplate": f"min %{{y:.1f}} {unit}<extra></extra>",
                }
            )
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "x": x,
                "y": _rounded(b.mean, 1),
                "line": {"width": 1.3, "color": color},
                "name": f"{label}: mean",
                "yaxis": ref[key],
                "legendgroup": label,
                "hovertemplate": f"mean %{{y:.1f}} {unit}<extra></extra>",
            }
        )
        return b

    if individual:
        add_lines("util", "util_gpu_pct", 1.0, True, "%")
        if sm_present:
            add_lines("sm", "sm_active_pct", 1.0, False, "%")
        if mem_present:
            add_lines("mem", "mem_used_bytes", GIB, False, "GiB")
    elif has_gpu:
        add_band("util", series.values(run, "util_gpu_pct"), "utilization", "#1f77b4", "%")
        out.gpu_selector = _selector(
            run, series, budget, out, dec, len(traces), ref["util"], windows if coarse else []
        )
        traces.append(out.gpu_selector.pop("trace"))
        if sm_present:
            add_band("sm", series.values(run, "sm_active_pct"), "SM active", "#2ca02c", "%")
        if mem_present:
            add_band("mem", series.values(run, "mem_used_bytes", GIB), "memory", "#9467bd", "GiB")
        out.notes.append(
            f"{len(series)} GPUs: the timeline shows the mean and the min–max band over GPUs "
            f"in {b_width(end - start, bins, axis.unit)} bins; pick one GPU with the selector, "
            "and see every GPU in the heatmap."
        )
    link_colors = {"pcie": "#ff7f0e", "nvlink": "#17becf"}
    for name, values in links.items():
        label = "PCIe" if name == "pcie" else "NVLink"
        b = add_band("link", values, f"{label} tx+rx", link_colors[name], "GB/s", show_band=False)
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "x": _rounded(b.centers, dec),
                "y": _rounded(b.max, 2),
                "yaxis": ref["link"],
                "name": f"{label} tx+rx: max GPU",
                "legendgroup": f"{label} tx+rx",
                "line": {"width": 1, "dash": "dot", "color": link_colors[name]},
                "hovertemplate": "max %{y:.2f} GB/s<extra></extra>",
            }
        )
        out.points += len(b.centers)
    if cpu_present:
        traces.extend(_host_cpu(run, axis, budget, ref["cpu"], dec, windows if coarse else []))

    empty = not has_gpu
    layout: dict[str, Any] = {
        **yaxes,
        "xaxis": {
            "title": {"text": axis.title},
            "anchor": ref[rows.names[-1][0]],
            "range": [0, max(axis.end, 1e-9)],
            "showspikes": True,
            "spikemode": "across",
            "spikethickness": 1,
        },
        "height": 260 + 130 * len(rows.names),
        "margin": {"l": 60, "r": 20, "t": 30, "b": 45},
        "hovermode": "closest",
        "legend": {"font": {"size": 10}, "tracegroupgap": 2, "traceorder": "grouped"},
        "showlegend": True,
        "template": "plotly_white",
    }
    if empty:
        layout["annotations"] = [
            {
                "text": "no GPU samples in this run",
                "xref": "paper",
                "yref": "paper",
                "x": 0.5,
                "y": 0.85,
                "showarrow": False,
                "font": {"size": 16, "color": "#888"},
            }
        ]
    return {"data": traces, "layout": layout}


def b_width(span: float, bins: int, unit: str) -> str:
    """The width of one of ``bins`` bins over ``span`` units, as text in seconds or more."""
    from gpuprof.reports.fmt import seconds

    scale = {"s": 1.0, "min": 60.0, "h": 3600.0}[unit]
    return seconds(span * scale / max(bins, 1))


def _alpha(color: str, alpha: float) -> str:
    """``#rrggbb`` or ``rgb(r, g, b)`` as ``rgba(r,g,b,alpha)``."""
    if color.startswith("#"):
        r, g, b = (int(color[k : k + 2], 16) for k in (1, 3, 5))
    else:
        r, g, b = (int(float(v)) for v in color[color.index("(") + 1 : -1].split(",")[:3])
    return f"rgba({r},{g},{b},{alpha})"


def _binned_with_windows(
    series: _GpuSeries,
    values: np.ndarray,
    start: float,
    end: float,
    bins: int,
    windows: list[tuple[float, float]],
    window_bins: int,
) -> Binned:
    """Bins pooled over GPUs on the coarse grid, with finer bins (down to the sample interval)
    inside each evidence window replacing the coarse ones there."""
    b = bin_stats(series.t, values, start, end, bins, group=series.code).pooled()
    if not windows:
        return b
    keep = ~_inside(b.centers, windows)
    parts = [(b.centers[keep], b.mean[keep], b.min[keep], b.max[keep], b.count[keep])]
    for lo, hi in windows:
        rows = []
        for i in range(len(series)):  # each GPU's samples are time-sorted: two binary searches
            part = series.slice(i)
            a, z = np.searchsorted(series.t[part], [lo, hi])
            rows.append(np.arange(part.start + a, part.start + z))
        idx = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
        if not len(idx):
            continue
        per_gpu = len(idx) / len(series)
        w = bin_stats(series.t[idx], values[idx], lo, hi, int(min(window_bins, max(per_gpu, 1))),
                      group=series.code[idx]).pooled()  # fmt: skip
        parts.append((w.centers, w.mean, w.min, w.max, w.count))
    centers, mean, lo_, hi_, count = (np.concatenate(c) for c in zip(*parts))
    order = np.argsort(centers, kind="stable")
    return Binned(centers[order], mean[order], lo_[order], hi_[order], count[order], b.width)


def _deltas(x: np.ndarray, dec: int) -> list[int]:
    """Increasing times as integer steps of ``10**-dec`` from 0: about half the characters of
    the decimals for the per-GPU picker data (report.js sums them back)."""
    ticks = np.round(np.asarray(x, dtype=np.float64) * 10**dec).astype(np.int64)
    return np.diff(ticks, prepend=0).tolist()


def _selector(
    run: Run,
    series: _GpuSeries,
    budget: Budget,
    out: FigureSet,
    dec: int,
    index: int,
    yref: str,
    windows: list[tuple[float, float]],
) -> dict[str, Any]:
    """Per-GPU utilisation for the GPU picker and the (initially first) selected-GPU trace."""
    per_gpu = max(200, budget.selector_points // max(len(series), 1))
    # windows share a quarter of the picker's budget: at 512 GPUs a few points per window
    per_window = max(
        20,
        min(
            budget.window_points // 4,
            budget.selector_points // (4 * len(series) * max(len(windows), 1)),
        ),
    )
    util = series.values(run, "util_gpu_pct")
    xs, ys = [], []
    for i in range(len(series)):
        part = series.slice(i)
        t, y = series.t[part], util[part]
        keep = _with_windows(t, y, keep_shape(t, y, per_gpu), windows, per_window)
        out.points += len(keep)
        xs.append(_deltas(t[keep], dec))
        ys.append(_rounded(y[keep], 0))
    first = series.slice(0) if len(series) else slice(0, 0)
    x0 = np.cumsum(xs[0]) / 10**dec if xs else np.zeros(0)
    trace = {
        "type": "scatter",
        "mode": "lines",
        "x": _rounded(x0, dec) if len(series.t[first]) else [],
        "y": ys[0] if ys else [],
        "name": f"selected: {series.labels[0]}",
        "yaxis": yref,
        "line": {"width": 1, "color": "#d62728"},
        "hovertemplate": "%{y:.0f}%<extra>selected GPU</extra>",
    }
    return {"labels": series.labels, "x_deltas": xs, "x_scale": 10**dec, "y": ys,
            "trace_index": index, "trace": trace}  # fmt: skip


def _band_process(spans: pd.DataFrame) -> tuple[str, int, str]:
    """(host, pid, description) of the process whose phases the bands show: the lowest rank,
    or without ranks the process whose spans cover the most time (a single controller).

    Chosen from the spans alone: `ownership.gpu_owner` would scan every GPU sample, which at
    tens of millions of samples costs more than the rest of the report."""
    per = (
        spans.assign(dur=spans["end_ns"] - spans["start_ns"])
        .groupby(["host", "pid"], sort=True)
        .agg(rank=("rank", "min"), dur=("dur", "sum"))
    )
    per = per.reset_index()
    ranked = per[per["rank"].notna()]
    if len(ranked):
        best = ranked.sort_values(["rank", "host", "pid"]).iloc[0]
        return str(best["host"]), int(best["pid"]), f"rank {int(best['rank'])}"
    best = per.sort_values(["dur", "host", "pid"], ascending=[False, True, True]).iloc[0]
    return str(best["host"]), int(best["pid"]), f"process {int(best['pid'])} on {best['host']}"


def _phase_bands(
    run: Run, axis: TimeAxis, budget: Budget, out: FigureSet, yref: str
) -> list[dict[str, Any]]:
    """The phases of one process (the lowest rank) as coloured bands behind the lines.

    Each phase is one step-shaped line (``hv``: 100 from a span's start to its end, 0 until the
    next) filled to zero: two points per span and one SVG path per phase, which draws several
    times faster than one polygon per span at thousands of spans.
    """
    spans, _ = valid_spans(run)
    if spans.empty:
        out.notes.append("No phase spans were recorded: the timeline has no phase bands.")
        return []
    host, pid, who = _band_process(spans)
    mine = spans[((spans["host"] == host) & (spans["pid"] == pid)).to_numpy(bool)]
    # each instant in the phase of its innermost span: a phase nested in another (TRL's
    # generation inside its training step) shows as itself, not under the one enclosing it
    seg_s, seg_e, owner = owned_segments(mine)
    phase_of = mine["phase"].to_numpy(object)[owner]
    named = ~mine["is_step"].to_numpy(bool)[owner]
    seg_s, seg_e, phase_of = seg_s[named], seg_e[named], phase_of[named]
    if len(seg_s) == 0:
        return []
    if len(seg_s) > budget.max_bands:
        longest = np.sort(np.argsort(-(seg_e - seg_s), kind="stable")[: budget.max_bands])
        out.notes.append(
            f"Phase bands: the {budget.max_bands:,} longest of {len(seg_s):,} stretches are drawn."
        )
        seg_s, seg_e, phase_of = seg_s[longest], seg_e[longest], phase_of[longest]
    out.notes.append(f"Phase bands show the phases of {who} (each instant in its innermost).")
    traces = []
    dec = axis.decimals
    extra = iter(_EXTRA_COLORS)
    for phase in pd.unique(phase_of):
        color = PHASE_COLORS.get(str(phase)) or next(extra, "#aaaaaa")
        rows = phase_of == phase
        start, end = union(seg_s[rows], seg_e[rows])
        x = axis.of(np.column_stack([start, end]).ravel())
        y = np.tile([100.0, 0.0], len(start))
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "x": _rounded(x, dec),
                "y": _rounded(y, 0),
                "fill": "tozeroy",
                "fillcolor": _alpha(color, 0.22),
                "line": {"width": 0, "shape": "hv"},
                "name": str(phase),
                "legendgroup": "phases",
                "legendgrouptitle": {"text": "phases"},
                "yaxis": yref,
                "hoverinfo": "name",
            }
        )
    order = {p: i for i, p in enumerate(PHASE_COLORS)}
    traces.sort(key=lambda tr: order.get(tr["name"], len(order)))
    return traces


def _host_cpu(
    run: Run,
    axis: TimeAxis,
    budget: Budget,
    yref: str,
    dec: int,
    windows: list[tuple[float, float]],
) -> list[dict]:
    host = run.host
    t = axis.of(pd.to_numeric(host["t_ns"]).to_numpy(np.int64))
    cpu = _col(host, "cpu_pct")
    names = host["host"].astype(str).to_numpy()
    hosts = sorted(set(names))
    traces = []
    if len(hosts) <= budget.max_host_lines:
        for name in hosts:
            mask = names == name
            order = np.argsort(t[mask], kind="stable")
            tt, yy = t[mask][order], cpu[mask][order]
            keep = _with_windows(tt, yy, keep_shape(tt, yy, budget.line_points), windows,
                                 budget.window_points)  # fmt: skip
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "x": _rounded(tt[keep], dec),
                    "y": _rounded(yy[keep], 1),
                    "name": f"CPU {name}",
                    "yaxis": yref,
                    "line": {"width": 1, "color": "#555555"},
                    "legendgroup": "cpu",
                    "hovertemplate": f"{name}: %{{y:.0f}}%<extra></extra>",
                }
            )
        return traces
    b = bin_stats(t, cpu, 0.0, max(axis.end, 1e-9), budget.bins)
    for stat, dash in (("mean", "solid"), ("max", "dot")):
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "x": _rounded(b.centers, dec),
                "y": _rounded(getattr(b, stat), 1),
                "name": f"host CPU {stat}",
                "yaxis": yref,
                "line": {"width": 1, "color": "#555555", "dash": dash},
            }
        )
    return traces


# ------------------------------------------------------------------------------------------
# Heatmap and summary charts


HEATMAP_PX = {"base": 90, "row": 14, "min": 220, "max": 1000}
"""Heatmap height: ``base`` + ``row`` per GPU, within [``min``, ``max``] (report.js sizes a
one-node view with the same numbers)."""
HEATMAP_LABELLED_ROWS = 64
"""Above this many rows the per-GPU tick labels would overlap: node names (or none) instead."""
NODE_TICK_PX = 11
"""Least height per node for its name on the heatmap's axis."""
NODE_PICKER_MIN_NODES = 64
"""From this many nodes (or above `HEATMAP_LABELLED_ROWS` GPUs on several nodes) the report
has a node picker that narrows the heatmap and the GPU picker to one node."""


def heatmap_height(rows: int) -> int:
    """The heatmap's height in px for ``rows`` GPUs."""
    px = HEATMAP_PX
    return int(min(px["max"], max(px["min"], px["base"] + px["row"] * rows)))


def node_groups(series: _GpuSeries) -> dict[str, Any] | None:
    """How a multi-node run's GPUs group, for the heatmap and the pickers: ``names`` (node
    order), ``bounds`` (node k's GPUs are ``bounds[k]:bounds[k + 1]``), ``picker`` (draw a node
    picker), ``all`` (an "all nodes" view fits the heatmap: at most one GPU per pixel) and the
    heatmap's ``height`` numbers. None for a run on one node: its report stays as it was."""
    names: list[str] = []
    bounds: list[int] = []
    for i, host in enumerate(series.hosts):  # a node's GPUs are contiguous (sorted by node)
        if not names or host != names[-1]:
            names.append(host)
            bounds.append(i)
    if len(names) < 2:
        return None
    rows = len(series)
    return {
        "names": names,
        "bounds": [*bounds, rows],
        "picker": len(names) >= NODE_PICKER_MIN_NODES or rows > HEATMAP_LABELLED_ROWS,
        "all": rows <= HEATMAP_PX["max"],
        "height": HEATMAP_PX,
    }


def _node_axis(labels: list[str], nodes: dict[str, Any], height: int) -> dict[str, Any]:
    """The heatmap's y-axis ticks on several nodes: every ``node/gpuN`` while they fit, else
    each node's name at the middle of its rows, else none."""
    names, bounds = nodes["names"], nodes["bounds"]
    if len(labels) <= HEATMAP_LABELLED_ROWS:
        return {"showticklabels": True, "automargin": True}
    if (height - HEATMAP_PX["base"]) / len(names) < NODE_TICK_PX:
        return {"showticklabels": False}
    return {
        "showticklabels": True,
        "automargin": True,
        "tickmode": "array",
        "tickvals": [(bounds[k] + bounds[k + 1] - 1) / 2 for k in range(len(names))],
        "ticktext": names,
        "tickfont": {"size": 10},
    }


def node_lines(bounds: list[int], height: int) -> list[dict[str, Any]]:
    """A white rule across the heatmap between consecutive nodes' rows (a category axis
    places row k at k, so a boundary sits at the first row of the next node minus a half);
    thin where rows are a few pixels high, so that it hides no GPU's row."""
    row_px = (height - HEATMAP_PX["base"]) / max(bounds[-1], 1)
    width = 2 if row_px >= 6 else 1
    return [
        {
            "type": "line",
            "xref": "paper",
            "x0": 0,
            "x1": 1,
            "yref": "y",
            "y0": b - 0.5,
            "y1": b - 0.5,
            "line": {"color": "#ffffff", "width": width},
        }
        for b in bounds[1:-1]
    ]


def _heatmap(
    run: Run, series: _GpuSeries, axis: TimeAxis, budget: Budget, out: FigureSet
) -> dict[str, Any]:
    n = len(series)
    per_gpu = int(np.median(np.diff(series.bounds))) if n else 0
    # never more columns than samples per GPU: empty cells would read as stripes of "no data"
    bins = int(max(1, min(budget.bins, budget.heatmap_cells // max(n, 1), per_gpu)))
    end = max(axis.end, float(series.t.max()) if len(series.t) else 0.0, 1e-9)
    b = bin_stats(series.t, series.values(run, "util_gpu_pct"), 0.0, end, bins, group=series.code)
    z = np.round(b.mean, 0)
    out.points += z.size
    rows = [[None if v != v else int(v) for v in row] for row in z.tolist()]
    height = heatmap_height(n)
    labels = out.rows
    yaxis: dict[str, Any] = {
        "autorange": "reversed",
        "type": "category",
        "fixedrange": True,
        "showticklabels": n <= HEATMAP_LABELLED_ROWS,
        "title": {"text": f"{n} GPUs"},
    }
    layout: dict[str, Any] = {}
    if out.nodes is not None:
        yaxis.update(_node_axis(labels, out.nodes, height))
        yaxis["title"] = {"text": f"{n} GPUs on {len(out.nodes['names'])} nodes"}
        layout["shapes"] = node_lines(out.nodes["bounds"], height)
        if not out.nodes["all"]:
            out.notes.append(
                f"{n} GPUs are more heatmap rows than pixels: the heatmap shows one node at a "
                "time (pick it with the node picker)."
            )
    return {
        "data": [
            {
                "type": "heatmap",
                "z": rows,
                "x": _rounded(b.centers, axis.decimals),
                "y": labels,
                "zmin": 0,
                "zmax": 100,
                "colorscale": "Viridis",
                "colorbar": {"title": {"text": "util %"}, "thickness": 12},
                "hovertemplate": "%{y} at %{x}: %{z}%<extra></extra>",
            }
        ],
        "layout": {
            "xaxis": {"title": {"text": axis.title}, "range": [0, end]},
            "yaxis": yaxis,
            "height": height,
            "margin": {"l": 80, "r": 20, "t": 30, "b": 45},
            "title": {
                "text": f"mean utilization per {b_width(end, bins, axis.unit)} bin",
                "font": {"size": 12},
            },
            "template": "plotly_white",
            **layout,
        },
    }


def _phase_steps(table: pd.DataFrame | None, max_bars: int = 200) -> dict[str, Any] | None:
    """Stacked wall seconds per phase for each step (from `phase_breakdown` by phase, step):
    bars up to ``max_bars`` steps, stacked areas above."""
    if table is None or table.empty or "step" not in table:
        return None
    table = table[np.isfinite(pd.to_numeric(table["step"], errors="coerce"))]
    table = table[table["wall_s"].notna()]
    if table.empty:
        return None
    traces = []
    extra = iter(_EXTRA_COLORS)
    # a bar per step reads best, but every bar is an SVG element: past a few hundred steps
    # (a day-long run has ~1500) one stacked area per phase draws in a fraction of the time
    as_area = table["step"].nunique() > max_bars
    for phase in dict.fromkeys(table["phase"]):
        part = table[table["phase"] == phase].sort_values("step")
        label = fmt.phase_label(phase)
        color = PHASE_COLORS.get(str(phase)) or next(extra, "#aaaaaa")
        trace = {
            "name": str(label),
            "x": part["step"].astype(int).tolist(),
            "y": _rounded(part["wall_s"].to_numpy(), 2),
            "hovertemplate": f"{label}<br>step %{{x}}: %{{y:.2f}} s<extra></extra>",
        }
        if as_area:
            trace.update(type="scatter", mode="lines", stackgroup="phases",
                         line={"width": 0.5, "color": color})  # fmt: skip
        else:
            trace.update(type="bar", marker={"color": color})
        traces.append(trace)
    return {
        "data": traces,
        "layout": {
            "barmode": "stack",
            "bargap": 0.1,
            "height": 380,
            "template": "plotly_white",
            "xaxis": {"title": {"text": "step"}},
            "yaxis": {"title": {"text": "wall seconds (mean over GPU owners)"}},
            "margin": {"l": 60, "r": 20, "t": 20, "b": 45},
            "legend": {"font": {"size": 10}, "traceorder": "reversed"},
        },
    }


def _idle_by_cause(summary: dict[str, Any]) -> dict[str, Any] | None:
    causes = {
        k: float(v)
        for k, v in (summary.get("idle_gpu_s_by_cause") or {}).items()
        if v is not None and float(v) > 0
    }
    if not causes:
        return None
    ranked = sorted(causes.items(), key=lambda kv: kv[1])
    big = max(causes.values()) >= 3600
    scale, unit = (3600.0, "GPU-h") if big else (1.0, "GPU-s")
    labels = ["idle, no finding" if k == "other_idle" else k for k, _ in ranked]
    return {
        "data": [
            {
                "type": "bar",
                "orientation": "h",
                "y": labels,
                "x": [round(v / scale, 3) for _, v in ranked],
                "marker": {
                    "color": ["#bbbbbb" if k == "other_idle" else "#d62728" for k, _ in ranked]
                },
                "hovertemplate": f"%{{y}}: %{{x:.2f}} {unit}<extra></extra>",
            }
        ],
        "layout": {
            "height": 120 + 28 * len(ranked),
            "template": "plotly_white",
            "xaxis": {"title": {"text": f"idle {unit}"}},
            "margin": {"l": 170, "r": 20, "t": 20, "b": 45},
        },
    }


def _step_hist(run: Run, summary: dict[str, Any]) -> dict[str, Any] | None:
    steps = step_times(run)
    durations = pd.to_numeric(steps["duration_s"], errors="coerce").to_numpy(np.float64)
    durations = durations[np.isfinite(durations)]
    if len(durations) == 0:
        return None
    lo, hi = float(durations.min()), float(durations.max())
    counts, edges = np.histogram(
        durations,
        bins=int(np.clip(np.sqrt(len(durations)), 5, 60)),
        range=(lo, hi if hi > lo else lo + 1.0),
    )
    centers = (edges[:-1] + edges[1:]) / 2
    shapes, notes = [], []
    for key, label in (("step_time_p50_s", "p50"), ("step_time_p95_s", "p95")):
        value = summary.get(key)
        if value is not None:
            shapes.append(
                {
                    "type": "line",
                    "x0": value,
                    "x1": value,
                    "yref": "paper",
                    "y0": 0,
                    "y1": 1,
                    "line": {"dash": "dash", "color": "#444", "width": 1},
                }
            )
            notes.append(
                {
                    "x": value,
                    "y": 1,
                    "yref": "paper",
                    "text": f" {label}",
                    "showarrow": False,
                    "yanchor": "top",
                    "xanchor": "left",
                }
            )
    return {
        "data": [
            {
                "type": "bar",
                "x": _rounded(centers, 3),
                "y": counts.tolist(),
                "width": float(edges[1] - edges[0]),
                "marker": {"color": "#1f77b4"},
                "hovertemplate": "%{x:.2f} s: %{y} step spans<extra></extra>",
            }
        ],
        "layout": {
            "height": 300,
            "template": "plotly_white",
            "shapes": shapes,
            "annotations": notes,
            "xaxis": {"title": {"text": "step time (s)"}},
            "yaxis": {"title": {"text": "step spans"}},
            "margin": {"l": 60, "r": 20, "t": 25, "b": 45},
            "bargap": 0.05,
        },
    }
