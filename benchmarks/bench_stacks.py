"""What sampling Python stacks costs: the watcher's CPU and the training's step time, with
and without stacks.

    python benchmarks/bench_stacks.py cpu   [--repeats 3] [--seconds 30] [--gpus busy|idle]
    python benchmarks/bench_stacks.py steps [--pairs 10] [--steps 40] [--gpus busy|idle]
    python benchmarks/bench_stacks.py threads [--threads 40] [--repeats 200]
    python benchmarks/bench_stacks.py analyze [--hours 1] [--threads 12]
    python benchmarks/bench_stacks.py modes [--seconds 10]

``cpu``: `gpuprof watch` over an idle command with 4 worker processes (5 Python processes
for py-spy to sample, as ``bench_sampler.py``), 8 simulated GPUs at 10 Hz reading busy (the
default stack rate) or idle (the idle rate), alternately with ``--no-stacks`` and with
stacks. Over a window after start-up it reads the watcher process's CPU (user + system, all
its threads) and that of every py-spy process it runs (polled every 0.2 s; a py-spy that
ends between two polls loses at most its last 0.2 s), as % of one core; and the total py-spy
CPU the watcher itself accounts (``wait4`` of each round, the run's ``collector`` event)
over the run's length.

``steps``: ``examples/grpo_tiny.py --num-workers 1`` (a trainer and a loader worker) under
`gpuprof watch`, alternately ``--no-stacks`` and with stacks, on the same simulated GPUs;
step 0 is dropped. Reported: the median step time of each variant over all its steps, the
ratio of the medians and the median of the per-pair ratios. The training is never paused
(``py-spy --nonblocking``): what remains is py-spy reading its memory from another core.

``threads``: what reading one busy process's threads costs the watcher's host collector
(`gpuprof.collectors.host.read_threads`, ``/proc/<pid>/task/*/schedstat`` and, for threads
not seen before, ``stat``), for a process of ``--threads`` threads plus its spinning main
thread: µs per reading, and % of one core at the host sampler's 2 readings a second.

``analyze``: the analysis side on a synthetic run of ``--hours`` with ``--threads`` Python
threads sampled (one row per thread per 1 s window, a busy main thread changing among 300
stacks, plus its thread readings at 2 Hz): seconds to index the stacks and to give 20
findings their top stacks and flame graphs.

``modes``: why the collector runs ``py-spy record`` in rounds rather than ``py-spy dump``
each time it wants a sample: the CPU of one ``dump --json --nonblocking`` (which attaches to
the process every time) against that of a ``record --format chrometrace --idle --threads
--nonblocking`` round of ``--seconds`` at 2 and 20 Hz, on a busy Python process of 2 threads.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_sampler import CHILD  # noqa: E402  (the same idle tree: 1 + 4 processes)
from simnvml import build_library, simnvml_env, write_scenario  # noqa: E402

EXAMPLE = ROOT / "examples" / "grpo_tiny.py"
_STEP = re.compile(r"^step\s+(\d+)\s.*\btime\s+([0-9.]+) ms", re.MULTILINE)


def environment(tmp: Path, gpus: str) -> dict[str, str]:
    util = 90 if gpus == "busy" else 0
    scenario = {"gpus": [{"gpm": True, "series": {"util_gpu_pct": util}} for _ in range(8)]}
    env = simnvml_env(build_library(tmp), write_scenario(tmp / "scenario.txt", scenario))
    env["PYTHONPATH"] = str(ROOT)
    return env


def _cpu(proc: psutil.Process) -> float | None:
    try:
        times = proc.cpu_times()
    except psutil.Error:
        return None
    return times.user + times.system


def cpu_run(env: dict[str, str], stacks: bool, seconds: float) -> dict[str, float]:
    """Watcher and py-spy CPU (% of one core) over ``seconds`` after a 5 s start-up."""
    from gpuprof import store

    run_dir = Path(tempfile.mkdtemp(prefix="gpuprof-stacks-bench-"))
    flags = [] if stacks else ["--no-stacks"]
    cmd = [sys.executable, "-m", "gpuprof", "watch", "--quiet", "-o", str(run_dir), *flags,
           "--", sys.executable, "-c", CHILD]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    watcher = psutil.Process(proc.pid)
    time.sleep(5.0)  # imports, NVML init, the tree walked, py-spy attached
    spies: dict[int, list[float]] = {}  # pid -> [cpu when first seen in the window, last]
    c0, t0 = _cpu(watcher), time.monotonic()
    first = True
    while time.monotonic() - t0 < seconds:
        for child in watcher.children():
            try:
                if child.name() != "py-spy":
                    continue
            except psutil.Error:
                continue
            used = _cpu(child)
            if used is None:
                continue
            if child.pid not in spies:
                spies[child.pid] = [used if first else 0.0, used]
            spies[child.pid][1] = used
        first = False
        time.sleep(0.2)
    c1, t1 = _cpu(watcher), time.monotonic()
    for child in watcher.children(recursive=True):
        if child.name() != "py-spy":
            child.kill()
    proc.wait(timeout=120)
    run = store.load_run(run_dir)
    event = run.events[run.events["kind"] == "collector"]
    accounted = float(event["attrs"].iloc[0]["pyspy_cpu_s"]) if len(event) else 0.0
    length = (run.meta.end_ns - run.meta.start_ns) / 1e9
    return {
        "watcher": 100.0 * (c1 - c0) / (t1 - t0),
        "pyspy": 100.0 * sum(last - base for base, last in spies.values()) / (t1 - t0),
        "pyspy_run": 100.0 * accounted / length,
        "rows": float(len(run.stack_samples)),
    }


def step_run(env: dict[str, str], stacks: bool, steps: int) -> list[float]:
    run_dir = tempfile.mkdtemp(prefix="gpuprof-stacks-steps-")
    flags = [] if stacks else ["--no-stacks"]
    cmd = [sys.executable, "-m", "gpuprof", "watch", "--quiet", "-o", run_dir, *flags, "--",
           sys.executable, str(EXAMPLE), "--steps", str(steps), "--num-workers", "1"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT,
                         env=env).stdout  # fmt: skip
    times = [float(ms) for step, ms in _STEP.findall(out) if int(step) > 0]
    if len(times) != steps - 1:
        raise SystemExit(f"expected {steps - 1} step times, got {len(times)}")
    return times


THREADED = """
import threading, time
for _ in range({n}):
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
print("ready", flush=True)
while True:
    sum(i * i for i in range(1000))
