"""Speed and size of `gpuprof export` (Perfetto trace, Parquet) and the cost of the live view.

    python benchmarks/bench_export.py [--gpus 8] [--hours 0.5 2] [--repeats 3]

Each size is a simulated GRPO run (`gpuprof.sim`, GPU samples every 0.1 s) with its diagnosis.
Per size it times, medians over ``--repeats``:

- ``perfetto``: building the trace (spans, counters under the default cap, findings) and
  writing it gzipped; the file's size and how many counter events the cap let through;
- ``parquet``: writing the Parquet directory; its size next to the run's SQLite file;
- ``live``: one status redraw for the run's GPUs (state update + rendering, what the live
  thread does up to 4 times a second) and one incremental read of the run file with every span
  new (the worst case of its once-a-second poll).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuprof import store  # noqa: E402
from gpuprof.analyzers.diagnose import diagnose  # noqa: E402
from gpuprof.model import GpuSample  # noqa: E402
from gpuprof.reports.export import export  # noqa: E402
from gpuprof.reports.live import LiveView  # noqa: E402
from gpuprof.run_tail import FileTail  # noqa: E402
from gpuprof.sim import Pathology, SimConfig, simulate  # noqa: E402
from gpuprof.sim.config import DEFAULT_PHASE_S  # noqa: E402


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench(hours: float, gpus: int, repeats: int, tmp: Path) -> dict:
    step_s = sum(v for k, v in DEFAULT_PHASE_S.items() if k not in ("values", "update_critic"))
    config = SimConfig(gpus=gpus, steps=max(1, round(hours * 3600 / step_s)), seed=1,
                       pathologies=[Pathology("reward_bound", 0.6)])  # fmt: skip
    run = simulate(config).run
    diagnosis = diagnose(run)
    run_dir = tmp / f"run-{hours}"
    store.save_run(run, run_dir)
    trace = tmp / "trace.json.gz"
    perfetto_s = _median_s(lambda: export(run, "perfetto", trace, diagnosis=diagnosis), repeats)
    result = export(run, "perfetto", trace, diagnosis=diagnosis)
    parquet = tmp / "parquet"
    parquet_s = _median_s(lambda: export(run, "parquet", parquet), repeats)

    # live view: one redraw's work, and one poll that finds every span of the run new
    class _Stream:
        def fileno(self) -> int:
            return sys.stdout.fileno()

    view = LiveView(lambda: None, store.host_file(run_dir, run.meta.hosts[0]), _Stream())
    t_ns = int(run.gpu["t_ns"].iloc[-1])
    readings = [GpuSample("node0", i, None, t_ns, 50.0, None, 2**34, 2**36) for i in range(gpus)]

    def redraw() -> None:
        view.state.add_readings((t_ns + view.draws, readings, None))
        view.draws += 1
        view._render(79)

    redraws = 200
    redraw_ms = _median_s(lambda: [redraw() for _ in range(redraws)], repeats) / redraws * 1e3

    # the run file as a running watch has it: spans as SQLite rows (a saved run keeps them
    # in Parquet side files, which the live view never reads)
    live_file = tmp / f"live-{hours}.sqlite"
    conn = store.connect(live_file)
    store.insert_rows(conn, {"spans": list(store._frame_rows("spans", run.spans))})
    conn.close()

    def poll_all() -> None:
        tail = FileTail(live_file)
        spans = tail.poll().spans
        assert len(spans) == len(run.spans)
        view.state.add_spans(spans)
        tail.close()

    poll_ms = _median_s(poll_all, repeats) * 1e3
    return {
        "hours": (run.duration_s or 0.0) / 3600,
        "gpu_samples": len(run.gpu),
        "spans": len(run.spans),
        "perfetto_s": perfetto_s,
        "trace_mb": _size(trace) / 1e6,
        "counter_events": result.counts["counter events"],
        "parquet_s": parquet_s,
        "parquet_mb": _size(parquet) / 1e6,
        "sqlite_mb": _size(run_dir) / 1e6,
        "redraw_ms": redraw_ms,
        "poll_ms": poll_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--hours", type=float, nargs="+", default=[0.5, 2.0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpuprof-bench-export-"))
    try:
        rows = [bench(h, args.gpus, args.repeats, tmp) for h in args.hours]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("| run | GPU samples | spans | perfetto s | trace MB (gz) | counter events | "
          "parquet s | parquet MB | SQLite MB | live redraw ms | live poll ms |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['hours']:.2f} h x {args.gpus} GPUs | {r['gpu_samples']:,} | {r['spans']:,} | "
              f"{r['perfetto_s']:.2f} | {r['trace_mb']:.1f} | {r['counter_events']:,} | "
              f"{r['parquet_s']:.2f} | {r['parquet_mb']:.1f} | {r['sqlite_mb']:.1f} | "
              f"{r['redraw_ms']:.2f} | {r['poll_ms']:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
