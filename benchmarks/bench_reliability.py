"""Reliability matrix: what a run loses when the machine or the user misbehaves.

    python benchmarks/bench_reliability.py [--repeats 5] [--spans 200000] [--json OUT]

Each scenario runs a real ``gpuprof watch`` over a Python command that records a phase every
10 ms and a step every 100 ms through the hooks, with 8 simulated GPUs sampled at 10 Hz through
the real NVML bindings (the simulated library, see tests/simnvml). Faults are real: SIGKILL,
a tmpfs filled to the last block, a tmpfs mounted read-only, ``rm -rf`` of the run directory.

Measured per scenario (median and worst over ``--repeats``):

- samples lost (s): how long before the fault the last stored GPU sample is, beyond the
  sampling period (the fault's instant minus the last sample's time, minus 0.1 s);
- spans lost (s): the same for the last stored span end, minus the 10 ms span period;
- spans lost (count) where the command outlives the fault and counts what it recorded;
- said (s): from the fault to the watcher's line about it, where there is one.

Budgets (issue 11): ≤ 1 s of samples and ≤ 0.5 s of spans lost; 0 spans lost under load
(4 threads × ``--spans`` spans each, and 4 processes × ``--spans``). Disk scenarios need
root to mount a tmpfs; without it they are reported as skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from gpuprof import store  # noqa: E402

SAMPLE_PERIOD_S = 0.1
SPAN_PERIOD_S = 0.01

# records a 10 ms phase in a loop and a step every 10 phases; on SIGTERM it leaves the number
# of spans it recorded in argv[1] and exits 0
TRAINER = textwrap.dedent(
    """
    import signal, sys, time, gpuprof
    made = 0
    stop = False
    def on_term(*_):
        global stop
        stop = True
    signal.signal(signal.SIGTERM, on_term)
    seconds = float(sys.argv[2])
    end = time.monotonic() + seconds
    while not stop and time.monotonic() < end:
        with gpuprof.phase("rollout"):
            time.sleep(0.01)
        made += 1
        if made % 10 == 0:
            gpuprof.step()
    open(sys.argv[1], "w").write(str(made))
    sys.exit(3)
    """
)

# N threads (or, with "proc", N processes) record SPANS spans each as fast as they can
LOAD = textwrap.dedent(
    """
    import multiprocessing as mp, sys, threading, gpuprof
    n, spans, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    def work():
        phase = gpuprof.phase
        for _ in range(spans):
            with phase("update"):
                pass
    if kind == "proc":
        ctx = mp.get_context("fork")
        workers = [ctx.Process(target=work) for _ in range(n)]
    else:
        workers = [threading.Thread(target=work) for _ in range(n)]
    for w in workers: w.start()
    for w in workers: w.join()
    """
)


class Watch:
    """A `gpuprof watch` in the background, its stderr lines stamped as they arrive."""

    def __init__(self, run: Path, env: dict[str, str], *argv: str) -> None:
        cmd = [sys.executable, "-m", "gpuprof", "watch", "--interval", str(SAMPLE_PERIOD_S),
               "-o", str(run), "--", sys.executable, *argv]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     env=env, text=True)  # fmt: skip
        self.lines: list[tuple[int, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append((time.time_ns(), line.rstrip("\n")))

    def wait(self, timeout: float = 120) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return code

    def said(self, text: str) -> int | None:
        """When the first line containing ``text`` arrived (ns), or None."""
        return next((t for t, line in self.lines if text in line), None)


def wait_for_run(run: Path, seconds: float = 30) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if any(run.glob("*.sqlite")):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{run}: no run file after {seconds} s")


def child_pids(run: Path) -> list[int]:
    procs = store.load_run(run).procs
    return sorted(set(procs.loc[procs["role"] == "main", "pid"].astype(int)))


def lost_before(fault_ns: int, run: Path) -> dict[str, float]:
    """Seconds of samples and of spans missing before ``fault_ns`` in what ``run`` holds."""
    loaded = store.load_run(run)
    gpu_t = loaded.gpu["t_ns"][loaded.gpu["t_ns"] <= fault_ns]
    spans = loaded.spans[(loaded.spans["phase"] == "rollout")]
    span_t = spans["end_ns"][spans["end_ns"] <= fault_ns]
    samples = (fault_ns - gpu_t.max()) / 1e9 - SAMPLE_PERIOD_S if len(gpu_t) else float("inf")
    span_s = (fault_ns - span_t.max()) / 1e9 - SPAN_PERIOD_S if len(span_t) else float("inf")
    return {"samples_lost_s": max(0.0, samples), "spans_lost_s": max(0.0, span_s)}


def recorded_spans(run: Path, phase: str = "rollout") -> int:
    spans = store.load_run(run).spans
    return int((spans["phase"] == phase).sum())


def jitter(i: int, repeats: int, period: float = 0.5) -> float:
    """Fault instants spread evenly over the writers' flush period."""
    return period * i / max(1, repeats)


