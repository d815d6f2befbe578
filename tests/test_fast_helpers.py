"""The numpy helpers that replaced pandas joins and group-bys in the detectors give exactly what
the pandas formulations they replaced give (random data: ties, gaps, missing keys)."""

from __future__ import annotations

import types

import numpy as np
import pandas as pd
import pytest

from gpuprof.analyzers import resample
from gpuprof.analyzers.grouping import _factorize, appearance_codes, asof_backward, stable_order
from gpuprof.analyzers.ownership import _first_rows
from gpuprof.analyzers.stalls._resource import _first_of_each, _inside, _runs
from gpuprof.analyzers.stalls.phantom_util import _with_process
from gpuprof.analyzers.texts import as_texts

# --------------------------------------------------------------------------------------------
# Reference implementations: as the helpers were first written


def ref_inside(samples: pd.DataFrame, spans: pd.DataFrame) -> np.ndarray:
    out = np.full(len(samples), -1, dtype=np.int64)
    if samples.empty or spans.empty:
        return out
    left = pd.DataFrame(
        {"t_ns": samples["t_ns"].to_numpy(np.int64),
         "owner_host": samples["owner_host"].astype(object).to_numpy(),
         "pid": pd.to_numeric(samples["pid"]).to_numpy(np.float64),
         "row": np.arange(len(samples))}
    ).dropna(subset=["owner_host", "pid"])  # fmt: skip
    if left.empty:
        return out
    right = pd.DataFrame(
        {"t_ns": spans["start_ns"].to_numpy(np.int64),
         "owner_host": spans["host"].astype(object).to_numpy(),
         "pid": spans["pid"].to_numpy(np.float64), "end_ns": spans["end_ns"].to_numpy(np.int64),
         "pos": np.arange(len(spans))}
    )  # fmt: skip
    merged = pd.merge_asof(
        left.sort_values("t_ns", kind="stable"), right.sort_values("t_ns", kind="stable"),
        on="t_ns", by=["owner_host", "pid"], direction="backward",
    )  # fmt: skip
    hit = merged["pos"].notna().to_numpy() & (
        merged["t_ns"].to_numpy() < merged["end_ns"].to_numpy(np.float64, na_value=-1.0)
    )
    out[merged["row"].to_numpy()[hit]] = merged["pos"].to_numpy()[hit].astype(np.int64)
    return out


def ref_runs(s: pd.DataFrame, mask: np.ndarray, weight: np.ndarray) -> pd.DataFrame:
    if s.empty or not mask.any():  # integer times even when empty (they are joined)
        return pd.DataFrame({"start_ns": np.zeros(0, np.int64), "end_ns": np.zeros(0, np.int64),
                             "w": np.zeros(0)})  # fmt: skip
    gid = s.groupby(["host", "gpu"], sort=False).ngroup().to_numpy()
    m = mask.astype(bool)
    brk = np.ones(len(s), dtype=bool)
    brk[1:] = (gid[1:] != gid[:-1]) | (m[1:] != m[:-1])
    run_id = np.cumsum(brk)
    t = s["t_ns"].to_numpy(np.int64)
    end = t + np.round(s["dt_s"].to_numpy(np.float64) * 1e9).astype(np.int64)
    f = pd.DataFrame({"run": run_id[m], "t": t[m], "e": end[m], "w": weight[m]})
    agg = f.groupby("run").agg(start_ns=("t", "min"), end_ns=("e", "max"), w=("w", "sum"))
    return agg.reset_index(drop=True)


def ref_with_process(procs: pd.DataFrame, s: pd.DataFrame) -> np.ndarray:
    out = np.zeros(len(s), dtype=bool)
    mem = pd.to_numeric(procs["gpu_mem_bytes"], errors="coerce").fillna(1.0)
    held = procs[mem.to_numpy() > 0]
    if held.empty:
        return out
    right = pd.DataFrame(
        {"t_ns": pd.to_numeric(held["t_ns"]).astype(np.int64), "host": held["host"].astype(str),
         "gpu": pd.to_numeric(held["gpu"]).astype(np.int64), "seen": True}
    ).sort_values("t_ns", kind="stable")  # fmt: skip
    left = pd.DataFrame(
        {"t_ns": s["t_ns"].to_numpy(np.int64), "host": s["host"].astype(str).reset_index(drop=True),
         "gpu": s["gpu"].to_numpy(np.int64), "pos": np.arange(len(s))}
    ).sort_values("t_ns", kind="stable")  # fmt: skip
    dt = s["dt_s"].to_numpy(np.float64)
    tolerance = int(max(1.0, float(np.nanmedian(dt)) if np.isfinite(dt).any() else 1.0) * 2e9)
    merged = pd.merge_asof(
        left, right, on="t_ns", by=["host", "gpu"], direction="nearest", tolerance=tolerance
    )
    out[merged["pos"].to_numpy()] = merged["seen"].fillna(False).to_numpy(bool)
    return out


