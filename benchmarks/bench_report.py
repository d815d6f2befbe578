"""Size, render time and browser load time of the HTML report on a day-long, 64-GPU run.

    python benchmarks/bench_report.py [--hours 24] [--gpus 64] [--repeats 3] [--out DIR]
    python benchmarks/bench_report.py --hours 1 --gpus 512      # the widest case

The big run is built here with vectorised numpy rather than `gpuprof.sim` (whose per-sample
frames would need tens of GB at ~55 M GPU samples): a synchronous GRPO job, 8 GPUs per host,
every rank recording step + 8 phase spans per ~56 s step, GPU samples every 0.1 s whose
utilisation, SM activity, memory, PCIe and NVLink follow the phase (long rollout tail, idle
reward scoring and weight sync, rare one-sample drops to 0 %), host CPU every 0.5 s.

`diagnose()` and the per-step `phase_breakdown` can't yet align 55 M samples in memory, so
they run on the same run sampled at ``--diagnose-interval`` (default 1 s; the phases are the
same spans) and are passed to `render_html`, which renders every 0.1 s sample. Reported:

- render: `render_html` + write, median of ``--repeats`` (diagnosis excluded, timed apart);
- size of the file (plotly.js is ~4.8 MB of it);
- load: headless Chromium, cold start per repeat, ``window.__gpuprofRenderedMs`` — the page's
  ``performance.now()`` when every figure has been drawn (time from navigation start);
- memory: this process's RSS holding the run and its diagnosis, and its peak while rendering
  (the high-water mark reset just before the renders, `measure.reset_hwm`), apart from the
  peak of the whole benchmark (building the run and the diagnosis included).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import measure  # noqa: E402
from browser import Browser  # noqa: E402

from gpuprof.analyzers.diagnose import diagnose  # noqa: E402
from gpuprof.analyzers.findings import AnalysisContext  # noqa: E402
from gpuprof.model import GpuSample, Run, RunMeta, Span, columns  # noqa: E402
from gpuprof.reports.html import write_html  # noqa: E402

START_NS = 1_767_225_600_000_000_000
GIB = 2**30
# phase, mean seconds, GPU utilisation %, memory GiB, PCIe GB/s, NVLink GB/s (per GPU)
PHASES = [
    ("dataload", 0.4, 0.0, 40, 0.2, 0.0),
    ("rollout", 26.0, 85.0, 62, 0.3, 2.0),
    ("reward", 9.0, 0.0, 40, 0.0, 0.0),
    ("old_logprob", 3.0, 95.0, 52, 0.2, 5.0),
    ("ref_logprob", 3.0, 95.0, 52, 0.2, 5.0),
    ("advantage", 0.2, 3.0, 40, 0.0, 0.0),
    ("update_actor", 9.0, 96.0, 71, 0.5, 40.0),
    ("reshard", 5.0, 5.0, 45, 22.0, 150.0),
]
COMMAND = [
    "python3", "-m", "verl.trainer.main_ppo", "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.5",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "data.train_batch_size=1024",
    "reward_model.reward_manager=naive",
]  # fmt: skip


def schedule(hours: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Shared phase timeline: start/end ns of every (step, phase) and its phase index."""
    rng = np.random.default_rng(seed)
    means = np.array([p[1] for p in PHASES])
    step_s = means.sum()
    steps = int(hours * 3600 / step_s)
    durations = means * rng.lognormal(0.0, 0.08, size=(steps, len(PHASES)))
    ends = START_NS + np.cumsum(durations.ravel() * 1e9).astype(np.int64)
    starts = np.concatenate([[START_NS], ends[:-1]])
    phase = np.tile(np.arange(len(PHASES)), steps)
    return starts, ends, phase


