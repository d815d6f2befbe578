"""The alignment computed with numpy group codes (`analyzers.spans`, `.ownership`,
`.labelling`, `.breakdown`) equals the straightforward pandas formulation it replaced: sort,
join, group-by, categoricals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpuprof import store
from gpuprof.analyzers.breakdown import _owner_wall, phase_breakdown
from gpuprof.analyzers.labelling import _object_labels, _samples, _samples_joined
from gpuprof.analyzers.ownership import (
    _gpu_inventory,
    _gpu_owner,
    _nvml_owners,
    _parent_map,
    _process_events,
    _recording_ancestor,
)
from gpuprof.analyzers.spans import _label, _num, valid_spans
from gpuprof.loader import load_for_analysis
from gpuprof.model import Run, RunMeta
from gpuprof.sim import Pathology, SimConfig, simulate

# --------------------------------------------------------------------------------------------
# Reference implementations


def ref_inventory(run: Run) -> pd.DataFrame:
    rows = [
        (g.get("host"), g.get("index"), g.get("uuid"))
        for g in (run.meta.gpus or [])
        if isinstance(g, dict) and g.get("host") is not None and g.get("index") is not None
    ]
    meta = pd.DataFrame(rows, columns=["host", "gpu", "uuid"])
    gpu = run.gpu
    if gpu is not None and len(gpu):
        seen = pd.DataFrame(
            {
                "host": gpu["host"].astype(object),
                "gpu": _num(gpu, "gpu"),
                "uuid": gpu["uuid"].astype(object) if "uuid" in gpu else None,
            }
        )
        seen = seen[seen["host"].notna() & seen["gpu"].notna()]
        meta = pd.concat([meta.astype({"gpu": np.float64}), seen], ignore_index=True)
    meta["gpu"] = meta["gpu"].astype(np.int64)
    meta["host"] = meta["host"].astype(str)
    inv = meta.groupby(["host", "gpu"], sort=True)["uuid"].first().reset_index()
    inv["uuid"] = inv["uuid"].astype(object)
    return inv


def ref_samples(run: Run, spans: pd.DataFrame, owners: pd.DataFrame) -> pd.DataFrame:
    """Sort the samples by GPU and time with pandas, join the owners row by row, label each
    owner's samples (`_label`), make the labels categoricals of every row."""
    frame = _samples_joined(run, spans, owners)
    frame["phase"] = pd.Categorical(frame["phase"].to_numpy(object))
    return frame


def ref_owner_wall(spans: pd.DataFrame, owners: pd.DataFrame) -> pd.DataFrame:
    cols = ["owner_host", "pid", "phase", "step", "wall_s"]
    parts = []
    by_proc = spans.groupby(["host", "pid"], sort=False).indices if len(spans) else {}
    keys = owners.dropna(subset=["pid"])[["owner_host", "pid"]].drop_duplicates()
    for o_host, o_pid in zip(keys["owner_host"], keys["pid"]):
        rows = by_proc.get((o_host, int(o_pid)))
        if rows is None:
            continue
        proc_spans = spans.iloc[rows].reset_index(drop=True)
        bounds = np.unique(
            np.concatenate([proc_spans["start_ns"].to_numpy(), proc_spans["end_ns"].to_numpy()])
        )
        if len(bounds) < 2:
            continue
        phase, step, covered = _label(proc_spans, bounds[:-1])
        part = pd.DataFrame({"phase": phase, "step": step, "wall_s": np.diff(bounds) / 1e9})
        part = part[covered].groupby(["phase", "step"], dropna=False, sort=False)["wall_s"].sum()
        parts.append(part.reset_index().assign(owner_host=o_host, pid=float(o_pid)))
    return pd.concat(parts, ignore_index=True)[cols]


