"""Join GPU samples with the phase the process driving each GPU was in.

The analyzers that explain idle time all start from the same question: *while this GPU sample
was taken, what was the rank that uses the GPU doing?* This module answers it in three steps:

1. `gpu_owner` decides which span-recording process drives each GPU (NVML's process list,
   ``local_rank`` + ``CUDA_VISIBLE_DEVICES``, rank order, or a single controller).
2. `gpu_phase_samples` gives every GPU sample the innermost phase of its owner at that instant
   and the GPU-seconds the sample stands for.
3. `phase_breakdown` and `run_totals` aggregate those GPU-seconds by phase / step / GPU.

Conventions: a sample at ``t_ns`` stands for ``[t_ns, next sample of the same GPU)``; a span
covers ``[start_ns, end_ns)``. ``busy_frac`` is ``util_gpu_pct / 100`` — NVML's "a kernel was
running" share, *not* SM activity (a one-thread kernel reads 100 %); ``sm_busy_frac`` is the GPM
``sm_active_pct / 100`` where the GPU has GPM (Hopper and newer), and `run_totals` says which
measure a figure uses. Everything is vectorised: loops run over owners, GPUs and nesting depths,
never over samples or spans. Bad input (no samples, no spans, spans ending before they start,
NaN metrics, GPUs nobody owns) degrades to NaN / ``"(none)"`` rows, never an exception.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.analyzers.grouping import appearance_codes, first_rows
from gpuprof.model import Run, span_depths
from gpuprof.phases import CANONICAL_PHASES

NO_PHASE = "(none)"
"""Phase label of a sample no span of its owner covers (or of a GPU without an owner)."""

STEP_PHASE = "step"
"""The whole-step phase: it only labels a sample when no other span covers it."""

OWNER_HOW = ("nvml", "nvml_ancestor", "local_rank", "rank_order", "single_controller",
             "single_controller_remote", "none")  # fmt: skip
"""Values of ``gpu_owner(...)["how"]``, in rule priority order:

- ``nvml``: NVML listed the span-recording process on the GPU (``run.gpu_procs``);
- ``nvml_ancestor``: NVML listed a child of a span-recording process (e.g. an inference worker
  the trainer spawned); the nearest recording ancestor owns the GPU;
- ``local_rank``: the process's ``local_rank`` picks the GPU, through its ``CUDA_VISIBLE_DEVICES``;
- ``rank_order``: the host's ranked processes take its remaining GPUs in rank order;
- ``single_controller``: one process (or only processes without a rank) recorded spans on the
  GPU's host — a verl driver, a single-process TRL run — and drives all its GPUs;
- ``single_controller_remote``: no process on the GPU's host recorded spans and the run as a
  whole has a single controller (on another host), which drives the GPU;
