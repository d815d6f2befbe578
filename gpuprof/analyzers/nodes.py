"""Cross-node figures of a multi-node run: per node, per link type, the straggler node.

Pure and vectorised like the detectors; the result is the diagnosis summary's ``nodes``
section (None for a single-node run):

- per node: GPUs, ranks, mean utilisation, busy and idle GPU-seconds, and the idle GPU-seconds
  spent while another node's GPUs were busy (one node waiting on another: a straggler, a
  disaggregated rollout, a weight sync from elsewhere), plus the clock offset applied to it;
- per link type (intra-node / inter-node): the blocking collectives' calls, bytes, seconds and
  effective bandwidth (bytes over wall time, what nccl-tests calls algbw);
- the straggler node: the node whose ranks finish their work phases last, step after step,
  and what the other nodes' GPUs lose waiting for it;
- whether weight sync crosses nodes: reshard spans that contain inter-node collectives, or
  rollout and update phases that run on different nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.analyzers import attr_columns
from gpuprof.analyzers.basic import finite_or_none, node_accounts
from gpuprof.analyzers.findings import AnalysisContext, Thresholds
from gpuprof.analyzers.grouping import appearance_codes, first_rows
from gpuprof.analyzers.parts import Parts, exact_sum, sampled
from gpuprof.nodes import natural_key

WINDOW_S = 1.0
"""Width of the time windows in which nodes' busy fractions are compared (s)."""
WORK_PHASES_EXCLUDED = frozenset({"step", "collective", "reshard", "idle", "wait"})
"""Phases not compared across nodes as units of work (boundaries, communication, syncs)."""
_ROLLOUT, _UPDATE = frozenset({"rollout"}), frozenset({"update_actor", "update_critic"})


def node_summary(ctx: AnalysisContext, th: Thresholds) -> dict[str, Any] | None:
    """The ``nodes`` section of the diagnosis summary, or None with fewer than two nodes."""
    run = ctx.run
    parts = Parts.of(ctx)
    # each part's spans are its nodes' processes: what a node did is in one part
    spans = parts.map(_node_spans)
    names = set(run.meta.hosts)
    names |= {h for h in sampled(parts).hosts if h is not None and h == h}
    names |= set().union(*(part["hosts"] for part in spans))
    # a Ray cluster's nodes that were lost or never recorded are listed too, with how
    accounts = {a["node"]: a for a in node_accounts(run)}
    names |= set(accounts)
    if len(names) < 2:
        return None
    nodes = sorted(names, key=natural_key)  # node2 before node10, as the report shows them
    windows = [w for w in parts.map(_node_windows) if w is not None]
    gpus = _gpus_per_node(windows)
    per_node = _per_node(windows, gpus, _ranks_of(spans), nodes, th)
    clocks = run.meta.clocks or {}
    for row in per_node:
        account = accounts.get(row["node"])
        row["recorded"] = (
            {k: account[k] for k in ("state", "from_s", "lost_s", "why", "watcher")}
            if account else None
        )  # fmt: skip
        clock = clocks.get(row["node"])
        row["clock"] = (
            {k: clock.get(k) for k in ("offset_ns", "error_ns", "method")} if clock else None
        )
    return {
        "nodes": per_node,
        "links": _links_of(spans),
        "straggler_node": _straggler_of([part["straggler"] for part in spans], gpus, th),
        "weight_sync_crosses_nodes": weight_sync_crosses_nodes(parts),
        "alignment": _alignment(clocks, nodes),
    }


def _node_spans(ctx: AnalysisContext) -> dict[str, Any]:
    """One part's span figures for `node_summary`: the hosts with spans, each host's ranks
    (``host``, ``rank`` pairs), the most ranks one host runs, `_straggler_rows`, and its
    blocking collectives' group sizes, seconds and bytes (`collectives`)."""
    spans = ctx.spans
    out: dict[str, Any] = {"hosts": set(), "ranks": None, "ranks_per_node": 1,
                           "straggler": _straggler_rows(spans), "coll": None}  # fmt: skip
    out["ranks_per_node"] = run_ranks_per_node(ctx)  # of all its spans, as the links read
    coll = run_collectives(ctx)
    if len(coll):
        out["coll"] = (
            coll["group_size"].to_numpy(np.float64),
            coll["seconds"].to_numpy(np.float64),
            coll["bytes"].to_numpy(np.float64),
        )
    if spans.empty:
        return out
    out["hosts"] = set(spans["host"].dropna().unique().tolist())
    if "rank" in spans:
        rank = spans["rank"].to_numpy(np.float64)
        known = np.flatnonzero(~np.isnan(rank))
        host, rank = spans["host"].to_numpy(object)[known], rank[known].astype(np.int64)
        # each (host, rank) once, where first seen (``drop_duplicates``)
        first = first_rows(appearance_codes([host, rank], missing_is_value=True))
        out["ranks"] = pd.DataFrame({"host": host[first], "rank": rank[first]}, index=first)
    return out


