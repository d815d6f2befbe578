"""A run as a Chrome trace-event JSON file, for ui.perfetto.dev and chrome://tracing.

What goes where:

- one trace process (``pid``) per host, named after the host; one thread (``tid``) per
  recording thread, named ``rank 0 (pid 1234)``, ordered by rank;
- every valid span (end ≥ start) is a complete slice (``"ph": "X"``, ``ts``/``dur`` in µs)
  named after its canonical phase, on its thread's track. Slices of one track must nest; spans
  that overlap without nesting (async phases, clock trouble) go to an extra track of the same
  thread, ``… overlap 1``, so no span is dropped or cut;
- GPU metrics are counter tracks (``"ph": "C"``) of the host: per GPU, utilization /
  SM activity / tensor activity (%), memory used (bytes), PCIe and NVLink (bytes/s), power (W);
  the host's CPU (%) too. A missing reading is left out of its event (the viewer then holds the
  previous value for that series), never written as 0;
- step, mark and other point events are instant events (``"ph": "i"``) on the process's track
  (steps, marks) or the host (exit, NVML faults);
- findings are slices over their evidence intervals on a ``gpuprof findings`` process, one
  track per stall kind (intervals of one kind merged), or an instant at the run start when a
  finding has no interval.

Times are µs since the run's first record (``otherData.start_ns`` holds that instant in ns
since the epoch), written with ns precision. Big runs stay usable: when the counters would
exceed ``max_counter_events``, each series is averaged over buckets of consecutive samples
(averaging keeps GPU-time integrals; plain decimation would alias periodic phases) and
``otherData.counter_downsample`` says by how much.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpuprof import __version__
from gpuprof.intervals import union
from gpuprof.model import Run
from gpuprof.reports.fmt import json_safe
from gpuprof.reports.progress import progress

MAX_COUNTER_EVENTS = 1_000_000
"""Default cap on counter events (~80 bytes each in the JSON, ~8 MB gzipped at the cap)."""

GPU_COUNTERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("utilization %", ("util_gpu_pct", "sm_active_pct", "tensor_active_pct")),
    ("memory used bytes", ("mem_used_bytes",)),
    ("PCIe bytes/s", ("pcie_tx_bytes_s", "pcie_rx_bytes_s")),
    ("NVLink bytes/s", ("nvlink_tx_bytes_s", "nvlink_rx_bytes_s")),
    ("power W", ("power_w",)),
)
"""Counter track name (after ``GPU <index>``) → the `GpuSample` columns it plots."""
HOST_COUNTERS: tuple[tuple[str, tuple[str, ...]], ...] = (("host CPU %", ("cpu_pct",)),)

FINDINGS_PROCESS = "gpuprof findings"
HOST_EVENTS_TID = 0
"""The thread of a host's process that carries host-wide instants (exit, NVML faults)."""
_CHUNK = 20_000


Record = tuple[float, float, str]
"""A timed event ready to write: (ts µs, -dur µs, its JSON text); sorting these orders events
by time and, at one instant, a longer slice before the slices it contains."""


