"""The end of `gpuprof watch`: the run's summary, the diagnosis's headline and the HTML report,
as the watcher makes them once the command has ended, on a run that was never analysed.

    python benchmarks/bench_watch_end.py RUN_DIR [--roots ROOT ...] [--repeats 5]

Each round starts a fresh interpreter (from `measure.run`'s spawner, its process tree's RSS
and PSS sampled every 0.1 s) that first imports what a watcher holds by then (the CLI, the
API, the store, pandas and pyarrow: untimed), then times the end of the watch alone — with a
checkout that has `gpuprof.watch_end`, ``watch_end.make`` (a process of its own: one reading
and one diagnosis on every core); with an older one, its ``_print_summary`` and
``_write_report`` (each read and diagnosed the run, in the watcher). Before each round the
run's kept form and report are removed, so every round reads the run as a watch's end does:
for the first time. ``--roots`` are checkouts (the first is usually one of the previous
commit), interleaved round by round with each other; the table gives medians, min and max
of the end's wall time, and the largest tree PSS and RSS. The summary's text is
captured, not shown. ``GPUPROF_WORKERS`` is passed on (default: every core).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import measure

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import sys, time
from pathlib import Path
import pandas, pyarrow, pyarrow.parquet
import gpuprof.cli, gpuprof.commands, gpuprof.api, gpuprof.store
run_dir = Path(sys.argv[1])
t0 = time.perf_counter()
try:
    from gpuprof import watch_end
except ImportError:
    watch_end = None
if watch_end is not None:
    made = watch_end.make(run_dir, quiet=False)
    ok = made.report is not None
else:
    from gpuprof.commands import _print_summary, _write_report
    _print_summary(run_dir)
    ok = _write_report(run_dir, False) is not None
wall = time.perf_counter() - t0
print(f"END {wall:.6f} {int(ok)}")
"""


def _round(root: Path, run_dir: Path) -> dict:
    shutil.rmtree(run_dir / ".gpuprof-loaded", ignore_errors=True)
    (run_dir / "report.html").unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=str(root))
    env.pop("GPUPROF_LOAD_CACHE", None)
    got = measure.run([sys.executable, "-c", CHILD, str(run_dir)], env=env, poll=True,
                      cwd=str(root))  # fmt: skip
    line = [x for x in got["stdout"].decode().splitlines() if x.startswith("END ")][-1]
    _, wall, ok = line.split()
    if ok != "1":
        raise RuntimeError(f"{root}: no report written: {got['stderr'].decode()[-2000:]}")
    return {"end_s": float(wall), "pss": got["tree_pss_bytes"], "rss": got["tree_rss_bytes"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--roots", nargs="+", type=Path, default=[ROOT])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, load {os.getloadavg()[0]:.2f}")  # fmt: skip
    got: dict[Path, list[dict]] = {r: [] for r in args.roots}
    for _ in range(args.repeats):
        for root in args.roots:
            got[root].append(_round(root.resolve(), args.run_dir))
    print(f"# load after {os.getloadavg()[0]:.2f}")
    print(f"{'checkout':40s} {'end median s':>12s} {'min':>7s} {'max':>7s} "
          f"{'tree PSS MB':>11s} {'tree RSS MB':>11s}")  # fmt: skip
    for root, rows in got.items():
        ends = [r["end_s"] for r in rows]
        print(f"{str(root)[-40:]:40s} {statistics.median(ends):12.3f} {min(ends):7.3f} "
              f"{max(ends):7.3f} {max(r['pss'] for r in rows) / 2**20:11.0f} "
              f"{max(r['rss'] for r in rows) / 2**20:11.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