"""


def threads_cost(n: int, repeats: int) -> tuple[float, int]:
    """µs per `read_threads` of a process with ``n`` + 1 threads (names cached after the
    first), and the threads read."""
    from gpuprof.collectors.host import read_threads

    proc = subprocess.Popen([sys.executable, "-c", THREADED.format(n=n)], stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        proc.stdout.readline()
        names: dict[int, str] = {}
        found = read_threads(proc.pid, names)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            read_threads(proc.pid, names)
            times.append(time.perf_counter() - t)
        return 1e6 * statistics.median(times), len(found)
    finally:
        proc.kill()
        proc.wait()


def analyze_cost(hours: float, threads: int) -> dict[str, float]:
    import numpy as np
    import pandas as pd

    from gpuprof.analyzers.stacks import StackIndex
    from gpuprof.collectors.stacks import frame_id, stack_id
    from gpuprof.model import Run, RunMeta, StackSample, ThreadSample

    rng = np.random.default_rng(0)
    t0, windows = 1_800_000_000 * 10**9, int(hours * 3600)
    frames = [(f"f{i}", f"/home/u/m{i % 7}.py", i) for i in range(60)]
    fids = [frame_id(*f) for f in frames]
    paths = [[fids[j] for j in rng.choice(60, size=rng.integers(3, 25), replace=False)]
             for _ in range(300)]  # fmt: skip
    sids = [stack_id(p) for p in paths]
    w = np.repeat(np.arange(windows), threads)
    thread = np.tile(np.arange(threads), windows)
    stack = np.where(thread == 0, rng.integers(0, 300, len(w)), thread % 300)
    samples = pd.DataFrame({
        "host": "h", "t_ns": t0 + w * 10**9, "span_s": 1.0, "window_s": 1.0, "pid": 10,
        "tid": 10 + thread, "thread": np.where(thread == 0, "MainThread", "worker"),
        "role": "main", "stack_id": np.array(sids)[stack], "seconds": 1.0, "rate_hz": 20.0,
    })[list(StackSample.__slots__)]  # fmt: skip
    ticks = np.arange(2 * windows)
    readings = pd.DataFrame({"host": "h", "t_ns": t0 + (ticks + 1) * 5 * 10**8, "pid": 10,
                             "tid": 10, "name": "python", "cpu_pct": 80.0, "runq_pct": 5.0,
                             "interval_s": 0.5})[list(ThreadSample.__slots__)]  # fmt: skip
    run = Run(RunMeta(run_id="bench"),
              stack_frames=pd.DataFrame([(i, *f) for i, f in zip(fids, frames)],
                                        columns=["frame_id", "name", "file", "line"]),
              stacks=pd.DataFrame([(i, " ".join(map(str, p))) for i, p in zip(sids, paths)],
                                  columns=["stack_id", "frames"]),
              stack_samples=samples, threads=readings)  # fmt: skip
    t = time.perf_counter()
    index = StackIndex(run)
    built = time.perf_counter() - t
    starts = np.sort(rng.integers(0, windows - 60, 20))
    intervals = [[[int(t0 + a * 10**9), int(t0 + (a + 60) * 10**9)]] for a in starts]
    t = time.perf_counter()
    for iv in intervals:
        index.summary(iv)
    summaries = time.perf_counter() - t
    t = time.perf_counter()
    for iv in intervals:
        index.tree(iv)
    trees = time.perf_counter() - t
    return {
        "rows": len(samples),
        "readings": len(readings),
        "index_s": built,
        "summaries_s": summaries,
        "trees_s": trees,
    }


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def modes_cost(seconds: float) -> dict[str, float]:
    from gpuprof.collectors.stacks import find_pyspy

    pyspy, why = find_pyspy()
    if pyspy is None:
        raise SystemExit(why)
    busy = THREADED.format(n=1)
    proc = subprocess.Popen([sys.executable, "-c", busy], stdout=subprocess.PIPE, text=True)
    out: dict[str, float] = {}
    try:
        proc.stdout.readline()
        pid, dumps = str(proc.pid), 20
        before = _children_cpu()
        for _ in range(dumps):
            subprocess.run([pyspy, "dump", "--pid", pid, "--json", "--nonblocking"],
                           capture_output=True, check=True)  # fmt: skip
        out["dump_ms"] = 1e3 * (_children_cpu() - before) / dumps
        for rate in (2, 20):
            before = _children_cpu()
            subprocess.run([pyspy, "record", "--pid", pid, "--rate", str(rate), "--duration",
                            str(int(seconds)), "--format", "chrometrace", "--output",
                            os.devnull, "--nonblocking", "--idle", "--threads"],
                           capture_output=True, check=True)  # fmt: skip
            out[f"record_{rate}_pct"] = 100 * (_children_cpu() - before) / int(seconds)
    finally:
        proc.kill()
        proc.wait()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["cpu", "steps", "threads", "analyze", "modes"])
    parser.add_argument("--hours", type=float, default=1.0, help="analyze: run length")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads: extra threads (40); analyze: Python threads")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3,
                        help="cpu: runs per variant; threads: readings")  # fmt: skip
    parser.add_argument("--seconds", type=float, default=30.0, help="cpu: measured window")
    parser.add_argument("--pairs", type=int, default=10, help="steps: interleaved pairs")
    parser.add_argument("--steps", type=int, default=40, help="steps: steps per run")
    parser.add_argument("--gpus", choices=["busy", "idle"], default="busy")
    args = parser.parse_args()
    if args.what == "modes":
        got = modes_cost(args.seconds if args.seconds != 30.0 else 10.0)
        print(f"py-spy dump: {got['dump_ms']:.1f} ms of CPU per sample (at 1 a second: "
              f"{got['dump_ms'] / 10:.2f}% of one core per process)")  # fmt: skip
        for rate in (2, 20):
            print(f"py-spy record at {rate:2d} Hz, one round: {got[f'record_{rate}_pct']:.2f}% "
                  "of one core per process")  # fmt: skip
        return
    if args.what == "analyze":
        got = analyze_cost(args.hours, args.threads or 12)
        print(f"{got['rows']:,} stack rows, {got['readings']:,} thread readings "
              f"({args.hours:g} h, {args.threads or 12} threads): index {got['index_s']:.2f} s, "
              f"20 findings' top stacks {got['summaries_s']:.2f} s, their flame graphs "
              f"{got['trees_s']:.2f} s")  # fmt: skip
        return
    if args.what == "threads":
        us, found = threads_cost(args.threads or 40, max(args.repeats, 20))
        print(f"read_threads of a process with {found} threads: median {us:.0f} µs per reading "
              f"({us / found:.1f} µs per thread); at 2 readings a second "
              f"{100 * 2 * us / 1e6:.3f}% of one core")  # fmt: skip
        return
    env = environment(Path(tempfile.mkdtemp(prefix="gpuprof-simnvml-")), args.gpus)
    print(f"{psutil.cpu_count()} CPUs; 8 simulated GPUs reading {args.gpus}; load average "
          f"{psutil.getloadavg()[0]:.1f} at start")  # fmt: skip
    if args.what == "cpu":
        runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for _ in range(args.repeats):
            for stacks in (False, True):
                runs[stacks].append(cpu_run(env, stacks, args.seconds))
        print(f"5 Python processes, {args.seconds:g} s window, {args.repeats} runs per variant")
        print(f"{'variant':12s} {'watcher %':>10s} {'py-spy %':>9s} {'total %':>8s} "
              f"{'py-spy/run %':>13s} {'stack rows':>11s}")  # fmt: skip
        for stacks, name in ((False, "--no-stacks"), (True, "stacks")):
            r = runs[stacks]
            med = {k: statistics.median(x[k] for x in r) for k in r[0]}
            total = statistics.median(x["watcher"] + x["pyspy"] for x in r)
            print(f"{name:12s} {med['watcher']:10.2f} {med['pyspy']:9.2f} {total:8.2f} "
                  f"{med['pyspy_run']:13.2f} {med['rows']:11.0f}")  # fmt: skip
            print("   runs (watcher + py-spy): "
                  + " ".join(f"{x['watcher']:.2f}+{x['pyspy']:.2f}" for x in r))  # fmt: skip
        return
    off: list[float] = []
    on: list[float] = []
    ratios: list[float] = []
    for i in range(args.pairs):
        order = (False, True) if i % 2 == 0 else (True, False)
        got = {stacks: step_run(env, stacks, args.steps) for stacks in order}
        off += got[False]
        on += got[True]
        ratios.append(statistics.median(got[True]) / statistics.median(got[False]))
    m_off, m_on = statistics.median(off), statistics.median(on)
    print(f"{args.pairs} pairs x {args.steps - 1} steps of grpo_tiny.py --num-workers 1")
    print(f"{'variant':12s} {'median step ms':>15s}")
    print(f"{'--no-stacks':12s} {m_off:15.2f}")
    print(f"{'stacks':12s} {m_on:15.2f}")
    print(f"ratio of medians stacks/--no-stacks: {m_on / m_off:.4f}")
    print(f"median of per-pair ratios:           {statistics.median(ratios):.4f}")
    print("per-pair ratios: " + " ".join(f"{r:.3f}" for r in ratios))


if __name__ == "__main__":
    main()