@dataclass
class Trace:
    """The trace: metadata events, timed events as sorted `Record`s, event counts by kind and
    what the export did (``info``, also stored in the file's ``otherData``)."""

    metadata: list[dict[str, Any]]
    records: list[Record]
    counts: dict[str, int] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every event as a dict, in file order (parses the records: for tests and tools)."""
        return self.metadata + [json.loads(text) for _, _, text in self.records]


def build_trace(
    run: Run,
    diagnosis: Any | None = None,
    *,
    max_counter_events: int | None = MAX_COUNTER_EVENTS,
) -> Trace:
    """All trace events of ``run`` sorted by time (metadata first), with the findings of
    ``diagnosis`` (a `gpuprof.analyzers.diagnose.Diagnosis`) when given.

    ``max_counter_events`` None or 0: every sample becomes a counter event.
    """
    t0 = _origin_ns(run)
    hosts = _hosts(run)
    host_pid = {h: i + 1 for i, h in enumerate(hosts)}
    meta: list[dict[str, Any]] = []
    timed: list[dict[str, Any]] = []
    for host, pid in host_pid.items():
        meta.append(_meta(pid, None, "process_name", {"name": host}))
        meta.append(_meta(pid, None, "process_sort_index", {"sort_index": pid}))
        meta.append(_meta(pid, HOST_EVENTS_TID, "thread_name", {"name": "host events"}))

    tracks = _SpanTracks(host_pid)
    span_slices, dropped = _span_slices(run, t0, tracks)
    timed.extend(span_slices)
    timed.extend(_instants(run, t0, tracks))
    meta.extend(tracks.metadata())

    factor = _downsample_factor(run, max_counter_events)
    counters = list(_counters(run.gpu, t0, host_pid, factor, per_gpu=True))
    counters.extend(_counters(run.host, t0, host_pid, factor, per_gpu=False))

    findings_pid = len(hosts) + 1
    if diagnosis is not None and diagnosis.findings:
        meta.append(_meta(findings_pid, None, "process_name", {"name": FINDINGS_PROCESS}))
        meta.append(_meta(findings_pid, None, "process_sort_index", {"sort_index": -1}))
        timed.extend(_finding_events(diagnosis.findings, t0, findings_pid, meta))

    records = [(e["ts"], -e.get("dur", 0.0), _dumps(e)) for e in timed]
    records.extend(counters)
    records.sort()
    counts = {
        "slices": sum(1 for e in timed if e["ph"] == "X"),
        "counter events": len(counters),
        "instant events": sum(1 for e in timed if e["ph"] == "i"),
        "metadata": len(meta),
    }
    info = {
        "run_id": run.meta.run_id,
        "start_ns": t0,
        "gpuprof_version": __version__,
        "spans_dropped": dropped,
        "counter_downsample": factor,
        "max_counter_events": max_counter_events or None,
        "notes": _notes(dropped, factor),
    }
    return Trace(meta, records, counts, info)


def _dumps(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"), allow_nan=False)


def write_trace(trace: Trace, path: Path) -> None:
    """Write the trace JSON to ``path`` (gzip when it ends in ``.gz``), chunk by chunk."""
    # level 6: ~6% larger than gzip's default level 9 in a quarter of its time
    opener = partial(gzip.open, compresslevel=6) if path.name.endswith(".gz") else open
    other = json.dumps(json_safe(trace.info))
    head = '{"displayTimeUnit": "ms", "otherData": ' + other + ', "traceEvents": ['
    texts = [_dumps(e) for e in trace.metadata] + [text for _, _, text in trace.records]
    chunks = range(0, len(texts), _CHUNK)
    with (
        opener(path, "wt", encoding="utf-8") as out,
        progress("writing trace", len(chunks)) as advance,
    ):
        out.write(head)
        for n, i in enumerate(chunks):
            out.write(("," if n else "") + ",".join(texts[i : i + _CHUNK]))
            advance()
        out.write("]}\n")


def _notes(dropped: int, factor: int) -> list[str]:
    notes = []
    if dropped:
        notes.append(f"{dropped} spans ending before they start were left out")
    if factor > 1:
        notes.append(f"GPU and host counters averaged over {factor} consecutive samples")
    return notes


def _origin_ns(run: Run) -> int:
    """The run's first instant (ns since the epoch): start of the run or first record."""
    candidates = [run.meta.start_ns] if run.meta.start_ns is not None else []
    for frame, column in ((run.gpu, "t_ns"), (run.host, "t_ns"), (run.spans, "start_ns"),
                          (run.events, "t_ns")):  # fmt: skip
        if len(frame):
            value = pd.to_numeric(frame[column], errors="coerce").min()
            if pd.notna(value):
                candidates.append(int(value))
    return min(candidates) if candidates else 0


def _us(t_ns: Any, t0: int) -> float:
    """ns since the epoch → µs since the trace origin (exact to the ns in the JSON text)."""
    return (int(t_ns) - t0) / 1000


def _hosts(run: Run) -> list[str]:
    hosts = set(run.meta.hosts)
    for frame in (run.gpu, run.host, run.spans, run.events):
        if len(frame):
            hosts.update(frame["host"].dropna().astype(str).unique().tolist())
    return sorted(hosts) or ["localhost"]