def ref_first_rows(host: pd.Series, number: np.ndarray, uuid: pd.Series | None) -> np.ndarray:
    host_code = pd.factorize(host)[0].astype(np.int64)
    rows = np.flatnonzero((host_code >= 0) & ~np.isnan(number))
    gpu_code = pd.factorize(number[rows])[0].astype(np.int64)
    key = host_code[rows] * (int(gpu_code.max(initial=0)) + 1) + gpu_code
    codes = pd.factorize(key)[0]
    new = np.ones(len(codes), dtype=bool)
    new[1:] = codes[1:] > np.maximum.accumulate(codes)[:-1]
    first = np.flatnonzero(new)
    out = [rows[first]]
    if uuid is not None:
        has = uuid.to_numpy(object)[rows[first]]
        for i in np.flatnonzero(pd.isna(has)):
            same = rows[key == key[first[i]]]
            out.append(same[uuid.iloc[same].notna().to_numpy()][:1])
    return np.unique(np.concatenate(out))


# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_inside_is_a_backward_asof_join_by_owner(seed):
    rng = np.random.default_rng(seed)
    n, m = int(rng.integers(0, 300)), int(rng.integers(0, 40))
    hosts = ["a", "b", "c"]
    owner = rng.choice([*hosts, None], n)
    samples = pd.DataFrame(
        {"t_ns": rng.integers(0, 1000, n),
         "owner_host": pd.Categorical(owner, categories=hosts) if seed % 2 else
         pd.Series(owner, dtype=object),
         "pid": np.where(rng.random(n) < 0.1, np.nan, rng.integers(1, 4, n)).astype(float)}
    )  # fmt: skip
    start = rng.integers(0, 1000, m)  # ties and overlaps included
    spans = pd.DataFrame(
        {"host": rng.choice(hosts, m), "pid": rng.integers(1, 4, m).astype(float),
         "start_ns": start, "end_ns": start + rng.integers(0, 200, m)}
    )  # fmt: skip
    assert (_inside(samples, spans) == ref_inside(samples, spans)).all()


@pytest.mark.parametrize("seed", range(40))
def test_runs_match_the_group_by(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 200))
    host = rng.choice(["a", "b"], n)
    s = pd.DataFrame(
        {"host": pd.Categorical(host, categories=["a", "b"]) if seed % 2 else
         pd.Series(host, dtype="str"),
         "gpu": rng.integers(0, 3, n), "t_ns": rng.integers(0, 10**12, n),
         "dt_s": rng.random(n) * (rng.random(n) > 0.1)}
    )  # fmt: skip
    if seed % 3:
        s = s.sort_values(["host", "gpu", "t_ns"]).reset_index(drop=True)
    mask = rng.random(n) < 0.6
    weight = np.where(rng.random(n) < 0.1, np.nan, rng.random(n) * 100)
    pd.testing.assert_frame_equal(_runs(s, mask, weight), ref_runs(s, mask, weight))


@pytest.mark.parametrize("seed", range(40))
def test_with_process_is_a_nearest_asof_join_with_tolerance(seed):
    rng = np.random.default_rng(seed)
    n, m = int(rng.integers(1, 200)), int(rng.integers(0, 30))
    s = pd.DataFrame(
        {"host": pd.Categorical(rng.choice(["a", "b"], n), categories=["a", "b"]),
         "gpu": rng.integers(0, 3, n), "t_ns": rng.integers(0, 20, n) * 10**9,
         "dt_s": rng.choice([0.5, 1.0, 1.5, np.nan], n)}
    ).sort_values(["host", "gpu", "t_ns"], kind="stable").reset_index(drop=True)  # fmt: skip
    procs = pd.DataFrame(
        {"host": rng.choice(["a", "b", "c"], m), "gpu": rng.integers(0, 3, m),
         "t_ns": rng.integers(0, 20, m) * 10**9 + rng.choice([0, 1], m),  # at the tolerance
         "gpu_mem_bytes": rng.choice([0.0, 5.0, np.nan], m)}
    )  # fmt: skip
    ctx = types.SimpleNamespace(run=types.SimpleNamespace(gpu_procs=procs))
    assert (_with_process(ctx, s) == ref_with_process(procs, s)).all()


@pytest.mark.parametrize("seed", range(60))
def test_factorize_on_runs_is_pandas_factorize(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 2000))
    runs = int(rng.integers(1, 30))
    lengths = rng.multinomial(n, np.ones(runs) / runs)
    values = np.repeat(rng.integers(0, 10, runs), lengths)
    if seed % 3 == 1:
        values = values.astype(float)
        values[rng.random(n) < 0.05] = np.nan
    elif seed % 3 == 2:
        values = rng.integers(0, 5, n)  # many short runs: the plain factorize
    codes = _factorize(values)
    assert codes.dtype == np.int64
    assert (codes == pd.factorize(values)[0]).all()