# --- scenarios -------------------------------------------------------------------------------


def kill_watcher(tmp: Path, env: dict[str, str], i: int, repeats: int) -> dict[str, float]:
    """SIGKILL of the watcher: the command goes on, its hooks keep recording."""
    run, made = tmp / f"kw{i}", tmp / f"kw{i}.made"
    watch = Watch(run, env, "-c", TRAINER, str(made), "30")
    wait_for_run(run)
    time.sleep(2.0 + jitter(i, repeats))
    watch.proc.kill()
    fault = time.time_ns()
    watch.wait()
    time.sleep(1.0)
    for pid in child_pids(run):
        os.kill(pid, signal.SIGTERM)
    deadline = time.time() + 10
    while not made.exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # its atexit flush
    result = lost_before(fault, run)
    result["spans_lost"] = int(made.read_text()) - recorded_spans(run)
    return result


def kill_training(tmp: Path, env: dict[str, str], i: int, repeats: int) -> dict[str, float]:
    """SIGKILL of the command: its queued spans die with it; the watcher records the end."""
    run, made = tmp / f"kt{i}", tmp / f"kt{i}.made"
    watch = Watch(run, env, "-c", TRAINER, str(made), "30")
    wait_for_run(run)
    time.sleep(2.0 + jitter(i, repeats))
    pids = child_pids(run)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    fault = time.time_ns()
    code = watch.wait()
    assert code == 128 + 9, code
    return lost_before(fault, run)


def _mount(tmp: Path, name: str, size: str = "4m", ro: bool = False) -> Path | None:
    mnt = tmp / name
    mnt.mkdir()
    opts = f"size={size}" + (",ro" if ro else "")
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(mnt)],
                        capture_output=True).returncode == 0  # fmt: skip
    return mnt if ok else None


def _umount(mnt: Path) -> None:
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError:
        pass
    finally:
        os.close(fd)


def disk_full(tmp: Path, env: dict[str, str], i: int, repeats: int) -> dict[str, float] | None:
    """The run's file system fills up mid-run (another process writes until ENOSPC)."""
    mnt = _mount(tmp, f"df{i}", size="16m")
    if mnt is None:
        return None
    try:
        run, made = mnt / "run", tmp / f"df{i}.made"
        watch = Watch(run, env, "-c", TRAINER, str(made), "4.5")
        wait_for_run(run)
        time.sleep(2.0 + jitter(i, repeats))
        _fill(mnt / "filler")
        fault = time.time_ns()
        code = watch.wait()
        assert code == 3, (code, watch.lines)
        said = watch.said("recording stopped at")
        os.unlink(mnt / "filler")  # room to read the run (SQLite's WAL index)
        result = lost_before(fault, run)
        result["said_s"] = (said - fault) / 1e9 if said else float("inf")
        return result
    finally:
        _umount(mnt)