def _meta(pid: int, tid: int | None, name: str, args: dict[str, Any]) -> dict[str, Any]:
    # ts and tid on process metadata too: some importers read every event's ts and tid
    tid = HOST_EVENTS_TID if tid is None else tid
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "ts": 0, "args": args}


class _SpanTracks:
    """Trace tids for (host, pid, tid, lane): one per recording thread and overlap lane."""

    def __init__(self, host_pid: dict[str, int]) -> None:
        self.host_pid = host_pid
        self.tids: dict[tuple[str, int, int, int], int] = {}
        self.rank: dict[tuple[str, int], int | None] = {}
        self.threads: dict[tuple[str, int], set[int]] = {}
        self.next_tid: dict[str, int] = {}

    def tid(self, host: str, pid: int, tid: int, lane: int, rank: int | None) -> int:
        key = (host, pid, tid, lane)
        if key not in self.tids:
            self.next_tid[host] = self.next_tid.get(host, 0) + 1
            self.tids[key] = self.next_tid[host]
            self.rank.setdefault((host, pid), rank)
            self.threads.setdefault((host, pid), set()).add(tid)
        return self.tids[key]

    def main_tid(self, host: str, pid: int, rank: int | None) -> int:
        """The track of a process's main thread (its own pid, else its first thread)."""
        threads = self.threads.get((host, pid))
        if not threads:
            return self.tid(host, pid, pid, 0, rank)
        tid = pid if pid in threads else min(threads)
        return self.tids[(host, pid, tid, 0)]

    def metadata(self) -> list[dict[str, Any]]:
        out = []
        for (host, pid, tid, lane), trace_tid in self.tids.items():
            rank = self.rank.get((host, pid))
            name = f"rank {rank} (pid {pid})" if rank is not None else f"pid {pid}"
            if len(self.threads[(host, pid)]) > 1:
                name += f" thread {tid}"
            if lane:
                name += f" overlap {lane}"
            order = (rank if rank is not None else 1_000_000) * 1000 + trace_tid
            pid_ = self.host_pid[host]
            out.append(_meta(pid_, trace_tid, "thread_name", {"name": name}))
            out.append(_meta(pid_, trace_tid, "thread_sort_index", {"sort_index": order}))
        return out


def _valid_span_mask(spans: pd.DataFrame) -> np.ndarray:
    """Spans with a host, a pid, and an end at or after their start (compared as int64 ns:
    float64 cannot tell apart instants < 256 ns apart at epoch magnitudes)."""
    start = pd.to_numeric(spans["start_ns"], errors="coerce")
    end = pd.to_numeric(spans["end_ns"], errors="coerce")
    pid = pd.to_numeric(spans["pid"], errors="coerce")
    ok = (start.notna() & end.notna() & pid.notna() & spans["host"].notna()).to_numpy(copy=True)
    ok[ok] = end[ok].astype(np.int64).to_numpy() >= start[ok].astype(np.int64).to_numpy()
    return ok


