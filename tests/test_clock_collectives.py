"""Node clock offsets from collectives: the array formulation gives what the per-pair frames
gave (random nodes, ranks, skews, async and sub-group calls, GPU-side times on some ranks,
disagreeing op sequences), and a known skew is found within its bounds."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from gpuprof.clocks import MIN_CALLS, ClockOffset, estimate_from_collectives

# --------------------------------------------------------------------------------------------
# Reference: the formulation with one frame per rank


def ref_rank_calls(spans: pd.DataFrame) -> dict[tuple[str, int], pd.DataFrame]:
    calls = spans[(spans["phase"] == "collective") & spans["rank"].notna()]
    if calls.empty:
        return {}
    attrs = calls["attrs"]
    is_async = attrs.map(lambda a: bool(a.get("async")) if isinstance(a, dict) else False)
    size = attrs.map(lambda a: a.get("group_size") if isinstance(a, dict) else None)
    world = pd.to_numeric(size, errors="coerce").max()
    keep = ~is_async.to_numpy()
    if pd.notna(world):
        keep &= (pd.to_numeric(size, errors="coerce") == world).to_numpy()
    calls = calls[keep]
    out = {}
    for (host, rank), group in calls.groupby(["host", "rank"], sort=True):
        group = group.sort_values("start_ns", kind="stable")
        on_gpu = group["gpu_start_ns"].notna().all() and group["gpu_end_ns"].notna().all()
        start = group["gpu_start_ns"] if on_gpu else group["start_ns"]
        end = group["gpu_end_ns"] if on_gpu else group["end_ns"]
        columns = {"start": start.to_numpy(np.float64), "end": end.to_numpy(np.float64),
                   "op": group["name"].to_numpy()}  # fmt: skip
        out[(str(host), int(rank))] = pd.DataFrame(columns)
    return out


def ref_pair_bounds(a: pd.DataFrame, b: pd.DataFrame) -> tuple[float, float, int] | None:
    n = min(len(a), len(b))
    if n < MIN_CALLS:
        return None
    a, b = a.iloc[:n], b.iloc[:n]
    if (a["op"].to_numpy() != b["op"].to_numpy()).mean() > 0.05:
        return None
    low = float(np.max(b["start"].to_numpy() - a["end"].to_numpy()))
    high = float(np.min(b["end"].to_numpy() - a["start"].to_numpy()))
    return low, high, n


def ref_estimate(spans: pd.DataFrame, reference: str, nodes: list[str]) -> dict[str, ClockOffset]:
    by_rank = ref_rank_calls(spans)
    ref_ranks = [v for (host, _), v in by_rank.items() if host == reference]
    out: dict[str, ClockOffset] = {}
    for node in nodes:
        if node == reference or not ref_ranks:
            continue
        bounds = [
            pair
            for (host, _), calls in by_rank.items()
            if host == node
            for ref in ref_ranks
            if (pair := ref_pair_bounds(ref, calls)) is not None
        ]
        if not bounds:
            continue
        low, high = max(b[0] for b in bounds), min(b[1] for b in bounds)
        calls = max(b[2] for b in bounds)
        if low <= high:
            lead, error = (low + high) / 2, (high - low) / 2
        else:
            middles = np.array([(b[0] + b[1]) / 2 for b in bounds])
            lead = float(np.median(middles))
            error = float(max(abs(low - high) / 2, np.ptp(middles) / 2))
        out[node] = ClockOffset(node, -round(lead), round(error), "collectives", reference,
                                calls)  # fmt: skip
    return out


# --------------------------------------------------------------------------------------------


def collective_spans(seed: int, skews: dict[str, int]) -> pd.DataFrame:
    """Ranks of several nodes making the same calls; each node's clock reads ``skews[node]``
    ns ahead; each call returns on every rank once the last rank has joined."""
    rng = random.Random(seed)
    ranks_per_node = rng.randint(1, 3)
    rows = []
    t = 1_000_000_000
    for call in range(rng.randint(0, 12)):
        op = rng.choice(["all_reduce", "all_gather", "broadcast"])
        joins = {}
        for n, node in enumerate(skews):
            for r in range(ranks_per_node):
                joins[(node, n * ranks_per_node + r)] = t + rng.randint(0, 2_000_000)
        done = max(joins.values()) + rng.randint(10_000, 500_000)
        sub_group = rng.random() < 0.1
        for (node, rank), join in joins.items():
            # now and then a rank whose sequence disagrees
            op_here = "reduce_scatter" if rng.random() < 0.05 and call > 2 else op
            on_gpu = rank % 2 == 0 and seed % 3 != 0
            rows.append({
                "host": node, "rank": float(rank), "pid": 100 + rank, "phase": "collective",
                "name": op_here,
                "start_ns": join + skews[node], "end_ns": done + skews[node],
                "gpu_start_ns": float(join + skews[node] + 5_000) if on_gpu else np.nan,
                "gpu_end_ns": float(done + skews[node] - 5_000) if on_gpu else np.nan,
                "attrs": {"group_size": 2 if sub_group else len(joins),
                          "async": rng.random() < 0.05},
            })  # fmt: skip
        t = done + rng.randint(1_000_000, 50_000_000)
    rows.append({"host": "n0", "rank": np.nan, "pid": 1, "phase": "rollout", "name": "x",
                 "start_ns": 0, "end_ns": 1, "gpu_start_ns": np.nan, "gpu_end_ns": np.nan,
                 "attrs": None})  # fmt: skip
    frame = pd.DataFrame(rows)
    return frame.sample(frac=1.0, random_state=seed).reset_index(drop=True)


@pytest.mark.parametrize("seed", range(30))
def test_offsets_match_the_frame_formulation(seed):
    rng = random.Random(1000 + seed)
    skews = {f"n{i}": rng.randint(-50_000_000, 50_000_000) if i else 0 for i in range(4)}
    spans = collective_spans(seed, skews)
    nodes = list(skews)
    assert estimate_from_collectives(spans, "n0", nodes) == ref_estimate(spans, "n0", nodes)


def test_a_known_skew_is_found_within_its_error():
    skews = {"n0": 0, "n1": 37_000_000, "n2": -12_000_000}
    for seed in (5, 9, 13, 16, 17):  # seeds whose calls are enough for both nodes
        spans = collective_spans(seed, skews)
        found = estimate_from_collectives(spans, "n0", list(skews))
        assert set(found) == {"n1", "n2"}
        for node, offset in found.items():
            assert abs(offset.offset_ns + skews[node]) <= offset.error_ns + 1
