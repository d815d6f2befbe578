"""The numpy group counts behind the cross-GPU wait split (`analyzers.grouping`, the helpers of
`analyzers.stalls._phase`) give exactly what the straightforward pandas group-bys give."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import numpy as np
import pandas as pd
import pytest

from gpuprof import store
from gpuprof.analyzers import grouping
from gpuprof.analyzers.findings import AnalysisContext, Thresholds
from gpuprof.analyzers.spans import NO_PHASE
from gpuprof.analyzers.stalls import _phase
from gpuprof.loader import load_for_analysis
from gpuprof.sim import Pathology, SimConfig, simulate

# --------------------------------------------------------------------------------------------
# Reference implementations: pandas group-bys, as the helpers were first written


def ref_gpu_key(s: pd.DataFrame) -> np.ndarray:
    return s.groupby(["host", "gpu"], sort=False, observed=True).ngroup().to_numpy()


def ref_others(flag: np.ndarray, bins: np.ndarray, gpu: np.ndarray) -> np.ndarray:
    f = pd.Series(flag.astype(np.int64))
    in_bin = f.groupby(bins).transform("sum").to_numpy()
    own = f.groupby([bins, gpu]).transform("sum").to_numpy()
    return in_bin - own


def ref_busy_by_bin(s: pd.DataFrame, th: Thresholds) -> tuple[np.ndarray, np.ndarray]:
    t = s["t_ns"].to_numpy(np.int64)
    dt = s["dt_s"].to_numpy(np.float64)
    period_ns = float(np.nanmedian(dt)) * 1e9 if np.isfinite(dt).any() else 0.0
    if not np.isfinite(period_ns) or period_ns <= 0:
        period_ns = 1e9
    bins = np.round((t - t.min()) / period_ns).astype(np.int64)
    busy = s["busy_frac"].to_numpy(np.float64) >= th.busy_util_pct / 100.0
    return ref_others(busy, bins, ref_gpu_key(s)), bins


def ref_wait_split(ctx: AnalysisContext, s: pd.DataFrame, th: Thresholds) -> dict:
    others_busy, bins = ref_busy_by_bin(s, th)
    phase = s["phase"].to_numpy(object)
    in_wait = s["phase"].isin(list(_phase._WAIT_PHASES)).to_numpy()
    waiting = in_wait & ~_phase._step_head_claim(ctx, s, th)
    idle = np.nan_to_num(s["idle_gpu_s"].to_numpy(np.float64))
    gpu = ref_gpu_key(s)
    others_in_phase = ref_others(~in_wait, bins, gpu)
    bubble = waiting & _phase._is_idle(s, th) & (others_busy > 0)
    rest = waiting & ~bubble
    claimed: dict[str, np.ndarray] = {}
    taken = np.zeros(len(s), dtype=bool)
    for p in _phase._CLAIMED_PHASES:
        n_p = ref_others(phase == p, bins, gpu)
        claimed[p] = rest & ~taken & (n_p > 0)
        taken |= claimed[p]
    bubble |= rest & ~taken & (others_in_phase > 0) & _phase._is_idle(s, th)
    alone = rest & ~taken & (others_in_phase == 0)
    return {"bubble": bubble, "alone": alone, "claimed": claimed, "idle": idle, "bins": bins}


def ref_phase_gpu_s(ctx: AnalysisContext, s: pd.DataFrame, phase: str) -> float:
    row = ctx.by_phase[ctx.by_phase["phase"] == phase]
    if row.empty:
        return np.nan
    wall = float(row["wall_s"].iloc[0])
    if not np.isfinite(wall) or wall <= 0:
        return np.nan
    sp = ctx.spans
    owners = sp.loc[sp["phase"] == phase, ["host", "pid"]].drop_duplicates()
    owners = owners.rename(columns={"host": "owner_host"}).astype({"pid": np.float64})
    gpus = s.dropna(subset=["pid"])[["owner_host", "pid", "host", "gpu"]].drop_duplicates()
    n = len(gpus.merge(owners, on=["owner_host", "pid"], how="inner"))
    return wall * n if n else np.nan


def ref_phase_idle(ctx: AnalysisContext, s: pd.DataFrame, phases: Iterable[str]) -> dict | None:
    phases = list(phases)
    sub = s[s["phase"].isin(phases)]
    util = sub["util_gpu_pct"].to_numpy(np.float64)
    dt = sub["dt_s"].to_numpy(np.float64)
    m = np.isfinite(util)
    meas_dt = float(dt[m].sum())
    if meas_dt <= 0:
        return None
    gpu_s = idle_gpu_s = 0.0
    for phase in phases:
        p = (sub["phase"] == phase).to_numpy() & m
        if not p.any():
            continue
        frac = float(sub["idle_gpu_s"].to_numpy(np.float64)[p].sum() / dt[p].sum())
        exact = ref_phase_gpu_s(ctx, s, phase)
        sampled = float(sub["dt_s"].to_numpy(np.float64)[(sub["phase"] == phase).to_numpy()].sum())
        g = exact if np.isfinite(exact) and exact > 0 else sampled
        gpu_s += g
        idle_gpu_s += g * frac
    pcie = sub["pcie_bytes"].to_numpy(np.float64)
    nvl = sub["nvlink_bytes"].to_numpy(np.float64)
    return {
        "gpu_s": gpu_s,
        "idle_gpu_s": idle_gpu_s,
        "idle_frac": idle_gpu_s / gpu_s if gpu_s > 0 else np.nan,
        "util_pct": float((util[m] * dt[m]).sum() / meas_dt),
        "gpus": _phase._gpu_labels(sub[m]),
        "pcie_bytes": float(np.nansum(pcie)) if np.isfinite(pcie).any() else np.nan,
        "nvlink_bytes": float(np.nansum(nvl)) if np.isfinite(nvl).any() else np.nan,
        "pcie_bytes_s": _phase._rate(pcie, dt),
        "nvlink_bytes_s": _phase._rate(nvl, dt),
    }


# --------------------------------------------------------------------------------------------
# Random data


@pytest.mark.parametrize("seed", range(40))
def test_others_matches_the_pandas_group_by(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    n_gpus = int(rng.integers(1, 70))
    gpu = rng.integers(-1, n_gpus, n)  # -1: a GPU like the others (an unowned key)
    if seed % 4 == 0:  # sparse bins: far-apart bursts, too wide to count densely
        bins = rng.choice([0, 5, 10**9, 2 * 10**12], n) + rng.integers(0, 3, n)
    elif seed % 4 == 1:  # merged samples: several of one GPU in a bin
        bins = np.sort(rng.integers(0, max(1, n // 20), n))
    else:
        bins = rng.integers(0, max(1, n // n_gpus + 1), n)
    flag = rng.random(n) < rng.uniform(0, 1)
    got = _phase._others(flag, bins, gpu)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, ref_others(flag, bins, gpu))
    counts = rng.integers(0, 4, n)  # a non-bool flag is summed
    np.testing.assert_array_equal(_phase._others(counts, bins, gpu), ref_others(counts, bins, gpu))


def test_others_of_nothing():
    empty = np.zeros(0, dtype=np.int64)
    assert len(_phase._others(np.zeros(0, dtype=bool), empty, empty)) == 0


def _random_samples(rng: np.random.Generator, n: int, categorical: bool) -> pd.DataFrame:
    hosts = np.array(["node-b", "node-a", "node10", "node2"], dtype=object)
    phases = np.array(["rollout", "reward", NO_PHASE, "step", "update", "reshard", "eval",
                       "dataload", "checkpoint", "wait"], dtype=object)  # fmt: skip
    frame = pd.DataFrame(
        {
            "host": hosts[rng.integers(0, len(hosts), n)],
            "gpu": rng.integers(0, 8, n).astype(np.int64),
            "t_ns": np.sort(rng.integers(0, 10**11, n)).astype(np.int64),
            "dt_s": rng.choice([0.1, 0.1, 0.1, 0.5, np.nan], n),
            "busy_frac": np.where(rng.random(n) < 0.1, np.nan, rng.random(n)),
            "phase": phases[rng.integers(0, len(phases), n)],
            "idle_gpu_s": rng.random(n),
        }
    )
    if categorical:
        for name in ("host", "phase"):
            frame[name] = pd.Categorical(frame[name].to_numpy(object))
    return frame


@pytest.mark.parametrize("seed", range(12))
def test_gpu_key_and_busy_by_bin_match_the_pandas_group_by(seed):
    rng = np.random.default_rng(100 + seed)
    s = _random_samples(rng, int(rng.integers(1, 4000)), categorical=seed % 2 == 0)
    np.testing.assert_array_equal(_phase._gpu_key(s), ref_gpu_key(s))
    th = Thresholds()
    got, got_bins = _phase._busy_by_bin(s, th)
    want, want_bins = ref_busy_by_bin(s, th)
    np.testing.assert_array_equal(got_bins, want_bins)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("seed", range(12))
def test_appearance_codes_match_ngroup(seed):
    rng = np.random.default_rng(200 + seed)
    n = int(rng.integers(1, 2000))
    frame = pd.DataFrame(
        {
            "a": rng.choice(np.array(["x", "y", None, "z"], dtype=object), n),
            "b": rng.choice([1.0, 2.0, np.nan, 7.5], n),
            "c": rng.integers(-3, 3, n),
        }
    )
    if seed % 2:
        frame["a"] = pd.Categorical(frame["a"], categories=["z", "y", "x", "unused"])
    for cols in (["a"], ["a", "b"], ["c", "a", "b"]):
        want = frame.groupby(cols, sort=False, observed=True).ngroup()
        want = want.fillna(-1).to_numpy(np.int64)  # a missing key: -1 here, NaN in pandas
        got = grouping.appearance_codes([frame[c] for c in cols])
        np.testing.assert_array_equal(got, want)
        first = grouping.first_rows(got)
        want_first = frame[cols].dropna().drop_duplicates().index.to_numpy()
        np.testing.assert_array_equal(first, want_first)
        with_missing = grouping.appearance_codes([frame[c] for c in cols], missing_is_value=True)
        want_first = frame[cols].drop_duplicates().index.to_numpy()
        np.testing.assert_array_equal(grouping.first_rows(with_missing), want_first)


@pytest.mark.parametrize("categorical", [True, False])
def test_label_codes_compare_like_the_labels(categorical):
    rng = np.random.default_rng(7)
    s = _random_samples(rng, 500, categorical)
    s.loc[::7, "phase"] = None
    codes, names = grouping.label_codes(s["phase"])
    for i, name in enumerate(names):
        np.testing.assert_array_equal(codes == i, (s["phase"] == name).to_numpy())
    assert ((codes == -1) == s["phase"].isna().to_numpy()).all()


# --------------------------------------------------------------------------------------------
# Simulated runs: the wait split and the phase figures, whole and as long runs are loaded


def _assert_same(got, want) -> None:
    if isinstance(want, dict):
        assert got.keys() == want.keys()
        for key in want:
            _assert_same(got[key], want[key])
    elif isinstance(want, np.ndarray):
        np.testing.assert_array_equal(got, want)
    elif isinstance(want, float) and np.isnan(want):
        assert isinstance(got, float) and np.isnan(got)
    elif isinstance(want, float):
        # the sums are exact (`parts.exact_sum`, rounded once) where the reference adds in
        # floating point: a few units in the last place apart at most
        assert isinstance(got, float) and math.isclose(got, want, rel_tol=1e-13, abs_tol=1e-12)
    else:
        assert got == want and type(got) is type(want)


CASES = [
    SimConfig(gpus=8, steps=6, seed=3, pathologies=[Pathology("reward_bound", 0.7)]),
    SimConfig(gpus=4, steps=5, seed=4, pathologies=[Pathology("pipeline_bubble", 0.8)]),
    SimConfig(gpus=16, steps=4, seed=5, framework="trl",
              pathologies=[Pathology("idle_unattributed", 0.8), Pathology("reshard_idle", 0.5)]),
    SimConfig(gpus=2, steps=5, seed=6, pathologies=[Pathology("periodic_stall", 0.8),
                                                    Pathology("dataloader_starvation", 0.6)]),
    SimConfig(gpus=1, steps=4, seed=7, pathologies=[Pathology("reward_bound", 0.6)]),
    SimConfig(gpus=8, steps=5, seed=8, pathologies=[Pathology("unused_gpu", 0.8)]),
]  # fmt: skip


@pytest.mark.parametrize("merge", [1, 7])
@pytest.mark.parametrize("config", CASES, ids=lambda c: f"{c.gpus}gpu-{c.pathologies[0].kind}")
def test_wait_split_and_phase_figures_match_the_reference(config, merge, tmp_path):
    run = simulate(config).run
    if merge > 1:  # merged samples of unequal length, as a long run is analysed
        store.save_run(run, tmp_path / "run")
        run = load_for_analysis(tmp_path / "run", merge=merge)
    th = Thresholds()
    for claim in (False, True):
        ctx = AnalysisContext(run)
        if claim:  # a claimed GPU leaves a subset of the samples to the later detectors
            ctx.claim((ctx.samples["gpu"] == 1).to_numpy())
        s = _phase._samples(ctx)
        assert s is not None
        _assert_same(_phase._wait_split(ctx, s, th), ref_wait_split(ctx, s, th))
        for th2 in (dataclasses.replace(th, busy_util_pct=5.0),):
            want = ref_wait_split(AnalysisContext(run), s, th2)
            _assert_same(_phase._wait_split(AnalysisContext(run), s, th2), want)
        for phases in (["reward"], ["reshard"], ["dataload"], ["checkpoint", "eval"],
                       ["rollout", "update"], ["no-such-phase"]):  # fmt: skip
            _assert_same(_phase._phase_idle(ctx, s, phases), ref_phase_idle(ctx, s, phases))
            for p in phases:
                _assert_same(_phase._phase_gpu_s(ctx, s, p), ref_phase_gpu_s(ctx, s, p))
        # samples of one GPU with several owners (hand-built frames): each pair counts once
        mixed = s.copy()
        rows = mixed.index[::3]
        mixed.loc[rows, "pid"] = np.where(np.arange(len(rows)) % 2, np.nan, 99.0)
        mixed.loc[mixed.index[1::7], "host"] = np.nan  # and samples of no known host
        for p in ("reward", "rollout", "reshard"):
            _assert_same(_phase._phase_gpu_s(ctx, mixed, p), ref_phase_gpu_s(ctx, mixed, p))
            _assert_same(_phase._phase_idle(ctx, mixed, [p]), ref_phase_idle(ctx, mixed, [p]))