def _span_slices(run: Run, t0: int, tracks: _SpanTracks) -> tuple[list[dict[str, Any]], int]:
    """Complete slices of every valid span; returns them and the number of invalid spans."""
    spans = run.spans
    if spans.empty:
        return [], 0
    ok = _valid_span_mask(spans)
    kept = spans.loc[ok].copy()
    kept["start_ns"] = pd.to_numeric(kept["start_ns"]).astype(np.int64)
    kept["end_ns"] = pd.to_numeric(kept["end_ns"]).astype(np.int64)
    kept["pid"] = pd.to_numeric(kept["pid"]).astype(np.int64)
    kept["tid"] = pd.to_numeric(kept["tid"], errors="coerce").fillna(kept["pid"]).astype(np.int64)
    kept["dur_ns"] = kept["end_ns"] - kept["start_ns"]
    # parents before children: by start, then the longer first (the span_depths order)
    kept = kept.sort_values(["host", "pid", "tid", "start_ns", "dur_ns"],
                            ascending=[True, True, True, True, False], kind="stable")  # fmt: skip
    out = []
    groups = kept.groupby(["host", "pid", "tid"], sort=True).indices
    with progress("spans", len(kept)) as advance:
        for (host, pid, tid), index in groups.items():
            part = kept.iloc[index]
            rank = _int_or_none(part["rank"].iloc[0])
            lanes = _nesting_lanes(part["start_ns"].to_numpy(), part["end_ns"].to_numpy())
            host_pid = tracks.host_pid[str(host)]
            for row, lane in zip(part.itertuples(index=False), lanes):
                args = {"step": _int_or_none(row.step), "rank": _int_or_none(row.rank)}
                if row.name != row.phase:
                    args["name"] = row.name
                if row.attrs:
                    args.update({f"attr.{k}": v for k, v in row.attrs.items()})
                for key in ("gpu_start_ns", "gpu_end_ns"):
                    value = getattr(row, key)
                    if value is not None and not pd.isna(value):
                        args[key] = int(value)
                out.append(
                    {
                        "ph": "X",
                        "cat": "phase",
                        "name": str(row.phase),
                        "pid": host_pid,
                        "tid": tracks.tid(str(host), int(pid), int(tid), lane, rank),
                        "ts": _us(row.start_ns, t0),
                        "dur": int(row.dur_ns) / 1000,
                        "args": json_safe(args),
                    }
                )
            advance(len(index))
    return out, int((~ok).sum())


def _nesting_lanes(starts: np.ndarray, ends: np.ndarray) -> list[int]:
    """Lane of each span (sorted by start, longer first) so spans in a lane nest properly.

    Lane 0 takes every span that nests in what is open there; a span that would straddle an
    open span's end goes to the first lane where it nests, a new one if none.
    """
    stacks: list[list[int]] = []
    lanes = []
    for s, e in zip(starts.tolist(), ends.tolist()):
        for i, stack in enumerate(stacks):
            while stack and stack[-1] <= s:
                stack.pop()
            if not stack or e <= stack[-1]:
                stack.append(e)
                lanes.append(i)
                break
        else:
            stacks.append([e])
            lanes.append(len(stacks) - 1)
    return lanes


def _instants(run: Run, t0: int, tracks: _SpanTracks) -> Iterator[dict[str, Any]]:
    """Steps and marks on their process's track; other point events on the host."""
    events = run.events
    if events.empty:
        return
    for row in events.itertuples(index=False):
        if row.host is None or pd.isna(row.t_ns) or str(row.host) not in tracks.host_pid:
            continue
        host_pid = tracks.host_pid[str(row.host)]
        args = json_safe({"kind": row.kind, **(row.attrs or {})})
        if row.kind in ("step", "mark") and not pd.isna(row.pid):
            tid = tracks.main_tid(str(row.host), int(row.pid), _int_or_none(row.rank))
            name = f"step {row.name}" if row.kind == "step" else str(row.name)
            scope = "t"
        else:
            tid, name, scope = HOST_EVENTS_TID, f"{row.kind}: {row.name}", "p"
        yield {"ph": "i", "s": scope, "cat": str(row.kind), "name": name, "pid": host_pid,
               "tid": tid, "ts": _us(row.t_ns, t0), "args": args}  # fmt: skip


def _series_count(frame: pd.DataFrame, counters: tuple, by: list[str]) -> int:
    """How many counter events ``frame`` gives at full rate (one per sample and track)."""
    if frame.empty:
        return 0
    total = 0
    for _, columns in counters:
        present = [c for c in columns if c in frame]
        if present:
            total += int(frame[present].notna().any(axis=1).sum())
    return total


def _downsample_factor(run: Run, cap: int | None) -> int:
    full = _series_count(run.gpu, GPU_COUNTERS, ["host", "gpu"])
    full += _series_count(run.host, HOST_COUNTERS, ["host"])
    if not cap or full <= cap:
        return 1
    return math.ceil(full / cap)


