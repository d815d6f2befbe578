"""One time axis for a run recorded on several nodes: clock offsets, estimated and applied.

Each node stamps its rows with its own wall clock; NTP keeps nodes within milliseconds at best,
and a step's phases last tens of milliseconds, so a run's nodes are put on the reference node's
clock when the run is read. An offset comes from one of two places:

- stored with the node's file (metadata key ``"clock"``) by whoever measured it, e.g. round
  trips to the head through Ray: ``{"offset_ns", "error_ns", "method", "reference"}``;
- estimated here from collectives that every rank takes part in (torch.distributed calls
  recorded as ``collective`` spans). A blocking collective cannot end on any rank before every
  rank has started it, so for ranks ``a`` and ``b`` and each call ``i`` (in clock readings)
  ``start_b[i] - end_a[i] ≤ s_b - s_a ≤ end_b[i] - start_a[i]``, ``s`` being each clock's lead.
  Intersecting these intervals over the calls bounds the offset; the estimate is the middle
  and the error half the width. GPU-side times (CUDA events) are used when recorded: on a GPU
  the CPU-side call returns once the work is queued, which would void the bound.

Offsets are in ns, to be *added* to a node's readings to get the reference node's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

TIME_COLUMNS: dict[str, tuple[str, ...]] = {
    "gpu": ("t_ns",),
    "host": ("t_ns",),
    "procs": ("t_ns",),
    "gpu_procs": ("t_ns",),
    "spans": ("start_ns", "end_ns", "gpu_start_ns", "gpu_end_ns"),
    "events": ("t_ns",),
    "logs": ("t_ns",),
    "threads": ("t_ns",),
    "stack_samples": ("t_ns",),
}
"""The wall-clock columns of each table (shifted together when a node's offset is applied)."""

MIN_CALLS = 3
"""Collectives a pair of ranks must share before their offset is estimated."""


@dataclass(frozen=True)
class ClockOffset:
    """How a node's clock relates to the reference node's.

    ``offset_ns`` is added to the node's times; ``error_ns`` bounds how wrong that can be
    (half the tightest round trip, or half the width of the collectives' interval); ``method``
    is ``"stored:<how>"``, ``"collectives"`` or ``"reference"``; ``calls`` counts the
    collectives used.
    """

    node: str
    offset_ns: int
    error_ns: int | None
    method: str
    reference: str
    calls: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def stored_offset(node: str, document: Any) -> ClockOffset | None:
    """A `ClockOffset` from a file's ``"clock"`` metadata, or None when absent or malformed."""
    if not isinstance(document, dict):
        return None
    offset, error = document.get("offset_ns"), document.get("error_ns")
    if not isinstance(offset, int) or isinstance(offset, bool):
        return None
    if not isinstance(error, int) or isinstance(error, bool):
        error = None
    return ClockOffset(
        node=str(document.get("node") or node),
        offset_ns=offset,
        error_ns=error,
        method=f"stored:{document.get('method') or 'unknown'}",
        reference=str(document.get("reference") or ""),
    )


def shift(frames: dict[str, pd.DataFrame], offset_ns: int) -> None:
    """Add ``offset_ns`` to every wall-clock column of ``frames`` (in place)."""
    if not offset_ns:
        return
    for table, frame in frames.items():
        for column in TIME_COLUMNS.get(table, ()):
            if column in frame and len(frame):
                frame[column] = frame[column] + offset_ns


def shift_node(tables: dict[str, pd.DataFrame], node: str, offset_ns: int) -> None:
    """Add ``offset_ns`` to the wall-clock columns of ``node``'s rows of every table."""
    if not offset_ns:
        return
    for table, frame in tables.items():
        if "host" not in frame or not len(frame):
            continue
        mine = (frame["host"] == node).to_numpy()
        if not mine.any():
            continue
        for column in TIME_COLUMNS.get(table, ()):
            if column in frame:
                values = frame[column].to_numpy()
                if values.dtype.kind == "i":
                    frame[column] = np.where(mine, values + offset_ns, values)
                else:
                    frame[column] = np.where(mine, values + float(offset_ns), values)


class _Calls(NamedTuple):
    """One rank's calls in call order: start and end (ns) and the op's code."""

    start: np.ndarray
    end: np.ndarray
    op: np.ndarray


def _rank_calls(spans: pd.DataFrame) -> dict[tuple[str, int], _Calls]:
    """Each rank's blocking whole-group collectives in call order: ``(host, rank)`` → their
    ``start``/``end`` (GPU-side times where every call has them) and ``op`` (the call's name,
    coded the same for every rank)."""
    if spans.empty or "phase" not in spans:
        return {}
    calls = spans[(spans["phase"] == "collective") & spans["rank"].notna()]
    if calls.empty:
        return {}
    attrs = [a if isinstance(a, dict) else {} for a in calls["attrs"]]
    is_async = np.array([bool(a.get("async")) for a in attrs], dtype=bool)
    size = pd.to_numeric(pd.Series([a.get("group_size") for a in attrs], dtype=object),
                         errors="coerce")  # fmt: skip
    world = size.max()
    keep = ~is_async
    if pd.notna(world):
        keep &= (size == world).to_numpy()
    calls = calls[keep]
    ops = pd.factorize(calls["name"].to_numpy(object))[0]
    start_ns, end_ns = calls["start_ns"].to_numpy(np.float64), calls["end_ns"].to_numpy(np.float64)
    gpu_start = calls["gpu_start_ns"].to_numpy(np.float64)
    gpu_end = calls["gpu_end_ns"].to_numpy(np.float64)
    out = {}
    for (host, rank), rows in sorted(calls.groupby(["host", "rank"]).indices.items()):
        rows = rows[np.argsort(start_ns[rows], kind="stable")]
        on_gpu = not (np.isnan(gpu_start[rows]).any() or np.isnan(gpu_end[rows]).any())
        start = gpu_start[rows] if on_gpu else start_ns[rows]
        end = gpu_end[rows] if on_gpu else end_ns[rows]
        out[(str(host), int(rank))] = _Calls(start, end, ops[rows])
    return out


def _pair_bounds(a: _Calls, b: _Calls) -> tuple[float, float, int] | None:
    """Bounds on ``s_b - s_a`` (ns) from the calls both ranks made, matched in order; None
    when they share too few calls or their op sequences disagree."""
    n = min(len(a.start), len(b.start))
    if n < MIN_CALLS:
        return None
    if (a.op[:n] != b.op[:n]).mean() > 0.05:
        return None  # not the same sequence of calls: matching them in order is meaningless
    low = float(np.max(b.start[:n] - a.end[:n]))
    high = float(np.min(b.end[:n] - a.start[:n]))
    return low, high, n


def estimate_from_collectives(
    spans: pd.DataFrame, reference: str, nodes: list[str]
) -> dict[str, ClockOffset]:
    """Offsets of ``nodes`` against ``reference`` from their ranks' collectives.

    For each node, every rank on it is paired with every rank on the reference node; the
    pairs' intervals are intersected (they bound the same offset). When the intersection is
    empty (clocks that drifted during the run, or calls that return before the group meets)
    the middles' median is used and the error is the spread. Nodes without usable calls are
    left out.
    """
    by_rank = _rank_calls(spans)
    ref_ranks = [v for (host, _), v in by_rank.items() if host == reference]
    out: dict[str, ClockOffset] = {}
    if not ref_ranks:
        return out
    for node in nodes:
        if node == reference:
            continue
        bounds = []
        for (host, _), calls in by_rank.items():
            if host != node:
                continue
            for ref in ref_ranks:
                pair = _pair_bounds(ref, calls)
                if pair is not None:
                    bounds.append(pair)
        if not bounds:
            continue
        low = max(b[0] for b in bounds)
        high = min(b[1] for b in bounds)
        calls = max(b[2] for b in bounds)
        if low <= high:
            lead, error = (low + high) / 2, (high - low) / 2
        else:
            middles = np.array([(b[0] + b[1]) / 2 for b in bounds])
            lead = float(np.median(middles))
            error = float(max(abs(low - high) / 2, np.ptp(middles) / 2))
        # the node's clock leads the reference's by `lead`: subtract it from its readings
        out[node] = ClockOffset(node, -round(lead), round(error), "collectives", reference,
                                calls)  # fmt: skip
    return out
