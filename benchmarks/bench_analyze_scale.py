"""`gpuprof analyze` of day-long runs on 64 GPUs: wall time and peak memory, end to end.

    python benchmarks/bench_analyze_scale.py [--gpus 64] [--hours 3 6 12 24] [--repeats 2]
                                             [--dir /tmp/gpuprof-scale] [--keep]
                                             [--interval 0.1] [--write-only] [--jobs 1]

Each size is a run directory as `watch` leaves it (SQLite host files with their Parquet sample
side files), made by repeating a simulated one-hour GRPO run of the same GPUs (two injected
pathologies) back to back: samples, spans, steps and events shifted in time and step number.
The hour is written by `gpuprof.sim.simulate_to` and repeated one host file at a time (one
GPU's samples at a time), so this process's memory does not grow with the GPUs or the hours.
The benchmark then runs ``gpuprof analyze RUN --json`` in a fresh process and reports its wall
time and peak RSS — the first analysis (the run files read, the kept form written) apart from
the median of the ``--repeats`` − 1 after it (the kept form read, as after ``watch``) — and the
GPU samples of the run, the samples it analysed after merging (the run's notice), and the
findings — which must match the one-hour run's, since every hour is the same. The peak RSS is
the analysis's own (`measure.run`: started from a small spawner, not from this process, which
holds the simulated hour; its processes' polled total where that is larger). Target (issue 3):
24 h x 64 GPUs at 10 Hz (~55 M GPU samples) in <= 60 s within 4 GB peak RSS on a 2-core machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sqlite3
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import measure  # noqa: E402

from gpuprof import columnar, store  # noqa: E402
from gpuprof.load_cache import DIRNAME as KEPT_DIR  # noqa: E402
from gpuprof.model import RECORD_TYPES, Run  # noqa: E402
from gpuprof.sim import Pathology, SimConfig, simulate, simulate_to  # noqa: E402
from gpuprof.sim.config import DEFAULT_PHASE_S  # noqa: E402

PATHOLOGIES = [Pathology("reward_bound", 0.6), Pathology("reshard_idle", 0.5)]
_GRPO_STEP_S = sum(v for k, v in DEFAULT_PHASE_S.items() if k not in ("values", "update_critic"))


def base_config(gpus: int, seed: int = 1, interval_s: float = 0.1) -> SimConfig:
    """An hour of GRPO on ``gpus`` GPUs, their samples ``interval_s`` apart (the host's and
    processes' `SimConfig`'s default apart, or as far as the GPUs' when that is longer)."""
    steps = max(1, round(3600 / _GRPO_STEP_S))
    host_s = max(SimConfig.host_interval_s, interval_s)
    return SimConfig(gpus=gpus, steps=steps, seed=seed, pathologies=PATHOLOGIES,
                     interval_s=interval_s, host_interval_s=host_s)  # fmt: skip


def base_run(gpus: int, seed: int = 1) -> Run:
    """A simulated hour of GRPO on ``gpus`` GPUs, in memory."""
    return simulate(base_config(gpus, seed)).run


def _shift(frame: pd.DataFrame, table: str, dt_ns: int, steps: int) -> pd.DataFrame:
    out = frame.copy()
    for col in ("t_ns", "start_ns", "end_ns", "gpu_start_ns", "gpu_end_ns"):
        if col in out:
            out[col] = out[col] + dt_ns
    if table in ("spans",) and "step" in out:
        out["step"] = out["step"] + steps
    return out


def write_tiled_run(base: Run, hours: float, run_dir: Path) -> int:
    """Write back-to-back copies of ``base`` covering ``hours`` as a run directory; returns
    the GPU samples written."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    t0 = int(min(base.gpu["t_ns"].min(), base.spans["start_ns"].min()))
    t1 = int(max(base.gpu["t_ns"].max(), base.spans["end_ns"].max()))
    period = t1 - t0 + 100_000_000
    tiles = max(1, round(hours * 3600e9 / period))
    n_steps = int(base.spans["step"].max()) + 1
    meta = base.meta
    meta.start_ns, meta.end_ns = t0, t0 + tiles * period
    total = 0
    for i, host in enumerate(sorted(base.gpu["host"].unique())):
        db = store.host_file(run_dir, host)
        listing = {}
        gpu_host = base.gpu[base.gpu["host"] == host]
        groups = gpu_host.groupby("gpu", sort=True).indices

        def per_gpu(rows_by_gpu=groups, frame=gpu_host):
            for rows in rows_by_gpu.values():
                g = frame.iloc[rows]
                yield pd.concat(
                    [_shift(g, "gpu", k * period, 0) for k in range(tiles)], ignore_index=True
                )

        side = columnar.side_file(db, "gpu")
        total += columnar.write_groups(side, "gpu", per_gpu())
        listing["gpu"] = side.name
        batch = {}
        for table in RECORD_TYPES:
            if table == "gpu":
                continue
            frame = getattr(base, table)
            frame = frame[frame["host"] == host] if len(frame) else frame
            tiled = pd.concat(
                [_shift(frame, table, k * period, k * n_steps) for k in range(tiles)],
                ignore_index=True,
            )
            if table in columnar.TABLES:
                side = columnar.side_file(db, table)
                columnar.write(side, table, tiled)
                listing[table] = side.name
            else:
                batch[table] = list(store._frame_rows(table, tiled))
        conn = store.connect(db)
        try:
            store.insert_rows(conn, batch)
            store.write_meta(conn, columnar.META_KEY, listing)
            if i == 0:
                store.write_meta(conn, "run", meta.to_dict())
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
    return total


def write_tiled_dir(base_dir: Path, hours: float, run_dir: Path, jobs: int = 1) -> int:
    """`write_tiled_run` for a base run directory (as `simulate_to` writes it), one host file
    at a time: memory holds one GPU's repeated samples, or one host's repeated other rows.
    With ``jobs`` > 1, that many host files are written at once, each in a process of its own.
    Returns the GPU samples written."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    files = store.run_files(base_dir)
    meta = next(m for m in map(store.file_meta, files) if m is not None)
    # a simulated run's first sample and span start at its start, its last span ends at its end
    t0, t1 = int(meta["start_ns"]), int(meta["end_ns"])
    period = t1 - t0 + 100_000_000
    tiles = max(1, round(hours * 3600e9 / period))
    first_spans = columnar.read(columnar.side_file(files[0], "spans"), "spans")
    n_steps = int(first_spans["step"].max()) + 1
    del first_spans
    meta.update(start_ns=t0, end_ns=t0 + tiles * period)
    args = [(path, run_dir, period, tiles, n_steps, meta) for path in files]
    if jobs <= 1:
        return sum(_tile_file(*a) for a in args)
    with ProcessPoolExecutor(jobs) as pool:
        return sum(pool.map(_tile_file, *zip(*args)))


def _tile_file(path: Path, run_dir: Path, period: int, tiles: int, n_steps: int,
               meta: dict) -> int:  # fmt: skip
    """One host file of `write_tiled_dir`; the GPU samples it wrote."""
    db = store.host_file(run_dir, path.stem)
    listing = {}
    total = 0
    with contextlib.closing(sqlite3.connect(path)) as conn:
        sides = columnar.listed(conn)
        has_run = conn.execute("SELECT 1 FROM meta WHERE key = 'run'").fetchone()
    for table in RECORD_TYPES:
        if table not in sides:
            continue
        src, dest = path.with_name(sides[table]), columnar.side_file(db, table)
        if table == "gpu":
            total += columnar.write_groups(dest, table, (
                pd.concat([_shift(g, table, k * period, 0) for k in range(tiles)],
                          ignore_index=True)
                for g in columnar.read_groups(src, table)))  # fmt: skip
        else:
            frame = columnar.read(src, table)
            columnar.write(dest, table, pd.concat(
                [_shift(frame, table, k * period, k * n_steps) for k in range(tiles)],
                ignore_index=True))  # fmt: skip
            del frame
        listing[table] = dest.name
    conn = store.connect(db)
    try:
        store.write_meta(conn, columnar.META_KEY, listing)
        if has_run:
            store.write_meta(conn, "run", meta)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return total


def analyze_once(run_dir: Path) -> dict:
    """Run ``gpuprof analyze RUN --json`` in a fresh process: wall s, its peak RSS (bytes,
    `measure.run`: the process's own high-water mark or its processes' polled total,
    whichever is larger), its output."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = measure.run([sys.executable, "-m", "gpuprof", "analyze", str(run_dir), "--json"],
                    cwd=ROOT, env=env, poll=True)  # fmt: skip
    doc = json.loads(r["stdout"])
    return {"s": r["wall_s"], "rss": max(r["peak_rss_bytes"], r["tree_rss_bytes"]), "doc": doc}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--hours", type=int, nargs="+", default=[3, 6, 12, 24])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/gpuprof-scale"))
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    parser.add_argument(
        "--interval", type=float, default=0.1,
        help="seconds between a GPU's samples (a cluster-day's kept form at 1 s is that of "
        "10 Hz: both are merged to the loader's budget, about a minute a bucket)",
    )  # fmt: skip
    parser.add_argument(
        "--write-only", action="store_true", help="write the runs (kept), analyse none"
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="host files written at once (processes)"
    )
    args = parser.parse_args()
    if args.write_only:
        args.keep = True

    t = time.perf_counter()
    base_dir = args.dir / "base-1h"
    shutil.rmtree(base_dir, ignore_errors=True)
    base = simulate_to(base_config(args.gpus, interval_s=args.interval), base_dir)
    print(f"simulated 1 h x {args.gpus} GPUs in {time.perf_counter() - t:.0f} s "
          f"({base.gpu_samples:,} GPU samples)", flush=True)  # fmt: skip
    print(f"{'hours':>5s} {'GPU samples':>12s} {'analysed':>10s} {'first s':>8s} "
          f"{'first MB':>9s} {'kept s':>7s} {'kept MB':>8s} {'s / M samples':>14s}  "
          "findings (share)")  # fmt: skip
    for hours in args.hours:
        run_dir = args.dir / f"{hours}h"
        n = write_tiled_dir(base_dir, hours, run_dir, args.jobs)
        if args.write_only:
            print(f"{hours:5d} {n:12,d}  written to {run_dir}", flush=True)
            continue
        # the first analysis reads the run files and leaves the kept form (`load_cache`) that
        # the others read: two figures, never one median of both
        shutil.rmtree(run_dir / KEPT_DIR, ignore_errors=True)
        first = analyze_once(run_dir)
        kept = [analyze_once(run_dir) for _ in range(max(args.repeats - 1, 0))]
        med = first["s"]
        kept_s = f"{statistics.median(r['s'] for r in kept):7.1f}" if kept else f"{'-':>7s}"
        kept_mb = (f"{statistics.median(r['rss'] for r in kept) / 2**20:8.0f}" if kept
                   else f"{'-':>8s}")  # fmt: skip
        doc = first["doc"]
        merged = [x for x in doc["notes"] if "analysed as" in x]
        analysed = merged[0].split("analysed as ")[1].split()[0] if merged else "all"
        findings = ", ".join(f"{f['kind']} ({f['share']:.3f})" for f in doc["findings"])
        print(f"{hours:5d} {n:12,d} {analysed!s:>10s} {med:8.1f} {first['rss'] / 2**20:9.0f} "
              f"{kept_s} {kept_mb} {med / (n / 1e6):14.2f}  {findings}", flush=True)  # fmt: skip
        if not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
    if not args.keep:
        shutil.rmtree(base_dir, ignore_errors=True)
    print(f"this benchmark's own peak RSS: {measure.mb(measure.hwm_bytes())} MB")


if __name__ == "__main__":
    main()
