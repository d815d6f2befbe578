"""The diagnosis's groupings on text keys, before and after session 16, side by side.

    python benchmarks/bench_text_keys.py [--rows 2000000] [--repeats 5]

Synthetic data the size of a cluster-day's part or whole (``--rows`` rows; 64 hosts, 8
processes each, 1 800 steps, 6 phases; pandas' default text dtype, as frames built from
object arrays get it under pandas 3), each variant timed ``--repeats`` times interleaved,
medians:

- the processes' order of step rows: ``np.argsort`` of ``host:pid`` strings against
  `grouping.stable_order`;
- the straggler figures of `imbalance._stragglers`: group-bys on (phase, step, throttled)
  text columns against one int64 code (`imbalance._paces`);
- the owners of a phase's spans (`_phase._owned_in_phase`): a set over every row against
  one over the distinct rows.

Each pair must give the same result (checked).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuprof.analyzers.grouping import stable_order
from gpuprof.analyzers.stalls.imbalance import _paces

PHASES = ["rollout", "reward", "old_log_prob", "ref", "update_actor", "reshard"]


def _data(rows: int) -> dict[str, object]:
    rng = np.random.default_rng(0)
    hosts = np.array([f"node{i}" for i in range(64)], dtype=object)
    host = hosts[rng.integers(0, 64, rows)]
    pid = 1000 + rng.integers(0, 8, rows)
    owners = np.array([f"{h}:{p}" for h, p in zip(host, pid)], dtype=object)
    per = pd.DataFrame({"phase": rng.choice(PHASES, rows), "step": rng.integers(0, 1800, rows),
                        "hot": rng.random(rows) < 0.01, "dur": rng.random(rows),
                        "n_gpu": rng.integers(1, 3, rows).astype(float)})  # fmt: skip
    spans = pd.DataFrame({"host": host, "pid": pid.astype(float),
                          "phase": rng.choice(PHASES, rows)})  # fmt: skip
    return {"owners": owners, "per": per, "spans": spans}


def _figures_old(per: pd.DataFrame) -> pd.DataFrame:
    per = per.copy()
    grp = per.groupby(["phase", "step", "hot"], sort=False)
    per["ranks"] = grp["dur"].transform("size")
    per["mx"] = grp["dur"].transform("max")
    others = per["dur"].where(per["dur"] < per["mx"])
    per["med"] = others.groupby([per["phase"], per["step"], per["hot"]], sort=False).transform(
        "median"
    )
    per["med"] = per["med"].fillna(per["mx"])
    per["all_gpus"] = per.groupby(["phase", "step"], sort=False)["n_gpu"].transform("sum")
    return per


def _owners_old(spans: pd.DataFrame) -> set:
    o = spans.loc[spans["phase"] == "rollout", ["host", "pid"]]
    return {(h, float(p)) for h, p in zip(o["host"], o["pid"])}


def _owners_new(spans: pd.DataFrame) -> set:
    o = spans.loc[spans["phase"] == "rollout", ["host", "pid"]].drop_duplicates()
    return {(h, float(p)) for h, p in zip(o["host"].tolist(), o["pid"].tolist())}


CASES = {
    "process order": (lambda d: np.argsort(d["owners"], kind="stable"),
                      lambda d: stable_order(d["owners"])),
    "straggler figures": (lambda d: _figures_old(d["per"]), lambda d: _paces(d["per"].copy())),
    "owners of a phase": (lambda d: _owners_old(d["spans"]), lambda d: _owners_new(d["spans"])),
}  # fmt: skip


def _same(a: object, b: object) -> bool:
    if isinstance(a, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b, check_exact=True)
        return True
    if isinstance(a, np.ndarray):
        return bool((a == b).all())
    return a == b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    data = _data(args.rows)
    print(f"{args.rows:,} rows, pandas {pd.__version__}")
    print(f"{'case':20s} {'before s':>9s} {'after s':>9s} {'ratio':>6s}  same")
    for name, (before, after) in CASES.items():
        times: dict[str, list[float]] = {"before": [], "after": []}
        results = {}
        for _ in range(args.repeats):
            for label, fn in (("before", before), ("after", after)):
                t = time.perf_counter()
                results[label] = fn(data)
                times[label].append(time.perf_counter() - t)
        b, a = statistics.median(times["before"]), statistics.median(times["after"])
        same = _same(results["before"], results["after"])
        print(f"{name:20s} {b:9.3f} {a:9.3f} {b / a:6.1f}  {same}")


if __name__ == "__main__":
    main()