def at_start(tmp: Path, env: dict[str, str], i: int, kind: str) -> dict[str, float] | None:
    """Nothing can be written from the start (ENOSPC, or a read-only file system)."""
    mnt = _mount(tmp, f"{kind}{i}", size="1m")
    if mnt is None:
        return None
    try:
        run = mnt / "run"
        if kind == "enospc":
            _fill(mnt / "filler")
        else:
            run.mkdir()
            subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        started = time.time_ns()
        watch = Watch(run, env, "-c", "import time; time.sleep(1); raise SystemExit(3)")
        code = watch.wait()
        said = watch.said("recording stopped at")
        left = sorted(p.name for p in run.glob("*")) if run.exists() else []
        return {
            "exit_code_kept": float(code == 3),
            "said_s": (said - started) / 1e9 if said else float("inf"),
            "files_left": float(len(left)),
        }
    finally:
        _umount(mnt)


def deleted_dir(tmp: Path, env: dict[str, str], i: int, repeats: int) -> dict[str, float]:
    """``rm -rf`` of the run directory mid-run: nothing can be kept; it must be said."""
    run, made = tmp / f"dd{i}", tmp / f"dd{i}.made"
    watch = Watch(run, env, "-c", TRAINER, str(made), "4")
    wait_for_run(run)
    time.sleep(1.5 + jitter(i, repeats))
    import shutil

    shutil.rmtree(run)
    fault = time.time_ns()
    code = watch.wait()
    assert code == 3, code
    said = watch.said("recording stopped at")
    return {"said_s": (said - fault) / 1e9 if said else float("inf"),
            "exit_code_kept": float(code == 3)}  # fmt: skip


def load(tmp: Path, env: dict[str, str], i: int, kind: str, spans: int) -> dict[str, float]:
    """4 threads or 4 processes recording ``spans`` spans each as fast as they can."""
    run = tmp / f"load-{kind}{i}"
    started = time.perf_counter()
    watch = Watch(run, env, "-c", LOAD, "4", str(spans), kind)
    code = watch.wait(timeout=600)
    assert code == 0, watch.lines
    wall = time.perf_counter() - started
    return {"spans_lost": 4 * spans - recorded_spans(run, "update"), "wall_s": wall}


def summarise(rows: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    keys = sorted({k for row in rows for k in row})
    return {
        k: {"median": statistics.median(r[k] for r in rows), "worst": max(r[k] for r in rows)}
        for k in keys
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--spans", type=int, default=200_000)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--only", help="comma-separated scenario names")
    args = parser.parse_args()

    from simnvml import build_library, simnvml_env, write_scenario

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        lib = build_library(tmp / "lib")
        gpus = [{"gpm": True, "series": {"util_gpu_pct": 60}} for _ in range(8)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROF_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        env.update(simnvml_env(lib, write_scenario(tmp / "scenario.txt", {"gpus": gpus})))
        n = args.repeats
        scenarios = {
            "kill -9 watcher": lambda i: kill_watcher(tmp, env, i, n),
            "kill -9 training": lambda i: kill_training(tmp, env, i, n),
            "disk full mid-run": lambda i: disk_full(tmp, env, i, n),
            "ENOSPC at start": lambda i: at_start(tmp, env, i, "enospc"),
            "read-only at start": lambda i: at_start(tmp, env, i, "ro"),
            "run dir deleted": lambda i: deleted_dir(tmp, env, i, n),
            f"4 threads x {args.spans}": lambda i: load(tmp, env, i, "thread", args.spans),
            f"4 processes x {args.spans}": lambda i: load(tmp, env, i, "proc", args.spans),
        }
        only = set(args.only.split(",")) if args.only else None
        for label, scenario in scenarios.items():
            if only and not any(o in label for o in only):
                continue
            repeats = 1 if label.startswith("4 ") else n
            rows = [scenario(i) for i in range(repeats)]
            if any(row is None for row in rows):
                print(f"{label}: skipped (cannot mount a tmpfs here)", flush=True)
                continue
            results[label] = summarise(rows)
            cells = ", ".join(f"{k} {v['median']:.3g} (worst {v['worst']:.3g})"
                              for k, v in results[label].items())  # fmt: skip
            print(f"{label}: {cells}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