@pytest.mark.parametrize("seed", range(40))
def test_stable_order_is_a_stable_argsort_of_the_texts(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 3000))
    # processes' keys as `process_keys` writes them: prefixes of each other, digits that sort
    # as text (node10 before node2), many ties
    names = np.array([f"node{h}:{p}" for h in (1, 2, 10, 11, 100) for p in (7, 70, 700)],
                     dtype=object)  # fmt: skip
    keys = names[rng.integers(0, int(rng.integers(1, len(names) + 1)), n)]
    assert (stable_order(keys) == np.argsort(keys, kind="stable")).all()


@pytest.mark.parametrize(
    "column",
    [
        pd.Series(["node0", "node1", "node0"], dtype=object),
        pd.Series(["node0", "node1"], dtype="category"),
        pd.Series(["rollout", None, "reward"], dtype=object),
        pd.Series(["rollout", np.nan], dtype=object),
        pd.Series([3, 4], dtype=np.int64),
        pd.Series([1.0, np.nan]),
        pd.Series(["a", 7, 2.5], dtype=object),
        pd.Series([], dtype=object),
        pd.Series(["x", "y"], dtype="string"),
        np.array(["h0", "h1"]),
    ],
)
def test_as_texts_is_astype_str_to_objects(column):
    want = pd.Series(column).astype(str).to_numpy(object)
    got = as_texts(column)
    assert got.dtype == object
    assert [(type(v), v) for v in map(str, got)] == [(type(v), v) for v in map(str, want)]
    assert (
        pd.isna(pd.Series(got, dtype=object)).tolist()
        == pd.isna(pd.Series(want, dtype=object)).tolist()
    )


@pytest.mark.parametrize("seed", range(40))
def test_first_of_each_is_not_duplicated(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 60))
    f = pd.DataFrame(
        {"host": pd.Categorical(rng.choice(["a", "b"], n), categories=["a", "b"]),
         "gpu": rng.integers(0, 3, n), "t_ns": rng.integers(0, 5, n)}
    )  # fmt: skip
    if seed % 2:
        f = f.sort_values(["host", "gpu", "t_ns"], kind="stable")
    keys = ["host", "gpu", "t_ns"]
    assert (_first_of_each(f, keys) == ~f.duplicated(keys).to_numpy()).all()


@pytest.mark.parametrize("seed", range(40))
def test_first_rows_of_each_gpu(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 300))
    host = pd.Series(rng.choice(["a", "b", None], n, p=[0.45, 0.45, 0.1]), dtype=object)
    number = rng.choice([0, 1, 2, 7, np.nan, 1e12 if seed % 5 == 0 else 3], n).astype(float)
    uuid = pd.Series(rng.choice(["u1", "u2", None], n), dtype=object)
    assert (_first_rows(host, number, uuid) == ref_first_rows(host, number, uuid)).all()
    assert (_first_rows(host, number, None) == ref_first_rows(host, number, None)).all()


@pytest.mark.parametrize("seed", range(60))
def test_asof_backward_is_merge_asof(seed):
    rng = np.random.default_rng(seed)
    nl, nr = int(rng.integers(0, 400)), int(rng.integers(0, 400))
    base = 10**18 if seed % 4 == 3 else 0  # epoch-like instants; far apart: the slow path
    span = 10**18 if seed % 7 == 6 else 5_000
    lt = base + np.sort(rng.integers(0, span, nl))
    rt = base + rng.integers(0, span, nr)  # ties in time: the last of them is picked
    hosts = np.array(["a", "b", "c", None], dtype=object)
    lh, rh = hosts[rng.integers(0, 4, nl)], hosts[rng.integers(0, 3, nr)]
    lp = rng.choice([1.0, 2.0, np.nan], nl)
    rp = rng.choice([1.0, 2.0, 3.0], nr)
    tol = int(rng.choice([0, 50, 400, span]))
    left = pd.DataFrame({"t": lt, "host": lh, "pid": lp, "row": np.arange(nl)})
    right = pd.DataFrame({"t": rt, "host": rh, "pid": rp, "pos": np.arange(nr)})
    right = right.sort_values("t", kind="stable")
    want = np.full(nl, -1)
    keyed = left.dropna(subset=["host", "pid"])
    if len(keyed) and len(right):
        m = pd.merge_asof(keyed, right, on="t", by=["host", "pid"], direction="backward",
                          tolerance=tol)  # fmt: skip
        found = m["pos"].notna().to_numpy()
        want[m["row"].to_numpy()[found]] = m["pos"].to_numpy()[found].astype(np.int64)
    got = asof_backward(lt, rt, tol, [lh, lp], [rh, rp])
    assert (got == want).all()
    # without keys: every left row may match
    want = np.full(nl, -1)
    if nl and nr:
        m = pd.merge_asof(left[["t", "row"]], right[["t", "pos"]], on="t",
                          direction="backward", tolerance=tol)  # fmt: skip
        found = m["pos"].notna().to_numpy()
        want[m["row"].to_numpy()[found]] = m["pos"].to_numpy()[found].astype(np.int64)
    assert (asof_backward(lt, rt, tol) == want).all()