def _ranks_of(parts: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Each host's ranks, sorted, from every part's `_node_spans`."""
    pairs = [p["ranks"] for p in parts if p["ranks"] is not None and len(p["ranks"])]
    if not pairs:
        return {}
    frame = pd.concat(pairs, ignore_index=True).drop_duplicates()
    return {
        str(host): sorted(int(r) for r in group["rank"]) for host, group in frame.groupby("host")
    }


def _links_of(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`link_figures` of every part's collectives, its sums exact (the same however the
    run's nodes are divided between parts)."""
    held = [p["coll"] for p in parts if p["coll"] is not None]
    if not held:
        return []
    sizes, seconds, nbytes = (np.concatenate(c) for c in zip(*held, strict=True))
    inter = sizes > max(p["ranks_per_node"] for p in parts)  # `crosses_nodes`
    out = []
    for label, mask in (("intra-node", ~inter), ("inter-node", inter)):
        if not mask.any():
            continue
        secs = float(exact_sum(np.clip(seconds[mask], 0, None)))
        total = float(exact_sum(nbytes[mask]))  # NaN counts as 0
        out.append({
            "link": label,
            "calls": int(mask.sum()),
            "bytes": int(total),
            "seconds": round(secs, 6),
            "bandwidth_bytes_s": finite_or_none(total / secs) if secs > 0 else None,
        })  # fmt: skip
    return out


def _node_windows(ctx: AnalysisContext) -> tuple[pd.DataFrame, ...] | None:
    """One part's GPU-seconds busy, idle and sampled (``busy``, ``idle``, ``dt``) per host and
    `WINDOW_S` window, its hosts' GPU numbers (``host``, ``gpu``), and its GPU-seconds per
    host (indexed by host); None without samples."""
    s = ctx.samples
    if s.empty:
        return None
    # hosts as integer codes: the same sums in the same order as grouping on the names
    codes, names = pd.factorize(s["host"].to_numpy(object))
    rows = codes >= 0
    busy = s["busy_gpu_s"].to_numpy(np.float64)[rows]
    idle = s["idle_gpu_s"].to_numpy(np.float64)[rows]
    dt = s["dt_s"].to_numpy(np.float64)[rows]
    host = np.asarray(names, dtype=object)[codes[rows]]
    frame = pd.DataFrame({
        "host": codes[rows],
        "window": (s["t_ns"].to_numpy(np.int64)[rows] // int(WINDOW_S * 1e9)),
        "busy": np.where(np.isfinite(busy), busy, 0.0),
        "idle": np.where(np.isfinite(idle), idle, 0.0),
        "dt": np.where(np.isfinite(busy), dt, 0.0),
    })  # fmt: skip
    totals = frame.groupby("host")[["busy", "idle", "dt"]].sum()
    totals.index = np.asarray(names, dtype=object)[totals.index.to_numpy()]
    win = frame.groupby(["host", "window"])[["busy", "idle", "dt"]].sum().reset_index()
    win["host"] = np.asarray(names, dtype=object)[win["host"].to_numpy()]
    gpus = pd.DataFrame({"host": host, "gpu": s["gpu"].to_numpy()[rows]}).drop_duplicates()
    return win, gpus, totals


def _gpus_per_node(windows: list[tuple[pd.DataFrame, ...]]) -> pd.Series:
    """Distinct GPUs per host over every part's `_node_windows`."""
    if not windows:
        return pd.Series(dtype=np.int64)
    pairs = pd.concat([w[1] for w in windows], ignore_index=True).drop_duplicates()
    return pairs.groupby("host")["gpu"].nunique()


def _per_node(
    windows: list[tuple[pd.DataFrame, ...]],
    gpus: pd.Series,
    ranks: dict[str, list[int]],
    nodes: list[str],
    th: Thresholds,
) -> list[dict[str, Any]]:
    out = {n: {"node": n, "gpus": 0, "ranks": ranks.get(n, []), "util_gpu_pct": None,
               "busy_gpu_s": 0.0, "idle_gpu_s": 0.0, "idle_while_others_busy_gpu_s": 0.0}
           for n in nodes}  # fmt: skip
    if not windows:
        return list(out.values())
    # per node and window: how busy its GPUs were; a node idle while another is busy waits
    win = pd.concat([w[0] for w in windows], ignore_index=True)
    totals = pd.concat([w[2] for w in windows])
    if len(windows) > 1:  # a node's windows may come from several parts
        win = win.groupby(["host", "window"], sort=True)[["busy", "idle", "dt"]].sum()
        win = win.reset_index()
        totals = totals.groupby(level=0).sum()
    win["frac"] = win["busy"] / win["dt"].where(win["dt"] > 0)
    win["is_busy"] = win["frac"] >= th.busy_util_pct / 100.0
    win["is_idle"] = win["frac"] < th.idle_util_pct / 100.0
    busy_nodes = win.groupby("window")["is_busy"].transform("sum")
    others_busy = (busy_nodes - win["is_busy"].astype(int)) > 0
    waiting = win[win["is_idle"] & others_busy].groupby("host")["idle"].sum()
    for host, row in totals.iterrows():
        entry = out.get(str(host))
        if entry is None:
            continue
        entry["gpus"] = int(gpus.get(host, 0))
        entry["busy_gpu_s"] = round(float(row["busy"]), 3)
        entry["idle_gpu_s"] = round(float(row["idle"]), 3)
        util = 100.0 * row["busy"] / row["dt"] if row["dt"] else None
        entry["util_gpu_pct"] = finite_or_none(util) if util is not None else None
        entry["idle_while_others_busy_gpu_s"] = round(float(waiting.get(host, 0.0)), 3)
    return list(out.values())


def collectives(spans: pd.DataFrame) -> pd.DataFrame:
    """Blocking collective spans with ``bytes``, ``group_size`` and ``seconds`` columns. A
    span without a host is on no node: it counts nowhere, as in a run diagnosed node by node
    (`parts.by_node` puts it in no part)."""
    if spans.empty or "attrs" not in spans:
        return spans.iloc[:0]
    keep = (spans["phase"] == "collective") & (spans["end_ns"] >= spans["start_ns"])
    if "host" in spans:
        keep &= spans["host"].notna()
    coll = spans[keep]
    if coll.empty:
        return coll
    attrs = list(coll["attrs"])

    def get(key: str) -> pd.Series:
        raw = pd.Series(attr_columns.values(attrs, key), index=coll.index, dtype=object)
        return pd.to_numeric(raw, errors="coerce")

    is_async = pd.Series([bool(v) for v in attr_columns.values(attrs, "async")], index=coll.index)
    if "gpu_start_ns" in coll and "gpu_end_ns" in coll:
        on_gpu = (coll["gpu_start_ns"].notna() & coll["gpu_end_ns"].notna()).to_numpy()
    else:
        on_gpu = np.zeros(len(coll), dtype=bool)
        coll = coll.assign(gpu_start_ns=np.nan, gpu_end_ns=np.nan)
    start = np.where(on_gpu, coll["gpu_start_ns"], coll["start_ns"]).astype(np.float64)
    end = np.where(on_gpu, coll["gpu_end_ns"], coll["end_ns"]).astype(np.float64)
    out = coll.assign(bytes=get("bytes"), group_size=get("group_size"),
                      seconds=(end - start) / 1e9)  # fmt: skip
    return out[~is_async.to_numpy()]


def _once(ctx: AnalysisContext, key: str, compute: Callable[[], Any]) -> Any:
    """``compute()`` once per analysis context (several steps read these figures)."""
    cache = ctx.__dict__.setdefault("_nodes_cache", {})
    if key not in cache:
        cache[key] = compute()
    return cache[key]


def run_collectives(ctx: AnalysisContext) -> pd.DataFrame:
    """`collectives` of the run's spans, once per context."""
    return _once(ctx, "collectives", lambda: collectives(ctx.run.spans))


def run_ranks_per_node(ctx: AnalysisContext) -> int:
    """`ranks_per_node` of the run's spans, once per context."""
    return _once(ctx, "ranks_per_node", lambda: ranks_per_node(ctx.run.spans))


def weight_sync_crosses_nodes(ctx: AnalysisContext | Parts) -> bool | None:
    """`sync_crosses_nodes` of the run's spans, once per context; of every part's spans
    together for a run in parts (`parts.Parts`)."""
    if isinstance(ctx, Parts):
        if ctx.count > 1:
            return _once(ctx.lead, "sync_crosses_parts", lambda: _sync_joined(ctx))
        ctx = ctx.lead
    return _once(ctx, "sync_crosses", lambda: sync_crosses_nodes(
        ctx.run.spans, lambda: run_collectives(ctx), run_ranks_per_node(ctx)))  # fmt: skip


def _sync_joined(parts: Parts) -> bool | None:
    """`sync_crosses_nodes` of every part's spans (each part holds its node's processes,
    and a collective and the reshard span holding it are one process's)."""
    got = parts.map(_sync_part)
    if not any(g["reshard"] for g in got):
        return None
    roll = set().union(*(g["roll"] for g in got))
    upd = set().union(*(g["upd"] for g in got))
    if roll and upd and roll.isdisjoint(upd):
        return True  # disaggregated: rollout on some nodes, training on others
    if len(set().union(*(g["hosts"] for g in got))) < 2:
        return False
    ranks = max(g["ranks"] for g in got)
    sizes = np.concatenate([g["inside"] for g in got])
    return bool((sizes > ranks).any())


def _sync_part(ctx: AnalysisContext) -> dict[str, Any]:
    spans = ctx.run.spans
    out: dict[str, Any] = {"reshard": False, "roll": set(), "upd": set(), "hosts": set(),
                           "ranks": ranks_per_node(spans), "inside": np.zeros(0)}  # fmt: skip
    if spans is None or spans.empty or "phase" not in spans:
        return out
    reshard = spans[spans["phase"] == "reshard"]
    out["reshard"] = not reshard.empty
    out["roll"] = set(spans.loc[spans["phase"].isin(_ROLLOUT), "host"])
    out["upd"] = set(spans.loc[spans["phase"].isin(_UPDATE), "host"])
    out["hosts"] = set(spans["host"].dropna().unique())
    coll = run_collectives(ctx)
    if reshard.empty or coll.empty:
        return out
    out["inside"] = _inside_reshard(coll, reshard)["group_size"].to_numpy(np.float64)
    return out


def _inside_reshard(coll: pd.DataFrame, reshard: pd.DataFrame) -> pd.DataFrame:
    """The collectives that start inside a reshard span of their own process."""
    keys = ["host", "pid"]
    right = reshard[[*keys, "start_ns", "end_ns"]].sort_values("start_ns", kind="stable")
    ends = right["end_ns"].to_numpy(np.int64)
    inside = pd.merge_asof(
        coll[[*keys, "start_ns", "group_size"]].sort_values("start_ns", kind="stable"),
        right[[*keys, "start_ns"]].assign(r_row=np.arange(len(right), dtype=np.float64))
        .rename(columns={"start_ns": "r_start"}),
        left_on="start_ns", right_on="r_start", by=keys, direction="backward",
    ).dropna(subset=["r_row"])  # fmt: skip
    # the reshard's end compared as an integer (a merged column with gaps is float64)
    r_end = ends[inside["r_row"].to_numpy(np.int64)]
    return inside[inside["start_ns"].to_numpy(np.int64) <= r_end]


def ranks_per_node(spans: pd.DataFrame) -> int:
    """The most ranks any node runs (1 without rank information)."""
    if spans.empty or "rank" not in spans:
        return 1
    rank = spans["rank"]
    if rank.dtype.kind not in "iuf":  # ranks of another kind: pandas counts them
        per_node = spans.dropna(subset=["rank"]).groupby("host")["rank"].nunique()
        return int(per_node.max()) if len(per_node) else 1
    # distinct ranks per host (a rank or a host missing: counted nowhere), on codes
    pairs = appearance_codes([spans["host"], rank.to_numpy(np.float64, na_value=np.nan)])
    hosts = appearance_codes([spans["host"]])[first_rows(pairs)]
    return int(np.bincount(hosts).max()) if len(hosts) else 1


def is_multi_node(spans: pd.DataFrame) -> bool:
    """Whether ranks run on more than one node."""
    if spans.empty or "rank" not in spans:
        return False
    return spans.dropna(subset=["rank"])["host"].nunique() > 1


def crosses_nodes(
    group_size: pd.Series | np.ndarray, spans: pd.DataFrame, ranks: int | None = None
) -> np.ndarray:
    """Per collective, whether it crosses nodes: its group holds more ranks than any node
    runs. A smaller group (tensor-parallel, within a node) is taken as intra-node, the usual
    placement. ``spans``: the run's spans, for the ranks per node (``ranks``, when known)."""
    ranks = ranks_per_node(spans) if ranks is None else ranks
    return np.asarray(group_size, dtype=np.float64) > ranks


def link_figures(
    coll: pd.DataFrame, spans: pd.DataFrame, ranks: int | None = None
) -> list[dict[str, Any]]:
    """Calls, bytes, seconds and effective bandwidth per link type (intra-node, inter-node)
    of blocking collectives (`collectives` frame rows; ``ranks``: `ranks_per_node` of
    ``spans`` when known)."""
    if coll.empty:
        return []
    inter = crosses_nodes(coll["group_size"], spans, ranks)
    out = []
    for label, mask in (("intra-node", ~inter), ("inter-node", inter)):
        part = coll[mask]
        if part.empty:
            continue
        seconds = float(part["seconds"].clip(lower=0).sum())
        nbytes = float(part["bytes"].fillna(0).sum())
        out.append({
            "link": label,
            "calls": len(part),
            "bytes": int(nbytes),
            "seconds": round(seconds, 6),
            "bandwidth_bytes_s": finite_or_none(nbytes / seconds) if seconds > 0 else None,
        })  # fmt: skip
    return out


_STRAGGLER_ROWS = ["phase", "step", "host", "dur_ns"]


def _straggler_rows(spans: pd.DataFrame) -> pd.DataFrame:
    """Per (phase, step, host) of some nodes' spans: the node's time, its slowest rank's
    summed work-span nanoseconds (a node's processes are all among the spans given)."""
    if spans.empty or "step" not in spans:
        return pd.DataFrame(columns=_STRAGGLER_ROWS)
    work = np.flatnonzero(~spans["phase"].isin(WORK_PHASES_EXCLUDED).to_numpy()
                          & np.isfinite(spans["step"].to_numpy(np.float64)))  # fmt: skip
    if not len(work):
        return pd.DataFrame(columns=_STRAGGLER_ROWS)
    names = ("phase", "step", "host")
    keys = [spans[k].to_numpy()[work] for k in names]
    dur = (spans["end_ns"].to_numpy() - spans["start_ns"].to_numpy())[work].astype(np.int64)
    # per rank (process) its summed nanoseconds, then per node its slowest rank's: integer
    # sums and maxima on group codes, in the order of first appearance a group-by gives
    rank = appearance_codes([*keys, spans["pid"].to_numpy()[work]])
    ok = rank >= 0
    per_rank = np.zeros(int(rank.max(initial=-1)) + 1, dtype=np.int64)
    np.add.at(per_rank, rank[ok], dur[ok])
    first = first_rows(rank)
    node = appearance_codes([k[first] for k in keys])
    per_node = np.full(int(node.max(initial=-1)) + 1, np.iinfo(np.int64).min)
    np.maximum.at(per_node, node[node >= 0], per_rank[node >= 0])
    at = work[first[first_rows(node)]]
    return pd.DataFrame(
        {**{k: spans[k].iloc[at].reset_index(drop=True) for k in names}, "dur_ns": per_node}
    )


def _straggler_node(spans: pd.DataFrame, gpus: pd.Series, th: Thresholds) -> dict | None:
    """`_straggler_of` the run's spans."""
    return _straggler_of([_straggler_rows(spans)], gpus, th)


def _straggler_of(rows: list[pd.DataFrame], gpus: pd.Series, th: Thresholds) -> dict | None:
    """The node whose ranks finish their work phases last, if one does in most phase-steps,
    from the `_straggler_rows` of disjoint sets of nodes (taken in (phase, step, host) order:
    the same answer however the nodes are divided).

    Per (phase, step) each node's time is its slowest rank's summed span time; a node is the
    straggler of a phase-step when it exceeds the median of the other nodes by
    ``th.imbalance_spread_frac``. Delay = its excess; GPU-seconds lost = delay × the other
    nodes' GPUs (they wait at the next synchronisation)."""
    rows = [r for r in rows if len(r)]
    if not rows:
        return None
    per_node = pd.concat(rows, ignore_index=True) if len(rows) > 1 else rows[0]
    if per_node["host"].nunique(dropna=False) < 2:
        return None  # one node: no phase-step has another to compare with
    per_node = per_node.sort_values(["phase", "step", "host"], kind="stable", ignore_index=True)
    per_node["dur"] = per_node["dur_ns"].to_numpy(np.float64) / 1e9
    nodes_in = per_node.groupby(["phase", "step"])["host"].transform("size")
    per_node = per_node[nodes_in >= 2]
    if per_node.empty:
        return None
    grp = per_node.groupby(["phase", "step"], sort=False)["dur"]
    per_node["mx"] = grp.transform("max")
    others = per_node["dur"].where(per_node["dur"] < per_node["mx"])
    per_node["med"] = others.groupby([per_node["phase"], per_node["step"]]).transform("median")
    per_node["med"] = per_node["med"].fillna(per_node["mx"])
    slowest = per_node[
        (per_node["dur"] >= per_node["mx"])
        & (per_node["mx"] > per_node["med"] * (1 + th.imbalance_spread_frac))
    ]
    slowest = slowest.drop_duplicates(["phase", "step"])  # fmt: skip
    if slowest.empty:
        return None
    delay = (slowest["mx"] - slowest["med"]).groupby(slowest["host"]).sum()
    node = str(delay.idxmax())
    phase_steps = per_node.drop_duplicates(["phase", "step"]).shape[0]
    if (slowest["host"] == node).sum() < 0.5 * phase_steps:
        return None  # no node is consistently last: per-rank imbalance, not a node
    others_gpus = float(gpus.drop(node, errors="ignore").sum())
    return {
        "node": node,
        "delay_s": round(float(delay[node]), 3),
        "gpu_s": round(float(delay[node]) * others_gpus, 3),
        "phase_steps": int((slowest["host"] == node).sum()),
        "of_phase_steps": int(phase_steps),
    }


def sync_crosses_nodes(
    spans: pd.DataFrame | None,
    coll: Callable[[], pd.DataFrame] | None = None,
    ranks: int | None = None,
) -> bool | None:
    """True when weight sync moves data between nodes (rollout and update on disjoint nodes,
    or a reshard span holding a collective that crosses nodes); None without reshard spans.
    ``coll`` gives `collectives` of ``spans`` and ``ranks`` their `ranks_per_node`, when the
    caller has them. A span without a host is on no node: it counts nowhere, as in a run
    diagnosed node by node."""
    if spans is None or spans.empty or "phase" not in spans:
        return None
    if "host" in spans and spans["host"].isna().any():
        spans = spans[spans["host"].notna().to_numpy(bool)]
    reshard = spans[spans["phase"] == "reshard"]
    if reshard.empty:
        return None
    roll = set(spans.loc[spans["phase"].isin(_ROLLOUT), "host"])
    upd = set(spans.loc[spans["phase"].isin(_UPDATE), "host"])
    if roll and upd and roll.isdisjoint(upd):
        return True  # disaggregated: rollout on some nodes, training on others
    if spans["host"].nunique() < 2:
        return False
    coll = collectives(spans) if coll is None else coll()
    if coll.empty:
        return False
    inside = _inside_reshard(coll, reshard)  # collectives inside a reshard span
    return bool(crosses_nodes(inside["group_size"], spans, ranks).any())


def _alignment(clocks: dict[str, dict], nodes: list[str]) -> dict[str, Any] | None:
    """How well the nodes' clocks were aligned (None: not aligned at all)."""
    aligned = {n: c for n, c in clocks.items() if c.get("method") != "reference"}
    if not aligned:
        return None
    errors = [c.get("error_ns") for c in aligned.values()]
    known = [e for e in errors if isinstance(e, int)]
    return {
        "worst_error_ns": max(known) if known else None,
        "method": ", ".join(sorted({str(c.get("method")) for c in aligned.values()})),
        "nodes_aligned": len(aligned),
        "nodes_unaligned": len([n for n in nodes if n not in clocks]),
    }
