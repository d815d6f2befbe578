"""What `gpuprof watch --log-to` costs: each tracker's process, and the watcher's figures.

    python benchmarks/bench_log_to.py [--points 100] [--gpus 8] [--repeats 3]

For each tracker (W&B offline, TensorBoard, MLflow's file store, all in a temporary directory)
the real tracker process (``python -m gpuprof.reports.tracker_sink KIND``) is fed what a watch
sends it: the open message, ``--points`` live points of ``--gpus`` GPUs and 8 phases, the
diagnosis's figures and the attached report (1 MB) and diagnosis. It runs twice, with no live
point and with ``--points``, so that its fixed cost (start, library import, the run's creation
and finish, the upload of the files) and its cost per point separate. CPU is user + system time
of the process and of the processes it starts (W&B's ``wandb-core``), from ``wait4``: CPU time
is what it could take from the training (at ``SCHED_IDLE``, only time the training leaves);
wall time depends on the machine's load. Then the watcher's side: `live_figures` for a point of
``--gpus`` GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuprof.model import GpuSample  # noqa: E402
from gpuprof.reports.live import LiveState  # noqa: E402
from gpuprof.reports.live_run import LiveRun  # noqa: E402
from gpuprof.reports.trackers import (  # noqa: E402
    TRACKERS,
    diagnosis_figures,
    live_figures,
    target,
)

PHASES = ["rollout", "reward", "ref_logprob", "old_logprob", "update_actor", "reshard",
          "dataload", "advantage"]  # fmt: skip


def live_run(gpus: int, seconds: float = 60.0) -> LiveRun:
    """A node's minute: readings at 4 Hz, a span per phase per 10 s, a step per 10 s."""
    live = LiveRun(LiveState(), "n1")
    s = 1_000_000_000
    for k in range(int(seconds * 4)):
        t = k * s // 4
        live.take((t, [GpuSample("n1", g, f"GPU-{g}", t, util_gpu_pct=(k * 7 + g * 13) % 100)
                       for g in range(gpus)], None))  # fmt: skip
    spans = []
    for step in range(int(seconds // 10)):
        for i, phase in enumerate(PHASES):
            spans.append((7, 0, phase, step * 10 * s + i * s, step * 10 * s + (i + 1) * s))
    live.state.add_spans(spans)
    live.state.add_steps([(7, 0, (step + 1) * 10 * s) for step in range(int(seconds // 10))])
    return live


def messages(kind: str, tmp: Path, points: int, gpus: int, files: list[Path]) -> str:
    env = {"WANDB_MODE": "offline", "MLFLOW_TRACKING_URI": (tmp / "mlruns").as_uri(),
           "TENSORBOARD_DIR": str(tmp / "tb"), "WANDB_PROJECT": "bench"}  # fmt: skip
    spec = {"gpuprof_run_dir": str(tmp), "gpuprof_run_id": "bench", "start_s": time.time(),
            **target(kind, ["python", "train.py"], env, str(tmp), tmp)}  # fmt: skip
    lines = [{"op": "open", "spec": spec}]
    figures, _ = live_figures(live_run(gpus))
    for step in range(points):
        figures.step = step
        lines.append(figures.message("log"))
    document = json.loads(files[1].read_text())
    lines.append(diagnosis_figures(document, points).message("final"))
    lines.append({"op": "attach", "files": [str(f) for f in files]})
    return "".join(json.dumps(line) + "\n" for line in lines)


def cpu_of(kind: str, tmp: Path, feed: str) -> tuple[float, float]:
    """Wall and CPU seconds (the process and its children) of one tracker process."""
    env = dict(os.environ)
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(tmp),
               WANDB_CONFIG_DIR=str(tmp / "wc"), WANDB_CACHE_DIR=str(tmp / "wca"),
               WANDB_DATA_DIR=str(tmp / "wd"), MLFLOW_ALLOW_FILE_STORE="true",
               PYTHONPATH=str(ROOT))  # fmt: skip
    # a shell between: its children's rusage (the tracker process and everything it waited
    # for) is what `times` prints, measured apart from this process's other children
    script = f"{sys.executable} -m gpuprof.reports.tracker_sink {kind} >out.jsonl; times"
    started = time.monotonic()
    done = subprocess.run(["bash", "-c", script], input=feed, env=env, cwd=tmp,
                          capture_output=True, text=True, check=True)  # fmt: skip
    wall = time.monotonic() - started
    reply = (tmp / "out.jsonl").read_text()
    if '"done"' not in reply:
        raise SystemExit(f"{kind}: {reply.strip()}")
    children = done.stdout.strip().splitlines()[-1].split()  # "0m1.2s 0m0.3s" user sys
    cpu = sum(_seconds(x) for x in children)
    return wall, cpu


def _seconds(text: str) -> float:
    minutes, seconds = text.rstrip("s").split("m")
    return int(minutes) * 60 + float(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-log-to-"))
    report = base / "report.html"
    report.write_bytes(os.urandom(1 << 20))
    diagnosis = base / "diagnosis.json"
    diagnosis.write_text(json.dumps({"summary": {"mean_util_gpu_pct": 40.0, "idle_gpu_s": 90.0,
        "phases": [{"phase": p, "idle_gpu_s": 10.0} for p in PHASES]},
        "findings": [{"kind": "reward_bound", "gpu_seconds_lost": 50.0, "share": 0.2,
                      "summary": "reward scoring takes 40% of the step"}]}))  # fmt: skip
    print(f"{args.points} live points of {args.gpus} GPUs and {len(PHASES)} phases; "
          f"medians of {args.repeats}; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'tracker':12s} {'fixed cpu s':>12s} {'wall s':>8s} {'cpu ms/point':>13s}")
    n = 0
    for kind in TRACKERS:
        fixed_cpu, fixed_wall, per_point = [], [], []
        for _ in range(args.repeats):
            costs = []
            for points in (0, args.points):
                n += 1
                tmp = base / f"{kind}-{n}"
                tmp.mkdir()
                feed = messages(kind, tmp, points, args.gpus, [report, diagnosis])
                costs.append(cpu_of(kind, tmp, feed))
            (wall0, cpu0), (_, cpu1) = costs
            fixed_cpu.append(cpu0)
            fixed_wall.append(wall0)
            per_point.append(1000 * (cpu1 - cpu0) / max(args.points, 1))
        cpu, wall = statistics.median(fixed_cpu), statistics.median(fixed_wall)
        print(f"{kind:12s} {cpu:12.2f} {wall:8.2f} {statistics.median(per_point):13.2f}")
    live = live_run(args.gpus)
    started = time.process_time()
    rounds = 200
    window = None
    for _ in range(rounds):
        _, window = live_figures(live, window)
    per = (time.process_time() - started) / rounds
    print(f"watcher: live_figures for {args.gpus} GPUs: {1e3 * per:.2f} ms CPU a point")


if __name__ == "__main__":
    main()
