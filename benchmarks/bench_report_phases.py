"""`gpuprof report` of a long run, phase by phase: the diagnosis in parts (each worker
reading its own nodes' series from the kept form), then the run read whole and the report
rendered from it — the two phases whose peaks a whole-run report holds one after the other
(`cli.report_command`, `watch_end.finish`).

    python benchmarks/bench_report_phases.py RUN_DIR [--workers 2]

Run in this process, which starts small (nothing but the imports): the diagnosis's wall time
and its peak PSS over this process and its workers (sampled every 0.1 s), then, with this
process's high-water mark reset (`measure.reset_hwm`), the whole reading and the report's
rendering: wall time, this process's own peak RSS (``VmHWM``) and its peak PSS sampled the
same way. The run must have its kept form (an ``analyze`` before) and be long enough to be
diagnosed in parts. The report is written to a temporary file.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import measure


def _pss_peak(done: threading.Event, peak: list[int]) -> None:
    import psutil

    me = psutil.Process()
    while not done.wait(0.1):
        total = 0
        for proc in [me, *me.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += proc.memory_full_info().pss
        peak[0] = max(peak[0], total)


def _watched(fn, *args, **kwargs):
    done, peak = threading.Event(), [0]
    thread = threading.Thread(target=_pss_peak, args=(done, peak), daemon=True)
    thread.start()
    t0 = time.perf_counter()
    try:
        out = fn(*args, **kwargs)
    finally:
        done.set()
        thread.join()
    return out, time.perf_counter() - t0, peak[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    from gpuprof import api, loader
    from gpuprof.analyzers.diagnose import parts_min_samples

    run, series = loader.load_for_diagnosis(
        args.run_dir, defer_from=parts_min_samples(args.workers)
    )
    if series is None:
        raise SystemExit(f"{args.run_dir}: not read node by node (no kept form, or too short)")
    print(f"# {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; rows {series.rows}")
    # the threads that sample memory start after the workers fork (they must not be inherited)
    diagnosis, wall, pss = _watched(api.analyze, run, workers=args.workers, series=series)
    print(f"diagnosis in parts: {wall:.1f} s, peak PSS {measure.mb(pss)} MB")
    del run, series
    gc.collect()
    measure.reset_hwm()

    def whole_and_report():
        whole = loader.load_for_analysis(args.run_dir, loader.MAX_GPU_SAMPLES)
        with tempfile.TemporaryDirectory() as tmp:
            api.report(args.run_dir, Path(tmp) / "report.html", run=whole, diagnosis=diagnosis)
        return len(whole.gpu), len(whole.spans)

    rows, wall, pss = _watched(whole_and_report)
    hwm = measure.mb(measure.hwm_bytes())
    print(f"whole reading and report: {wall:.1f} s, peak RSS {hwm} MB, peak PSS "
          f"{measure.mb(pss)} MB ({rows[0]:,} samples, {rows[1]:,} spans)")  # fmt: skip


if __name__ == "__main__":
    main()