def _counters(
    frame: pd.DataFrame, t0: int, host_pid: dict[str, int], factor: int, *, per_gpu: bool
) -> Iterator[Record]:
    """Counter events of the GPU (``per_gpu``) or host frame, averaged over ``factor``
    consecutive samples of each series when ``factor`` > 1."""
    if frame.empty:
        return
    counters = GPU_COUNTERS if per_gpu else HOST_COUNTERS
    keys = ["host", "gpu"] if per_gpu else ["host"]
    numeric = [c for _, cols in counters for c in cols if c in frame]
    with progress("counters", frame[keys].drop_duplicates().shape[0]) as advance:
        for key, part in frame.groupby(keys, sort=True):
            host = key[0] if isinstance(key, tuple) else key
            part = part.sort_values("t_ns", kind="stable")
            times = part["t_ns"].to_numpy(np.int64)
            values = part[numeric].apply(pd.to_numeric, errors="coerce").astype(float)
            if factor > 1:
                bucket = np.arange(len(part)) // factor
                times = times[::factor]  # each bucket's first sample
                values = values.groupby(bucket).mean()  # NaN-skipping: missing stays missing
            pid = host_pid[str(host)]
            # plain Python floats: indexing numpy arrays per element costs ~5x more
            data = {c: values[c].to_numpy(dtype=float).tolist() for c in numeric}
            ts = ((times - t0) / 1000).tolist()
            for label, cols in counters:
                cols = [c for c in cols if c in data]
                name = f"GPU {int(key[1])} {label}" if per_gpu else label
                yield from _counter_track(name, pid, ts, cols, [data[c] for c in cols])
            advance()


def _counter_track(
    name: str, pid: int, ts: list[float], cols: list[str], series: list[list[float]]
) -> list[Record]:
    """One counter track's events, written straight to JSON text (the bulk of a trace: a dict
    and json.dumps per event would cost several times more). A missing value (NaN) is left
    out; an event with nothing left is dropped."""
    head = f'{{"ph":"C","name":{json.dumps(name)},"pid":{pid},"ts":'
    keys = [json.dumps(c) for c in cols]
    isfinite = math.isfinite
    if len(cols) == 1:
        key = keys[0]
        return [(t, 0.0, f"{head}{t!r},\"args\":{{{key}:{v!r}}}}}")
                for t, v in zip(ts, series[0]) if isfinite(v)]  # fmt: skip
    out = []
    for t, *row in zip(ts, *series):
        args = ",".join(f"{k}:{v!r}" for k, v in zip(keys, row) if isfinite(v))
        if args:
            out.append((t, 0.0, f'{head}{t!r},"args":{{{args}}}}}'))
    return out


def _finding_events(
    findings: list[Any], t0: int, pid: int, meta: list[dict[str, Any]]
) -> Iterator[dict[str, Any]]:
    """Each finding on its own track: merged evidence intervals as slices, else an instant."""
    for tid, finding in enumerate(findings, 1):
        meta.append(_meta(pid, tid, "thread_name", {"name": finding.kind}))
        meta.append(_meta(pid, tid, "thread_sort_index", {"sort_index": tid}))
        args = json_safe(
            {
                "summary": finding.summary,
                "gpu_seconds_lost": round(float(finding.gpu_seconds_lost), 3),
                "share": round(float(finding.share), 5),
                "confidence": round(float(finding.confidence), 3),
            }
        )
        raw = (finding.evidence or {}).get("intervals") or []
        intervals = []
        for item in raw:
            try:
                s, e = int(item[0]), int(item[1])
            except (TypeError, ValueError, IndexError):
                continue
            if e >= s:
                intervals.append((max(s, t0), max(e, t0)))
        if not intervals:
            yield {"ph": "i", "s": "t", "cat": "finding", "name": finding.kind, "pid": pid,
                   "tid": tid, "ts": 0.0, "args": args}  # fmt: skip
            continue
        starts, ends = union(*np.array(intervals, dtype=np.int64).T)
        for s, e in zip(starts.tolist(), ends.tolist()):
            yield {"ph": "X", "cat": "finding", "name": finding.kind, "pid": pid, "tid": tid,
                   "ts": _us(s, t0), "dur": (e - s) / 1000, "args": args}  # fmt: skip


def _int_or_none(value: Any) -> int | None:
    try:
        return None if value is None or pd.isna(value) else int(value)
    except (TypeError, ValueError):
        return None
