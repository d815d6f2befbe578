"""Loading a run from SQLite rows vs from its Parquet side files, and what compaction costs.

    python benchmarks/bench_columnar.py [--gpus 8] [--hours 1] [--repeats 3]

A simulated GRPO run is written the way a watcher killed before the end leaves it (every table
as SQLite rows); the benchmark times `store.load_run` on it in a fresh process, then
`store.compact_run` (what `watch` does when the run ends), then `load_run` again on the
compacted run, and gives the file sizes. Medians of ``--repeats`` fresh-process loads.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuprof import store  # noqa: E402
from gpuprof.model import RECORD_TYPES  # noqa: E402
from gpuprof.sim import SimConfig, simulate  # noqa: E402
from gpuprof.sim.config import DEFAULT_PHASE_S  # noqa: E402

LOAD = """
import json, sys, time
sys.path.insert(0, {root!r})
from gpuprof import store
t = time.perf_counter()
run = store.load_run(sys.argv[1])
print(json.dumps({{"s": time.perf_counter() - t, "gpu": len(run.gpu)}}))
"""


def write_rows(run, run_dir: Path) -> None:
    """Every table as SQLite rows, one file per host (an uncompacted run)."""
    run_dir.mkdir(parents=True)
    for i, host in enumerate(sorted(run.gpu["host"].unique())):
        conn = store.connect(store.host_file(run_dir, host))
        try:
            batch = {}
            for table in RECORD_TYPES:
                frame = getattr(run, table)
                frame = frame[frame["host"] == host] if len(frame) else frame
                batch[table] = list(store._frame_rows(table, frame))
            store.insert_rows(conn, batch)
            if i == 0:
                store.write_meta(conn, "run", run.meta.to_dict())
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()


def load_seconds(run_dir: Path, repeats: int) -> tuple[float, int]:
    code = LOAD.format(root=str(ROOT))
    results = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", code, str(run_dir)], capture_output=True,
                             text=True, check=True)  # fmt: skip
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return statistics.median(r["s"] for r in results), results[0]["gpu"]


def size_mb(run_dir: Path) -> float:
    return sum(p.stat().st_size for p in run_dir.iterdir()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    step_s = sum(v for k, v in DEFAULT_PHASE_S.items() if k not in ("values", "update_critic"))
    run = simulate(SimConfig(gpus=args.gpus, steps=max(1, round(args.hours * 3600 / step_s)),
                             seed=1)).run  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        write_rows(run, run_dir)
        rows_s, n = load_seconds(run_dir, args.repeats)
        rows_mb = size_mb(run_dir)
        t = time.perf_counter()
        store.compact_run(run_dir)
        compact_s = time.perf_counter() - t
        cols_s, n2 = load_seconds(run_dir, args.repeats)
        cols_mb = size_mb(run_dir)
        assert n == n2
        shutil.rmtree(run_dir)
    print(f"{n:,} GPU samples, {len(run.spans):,} spans, {len(run.procs):,} process samples")
    print(f"load from SQLite rows   {rows_s:7.2f} s   {rows_mb:8.1f} MB")
    print(f"compact_run             {compact_s:7.2f} s")
    print(f"load from Parquet       {cols_s:7.2f} s   {cols_mb:8.1f} MB")
    print(
        f"ratio                   {rows_s / cols_s:7.1f}x faster, {rows_mb / cols_mb:.1f}x smaller"
    )


if __name__ == "__main__":
    main()