- ``none``: no rule applied; the GPU's samples get phase ``"(none)"`` and rank NaN.
"""

_BY_KEYS = ("phase", "step", "host", "gpu", "rank", "pid")
_MAX_DEPTH_LEVELS = 32  # deeper levels are merged into one (see `_innermost`)
_MAX_ANCESTRY = 16  # levels of ppid followed for `nvml_ancestor`; process trees are shallow
_OWNER_COLUMNS = ["host", "gpu", "uuid", "owner_host", "pid", "rank", "how"]
_SAMPLE_COLUMNS = [
    "host", "gpu", "t_ns", "dt_s", "owner_host", "pid", "rank", "phase", "step", "in_span",
    "util_gpu_pct", "sm_active_pct", "busy_frac", "sm_busy_frac", "busy_gpu_s", "idle_gpu_s",
    "sm_busy_gpu_s", "mem_used_bytes", "mem_total_bytes", "pcie_bytes", "nvlink_bytes", "row",
]  # fmt: skip
_BREAKDOWN_COLUMNS = [
    "ranks", "gpus", "samples", "wall_s", "gpu_s", "busy_gpu_s", "idle_gpu_s", "unknown_gpu_s",
    "util_gpu_pct", "sm_active_pct", "mem_peak_bytes", "pcie_bytes", "nvlink_bytes", "share",
]  # fmt: skip


# --------------------------------------------------------------------------------------------
# Input clean-up


def _num(
    frame: pd.DataFrame, name: str, rows: np.ndarray | None = None, dtype: Any = np.float64
) -> np.ndarray:
    """A column as a numpy array of ``dtype`` (its ``rows`` when given); missing column or
    junk → NaN."""
    if name not in frame:
        return np.full(len(frame) if rows is None else len(rows), np.nan)
    column = frame[name]
    if rows is not None and column.dtype in (np.float64, np.int64):  # no coercion needed
        return column.to_numpy().take(rows).astype(dtype, copy=False)
    values = pd.to_numeric(column, errors="coerce").to_numpy(dtype=dtype, na_value=np.nan)
    return values if rows is None else values[rows]


def valid_spans(run: Run) -> tuple[pd.DataFrame, int]:
    """The run's usable spans and how many were dropped.

    Dropped: spans without host/pid/start/end and spans ending before they start (clock
    trouble or a bad import). The rest get ``depth`` recomputed from their nesting within
    their thread (hand-built or imported frames may carry none) and ``is_step``.
    """
    spans = run.spans
    if spans is None or len(spans) == 0:
        return _empty_spans(), 0
    start = _num(spans, "start_ns")
    end = _num(spans, "end_ns")
    ok = np.isfinite(start) & np.isfinite(end)
    # compare as int64: float64 can't tell apart instants < 256 ns apart at epoch magnitudes
    start_i = np.where(ok, start, 0).astype(np.int64)
    end_i = np.where(ok, end, 0).astype(np.int64)
    if spans["start_ns"].dtype == np.int64 and spans["end_ns"].dtype == np.int64:
        start_i, end_i = spans["start_ns"].to_numpy(), spans["end_ns"].to_numpy()
    ok &= end_i >= start_i
    ok &= spans["host"].notna().to_numpy() & np.isfinite(_num(spans, "pid"))
    dropped = int((~ok).sum())
    kept = spans.loc[ok]
    out = pd.DataFrame(
        {
            "host": kept["host"].astype(object).to_numpy(),
            "pid": _num(kept, "pid").astype(np.int64),
            "tid": _num(kept, "tid"),
            "rank": _num(kept, "rank"),
            "local_rank": _num(kept, "local_rank"),
            "phase": kept["phase"].astype(object).fillna("(unnamed)").to_numpy()
            if "phase" in kept
            else np.full(len(kept), "(unnamed)", dtype=object),
            "step": _num(kept, "step"),
            # int64 ns: float64 would lose sub-microsecond precision at epoch magnitudes
            "start_ns": pd.to_numeric(kept["start_ns"]).to_numpy(np.int64),
            "end_ns": pd.to_numeric(kept["end_ns"]).to_numpy(np.int64),
        }
    )
    out["depth"] = span_depths(out) if len(out) else np.zeros(0, dtype=np.int64)
    out["is_step"] = (out["phase"] == STEP_PHASE).to_numpy(bool)
    return out, dropped


def _empty_spans() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "host": pd.Series([], dtype=object),
            "pid": pd.Series([], dtype=np.int64),
            **{c: pd.Series([], dtype=np.float64) for c in ("tid", "rank", "local_rank")},
            "phase": pd.Series([], dtype=object),
            "step": pd.Series([], dtype=np.float64),
            "start_ns": pd.Series([], dtype=np.int64),
            "end_ns": pd.Series([], dtype=np.int64),
            "depth": pd.Series([], dtype=np.int64),
            "is_step": pd.Series([], dtype=bool),
        }
    )


def _gpu_inventory(run: Run) -> pd.DataFrame:
    """Every (host, gpu) seen in the samples or listed in the metadata, with its uuid."""
    rows = [
        (g.get("host"), g.get("index"), g.get("uuid"))
        for g in (run.meta.gpus or [])
        if isinstance(g, dict) and g.get("host") is not None and g.get("index") is not None
    ]
    meta = pd.DataFrame(rows, columns=["host", "gpu", "uuid"])
    gpu = run.gpu
    if gpu is not None and len(gpu):
        host, number = gpu["host"].astype(object), _num(gpu, "gpu")
        uuid = gpu["uuid"].astype(object) if "uuid" in gpu else None
        # only two samples per GPU can matter below: its first, and its first with a uuid
        first = _first_rows(host, number, uuid)
        seen = pd.DataFrame(
            {
                "host": pd.Series(host.to_numpy(object)[first], dtype=object),
                "gpu": number[first],
                "uuid": pd.Series(uuid.to_numpy(object)[first], dtype=object)
                if uuid is not None
                else None,
            }
        )
        meta = pd.concat([meta.astype({"gpu": np.float64}), seen], ignore_index=True)
    if meta.empty:
        return pd.DataFrame(
            {"host": pd.Series([], dtype=object), "gpu": pd.Series([], dtype=np.int64),
             "uuid": pd.Series([], dtype=object)}
        )  # fmt: skip
    meta["gpu"] = meta["gpu"].astype(np.int64)
    meta["host"] = meta["host"].astype(str)
    # the first non-null uuid per GPU (metadata first, then samples)
    inv = meta.groupby(["host", "gpu"], sort=True)["uuid"].first().reset_index()
    inv["uuid"] = inv["uuid"].astype(object)
    return inv


def _first_rows(host: pd.Series, number: np.ndarray, uuid: pd.Series | None) -> np.ndarray:
    """Positions (ascending) of the first sample of each (host, gpu) and of its first sample
    with a uuid: the first non-null uuid per GPU over these rows is the one over all samples."""
    host_code = pd.factorize(host)[0].astype(np.int64)
    ok = (host_code >= 0) & ~np.isnan(number)
    rows = np.flatnonzero(ok)
    gpu_code = pd.factorize(number[rows])[0].astype(np.int64)
    key = host_code[rows] * (int(gpu_code.max(initial=0)) + 1) + gpu_code
    first = first_rows(pd.factorize(key)[0])
    out = [rows[first]]
    if uuid is not None:
        has = uuid.to_numpy(object)[rows[first]]
        for i in np.flatnonzero(pd.isna(has)):  # a GPU whose first sample lacks a uuid
            same = rows[key == key[first[i]]]
            with_uuid = same[uuid.iloc[same].notna().to_numpy()]
            out.append(with_uuid[:1])
    return np.unique(np.concatenate(out))


# --------------------------------------------------------------------------------------------
# Owners


def _span_processes(
    run: Run, spans: pd.DataFrame, events: pd.DataFrame | None = None
) -> pd.DataFrame:
    """One row per span-recording process: host, pid, rank, local_rank, CUDA_VISIBLE_DEVICES,
    ppid and the seconds its spans cover (summed)."""
    if spans.empty:
        return pd.DataFrame(
            columns=["host", "pid", "rank", "local_rank", "cvd", "ppid", "span_s"]
        ).astype({"pid": np.int64})
    dur_s = (spans["end_ns"] - spans["start_ns"]) / 1e9
    procs = (
        spans.assign(span_s=dur_s)
        .groupby(["host", "pid"], sort=True)
        .agg(rank=("rank", "first"), local_rank=("local_rank", "first"), span_s=("span_s", "sum"))
        .reset_index()
    )
    info = events if events is not None else _process_events(run)
    procs = procs.merge(info, on=["host", "pid"], how="left", suffixes=("", "_ev"))
    for col in ("rank", "local_rank"):  # the spans' own value first, the process event's next
        fill = pd.to_numeric(procs[f"{col}_ev"], errors="coerce").astype(np.float64)
        procs[col] = procs[col].astype(np.float64).fillna(fill)
    return procs[["host", "pid", "rank", "local_rank", "cvd", "ppid", "span_s"]]


def _process_events(run: Run) -> pd.DataFrame:
    """The ``process``/``start`` events hooks write once per process: rank, local_rank,
    CUDA_VISIBLE_DEVICES (None = unset) and ppid."""
    cols = ["host", "pid", "rank_ev", "local_rank_ev", "cvd", "ppid"]
    ev = run.events
    if ev is None or ev.empty or "kind" not in ev:
        return pd.DataFrame(columns=cols).astype({"pid": np.int64})
    ev = ev[(ev["kind"] == "process") & ev["host"].notna() & ev["pid"].notna()]
    if ev.empty:
        return pd.DataFrame(columns=cols).astype({"pid": np.int64})
    attrs = [a if isinstance(a, dict) else {} for a in ev["attrs"]]  # one per process
    info = pd.DataFrame(
        {
            "host": ev["host"].astype(object).to_numpy(),
            "pid": _num(ev, "pid").astype(np.int64),
            "rank_ev": _num(ev, "rank"),
            "local_rank_ev": pd.to_numeric(
                pd.Series([a.get("local_rank") for a in attrs], dtype=object), errors="coerce"
            ).to_numpy(np.float64),
            "cvd": [a.get("cuda_visible_devices") for a in attrs],
            "ppid": pd.to_numeric(
                pd.Series([a.get("ppid") for a in attrs], dtype=object), errors="coerce"
            ).to_numpy(np.float64),
        }
    )
    return info.drop_duplicates(["host", "pid"], keep="last")


def _visible_devices(cvd: Any, host_gpus: pd.DataFrame) -> list[int] | None:
    """GPU indices a ``CUDA_VISIBLE_DEVICES`` value exposes, in order; None when unset.

    Follows CUDA: entries are indices or (prefixes of) ``GPU-`` uuids, and enumeration stops
    at the first entry that names no GPU (so ``"-1"`` or ``""`` hide every GPU).
    """
    if cvd is None or (isinstance(cvd, float) and np.isnan(cvd)):
        return None
    uuids = [(str(u), int(g)) for u, g in zip(host_gpus["uuid"], host_gpus["gpu"]) if u]
    out: list[int] = []
    for token in str(cvd).split(","):
        token = token.strip()
        if token.isdigit():
            out.append(int(token))
            continue
        matches = [g for u, g in uuids if token and u.startswith(token)]
        if len(matches) != 1:
            break
        out.append(matches[0])
    return out


def gpu_owner(run: Run) -> pd.DataFrame:
    """Which span-recording process drives each GPU.

    One row per (host, gpu) of the inventory (samples ∪ ``meta.gpus``), columns: ``host``,
    ``gpu``, ``uuid``, ``owner_host`` and ``pid`` of the owning process (it differs from
    ``host`` only for ``single_controller_remote``), its ``rank`` (NaN when it has none) and
    ``how`` — the rule that decided, tried in the priority order documented in `OWNER_HOW`.
    A GPU no rule resolves has NaN pid/rank and ``how == "none"``. One process may own
    several GPUs (a controller); a GPU has at most one owner. Rule ``local_rank`` assumes
    CUDA numbers the GPUs as NVML does (true for identical GPUs; with mixed models set
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` in the job, or rely on NVML's process list).
    """
    spans, _ = valid_spans(run)
    return _gpu_owner(run, spans)


def _gpu_owner(run: Run, spans: pd.DataFrame) -> pd.DataFrame:
    inv = _gpu_inventory(run)
    events = _process_events(run)
    procs = _span_processes(run, spans, events)
    owner: dict[tuple[str, int], tuple[str, int, str]] = {}  # (host, gpu) → (host, pid, how)
    recording = {(h, int(p)) for h, p in zip(procs["host"], procs["pid"])}
    claimed: set[tuple[str, int]] = set()  # processes that already own a GPU by rules a/b/c

    # (a) NVML saw the process (or a child of it) on the GPU with memory
    for key, (o_host, o_pid, how) in _nvml_owners(run, recording, events).items():
        owner[key] = (o_host, o_pid, how)
        claimed.add((o_host, o_pid))

    for host, host_gpus in inv.groupby("host", sort=True):
        gpus = [int(g) for g in host_gpus["gpu"]]
        hp = procs[procs["host"] == host]
        # (b) local_rank → the local_rank-th GPU the process can see
        for pid, local_rank, cvd in zip(hp["pid"], hp["local_rank"], hp["cvd"]):
            if (host, int(pid)) in claimed or not np.isfinite(local_rank):
                continue
            visible = _visible_devices(cvd, host_gpus)
            lr = int(local_rank)
            if visible is None:
                target = lr
            elif lr < len(visible):
                target = visible[lr]
            else:
                continue  # CUDA would have refused this device: no evidence of a GPU
            if target in gpus and (host, target) not in owner:
                owner[(host, target)] = (host, int(pid), "local_rank")
                claimed.add((host, int(pid)))
        # (c) remaining ranked processes take the remaining GPUs in rank order
        ranked = hp[hp["rank"].notna()].sort_values(["rank", "pid"])
        left_procs = [int(p) for p in ranked["pid"] if (host, int(p)) not in claimed]
        left_gpus = [g for g in gpus if (host, g) not in owner]
        for pid, gpu in zip(left_procs, left_gpus):
            owner[(host, gpu)] = (host, pid, "rank_order")
            claimed.add((host, pid))
        # (d) a single controller on this host drives every GPU still unowned
        controller = _controller(hp)
        if controller is not None:
            for gpu in gpus:
                owner.setdefault((host, gpu), (*controller, "single_controller"))

    # (d') GPUs on hosts where nothing recorded spans: the run's single controller, if any
    controller = _controller(procs)
    if controller is not None:
        span_hosts = set(procs["host"])
        for host, gpu in zip(inv["host"], inv["gpu"]):
            if host not in span_hosts:
                owner.setdefault((host, int(gpu)), (*controller, "single_controller_remote"))

    rank_of = {(h, int(p)): r for h, p, r in zip(procs["host"], procs["pid"], procs["rank"])}
    rows = []
    for host, gpu, uuid in zip(inv["host"], inv["gpu"], inv["uuid"]):
        o = owner.get((host, int(gpu)))
        if o is None:
            rows.append((host, int(gpu), uuid, None, np.nan, np.nan, "none"))
        else:
            rank = rank_of.get((o[0], o[1]), np.nan)
            rows.append((host, int(gpu), uuid, o[0], float(o[1]), float(rank), o[2]))
    out = pd.DataFrame(rows, columns=_OWNER_COLUMNS)
    return out.astype({"gpu": np.int64, "pid": np.float64, "rank": np.float64})


def _controller(procs: pd.DataFrame) -> tuple[str, int] | None:
    """(host, pid) of the single controller among span-recording processes: the only one, or —
    when none of them has a rank — the one whose spans cover the most time (a driver's spans
    span the step; helper processes record short ones)."""
    if procs.empty:
        return None
    if len(procs) == 1 or procs["rank"].isna().all():
        best = procs.sort_values(["span_s", "pid"], ascending=[False, True]).iloc[0]
        return str(best["host"]), int(best["pid"])
    return None


def _nvml_owners(
    run: Run, recording: set[tuple[str, int]], events: pd.DataFrame | None = None
) -> dict[tuple[str, int], tuple[str, int, str]]:
    """Rule (a): for each GPU, the span-recording process NVML saw on it.

    A pid NVML lists that recorded no spans is followed up its parents (``run.procs`` and the
    ``process`` events give ppid) to the nearest recording ancestor. Several candidates on one
    GPU — typically every rank leaving a small context on GPU 0 — are ranked by direct match,
    then peak device memory, then how often NVML listed them.
    """
    gp = run.gpu_procs
    if gp is None or gp.empty or not recording:
        return {}
    host_code, hosts = pd.factorize(gp["host"].astype(object))
    gpu, pid, mem = _num(gp, "gpu"), _num(gp, "pid"), _num(gp, "gpu_mem_bytes")
    # "seen with memory": a listed pid holding 0 bytes has no context worth owning the GPU;
    # NaN means NVML could not tell (containers), which still proves a context exists
    rows = np.flatnonzero((host_code >= 0) & ~np.isnan(gpu) & ~np.isnan(pid) & ~(mem <= 0))
    if len(rows) == 0:
        return {}
    # one candidate per (host, gpu, pid), in order of appearance: peak memory, times listed
    group = appearance_codes([host_code[rows], gpu[rows], pid[rows]])
    first = rows[first_rows(group)]
    peak = np.full(len(first), np.nan)
    np.fmax.at(peak, group, mem[rows])  # NaN only where no listing had a reading
    cand = pd.DataFrame(
        {
            "host": pd.Series(np.asarray(hosts, dtype=object)[host_code[first]], dtype=object),
            "gpu": gpu[first],
            "pid": pid[first],
            "mem": peak,
            "seen": np.bincount(group, minlength=len(first)),
        }
    )
    parents = _parent_map(run, events)
    resolved, direct = [], []
    for host, pid in zip(cand["host"], cand["pid"]):  # one per (gpu, process), not per sample
        found, is_direct = _recording_ancestor(host, int(pid), recording, parents)
        resolved.append(found)
        direct.append(is_direct)
    cand["owner_pid"] = resolved
    cand["direct"] = direct
    cand = cand[cand["owner_pid"].notna()]
    if cand.empty:
        return {}
    cand = cand.assign(mem_rank=cand["mem"].fillna(-1.0)).sort_values(
        ["direct", "mem_rank", "seen", "owner_pid"], ascending=[False, False, False, True]
    )
    best = cand.drop_duplicates(["host", "gpu"], keep="first")
    return {
        (h, int(g)): (h, int(p), "nvml" if d else "nvml_ancestor")
        for h, g, p, d in zip(best["host"], best["gpu"], best["owner_pid"], best["direct"])
    }


def _parent_map(run: Run, events: pd.DataFrame | None = None) -> dict[tuple[str, int], int]:
    """(host, pid) → ppid from the watcher's process samples and the hooks' process events."""
    parents: dict[tuple[str, int], int] = {}
    procs = run.procs
    if procs is not None and len(procs) and "ppid" in procs:
        host_code, hosts = pd.factorize(procs["host"].astype(object))
        pid, ppid = _num(procs, "pid"), _num(procs, "ppid")
        rows = np.flatnonzero((host_code >= 0) & ~np.isnan(pid) & ~np.isnan(ppid))
        # the last sample of each (host, pid): first rows of the reversed order
        key = appearance_codes([host_code[rows][::-1], pid[rows][::-1]])
        last = rows[::-1][first_rows(key)]
        names = np.asarray(hosts, dtype=object)[host_code[last]]
        parents.update({(h, int(c)): int(q) for h, c, q in zip(names, pid[last], ppid[last])})
    ev = (events if events is not None else _process_events(run)).dropna(subset=["ppid"])
    parents.update({(h, int(c)): int(q) for h, c, q in zip(ev["host"], ev["pid"], ev["ppid"])})
    return parents


def _recording_ancestor(
    host: str, pid: int, recording: set[tuple[str, int]], parents: dict[tuple[str, int], int]
) -> tuple[float, bool]:
    """The pid itself when it recorded spans (direct), else its nearest recording ancestor."""
    if (host, pid) in recording:
        return float(pid), True
    seen = {pid}
    for _ in range(_MAX_ANCESTRY):
        pid = parents.get((host, pid), -1)
        if pid <= 1 or pid in seen:  # init / unknown / a cycle in bad data
            return np.nan, False
        if (host, pid) in recording:
            return float(pid), False
        seen.add(pid)
    return np.nan, False


# --------------------------------------------------------------------------------------------
# Innermost span lookup


def _cover(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """For spans sorted by start, the index of a span covering each time in ``t`` (-1: none).

    Prefers the latest-starting span (within one thread and depth spans are disjoint, so it is
    the only candidate); when that one has already ended, an earlier span may still cover
    ``t`` (spans of several threads overlap): the one reaching furthest, found with a running
    maximum of the end times, covers ``t`` whenever any span does.
    """
    if len(starts) == 0:
        return np.full(len(t), -1, dtype=np.int64)
    idx = np.searchsorted(starts, t, side="right") - 1
    ok = idx >= 0
    idx0 = np.where(ok, idx, 0)
    hit = ok & (t < ends[idx0])
    run_max = np.maximum.accumulate(ends)
    pos = np.arange(len(ends))
    reach = np.maximum.accumulate(np.where(ends == run_max, pos, 0))[idx0]
    hit_late = ok & ~hit & (t < ends[reach])
    return np.where(hit, idx0, np.where(hit_late, reach, -1))


def _innermost(spans: pd.DataFrame | dict, t: np.ndarray, step: bool) -> np.ndarray:
    """Row position in ``spans`` of the deepest span covering each time (-1: none), among
    the ``step`` spans (``step=True``) or the others. Loops over nesting depths only.
    ``spans``: a frame, or its ``is_step``, ``depth``, ``start_ns``, ``end_ns`` as arrays."""
    chosen = np.full(len(t), -1, dtype=np.int64)
    positions = np.flatnonzero(np.asarray(spans["is_step"]) == step)
    if len(positions) == 0 or len(t) == 0:
        return chosen
    # async code (many requests in flight on one event-loop thread) yields overlapping spans
    # whose derived "depth" is the number in flight — possibly thousands of levels; merging
    # the deepest levels bounds the loop, and `_cover` still finds a covering span there
    depth = np.minimum(np.asarray(spans["depth"])[positions], _MAX_DEPTH_LEVELS - 1)
    all_starts = np.asarray(spans["start_ns"])[positions]
    all_ends = np.asarray(spans["end_ns"])[positions]
    for d in np.unique(depth)[::-1]:  # deepest first: it wins wherever it covers
        mask = depth == d
        pos = positions[mask]
        starts = all_starts[mask]
        ends = all_ends[mask]
        order = np.argsort(starts, kind="stable")
        found = _cover(starts[order], ends[order], t)
        take = (chosen < 0) & (found >= 0)
        chosen[take] = pos[order[found[take]]]
    return chosen


def _label(spans: pd.DataFrame | dict, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Phase (object array, ``"(none)"`` outside spans), step (float, NaN unknown) and an
    in-span flag for each time in ``t``, from one process's spans (a frame, or its columns as
    arrays)."""
    n = len(t)
    phase = np.full(n, NO_PHASE, dtype=object)
    step = np.full(n, np.nan)
    if len(spans["start_ns"]) == 0 or n == 0:
        return phase, step, np.zeros(n, dtype=bool)
    span_phase = np.asarray(spans["phase"], dtype=object)
    inner = _innermost(spans, t, step=False)
    whole = _innermost(spans, t, step=True)
    has_inner, has_whole = inner >= 0, whole >= 0
    phase[has_whole] = STEP_PHASE
    phase[has_inner] = span_phase[inner[has_inner]]
    step, covered = _steps(spans, inner, whole)
    return phase, step, covered


# --------------------------------------------------------------------------------------------
# Samples


def gpu_phase_samples(
    run: Run, *, spans: pd.DataFrame | None = None, owners: pd.DataFrame | None = None
) -> pd.DataFrame:
    """One row per GPU sample with the phase its owner was in at that instant.

    Columns (sorted by host, gpu, t_ns):

    - ``host``, ``gpu``, ``t_ns``; ``dt_s`` = seconds to the GPU's next sample (the last one gets
      the GPU's median interval, a lone sample ``meta.interval_s`` or 0);
    - ``owner_host``, ``pid``, ``rank`` of the owner (`gpu_owner`; NaN when none);
    - ``phase``: the owner's innermost (deepest) span covering ``t_ns``; ``"step"`` only when
      no other span covers it; ``"(none)"`` outside every span; ``step``: the step number
      (the phase span's, else the enclosing step span's; NaN unknown); ``in_span`` (bool);
    - ``util_gpu_pct``, ``sm_active_pct`` as sampled; ``busy_frac`` = util_gpu_pct/100 and
      ``sm_busy_frac`` = sm_active_pct/100 (0–1, NaN when not measured);
    - ``busy_gpu_s`` = busy_frac·dt_s, ``idle_gpu_s`` = (1−busy_frac)·dt_s,
      ``sm_busy_gpu_s`` = sm_busy_frac·dt_s (GPU-seconds, NaN when not measured);
    - ``mem_used_bytes``, ``mem_total_bytes``; ``pcie_bytes`` and ``nvlink_bytes`` = (tx+rx
      rate)·dt_s, bytes moved during the sample (NaN when neither direction was measured);
    - ``row``: the sample's position in ``run.gpu`` (to fetch other columns without a join).

    ``frame.attrs["spans_dropped"]`` counts spans ignored for ending before they started.
    """
    valid, dropped = valid_spans(run)
    spans = valid if spans is None else spans
    owners = _gpu_owner(run, spans) if owners is None else owners
    out = _samples(run, spans, owners)
    out.attrs["spans_dropped"] = dropped
    return out


def _samples(run: Run, spans: pd.DataFrame, owners: pd.DataFrame) -> pd.DataFrame:
    gpu = run.gpu
    if gpu is None or gpu.empty:
        return _empty_samples()
    t_raw = pd.to_numeric(gpu["t_ns"], errors="coerce") if "t_ns" in gpu else None
    # hosts as codes into their sorted names (the order sorting the strings gives), -1: none
    host_all, host_names = _sorted_codes(gpu["host"])
    number_all = _num(gpu, "gpu")
    keep = (
        (host_all >= 0)
        & np.isfinite(number_all)
        & (t_raw.notna().to_numpy() if t_raw is not None else False)
    )
    rows = np.flatnonzero(keep)
    if len(rows) == 0:
        return _empty_samples()
    g = gpu if len(rows) == len(gpu) else gpu.loc[keep]
    host_code, host_names = _used_codes(host_all[rows], host_names)
    number = number_all[rows].astype(np.int64)
    t = t_raw.to_numpy()[rows].astype(np.int64)
    order = _gpu_time_order(host_code, number, t)
    host_code, number, t, rows = host_code[order], number[order], t[order], rows[order]
    n = len(t)
    # the samples of one GPU are one contiguous block
    new_gpu = np.ones(n, dtype=bool)
    new_gpu[1:] = (host_code[1:] != host_code[:-1]) | (number[1:] != number[:-1])
    starts = np.flatnonzero(new_gpu)
    block = np.cumsum(new_gpu) - 1
    dt = _block_durations(t, block, len(starts), run.meta.interval_s)

    # owners per GPU (a left join on a few rows, then spread over each GPU's samples)
    keys = pd.DataFrame(
        {"host": host_names.to_numpy(object)[host_code[starts]], "gpu": number[starts]}
    )
    cols = ["host", "gpu", "owner_host", "pid", "rank"]
    per_gpu = keys.merge(owners[cols], on=["host", "gpu"], how="left")
    if len(per_gpu) != len(keys):  # several owner rows for one GPU: join row by row
        return _samples_joined(run, spans, owners)
    owner_host = per_gpu["owner_host"].to_numpy()
    pid = per_gpu["pid"].to_numpy()
    phase_code, phase_names, step, in_span = _label_blocks(spans, per_gpu, starts, t)

    frame = {
        "host": pd.Categorical.from_codes(host_code, categories=host_names),
        "gpu": number,
        "t_ns": t,
        "dt_s": dt,
        "owner_host": _categorical(owner_host, block),
        "pid": pid[block],
        "rank": per_gpu["rank"].to_numpy()[block],
        "phase": _categorical(phase_names, phase_code),
        "step": step,
        "in_span": in_span,
    }
    metric_names = ["util_gpu_pct", "sm_active_pct", "mem_used_bytes", "mem_total_bytes",
                    "pcie_tx_bytes_s", "pcie_rx_bytes_s", "nvlink_tx_bytes_s",
                    "nvlink_rx_bytes_s"]  # fmt: skip
    metrics = {name: _num(g, name, order) for name in metric_names}
    util, sm = metrics["util_gpu_pct"], metrics["sm_active_pct"]
    busy_frac = np.clip(util / 100.0, 0.0, 1.0)  # NVML can overshoot by rounding
    sm_busy_frac = np.clip(sm / 100.0, 0.0, 1.0)
    frame.update(
        util_gpu_pct=util,
        sm_active_pct=sm,
        busy_frac=busy_frac,
        sm_busy_frac=sm_busy_frac,
        busy_gpu_s=busy_frac * dt,
        idle_gpu_s=(1.0 - busy_frac) * dt,
        sm_busy_gpu_s=sm_busy_frac * dt,
        mem_used_bytes=metrics["mem_used_bytes"],
        mem_total_bytes=metrics["mem_total_bytes"],
        pcie_bytes=_link_bytes(
            metrics["pcie_tx_bytes_s"], metrics["pcie_rx_bytes_s"], dt, overwrite=True
        ),
        nvlink_bytes=_link_bytes(
            metrics["nvlink_tx_bytes_s"], metrics["nvlink_rx_bytes_s"], dt, overwrite=True
        ),
        row=rows,
    )
    # fresh arrays: no copy into 2-D blocks (a third of the time of this function)
    return pd.DataFrame({name: frame[name] for name in _SAMPLE_COLUMNS}, copy=False)


def _sorted_codes(column: pd.Series) -> tuple[np.ndarray, pd.Index]:
    """A column's values as ``str``, coded by their place in the sorted distinct names (-1:
    missing)."""
    codes, uniques = pd.factorize(column)
    names = [str(u) for u in uniques]
    distinct = sorted(set(names))
    place = {name: i for i, name in enumerate(distinct)}
    remap = np.array([*(place[name] for name in names), -1], dtype=np.int64)
    return remap[codes], _object_index(distinct)  # code -1 picks the trailing -1


def _used_codes(codes: np.ndarray, names: pd.Index) -> tuple[np.ndarray, pd.Index]:
    """``codes`` (into sorted ``names``) renumbered to the names they use."""
    used = np.bincount(codes, minlength=len(names)) > 0
    if used.all():
        return codes, names
    return (np.cumsum(used) - 1)[codes], names[used]


def _gpu_time_order(host: np.ndarray, gpu: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The stable order of samples by host code, GPU, time (``np.lexsort``), found with one
    small-integer sort when the samples already come in time order (as runs are loaded)."""
    if len(t) > 1 and bool((t[1:] >= t[:-1]).all()):
        lo, width = int(gpu.min()), int(gpu.max()) - int(gpu.min()) + 1
        if width * (int(host.max()) + 1) < 2**16:  # a radix sort for 16-bit keys
            key = (host * width + (gpu - lo)).astype(np.uint16)
            return np.argsort(key, kind="stable")
    return np.lexsort((t, gpu, host))


def _categorical(values: np.ndarray, codes: np.ndarray) -> pd.Categorical:
    """The categorical of ``values[codes]``: categories the distinct non-null values used,
    sorted (an `_object_index`), computed on the few distinct values instead of every row."""
    values = np.asarray(values, dtype=object)
    used = np.bincount(codes, minlength=len(values)) > 0
    ok = used & pd.notna(values)
    if not all(isinstance(v, str) for v in values[ok]):
        return pd.Categorical(values[codes])  # mixed types: pandas decides the order
    categories = _object_index(sorted(set(values[ok])))
    place = {name: i for i, name in enumerate(categories)}
    remap = np.array([place[v] if k else -1 for v, k in zip(values, ok)], dtype=np.int64)
    return pd.Categorical.from_codes(remap[codes], dtype=pd.CategoricalDtype(categories))


def _object_index(names: list[str]) -> pd.Index:
    """Category labels as Python strings (an object index, not pandas' Arrow-backed ``str``):
    turning a column of millions of labels into an object array then takes one numpy take,
    where Arrow-backed labels would build every string again."""
    return pd.Index(np.array(names, dtype=object), dtype=object)


def _object_labels(cat: pd.Categorical) -> pd.Categorical:
    """``cat`` with its string categories as an `_object_index`."""
    if not isinstance(cat.categories.dtype, pd.StringDtype):
        return cat
    dtype = pd.CategoricalDtype(_object_index(list(cat.categories)))
    return pd.Categorical.from_codes(cat.codes, dtype=dtype)


def _block_durations(
    t: np.ndarray, block: np.ndarray, n_blocks: int, interval_s: float | None
) -> np.ndarray:
    """Seconds from each sample to the next one of its GPU (``block``: each sample's GPU, the
    samples sorted by GPU and time); a GPU's last sample gets that GPU's median interval."""
    dt = np.full(len(t), np.nan)
    if len(t) > 1:
        same = block[1:] == block[:-1]
        dt[:-1] = np.where(same, (t[1:] - t[:-1]) / 1e9, np.nan)
    median = pd.Series(dt).groupby(block).median().reindex(np.arange(n_blocks))
    fallback = float(interval_s) if interval_s and np.isfinite(interval_s) else 0.0
    last = median.fillna(fallback).to_numpy()[block]
    return np.where(np.isnan(dt), last, dt)


def _label_blocks(
    spans: pd.DataFrame, per_gpu: pd.DataFrame, starts: np.ndarray, t: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Phase (codes into the returned names, ``"(none)"`` outside spans), step and in-span flag
    of each sample, from the spans of the owner of its GPU (``per_gpu``: one row per block of
    samples starting at ``starts``)."""
    n = len(t)
    span_phase, names = pd.factorize(spans["phase"].to_numpy(object)) if len(spans) else (
        np.zeros(0, dtype=np.int64), np.zeros(0, dtype=object))  # fmt: skip
    names = np.array([*names, NO_PHASE, STEP_PHASE], dtype=object)
    none_code, step_code = len(names) - 2, len(names) - 1
    phase = np.full(n, none_code, dtype=np.int64)
    step = np.full(n, np.nan)
    in_span = np.zeros(n, dtype=bool)
    if not len(spans):
        return phase, names, step, in_span
    ends = np.append(starts[1:], n)
    by_proc = spans.groupby(["host", "pid"], sort=False).indices
    # the span columns the lookup reads, as arrays (row selections of a frame cost more)
    columns = {c: spans[c].to_numpy() for c in ("is_step", "depth", "start_ns", "end_ns", "step")}
    owned = per_gpu[per_gpu["pid"].notna()]
    for (o_host, o_pid), blocks in owned.groupby(["owner_host", "pid"], sort=False).indices.items():
        span_rows = by_proc.get((o_host, int(o_pid)))
        if span_rows is None:
            continue
        b = owned.index.to_numpy()[blocks]
        where = np.concatenate([np.arange(starts[i], ends[i]) for i in b])
        proc_spans = {c: values[span_rows] for c, values in columns.items()}
        inner = _innermost(proc_spans, t[where], False)
        whole = _innermost(proc_spans, t[where], True)
        code = span_phase[span_rows]
        has_inner, has_whole = inner >= 0, whole >= 0
        phase[where] = np.where(
            has_inner, code[np.maximum(inner, 0)], np.where(has_whole, step_code, none_code)
        )
        step[where], in_span[where] = _steps(proc_spans, inner, whole)
    return phase, names, step, in_span


def _steps(
    spans: pd.DataFrame | dict, inner: np.ndarray, whole: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Step number (the phase span's own, else the enclosing step span's; NaN unknown) and
    in-span flag, from `_innermost` positions of the phase (``inner``) and step (``whole``)
    span covering each time."""
    span_step = np.asarray(spans["step"], dtype=np.float64)
    has_inner, has_whole = inner >= 0, whole >= 0
    step = np.where(has_whole, span_step[np.maximum(whole, 0)], np.nan)
    inner_step = np.where(has_inner, span_step[np.maximum(inner, 0)], np.nan)
    step = np.where(np.isnan(inner_step), step, inner_step)
    return step, has_inner | has_whole


def _samples_joined(run: Run, spans: pd.DataFrame, owners: pd.DataFrame) -> pd.DataFrame:
    """`_samples` joining the owners row by row, as pandas does: for owner tables with
    several rows for one GPU (each sample then appears once per row)."""
    gpu = run.gpu
    if gpu is None or gpu.empty:
        return _empty_samples()
    t_raw = pd.to_numeric(gpu["t_ns"], errors="coerce") if "t_ns" in gpu else None
    keep = (
        gpu["host"].notna().to_numpy()
        & np.isfinite(_num(gpu, "gpu"))
        & (t_raw.notna().to_numpy() if t_raw is not None else False)
    )
    g = gpu.loc[keep]
    if g.empty:
        return _empty_samples()
    frame = pd.DataFrame(
        {
            "host": g["host"].astype(str).to_numpy(object),
            "gpu": _num(g, "gpu").astype(np.int64),
            "t_ns": t_raw[keep].to_numpy(np.int64),
            "row": np.flatnonzero(keep),
        }
    )
    metric_names = ["util_gpu_pct", "sm_active_pct", "mem_used_bytes", "mem_total_bytes",
                    "pcie_tx_bytes_s", "pcie_rx_bytes_s", "nvlink_tx_bytes_s",
                    "nvlink_rx_bytes_s"]  # fmt: skip
    for name in metric_names:
        frame[name] = _num(g, name)
    frame = frame.sort_values(["host", "gpu", "t_ns"], kind="stable", ignore_index=True)
    frame["dt_s"] = _durations(frame, run.meta.interval_s)

    frame = frame.merge(
        owners[["host", "gpu", "owner_host", "pid", "rank"]], on=["host", "gpu"], how="left"
    )
    n = len(frame)
    phase = np.full(n, NO_PHASE, dtype=object)
    step = np.full(n, np.nan)
    in_span = np.zeros(n, dtype=bool)
    t = frame["t_ns"].to_numpy(np.int64)
    by_proc = spans.groupby(["host", "pid"], sort=False).indices if len(spans) else {}
    owned = frame[frame["pid"].notna()]
    for (o_host, o_pid), rows in owned.groupby(["owner_host", "pid"], sort=False).indices.items():
        span_rows = by_proc.get((o_host, int(o_pid)))
        if span_rows is None:
            continue
        where = owned.index.to_numpy()[rows]
        proc_spans = spans.iloc[span_rows].reset_index(drop=True)
        phase[where], step[where], in_span[where] = _label(proc_spans, t[where])
    # labels as categoricals: comparisons and group-bys then work on small integer codes
    frame["phase"] = _object_labels(pd.Categorical(phase))
    frame["step"] = step
    frame["in_span"] = in_span
    for name in ("host", "owner_host"):
        frame[name] = _object_labels(pd.Categorical(frame[name].to_numpy(object)))

    util = frame["util_gpu_pct"].to_numpy()
    sm = frame["sm_active_pct"].to_numpy()
    dt = frame["dt_s"].to_numpy()
    frame["busy_frac"] = np.clip(util / 100.0, 0.0, 1.0)  # NVML can overshoot by rounding
    frame["sm_busy_frac"] = np.clip(sm / 100.0, 0.0, 1.0)
    frame["busy_gpu_s"] = frame["busy_frac"] * dt
    frame["idle_gpu_s"] = (1.0 - frame["busy_frac"]) * dt
    frame["sm_busy_gpu_s"] = frame["sm_busy_frac"] * dt
    frame["pcie_bytes"] = _bytes(frame, "pcie", dt)
    frame["nvlink_bytes"] = _bytes(frame, "nvlink", dt)
    return frame[_SAMPLE_COLUMNS]


def _durations(frame: pd.DataFrame, interval_s: float | None) -> np.ndarray:
    """Seconds from each sample to the next one of the same GPU (frame sorted by GPU, time);
    a GPU's last sample gets that GPU's median interval."""
    t = frame["t_ns"].to_numpy(np.int64)
    code = frame.groupby(["host", "gpu"], sort=False).ngroup().to_numpy()
    dt = np.full(len(t), np.nan)
    if len(t) > 1:
        same = code[1:] == code[:-1]
        dt[:-1] = np.where(same, (t[1:] - t[:-1]) / 1e9, np.nan)
    median = pd.Series(dt).groupby(code).median().reindex(np.arange(code.max() + 1))
    fallback = float(interval_s) if interval_s and np.isfinite(interval_s) else 0.0
    last = median.fillna(fallback).to_numpy()[code]
    return np.where(np.isnan(dt), last, dt)


def _bytes(frame: pd.DataFrame, link: str, dt: np.ndarray) -> np.ndarray:
    return _link_bytes(
        frame[f"{link}_tx_bytes_s"].to_numpy(), frame[f"{link}_rx_bytes_s"].to_numpy(), dt
    )


def _link_bytes(
    tx: np.ndarray, rx: np.ndarray, dt: np.ndarray, overwrite: bool = False
) -> np.ndarray:
    """Bytes moved in each sample: (tx + rx rate) · dt, NaN when neither was measured
    (``overwrite``: ``tx`` and ``rx`` are scratch arrays)."""
    none = np.isnan(tx) & np.isnan(rx)
    rate = np.nan_to_num(tx, copy=not overwrite) + np.nan_to_num(rx, copy=not overwrite)
    rate[none] = np.nan
    return rate * dt


def _empty_samples() -> pd.DataFrame:
    dtypes = {"host": object, "gpu": np.int64, "t_ns": np.int64, "owner_host": object,
              "phase": object, "in_span": bool, "row": np.int64}  # fmt: skip
    return pd.DataFrame(
        {c: pd.Series([], dtype=dtypes.get(c, np.float64)) for c in _SAMPLE_COLUMNS}
    )


# --------------------------------------------------------------------------------------------
# Aggregates


def _owner_wall(spans: pd.DataFrame, owners: pd.DataFrame) -> pd.DataFrame:
    """Seconds each GPU owner spent with each (phase, step) as its innermost phase.

    Exact, from the span timeline rather than the samples: between consecutive span boundaries
    the innermost span is constant, so the boundaries themselves are looked up.
    """
    cols = ["owner_host", "pid", "phase", "step", "wall_s"]
    by_proc = spans.groupby(["host", "pid"], sort=False).indices if len(spans) else {}
    keys = owners.dropna(subset=["pid"])[["owner_host", "pid"]].drop_duplicates()
    found: list[tuple[Any, float]] = []
    parts: list[tuple[np.ndarray, ...]] = []
    # the span columns the lookup reads, as arrays (row selections of a frame cost more)
    names = ("phase", "is_step", "depth", "start_ns", "end_ns", "step")
    columns = {c: spans[c].to_numpy() for c in names} if len(spans) else {}
    for o_host, o_pid in zip(keys["owner_host"], keys["pid"]):
        rows = by_proc.get((o_host, int(o_pid)))
        if rows is None:
            continue
        proc_spans = {c: values[rows] for c, values in columns.items()}
        bounds = np.unique(np.concatenate([proc_spans["start_ns"], proc_spans["end_ns"]]))
        if len(bounds) < 2:
            continue
        phase, step, covered = _label(proc_spans, bounds[:-1])
        wall_s = np.diff(bounds) / 1e9
        owner = np.full(int(covered.sum()), len(found), dtype=np.int64)
        parts.append((owner, phase[covered], step[covered], wall_s[covered]))
        found.append((o_host, float(o_pid)))
    if not parts:
        return pd.DataFrame(
            {"owner_host": pd.Series([], dtype=object), "pid": pd.Series([], dtype=float),
             "phase": pd.Series([], dtype=object), "step": pd.Series([], dtype=float),
             "wall_s": pd.Series([], dtype=float)}
        )  # fmt: skip
    # one group-by over every owner (each owner's rows together, so its groups come out in the
    # order a group-by per owner gives)
    frame = pd.DataFrame(
        {name: np.concatenate([p[i] for p in parts])
         for i, name in enumerate(["owner", "phase", "step", "wall_s"])}
    )  # fmt: skip
    out = frame.groupby(["owner", "phase", "step"], dropna=False, sort=False)["wall_s"].sum()
    out = out.reset_index()
    owner = out["owner"].to_numpy()
    hosts = pd.Series([h for h, _ in found])  # the dtype a column of these hosts gets
    out["owner_host"] = hosts.iloc[owner].reset_index(drop=True)
    out["pid"] = np.array([p for _, p in found], dtype=np.float64)[owner]
    return out[cols]


def phase_breakdown(
    run: Run,
    by: Sequence[str] = ("phase",),
    samples: pd.DataFrame | None = None,
    *,
    spans: pd.DataFrame | None = None,
    owners: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """GPU-time per group of ``by`` keys (any of phase, step, host, gpu, rank, pid).

    Columns, after the keys:

    - ``ranks``: owners (processes) in the group; ``gpus``: distinct GPUs; ``samples``;
    - ``wall_s``: wall seconds the owners spent in the group's phase as their innermost phase,
      averaged over the owners that spent any (for ``"(none)"``: the sampled seconds outside
      all spans, averaged over the GPUs); NaN when ``phase`` is not a key and no span applies;
    - ``gpu_s`` = Σ dt_s; ``busy_gpu_s``/``idle_gpu_s`` from ``util_gpu_pct``;
      ``unknown_gpu_s``: GPU-seconds without a utilisation reading;
    - ``util_gpu_pct``, ``sm_active_pct``: time-weighted means over the samples that have them;
    - ``mem_peak_bytes``; ``pcie_bytes``, ``nvlink_bytes``: bytes moved (rate × dt);
    - ``share``: gpu_s over the run's total GPU-seconds (0–1).

    Rows are sorted by the keys, phases in canonical order with ``"(none)"`` last. Pass
    ``samples`` (a `gpu_phase_samples` result), ``spans`` (`valid_spans`) and ``owners``
    (`gpu_owner`) to avoid recomputing them.
    """
    by = list(by)
    bad = [k for k in by if k not in _BY_KEYS]
    if bad or not by:
        raise ValueError(f"phase_breakdown: keys must be among {_BY_KEYS}, got {by}")
    if spans is None:
        spans, _ = valid_spans(run)
    if owners is None:
        owners = _gpu_owner(run, spans)
    if samples is None:
        samples = _samples(run, spans, owners)
    if samples.empty:
        return pd.DataFrame(
            {**{k: pd.Series([], dtype=object if k in ("phase", "host") else float) for k in by},
             **{c: pd.Series([], dtype=float) for c in _BREAKDOWN_COLUMNS}}
        )  # fmt: skip

    s = samples
    dt = s["dt_s"].to_numpy()
    util, sm = s["util_gpu_pct"].to_numpy(), s["sm_active_pct"].to_numpy()
    work = pd.DataFrame(
        {
            **{k: s[k] for k in by},
            # integer ids, not "host:pid" strings: string building dominates at 10⁵–10⁶ rows
            "owner": appearance_codes([s["owner_host"], s["pid"]]).astype(np.float64),
            "gpu_id": appearance_codes([s["host"], s["gpu"]]),
            "gpu_s": dt,
            "busy_gpu_s": s["busy_gpu_s"],
            "idle_gpu_s": s["idle_gpu_s"],
            "unknown_gpu_s": np.where(np.isnan(util), dt, 0.0),
            "util_w": util * dt,
            "util_dt": np.where(np.isnan(util), 0.0, dt),
            "sm_w": sm * dt,
            "sm_dt": np.where(np.isnan(sm), 0.0, dt),
            "mem_used_bytes": s["mem_used_bytes"],
            "pcie_bytes": s["pcie_bytes"],
            "nvlink_bytes": s["nvlink_bytes"],
        },
        copy=False,  # columns as they are, not copied into 2-D blocks
    )
    # no owner: NaN, which nunique skips
    work.loc[(work["owner"] < 0).to_numpy() | s["pid"].isna().to_numpy(), "owner"] = np.nan
    grouped = work.groupby(by, dropna=False, sort=False)
    table = grouped.agg(
        ranks=("owner", "nunique"),
        gpus=("gpu_id", "nunique"),
        samples=("gpu_s", "size"),
        gpu_s=("gpu_s", "sum"),
        unknown_gpu_s=("unknown_gpu_s", "sum"),
        util_w=("util_w", "sum"),
        util_dt=("util_dt", "sum"),
        sm_w=("sm_w", "sum"),
        sm_dt=("sm_dt", "sum"),
        mem_peak_bytes=("mem_used_bytes", "max"),
    )
    # NaN, not 0, when no sample of the group measured the quantity
    for col in ("busy_gpu_s", "idle_gpu_s", "pcie_bytes", "nvlink_bytes"):
        table[col] = grouped[col].sum(min_count=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        table["util_gpu_pct"] = np.where(table["util_dt"] > 0, table["util_w"] / table["util_dt"],
                                         np.nan)  # fmt: skip
        table["sm_active_pct"] = np.where(table["sm_dt"] > 0, table["sm_w"] / table["sm_dt"],
                                          np.nan)  # fmt: skip
    total = float(np.nansum(dt))
    table["share"] = table["gpu_s"] / total if total > 0 else np.nan
    table = table.reset_index()
    table = table.merge(_wall_by(by, spans, owners, s), on=by, how="left")
    table = _sort(table, by)
    return table[[*by, *_BREAKDOWN_COLUMNS]].reset_index(drop=True)


def _wall_by(
    by: list[str], spans: pd.DataFrame, owners: pd.DataFrame, samples: pd.DataFrame
) -> pd.DataFrame:
    """``wall_s`` per group of ``by`` keys (see `phase_breakdown`)."""
    wall = _owner_wall(spans, owners)
    per_gpu = owners.dropna(subset=["pid"])[["host", "gpu", "owner_host", "pid", "rank"]].merge(
        wall, on=["owner_host", "pid"], how="inner"
    )
    keys_gpu = list(dict.fromkeys([*by, "owner_host", "pid", "host", "gpu"]))
    keys_owner = list(dict.fromkeys([*by, "owner_host", "pid"]))
    # one owner may drive several GPUs: sum per GPU, then count each owner once, then average
    agg = per_gpu.groupby(keys_gpu, dropna=False, sort=False)["wall_s"].sum()
    agg = agg.groupby(keys_owner, dropna=False, sort=False).first()
    spans_wall = agg.groupby(by, dropna=False, sort=False).mean().reset_index()
    if "phase" not in by:
        return spans_wall
    keys = list(dict.fromkeys([*by, "host", "gpu"]))
    outside = samples.loc[(samples["phase"] == NO_PHASE).to_numpy(), [*keys, "dt_s"]]
    if outside.empty:
        return spans_wall
    none_wall = (
        outside.groupby(keys, dropna=False, sort=False)["dt_s"]
        .sum()
        .groupby(by, dropna=False, sort=False)
        .mean()
        .reset_index()
        .rename(columns={"dt_s": "wall_s"})
    )
    return pd.concat([spans_wall, none_wall], ignore_index=True)


def _sort(table: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Sort by the keys; phases in canonical order, unknown names after, ``"(none)"`` last."""
    if "phase" not in by:
        return table.sort_values(by, kind="stable", na_position="last")
    order = {name: i for i, name in enumerate(CANONICAL_PHASES)}
    rank = table["phase"].map(
        lambda p: len(order) + 1 if p == NO_PHASE else order.get(p, len(order))
    )
    keys = ["_phase_order" if k == "phase" else k for k in by]
    table = table.assign(_phase_order=rank.to_numpy(), _phase_name=table["phase"].astype(str))
    keys = [*keys[: keys.index("_phase_order") + 1], "_phase_name",
            *keys[keys.index("_phase_order") + 1 :]]  # fmt: skip
    return table.sort_values(keys, kind="stable", na_position="last").drop(
        columns=["_phase_order", "_phase_name"]
    )


def run_totals(
    run: Run,
    samples: pd.DataFrame | None = None,
    *,
    spans: pd.DataFrame | None = None,
    owners: pd.DataFrame | None = None,
) -> dict[str, Any]:
    """The run's GPU-time budget as a plain dict (floats in GPU-seconds unless named otherwise).

    Keys: ``gpus``, ``samples``, ``gpu_s``, ``busy_gpu_s``, ``idle_gpu_s``, ``unknown_gpu_s``
    (no utilisation reading), ``idle_in_spans_gpu_s`` / ``idle_outside_spans_gpu_s`` (idle
    while the owner was inside some span vs outside all of them — the latter is what
    ``idle_unattributed`` explains), ``util_gpu_pct`` (time-weighted mean), ``busy_measure``
    (``"util_gpu_pct"``: busy/idle above count "a kernel was running", which overstates how
    busy the SMs were) with ``busy_measure_note``, ``sm_active_pct`` and ``sm_busy_gpu_s``
    (GPM SM activity, None without GPM) with ``sm_active_coverage`` (share of GPU-seconds that
    have it, 0–1), ``owners`` (count of GPUs per `gpu_owner` rule), ``unowned_gpus`` and
    ``spans_dropped``. Numbers are None when nothing was measured. ``samples``, ``spans`` and
    ``owners`` as in `phase_breakdown`.
    """
    if spans is None:
        spans, dropped = valid_spans(run)
    else:
        dropped = int(samples.attrs.get("spans_dropped", 0)) if samples is not None else 0
    if owners is None:
        owners = _gpu_owner(run, spans)
    if samples is None:
        samples = _samples(run, spans, owners)
    dt = samples["dt_s"].to_numpy(np.float64)
    util = samples["util_gpu_pct"].to_numpy(np.float64)
    sm = samples["sm_active_pct"].to_numpy(np.float64)
    idle = samples["idle_gpu_s"].to_numpy(np.float64)
    in_span = samples["in_span"].to_numpy(bool)
    has_util, has_sm = ~np.isnan(util), ~np.isnan(sm)
    gpu_s = float(dt.sum())
    util_dt, sm_dt = float(dt[has_util].sum()), float(dt[has_sm].sum())
    return {
        "gpus": len(owners),
        "samples": len(samples),
        "gpu_s": gpu_s,
        "busy_gpu_s": float(np.nansum(samples["busy_gpu_s"].to_numpy())) if util_dt else None,
        "idle_gpu_s": float(np.nansum(idle)) if util_dt else None,
        "unknown_gpu_s": float(dt[~has_util].sum()),
        "idle_in_spans_gpu_s": float(np.nansum(idle[in_span])) if util_dt else None,
        "idle_outside_spans_gpu_s": float(np.nansum(idle[~in_span])) if util_dt else None,
        "util_gpu_pct": float((util[has_util] * dt[has_util]).sum() / util_dt)
        if util_dt > 0
        else None,
        "busy_measure": "util_gpu_pct",
        "busy_measure_note": "share of time a kernel was running (NVML utilization.gpu), "
        "not SM activity; see sm_active_pct where GPM is available",
        "sm_active_pct": float((sm[has_sm] * dt[has_sm]).sum() / sm_dt) if sm_dt > 0 else None,
        "sm_busy_gpu_s": float(np.nansum(samples["sm_busy_gpu_s"].to_numpy())) if sm_dt else None,
        "sm_active_coverage": sm_dt / gpu_s if gpu_s > 0 else None,
        "owners": {str(k): int(v) for k, v in owners["how"].value_counts().items()},
        "unowned_gpus": int((owners["how"] == "none").sum()),
        "spans_dropped": dropped,
    }