def gpu_frame(
    starts: np.ndarray, ends: np.ndarray, phase: np.ndarray, gpus: int, interval_s: float,
    seed: int, full_columns: bool = False,
) -> pd.DataFrame:  # fmt: skip
    """GPU samples of every GPU, GPU-major and time-ordered, float32 metrics."""
    rng = np.random.default_rng(seed + 1)
    per_gpu = int((ends[-1] - START_NS) / (interval_s * 1e9))
    n = per_gpu * gpus
    util_lv = np.array([p[2] for p in PHASES], dtype=np.float32)
    mem_lv = np.array([p[3] for p in PHASES], dtype=np.float32) * GIB
    pcie_lv = np.array([p[4] for p in PHASES], dtype=np.float32) * 1e9
    nvl_lv = np.array([p[5] for p in PHASES], dtype=np.float32) * 1e9
    cols = {
        "t_ns": np.empty(n, np.int64),
        "util_gpu_pct": np.empty(n, np.float32),
        "sm_active_pct": np.empty(n, np.float32),
        "mem_used_bytes": np.empty(n, np.float32),
        "pcie_tx_bytes_s": np.empty(n, np.float32),
        "pcie_rx_bytes_s": np.empty(n, np.float32),
        "nvlink_tx_bytes_s": np.empty(n, np.float32),
        "nvlink_rx_bytes_s": np.empty(n, np.float32),
    }
    base_t = START_NS + (np.arange(per_gpu) * interval_s * 1e9).astype(np.int64)
    seg = np.searchsorted(starts, base_t, side="right") - 1
    ph = phase[seg]
    frac = ((base_t - starts[seg]) / (ends[seg] - starts[seg])).astype(np.float32)
    util0 = util_lv[ph]
    rollout = ph == 1
    util0[rollout] -= 45.0 * frac[rollout] ** 4  # the generation tail
    for g in range(gpus):
        part = slice(g * per_gpu, (g + 1) * per_gpu)
        cols["t_ns"][part] = base_t + (g // 8) * 3_000_000
        noise = rng.normal(0.0, 3.0, per_gpu).astype(np.float32)
        util = np.clip(util0 + noise * (util0 > 10) + (g % 8) * 0.3, 0, 100)
        util[rng.random(per_gpu) < 1e-4] = 0.0  # rare one-sample stalls the plot must keep
        cols["util_gpu_pct"][part] = util
        cols["sm_active_pct"][part] = util * 0.68
        cols["mem_used_bytes"][part] = mem_lv[ph] + (g % 8) * 0.2 * GIB
        link = 1.0 + 0.05 * noise / 3.0
        cols["pcie_tx_bytes_s"][part] = pcie_lv[ph] * link
        cols["pcie_rx_bytes_s"][part] = pcie_lv[ph] * link
        cols["nvlink_tx_bytes_s"][part] = nvl_lv[ph] * link
        cols["nvlink_rx_bytes_s"][part] = nvl_lv[ph] * link
    gpu_index = np.repeat(np.arange(gpus, dtype=np.int16), per_gpu)
    hosts = [f"node{h}" for h in range((gpus + 7) // 8)]
    frame = pd.DataFrame(
        {
            "host": pd.Categorical.from_codes(gpu_index // 8, categories=hosts),
            "gpu": gpu_index % 8,
            **cols,
        }
    )
    frame["mem_total_bytes"] = np.float32(80 * GIB)
    if full_columns:  # the analyzers read every model column; missing ones are NaN
        frame = frame.astype({"gpu": np.int64, "host": object})
        for name in columns(GpuSample):
            if name not in frame:
                frame[name] = np.nan
        frame = frame[columns(GpuSample)]
    return frame


def spans_frame(starts: np.ndarray, ends: np.ndarray, phase: np.ndarray, gpus: int) -> pd.DataFrame:
    """Step + phase spans of every rank (one process per GPU, rank = GPU index)."""
    k = len(PHASES)
    steps = len(starts) // k
    step_start, step_end = starts[::k], ends[k - 1 :: k]
    names = np.array([p[0] for p in PHASES] + ["step"], dtype=object)
    one_start = np.concatenate([starts, step_start])
    one_end = np.concatenate([ends, step_end])
    one_phase = np.concatenate([phase, np.full(steps, k)])
    one_step = np.concatenate([np.repeat(np.arange(steps), k), np.arange(steps)])
    m = len(one_start)
    rank = np.repeat(np.arange(gpus), m)
    frame = pd.DataFrame(
        {
            "host": np.array([f"node{r // 8}" for r in range(gpus)], dtype=object)[rank],
            "pid": 10_000 + rank,
            "tid": 10_000 + rank,
            "rank": rank,
            "local_rank": rank % 8,
            "phase": names[np.tile(one_phase, gpus)],
            "name": names[np.tile(one_phase, gpus)],
            "step": np.tile(one_step, gpus),
            "depth": np.tile((one_phase < k).astype(np.int64), gpus),
            "start_ns": np.tile(one_start, gpus),
            "end_ns": np.tile(one_end, gpus),
            "gpu_start_ns": np.nan,
            "gpu_end_ns": np.nan,
        }
    )
    frame["attrs"] = [{}] * len(frame)
    return frame[columns(Span)]


def host_frame(starts: np.ndarray, ends: np.ndarray, phase: np.ndarray, gpus: int) -> pd.DataFrame:
    t = np.arange(START_NS, ends[-1], 500_000_000, dtype=np.int64)
    ph = phase[np.searchsorted(starts, t, side="right") - 1]
    cpu = np.where(ph == 2, 72.0, 8.0)  # reward scoring runs on the CPU
    hosts = [f"node{h}" for h in range((gpus + 7) // 8)]
    return pd.DataFrame(
        {
            "host": np.repeat(np.array(hosts, dtype=object), len(t)),
            "t_ns": np.tile(t, len(hosts)),
            "cpu_pct": np.tile(cpu, len(hosts)),
            "mem_used_bytes": 512 * GIB,
            "mem_total_bytes": 2048 * GIB,
            "n_cpus": 128,
        }
    )


def make_run(hours: float, gpus: int, interval_s: float, seed: int = 0, **kw) -> Run:
    starts, ends, phase = schedule(hours, seed)
    hosts = [f"node{h}" for h in range((gpus + 7) // 8)]
    meta = RunMeta(
        run_id=f"bench-{hours:g}h-{gpus}gpu",
        command=COMMAND,
        hosts=hosts,
        gpus=[
            {
                "host": f"node{g // 8}",
                "index": g % 8,
                "uuid": f"GPU-{g:04d}",
                "name": "NVIDIA H100 80GB HBM3",
                "mem_total_bytes": 80 * GIB,
            }
            for g in range(gpus)
        ],
        framework="verl",
        start_ns=START_NS,
        end_ns=int(ends[-1]),
        exit_code=0,
        interval_s=interval_s,
    )
    run = Run(meta)
    run.gpu = gpu_frame(starts, ends, phase, gpus, interval_s, seed, **kw)
    run.spans = spans_frame(starts, ends, phase, gpus)
    run.host = host_frame(starts, ends, phase, gpus)
    return run


def browser_load(path: Path, repeats: int) -> list[dict]:
    """Per cold-started Chromium: ms from navigation start to plotly.js parsed (``parsed``)
    and to every figure drawn (``drawn``), and each figure's own draw time (``figures``)."""
    results = []
    for _ in range(repeats):
        with Browser() as browser:
            page = browser.open(path.resolve().as_uri())
            drawn = float(page.wait_for("window.__gpuprofRenderedMs", timeout_s=120))
            if page.errors:
                raise SystemExit(f"browser errors: {page.errors}")
            if not page.evaluate(
                "Array.from(document.querySelectorAll('.fig'))"
                ".every(d => d.querySelector('.main-svg'))"
            ):
                raise SystemExit("a figure was not drawn")
            results.append(
                {
                    "drawn": drawn,
                    "parsed": float(page.evaluate("window.__gpuprofScriptStartMs")),
                    "figures": page.evaluate("window.__gpuprofDrawMs"),
                }
            )
    return results


def plotly_only_ms(out_dir: Path, repeats: int) -> float:
    """Median ms to parse and run plotly.js alone in a cold Chromium: the floor under any
    report's load time on this machine."""
    from plotly.offline import get_plotlyjs

    path = out_dir / "plotly-only.html"
    path.write_text(
        "<!DOCTYPE html><html><body><script>" + get_plotlyjs() + "</script>"
        "<script>window.__gpuprofRenderedMs = performance.now()</script></body></html>"
    )
    times = []
    for _ in range(repeats):
        with Browser() as browser:
            page = browser.open(path.resolve().as_uri())
            times.append(float(page.wait_for("window.__gpuprofRenderedMs", timeout_s=60)))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--interval", type=float, default=0.1, help="GPU sample period, s")
    parser.add_argument("--diagnose-interval", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="keep the report here")
    parser.add_argument(
        "--load-only", type=Path, default=None, metavar="REPORT",
        help="only time opening an existing report (and plotly.js alone) in Chromium",
    )  # fmt: skip
    args = parser.parse_args()
    if args.load_only:
        loads = browser_load(args.load_only, args.repeats + 2)
        drawn = statistics.median(r["drawn"] for r in loads)
        floor = plotly_only_ms(Path(tempfile.mkdtemp(prefix="gpuprof-bench-")), args.repeats + 2)
        runs = ", ".join(f"{r['drawn'] / 1000:.2f}" for r in loads)
        print(f"{args.load_only}: {args.load_only.stat().st_size / 1e6:.2f} MB")
        print(f"  Chromium load   median {drawn / 1000:.2f} s (runs: {runs})")
        print(f"  plotly.js alone median {floor / 1000:.2f} s")
        print(f"  load average    {os.getloadavg()[0]:.2f}")
        return

    t0 = time.perf_counter()
    run = make_run(args.hours, args.gpus, args.interval)
    built = time.perf_counter() - t0
    print(
        f"run: {args.hours:g} h x {args.gpus} GPUs, {len(run.gpu):,} GPU samples, "
        f"{len(run.spans):,} spans, {len(run.host):,} host samples (built in {built:.1f} s)"
    )

    t0 = time.perf_counter()
    coarse = make_run(args.hours, args.gpus, args.diagnose_interval, full_columns=True)
    diagnosis = diagnose(coarse)
    ctx = AnalysisContext(coarse)
    phase_steps = ctx.by_phase_step
    took = time.perf_counter() - t0
    print(f"diagnosis on the run at {args.diagnose_interval:g} s sampling ({len(coarse.gpu):,} "
          f"samples): {took:.1f} s, findings: {[f.kind for f in diagnosis.findings]}")  # fmt: skip
    del coarse, ctx

    out_dir = args.out or Path(tempfile.mkdtemp(prefix="gpuprof-bench-report-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report.html"
    render_s = []
    gc.collect()
    held, whole = measure.rss_bytes(), measure.hwm_bytes()
    reset = measure.reset_hwm()
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        write_html(run, path, diagnosis, phase_steps=phase_steps)
        render_s.append(time.perf_counter() - t0)
    rendering = measure.hwm_bytes()
    whole = max(whole, rendering)
    size = path.stat().st_size
    loads = browser_load(path, args.repeats + 2)
    load_ms = [r["drawn"] for r in loads]
    parsed_ms = statistics.median(r["parsed"] for r in loads)
    per_figure = {k: statistics.median(r["figures"][k] for r in loads) for k in loads[0]["figures"]}
    print(f"report: {path}")
    print(f"  size            {size / 1e6:.2f} MB")
    print(f"  render + write  median {statistics.median(render_s):.1f} s  "
          f"(runs: {', '.join(f'{s:.1f}' for s in render_s)})")  # fmt: skip
    print(f"  Chromium load   median {statistics.median(load_ms) / 1000:.2f} s to all figures "
          f"drawn (runs: {', '.join(f'{m / 1000:.2f}' for m in load_ms)})")  # fmt: skip
    print(f"    of which plotly.js parsed at {parsed_ms / 1000:.2f} s; figures drawn in "
          + ", ".join(f"{k[3:]} {v / 1000:.2f} s" for k, v in per_figure.items()))  # fmt: skip
    floor = plotly_only_ms(out_dir, args.repeats + 2)
    print(f"  plotly.js alone (same Chromium, empty page): median {floor / 1000:.2f} s")
    print(f"  load average    {os.getloadavg()[0]:.2f} (other jobs on the machine)")
    if reset:
        print(f"  peak RSS        {measure.mb(rendering)} MB while rendering (the run and its "
              f"diagnosis held: {measure.mb(held)} MB before); {measure.mb(whole)} MB over the "
              "whole benchmark")  # fmt: skip
    else:
        print(f"  peak RSS        {measure.mb(whole)} MB over the whole benchmark (this kernel "
              "does not let the high-water mark be reset)")  # fmt: skip


if __name__ == "__main__":
    main()
