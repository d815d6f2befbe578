"""GPU-time budgets: the labelled GPU samples aggregated by phase, step, host, GPU, rank, pid.

`phase_breakdown` sums the GPU-seconds of `labelling.gpu_phase_samples` per group of keys,
with the wall time the owners spent in each phase taken exactly from their span timeline;
`run_totals` gives the whole run's budget and says which busy measure a figure uses
(``util_gpu_pct``, NVML's "a kernel was running" share, or GPM's ``sm_active_pct``). Pass the
run's spans, owners and samples, when already computed, to skip recomputing them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.analyzers.grouping import appearance_codes, first_rows, group_rows, inner_join_rows
from gpuprof.analyzers.labelling import _samples
from gpuprof.analyzers.ownership import _gpu_owner
from gpuprof.analyzers.spans import NO_PHASE, _label, valid_spans
from gpuprof.model import Run
from gpuprof.phases import CANONICAL_PHASES

_BY_KEYS = ("phase", "step", "host", "gpu", "rank", "pid")
_BREAKDOWN_COLUMNS = [
    "ranks", "gpus", "samples", "wall_s", "gpu_s", "busy_gpu_s", "idle_gpu_s", "unknown_gpu_s",
    "util_gpu_pct", "sm_active_pct", "mem_peak_bytes", "pcie_bytes", "nvlink_bytes", "share",
]  # fmt: skip


def _owner_wall(spans: pd.DataFrame, owners: pd.DataFrame) -> pd.DataFrame:
    """Seconds each GPU owner spent with each (phase, step) as its innermost phase.

    Exact, from the span timeline rather than the samples: between consecutive span boundaries
    the innermost span is constant, so the boundaries themselves are looked up.
    """
    cols = ["owner_host", "pid", "phase", "step", "wall_s"]
    by_proc = group_rows([spans["host"], spans["pid"]]) if len(spans) else {}
    # the owners with a pid, each once (as ``drop_duplicates``), from arrays: a few owner rows
    # do not pay for a frame's selections
    o_host = owners["owner_host"].to_numpy(object)
    o_pid = owners["pid"].to_numpy(np.float64)
    with_pid = np.flatnonzero(~np.isnan(o_pid))
    keys = with_pid[first_rows(appearance_codes([o_host[with_pid], o_pid[with_pid]], True))]
    found: list[tuple[Any, float]] = []
    parts: list[tuple[np.ndarray, ...]] = []
    # the span columns the lookup reads, as arrays (row selections of a frame cost more)
    names = ("phase", "is_step", "depth", "start_ns", "end_ns", "step")
    columns = {c: spans[c].to_numpy() for c in names} if len(spans) else {}
    for o_host_, o_pid_ in zip(o_host[keys], o_pid[keys].tolist()):
        rows = by_proc.get((o_host_, int(o_pid_)))
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
        found.append((o_host_, float(o_pid_)))
    if not parts:
        return pd.DataFrame(
            {"owner_host": pd.Series([], dtype=object), "pid": pd.Series([], dtype=float),
             "phase": pd.Series([], dtype=object), "step": pd.Series([], dtype=float),
             "wall_s": pd.Series([], dtype=float)}
        )  # fmt: skip
    # one group-by over every owner (each owner's rows together, so its groups come out in the
    # order a group-by per owner gives): integer codes of (owner, phase, step), NaN a value
    # like the others (``dropna=False``), summed by pandas as a group-by of the keys sums them
    owner, phase, step, wall_s = (np.concatenate([p[i] for p in parts]) for i in range(4))
    group = appearance_codes([owner, phase, step], missing_is_value=True)
    first = first_rows(group)
    sums = pd.Series(wall_s, copy=False).groupby(group, sort=False).sum().to_numpy()
    owner = owner[first]
    hosts = pd.Series([h for h, _ in found])  # the dtype a column of these hosts gets
    return pd.DataFrame(
        {
            "owner_host": hosts.iloc[owner].reset_index(drop=True),
            "pid": np.array([p for _, p in found], dtype=np.float64)[owner],
            "phase": phase[first],
            "step": step[first],
            "wall_s": sums,
        }
    )[cols]


def phase_breakdown(
    run: Run,
    by: Sequence[str] = ("phase",),
    samples: pd.DataFrame | None = None,
    *,
    spans: pd.DataFrame | None = None,
    owners: pd.DataFrame | None = None,
    owner_wall: pd.DataFrame | None = None,
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
    (`gpu_owner`) to avoid recomputing them, and ``owner_wall`` (`_owner_wall` of those spans
    and owners) when several breakdowns of one run are made.
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

    return finish_breakdown(by, [partial_breakdown(by, samples, spans, owners, owner_wall)])


_SUMMED = ["ranks", "gpus", "samples", "gpu_s", "unknown_gpu_s", "util_w", "util_dt", "sm_w",
           "sm_dt"]  # fmt: skip
_MEASURED = ["busy_gpu_s", "idle_gpu_s", "pcie_bytes", "nvlink_bytes"]


def partial_breakdown(
    by: Sequence[str],
    samples: pd.DataFrame,
    spans: pd.DataFrame,
    owners: pd.DataFrame,
    owner_wall: pd.DataFrame | None = None,
) -> dict[str, Any]:
    """`phase_breakdown` of one part of a run (`parts.Parts`), before its groups meet the
    other parts': per group of ``by`` and host its sums (owners and GPUs belong to one host,
    so their counts add up too), the wall seconds of each owner and, for ``"(none)"``, of
    each GPU (averaged once every part's are together), and the part's GPU-seconds per host.
    `finish_breakdown` puts the parts together, adding the hosts' sums in the order of their
    names: the same figures to the last bit however the hosts are divided between parts."""
    by = list(by)
    s = samples
    if s.empty:
        return {"groups": None, "owners": None, "outside": None, "gpu_s": 0.0}
    dt = s["dt_s"].to_numpy()
    util, sm = s["util_gpu_pct"].to_numpy(), s["sm_active_pct"].to_numpy()
    # the groups as integer codes, in order of first appearance (NaN keys make groups of their
    # own, as groupby(dropna=False) does); the sums in row order (`group_sums`)
    group = appearance_codes([*(s[k] for k in by), s["host"]], missing_is_value=True)
    first = first_rows(group)
    n_groups = len(first)
    summed = {
        "gpu_s": dt,
        "unknown_gpu_s": np.where(np.isnan(util), dt, 0.0),
        "util_w": util * dt,
        "util_dt": np.where(np.isnan(util), 0.0, dt),
        "sm_w": sm * dt,
        "sm_dt": np.where(np.isnan(sm), 0.0, dt),
    }
    owner = appearance_codes([s["owner_host"], s["pid"]])
    owner[s["pid"].isna().to_numpy()] = -1  # no owner: not counted
    # the table's columns made first and put in a frame once (each column added to a frame
    # costs more than its figures)
    table: dict[str, Any] = {k: s[k].iloc[first].reset_index(drop=True) for k in by}
    table["_host"] = s["host"].iloc[first].to_numpy(object)
    table["ranks"] = _distinct_per_group(group, owner, n_groups)
    table["gpus"] = _distinct_per_group(group, appearance_codes([s["host"], s["gpu"]]), n_groups)
    table["samples"] = np.bincount(group, minlength=n_groups)
    for col, values in summed.items():
        table[col] = group_sums(group, n_groups, values)
    table["mem_peak_bytes"] = group_max(group, n_groups, s["mem_used_bytes"].to_numpy())
    for col in _MEASURED:  # NaN, not 0, when no sample of the group measured the quantity
        table[col] = group_sums(group, n_groups, s[col].to_numpy(), min_count=1)
    per_owner, outside = _wall_parts(by, spans, owners, s, owner_wall)
    return {"groups": pd.DataFrame(table), "owners": per_owner, "outside": outside,
            "gpu_s": host_sums(s, gpu_s=dt)["gpu_s"]}  # fmt: skip


def finish_breakdown(by: Sequence[str], partials: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """The `phase_breakdown` of a run from its parts' `partial_breakdown` (one part: the
    whole run's, figure for figure)."""
    by = list(by)
    groups = [p["groups"] for p in partials if p["groups"] is not None]
    if not groups:
        return pd.DataFrame(
            {**{k: pd.Series([], dtype=object if k in ("phase", "host") else float) for k in by},
             **{c: pd.Series([], dtype=float) for c in _BREAKDOWN_COLUMNS}}
        )  # fmt: skip
    joined = pd.concat(groups, ignore_index=True) if len(groups) > 1 else groups[0]
    # each group's hosts in the order of their names (no host last), whatever the parts
    host = joined["_host"].to_numpy(object)
    order = np.lexsort((np.array([str(h) for h in host], dtype=object), pd.isna(host)))
    keys = {k: joined[k].iloc[order] for k in by}
    if len(groups) > 1:  # the parts' categories differ: their labels as they are
        keys = {k: v.astype(object) if isinstance(v.dtype, pd.CategoricalDtype) else v
                for k, v in keys.items()}  # fmt: skip
    group = appearance_codes(list(keys.values()), missing_is_value=True)
    first = first_rows(group)
    n = len(first)
    table: dict[str, Any] = {k: v.iloc[first].reset_index(drop=True) for k, v in keys.items()}
    for col in _SUMMED:
        table[col] = group_sums(group, n, joined[col].to_numpy()[order])
    table["mem_peak_bytes"] = group_max(group, n, joined["mem_peak_bytes"].to_numpy()[order])
    for col in _MEASURED:
        table[col] = group_sums(group, n, joined[col].to_numpy()[order], min_count=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        table["util_gpu_pct"] = np.where(table["util_dt"] > 0, table["util_w"] / table["util_dt"],
                                         np.nan)  # fmt: skip
        table["sm_active_pct"] = np.where(table["sm_dt"] > 0, table["sm_w"] / table["sm_dt"],
                                          np.nan)  # fmt: skip
    total = add_hosts([p["gpu_s"] for p in partials if p["groups"] is not None])
    table["share"] = table["gpu_s"] / total if total > 0 else np.full(n, np.nan)
    # the wall seconds of each group, joined on the keys by pandas (the keys come out with the
    # dtypes its join gives them), then the rows in the breakdown's order
    rows = pd.DataFrame({**{k: table[k] for k in by}, "_row": np.arange(n)})
    joined_wall = rows.merge(_wall_finish(by, partials), on=by, how="left")
    row = joined_wall["_row"].to_numpy()
    order = _sort_order({k: joined_wall[k] for k in by})
    out = {k: joined_wall[k].iloc[order].reset_index(drop=True) for k in by}
    for col in _BREAKDOWN_COLUMNS:
        values = joined_wall[col].to_numpy() if col == "wall_s" else table[col][row]
        out[col] = values[order]
    return pd.DataFrame(out)


def group_sums(
    group: np.ndarray, n_groups: int, values: np.ndarray, min_count: int = 0
) -> np.ndarray:
    """Per group (codes ``0…n_groups-1``) the sum of ``values`` in row order, NaN counted as 0
    (NaN where fewer than ``min_count`` values are not NaN): a sum that depends only on the
    group's own rows, however many other groups there are."""
    v = np.asarray(values, dtype=np.float64)
    ok = ~np.isnan(v)
    out = np.bincount(group, weights=np.where(ok, v, 0.0), minlength=n_groups)
    if min_count:
        out[np.bincount(group, weights=ok.astype(np.float64), minlength=n_groups) < min_count] = (
            np.nan
        )
    return out


def group_max(group: np.ndarray, n_groups: int, values: np.ndarray) -> np.ndarray:
    """Per group (codes ``0…n_groups-1``, every one used) the largest of ``values``, NaN
    skipped (NaN where all are): a group-by's ``max``, without building one."""
    out = np.full(n_groups, np.nan)
    np.fmax.at(out, group, np.asarray(values, dtype=np.float64))
    return out


def keyed_sums(frame: pd.DataFrame, keys: list[str], columns: list[str]) -> pd.DataFrame:
    """Per group of ``keys`` (rows with a missing key left out; groups in order of first
    appearance, indexed by their keys), the sums of ``columns`` in row order (`group_sums`):
    each group's sums depend on its own rows alone. pandas' group-by sums do not — the same
    rows of one GPU sum to another last bit inside a larger frame — so a part's sums would
    not be the whole run's."""
    # the group-by's codes (`appearance_codes`: -1 where a key is missing), found on arrays
    codes = appearance_codes([frame[k] for k in keys])
    first = first_rows(codes)
    ok = codes >= 0
    index = pd.MultiIndex.from_arrays([frame[k].iloc[first] for k in keys], names=keys) if (
        len(keys) > 1) else pd.Index(frame[keys[0]].iloc[first], name=keys[0])  # fmt: skip
    return pd.DataFrame(
        {c: group_sums(codes[ok], len(first), frame[c].to_numpy(np.float64)[ok]) for c in columns},
        index=index,
    )


def _distinct_per_group(group: np.ndarray, values: np.ndarray, n_groups: int) -> np.ndarray:
    """How many distinct ``values`` (integer codes; -1 not counted) each group has."""
    ok = values >= 0
    width = int(values.max(initial=0)) + 1
    pair = group[ok] * width + values[ok]
    if n_groups * width <= 4 * len(group) + 1024:  # a table of (group, value) counts
        seen = np.bincount(pair, minlength=n_groups * width).reshape(n_groups, width) > 0
        return seen.sum(axis=1)
    return np.bincount(np.unique(pair) // width, minlength=n_groups)


def _wall_parts(
    by: list[str],
    spans: pd.DataFrame,
    owners: pd.DataFrame,
    samples: pd.DataFrame,
    wall: pd.DataFrame | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """One part's wall seconds (see `phase_breakdown`'s ``wall_s``) before averaging: per
    group of ``by`` keys and owner (the keys, ``wall_s``), and, when ``phase`` is a key, the
    sampled seconds outside every span per group and GPU (the keys, ``host``, ``gpu``,
    ``dt_s``; None when there are none); ``wall``: `_owner_wall`.

    Figured on integer codes of the keys, in the order and with the sums of the group-bys on
    the owners joined to their wall rows (a handful of rows, where each frame operation cost
    more than the figures)."""
    wall = _owner_wall(spans, owners) if wall is None else wall
    # the owners with a pid joined to their wall rows, as an inner merge pairs them
    with_pid = np.flatnonzero(owners["pid"].notna().to_numpy())
    left, right = inner_join_rows(
        [owners["owner_host"].to_numpy()[with_pid], owners["pid"].to_numpy()[with_pid]],
        [wall["owner_host"], wall["pid"]],
    )
    left = with_pid[left]

    def side(name: str) -> tuple[pd.DataFrame, np.ndarray]:  # the joined rows' source
        return (wall, right) if name in ("phase", "step") else (owners, left)

    def values(name: str) -> Any:  # a joined column as a group-by compares it
        frame, rows = side(name)
        column = frame[name]
        if isinstance(column.dtype, pd.CategoricalDtype):
            return column.iloc[rows]
        return column.to_numpy()[rows]

    keys_gpu = list(dict.fromkeys([*by, "owner_host", "pid", "host", "gpu"]))
    keys_owner = list(dict.fromkeys([*by, "owner_host", "pid"]))
    # one owner may drive several GPUs: sum per GPU (pandas' sums, in row order), then count
    # each owner once (its first GPU's sum)
    columns = {k: values(k) for k in keys_gpu}
    per_gpu = appearance_codes(list(columns.values()), missing_is_value=True)
    sums = wall["wall_s"].iloc[right].groupby(per_gpu, sort=False).sum().to_numpy()
    first = first_rows(per_gpu)
    owner = appearance_codes(
        [c.iloc[first] if isinstance(c, pd.Series) else c[first]
         for c in (columns[k] for k in keys_owner)],
        missing_is_value=True,
    )  # fmt: skip
    once = first_rows(owner)
    rows = first[once]

    def joined(name: str) -> pd.Series:  # the key of the chosen rows, as the join types it
        frame, at = side(name)
        return frame[name].iloc[at[rows]].reset_index(drop=True)

    agg = pd.DataFrame({**{k: joined(k) for k in by}, "wall_s": sums[once]})
    if "phase" not in by:
        return agg, None
    keys = list(dict.fromkeys([*by, "host", "gpu"]))
    outside = np.flatnonzero((samples["phase"] == NO_PHASE).to_numpy())
    if not len(outside):
        return agg, None
    return agg, _keyed_totals(samples, outside, keys, "dt_s", "sum")


def _keyed_totals(
    frame: pd.DataFrame, rows: np.ndarray, keys: list[str], value: str, how: str
) -> pd.DataFrame:
    """``frame.iloc[rows].groupby(keys, dropna=False, sort=False)[value].agg(how)
    .reset_index()`` (``how``: ``"sum"`` or ``"mean"``), the keys taken from their first
    rows (their dtypes kept) and the group-by run on one integer code."""
    group = appearance_codes([frame[k].iloc[rows] for k in keys], missing_is_value=True)
    first = rows[first_rows(group)]
    values = frame[value].iloc[rows].groupby(group, sort=False).agg(how).to_numpy()
    return pd.DataFrame(
        {**{k: frame[k].iloc[first].reset_index(drop=True) for k in keys}, value: values}
    )


def _wall_finish(by: list[str], partials: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """``wall_s`` per group of ``by`` keys: the parts' `_wall_parts` averaged over the owners
    (over the GPUs for ``"(none)"``)."""
    owners = [p["owners"] for p in partials if p["owners"] is not None]
    agg = pd.concat(owners, ignore_index=True) if len(owners) > 1 else owners[0]
    spans_wall = _keyed_totals(agg, np.arange(len(agg)), by, "wall_s", "mean")
    outside = [p["outside"] for p in partials if p["outside"] is not None]
    if not outside:
        return spans_wall
    outside = pd.concat(outside, ignore_index=True) if len(outside) > 1 else outside[0]
    if len(partials) > 1:
        for k in by:
            if isinstance(outside[k].dtype, pd.CategoricalDtype):
                outside[k] = outside[k].astype(object)
    none_wall = _keyed_totals(outside, np.arange(len(outside)), by, "dt_s", "mean")
    return pd.concat([spans_wall, none_wall.rename(columns={"dt_s": "wall_s"})],
                     ignore_index=True)  # fmt: skip


def _sort_order(keys: dict[str, pd.Series]) -> np.ndarray:
    """The order that sorts rows by their ``keys`` (stable, missing values last); phases in
    canonical order, unknown names after (by name), ``"(none)"`` last: what a stable
    ``sort_values`` on the keys gives, from one ``np.lexsort`` of the keys' ranks."""
    ranks = []
    for name, column in keys.items():
        if name == "phase":
            order = {p: i for i, p in enumerate(CANONICAL_PHASES)}
            values = column.to_numpy(object)
            rank = np.array(
                [len(order) + 1 if p == NO_PHASE else order.get(p, len(order)) for p in values],
                dtype=np.int64,
            )
            ranks += [rank, _rank(column.astype(str))]
        else:
            ranks.append(_rank(column))
    return np.lexsort(ranks[::-1]) if ranks else np.arange(0)


def _rank(column: pd.Series) -> np.ndarray:
    """Each value's place among the column's sorted distinct values, missing values after
    every other (the ranks a sort of the column by value orders its rows by)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        codes = column.cat.codes.to_numpy(np.int64)
        n = len(column.cat.categories)
    else:
        codes, uniques = pd.factorize(column, sort=True)
        n = len(uniques)
    return np.where(codes < 0, n, codes)


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
    return finish_totals([partial_totals(samples, owners, dropped)])


def partial_totals(samples: pd.DataFrame, owners: pd.DataFrame, dropped: int) -> dict[str, Any]:
    """`run_totals` of one part of a run (`parts.Parts`), as sums that add up over the parts
    (`finish_totals`); ``dropped``: the part's spans that ended before they started.

    Each sum is kept per host (`host_sums`) and the hosts' sums are added in the order of
    their names when finished, so a run gives the same figures to the last bit however its
    nodes are divided between parts."""
    dt = samples["dt_s"].to_numpy(np.float64)
    util = samples["util_gpu_pct"].to_numpy(np.float64)
    sm = samples["sm_active_pct"].to_numpy(np.float64)
    idle = samples["idle_gpu_s"].to_numpy(np.float64)
    in_span = samples["in_span"].to_numpy(bool)
    has_util, has_sm = ~np.isnan(util), ~np.isnan(sm)
    sums = host_sums(
        samples,
        gpu_s=dt,
        util_dt=np.where(has_util, dt, 0.0),
        sm_dt=np.where(has_sm, dt, 0.0),
        busy_gpu_s=samples["busy_gpu_s"].to_numpy(np.float64),
        idle_gpu_s=idle,
        unknown_gpu_s=np.where(has_util, 0.0, dt),
        idle_in_spans_gpu_s=np.where(in_span, idle, 0.0),
        idle_outside_spans_gpu_s=np.where(in_span, 0.0, idle),
        util_w=np.where(has_util, util * dt, 0.0),
        sm_w=np.where(has_sm, sm * dt, 0.0),
        sm_busy_gpu_s=samples["sm_busy_gpu_s"].to_numpy(np.float64),
    )
    return {
        **sums,
        "gpus": len(owners),
        "samples": len(samples),
        "owners": {str(k): int(v) for k, v in owners["how"].value_counts().items()},
        "unowned_gpus": int((owners["how"] == "none").sum()),
        "spans_dropped": int(dropped),
    }


def host_sums(samples: pd.DataFrame, **columns: np.ndarray) -> dict[str, dict[Any, float]]:
    """Per name in ``columns``, the sum of its values (NaN counted as 0) per host of
    ``samples`` (rows in order), as ``{host: sum}`` over the hosts with rows; `add_hosts`
    adds them up."""
    host = samples["host"]
    if isinstance(host.dtype, pd.CategoricalDtype):
        codes = host.cat.codes.to_numpy(np.int64)
        names = np.asarray(host.cat.categories, dtype=object)
    else:
        codes, names = pd.factorize(host.to_numpy(object))
        names = np.asarray(names, dtype=object)
    codes = np.where(codes < 0, len(names), codes)  # no host: a bucket of its own
    names = np.append(names, None)
    present = np.flatnonzero(np.bincount(codes, minlength=len(names)))
    out = {}
    for key, values in columns.items():
        per = group_sums(codes, len(names), values)
        out[key] = {names[i]: float(per[i]) for i in present}
    return out


def add_hosts(partials: Sequence[dict[Any, float]]) -> float:
    """The hosts' sums of `host_sums` from every part, added in the order of the hosts'
    names (rows without a host last): the same float however the hosts are divided."""
    items = sorted(
        (kv for p in partials for kv in p.items()),
        key=lambda kv: (kv[0] is None, str(kv[0])),
    )
    return float(sum(v for _, v in items))


def finish_totals(partials: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The `run_totals` of a run from its parts' `partial_totals` (one part: the whole
    run's)."""

    def total(key: str) -> Any:
        values = [p[key] for p in partials]
        return add_hosts(values) if isinstance(values[0], dict) else sum(values)

    gpu_s, util_dt, sm_dt = total("gpu_s"), total("util_dt"), total("sm_dt")
    owners: dict[str, int] = {}
    for p in partials:
        for how, n in p["owners"].items():
            owners[how] = owners.get(how, 0) + n
    if len(partials) > 1:  # in the order value_counts gives them: most first, then first seen
        owners = dict(sorted(owners.items(), key=lambda item: -item[1]))
    return {
        "gpus": total("gpus"),
        "samples": total("samples"),
        "gpu_s": gpu_s,
        "busy_gpu_s": total("busy_gpu_s") if util_dt else None,
        "idle_gpu_s": total("idle_gpu_s") if util_dt else None,
        "unknown_gpu_s": total("unknown_gpu_s"),
        "idle_in_spans_gpu_s": total("idle_in_spans_gpu_s") if util_dt else None,
        "idle_outside_spans_gpu_s": total("idle_outside_spans_gpu_s") if util_dt else None,
        "util_gpu_pct": total("util_w") / util_dt if util_dt > 0 else None,
        "busy_measure": "util_gpu_pct",
        "busy_measure_note": "share of time a kernel was running (NVML utilization.gpu), "
        "not SM activity; see sm_active_pct where GPM is available",
        "sm_active_pct": total("sm_w") / sm_dt if sm_dt > 0 else None,
        "sm_busy_gpu_s": total("sm_busy_gpu_s") if sm_dt else None,
        "sm_active_coverage": sm_dt / gpu_s if gpu_s > 0 else None,
        "owners": owners,
        "unowned_gpus": total("unowned_gpus"),
        "spans_dropped": total("spans_dropped"),
    }