def _same_labels(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """Equal frames; categorical labels compared as values (their categories: the same names
    in the same order, as Python strings here)."""
    for name in ("host", "owner_host", "phase"):
        assert list(got[name].cat.categories) == list(want[name].cat.categories)
        want = want.assign(**{name: _object_labels(want[name].array)})
    pd.testing.assert_frame_equal(got, want, check_exact=True)


def ref_parent_map(run: Run) -> dict[tuple[str, int], int]:
    parents: dict[tuple[str, int], int] = {}
    procs = run.procs
    if procs is not None and len(procs) and "ppid" in procs:
        p = pd.DataFrame(
            {"host": procs["host"].astype(object), "pid": _num(procs, "pid"),
             "ppid": _num(procs, "ppid")}
        ).dropna().drop_duplicates(["host", "pid"], keep="last")  # fmt: skip
        parents.update({(h, int(c)): int(q) for h, c, q in zip(p["host"], p["pid"], p["ppid"])})
    ev = _process_events(run).dropna(subset=["ppid"])
    parents.update({(h, int(c)): int(q) for h, c, q in zip(ev["host"], ev["pid"], ev["ppid"])})
    return parents


def ref_nvml_owners(run: Run, recording: set[tuple[str, int]]) -> dict:
    gp = run.gpu_procs
    if gp is None or gp.empty or not recording:
        return {}
    frame = pd.DataFrame(
        {"host": gp["host"].astype(object), "gpu": _num(gp, "gpu"),
         "pid": _num(gp, "pid"), "mem": _num(gp, "gpu_mem_bytes")}
    ).dropna(subset=["host", "gpu", "pid"])  # fmt: skip
    frame = frame[~(frame["mem"] <= 0)]
    if frame.empty:
        return {}
    cand = (
        frame.groupby(["host", "gpu", "pid"], sort=False)
        .agg(mem=("mem", "max"), seen=("mem", "size"))
        .reset_index()
    )
    parents = ref_parent_map(run)
    found = [_recording_ancestor(h, int(p), recording, parents)
             for h, p in zip(cand["host"], cand["pid"])]  # fmt: skip
    cand["owner_pid"] = [f for f, _ in found]
    cand["direct"] = [d for _, d in found]
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


def _text_as_objects(frame: pd.DataFrame) -> pd.DataFrame:
    """Label columns as Python strings: the tables built from object categories hold object
    columns where those built from pandas' default ``str`` categories hold ``str`` ones."""
    kinds = (pd.StringDtype, pd.CategoricalDtype)
    return frame.astype({c: object for c in frame if isinstance(frame[c].dtype, kinds)})


# --------------------------------------------------------------------------------------------
# Runs


def _runs(tmp_path) -> list[Run]:
    runs = [
        simulate(SimConfig(gpus=8, steps=4, seed=1,
                           pathologies=[Pathology("reward_bound", 0.6)])).run,
        simulate(SimConfig(gpus=16, gpus_per_host=8, steps=3, seed=2, framework="trl")).run,
        simulate(SimConfig(gpus=3, steps=4, seed=3, framework="openrlhf",
                           pathologies=[Pathology("unused_gpu", 0.8)])).run,
        simulate(SimConfig(gpus=2, steps=3, seed=4, algorithm="ppo", framework="swift")).run,
    ]  # fmt: skip
    store.save_run(runs[0], tmp_path / "merged")
    runs.append(load_for_analysis(tmp_path / "merged", merge=5))  # merged, as long runs are
    # shuffled rows, a missing host / gpu / time, a GPU without a uuid at first
    odd = simulate(SimConfig(gpus=4, steps=3, seed=5)).run
    gpu = odd.gpu.sample(frac=1.0, random_state=0).reset_index(drop=True)
    gpu = gpu.astype({"host": object, "uuid": object, "t_ns": np.float64, "gpu": np.float64})
    gpu.loc[3, "host"] = None
    gpu.loc[5, "gpu"] = np.nan
    gpu.loc[7, "t_ns"] = np.nan
    first_of_gpu1 = gpu.index[gpu["gpu"] == 1][:3]
    gpu.loc[first_of_gpu1, "uuid"] = [None, np.nan, None]
    gpu.loc[gpu["gpu"] == 2, "uuid"] = None
    odd.gpu = gpu
    runs.append(odd)
    return runs


def test_inventory_samples_and_breakdowns_match_the_reference(tmp_path):
    for run in _runs(tmp_path):
        pd.testing.assert_frame_equal(_gpu_inventory(run), ref_inventory(run))
        spans, _ = valid_spans(run)
        owners = _gpu_owner(run, spans)
        got = _samples(run, spans, owners)
        want = ref_samples(run, spans, owners)
        _same_labels(got, want)
        pd.testing.assert_frame_equal(
            _owner_wall(spans, owners), ref_owner_wall(spans, owners), check_exact=True
        )
        for by in (("phase",), ("phase", "step"), ("host", "gpu"), ("rank",), ("phase", "pid")):
            a = phase_breakdown(run, by, got, spans=spans, owners=owners)
            b = phase_breakdown(run, by, want, spans=spans, owners=owners)
            a, b = _text_as_objects(a), _text_as_objects(b)
            pd.testing.assert_frame_equal(a, b, check_exact=True)


def test_several_owner_rows_for_one_gpu_join_row_by_row():
    run = simulate(SimConfig(gpus=2, steps=2, seed=6)).run
    spans, _ = valid_spans(run)
    owners = _gpu_owner(run, spans)
    doubled = pd.concat([owners, owners.iloc[:1]], ignore_index=True)  # GPU 0 listed twice
    got = _samples(run, spans, doubled)
    assert len(got) == len(run.gpu) + int((run.gpu["gpu"] == owners["gpu"].iloc[0]).sum())
    _same_labels(got, ref_samples(run, spans, doubled))


@pytest.mark.parametrize("seed", range(8))
def test_nvml_owners_and_parents_match_the_reference(seed):
    """Random process listings: repeated, missing and zero-memory rows, children of ranks."""
    rng = np.random.default_rng(50 + seed)
    run = simulate(SimConfig(gpus=4, steps=2, seed=seed)).run
    spans, _ = valid_spans(run)
    recording = {(h, int(p)) for h, p in zip(spans["host"], spans["pid"])}
    pids = sorted({p for _, p in recording})
    n = int(rng.integers(1, 300))
    host = rng.choice(np.array([*{h for h, _ in recording}, None], dtype=object), n)
    pid = rng.choice(np.array([*pids, 7001, 7002, np.nan], dtype=float), n)
    run.gpu_procs = pd.DataFrame(
        {"host": host, "t_ns": np.arange(n), "gpu": rng.choice([0.0, 1.0, 3.0, np.nan], n),
         "pid": pid, "gpu_mem_bytes": rng.choice([0.0, 5e9, 7e9, np.nan], n),
         "sm_util_pct": np.nan, "watched": True}
    )  # fmt: skip
    m = int(rng.integers(1, 200))
    run.procs = pd.DataFrame(
        {"host": rng.choice(host, m), "t_ns": np.arange(m),
         "pid": rng.choice([7001.0, 7002.0, 7003.0, np.nan], m),
         "ppid": rng.choice(np.array([*pids, 7001, 1, np.nan], dtype=float), m)}
    )  # fmt: skip
    assert _parent_map(run) == ref_parent_map(run)
    assert _nvml_owners(run, recording) == ref_nvml_owners(run, recording)


@pytest.mark.parametrize("seed", range(6))
def test_inventory_first_uuid_per_gpu(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    gpu = pd.DataFrame(
        {
            "host": rng.choice(np.array(["b", "a", None], dtype=object), n, p=[0.45, 0.45, 0.1]),
            "gpu": rng.choice([0.0, 1.0, 2.0, np.nan], n),
            "uuid": rng.choice(np.array(["U1", "U2", None, np.nan], dtype=object), n),
            "t_ns": np.arange(n, dtype=np.int64),
        }
    )
    meta = RunMeta(run_id="r", gpus=[{"host": "a", "index": 5, "uuid": None},
                                     {"host": "b", "index": 0, "uuid": "META"}])  # fmt: skip
    run = Run(meta=meta, gpu=gpu)
    pd.testing.assert_frame_equal(_gpu_inventory(run), ref_inventory(run))