def ref_typical_interval_ns(table: str, frame: pd.DataFrame) -> int:
    keys, _ = resample._TABLE_RULES[table]
    ordered = frame.sort_values([*keys, "t_ns"], kind="stable")
    t = ordered["t_ns"].to_numpy(np.int64)
    same = np.ones(len(t) - 1, dtype=bool)
    for key in keys:
        k = pd.factorize(ordered[key])[0]
        same &= k[1:] == k[:-1]
    gaps = np.diff(t)[same]
    return int(resample.typical_gap(gaps[gaps > 0]))


def _sample_table(rng, table: str, n: int, in_time_order: bool) -> pd.DataFrame:
    hosts = np.array(["node10", "node2", "a", "b-1"], dtype=object)
    t = rng.integers(0, 60_000_000_000, n)
    if in_time_order:
        t = np.sort(t)
    frame = {"host": hosts[rng.integers(0, 4, n)], "t_ns": t}
    if table in ("procs", "gpu_procs"):
        frame["pid"] = rng.choice([7, 123, 9999, 40], n)
    if table == "gpu_procs":
        frame["gpu"] = rng.integers(0, 3, n)
        frame["gpu_mem_bytes"] = rng.integers(0, 10**9, n)
        frame["sm_util_pct"] = np.where(rng.random(n) < 0.1, np.nan, rng.random(n) * 100)
        frame["watched"] = rng.random(n) < 0.5
    elif table == "procs":
        frame["ppid"] = 1
        frame["role"] = rng.choice(np.array(["trainer", "main", None], dtype=object), n)
        frame["name"] = rng.choice(np.array(["python", "ray::W"], dtype=object), n)
        frame["cpu_pct"] = np.where(rng.random(n) < 0.1, np.nan, rng.random(n) * 300)
        frame["rss_bytes"] = rng.integers(0, 10**10, n)
        frame["io_read_bytes_s"] = rng.random(n)
        frame["io_write_bytes_s"] = rng.random(n)
        frame["num_threads"] = rng.integers(1, 90, n)
    else:
        frame["cpu_pct"] = rng.random(n) * 100
        frame["mem_used_bytes"] = rng.integers(0, 10**11, n)
        frame["mem_total_bytes"] = 10**11
        frame["n_cpus"] = 2
    out = pd.DataFrame(frame)
    for name in ("host", "role", "name"):
        if name in out:
            out[name] = pd.Series(out[name].to_numpy(object), dtype=object)
    return out


@pytest.mark.parametrize("seed", range(45))
def test_typical_interval_takes_the_series_in_sorted_order(seed):
    rng = np.random.default_rng(seed)
    table = ("procs", "gpu_procs", "host")[seed % 3]
    frame = _sample_table(rng, table, int(rng.integers(2, 3000)), in_time_order=seed % 5 != 4)
    if seed % 9 == 8:  # a missing key: the frame's own sort
        frame.loc[frame.index[:3], "host"] = None
    assert resample.typical_interval_ns(table, frame) == ref_typical_interval_ns(table, frame)


@pytest.mark.parametrize("seed", range(30))
def test_appearance_codes_number_groups_as_the_group_by(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 500))
    frame = pd.DataFrame(
        {"h": pd.Series(rng.choice(np.array(["a", "b", None], dtype=object), n), dtype=object),
         "z": rng.choice([0.5, 1.5, np.nan], n),
         # eight columns of up to 400 values: the combined key outgrows int64 on the way
         **{f"x{i}": rng.integers(0, 400 if seed % 2 else 3, n) * 10**12 for i in range(8)}}
    )  # fmt: skip
    wide = [f"x{i}" for i in range(8)]
    for names in (["x0", "x1"], ["h", "x0", "z"], [*wide, "h"], ["z", *wide]):
        want = frame.groupby(names, sort=False, dropna=True).ngroup().to_numpy()
        want = np.where(np.isnan(want.astype(float)), -1, want).astype(np.int64)
        got = appearance_codes([frame[c] for c in names])
        assert (got == want).all(), names
