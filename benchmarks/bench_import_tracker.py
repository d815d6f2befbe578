"""Speed of `gpuprof import` on a long experiment-tracker history.

    python benchmarks/bench_import_tracker.py [--steps 10000] [--keys 10] [--repeats 3]
                                              [--only tensorboard wandb-run …]

Writes, in a temporary directory, a ``--steps``-step verl history of ``--keys`` keys per step
(the phase times ``timing_s/gen, reward, old_log_prob, ref, adv, update_actor, step`` first, then
``perf/mfu/actor``, ``response_length/mean`` and loss-like keys) with each tracker's own writer:

- ``tensorboard``: torch's ``SummaryWriter`` (one event file, one scalar per key per step);
- ``wandb-run``: a real offline W&B run (``wandb.log(row, step=n)``; history only — W&B's
  system monitor can't be made to sample a week of GPUs here);
- ``wandb-history``: the same history as ``run.history()`` exports it to CSV, plus system rows
  for 8 GPUs (4 metrics each) every 15 s of a 60-s step, as ``run.history(stream="system")``
  gives them: 40 000 GPU-sample rows;
- ``mlflow``: a file-store run written with ``MlflowClient.log_batch``.

and times, medians over ``--repeats``, the whole ``import`` (detect, read with the tracker's
library, map keys, merge, write the run directory) — the figure the ≤ 5 s target is about —
and the CPU seconds it used (this process and wandb's reader), which a loaded machine does not
inflate.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuprof.importing import import_files  # noqa: E402

T0 = 1_760_000_000.0
STEP_S = 60.0
PHASES = {
    "timing_s/gen": 30.0,
    "timing_s/reward": 3.0,
    "timing_s/old_log_prob": 4.0,
    "timing_s/ref": 4.0,
    "timing_s/adv": 0.5,
    "timing_s/update_actor": 15.0,
    "timing_s/step": 57.0,
}
EXTRA = ["perf/mfu/actor", "response_length/mean", "actor/pg_loss", "actor/entropy",
         "critic/score/mean", "actor/grad_norm", "actor/lr"]  # fmt: skip


def rows(steps: int, keys: int) -> list[dict[str, float]]:
    names = [*PHASES, *EXTRA, *(f"extra/k{i}" for i in range(max(0, keys - 14)))]
    names = names[:keys]
    return [{k: PHASES.get(k, 0.5 + (s % 7) / 10) for k in names} for s in range(steps)]


def write_tensorboard(where: Path, history: list[dict[str, float]]) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(where), max_queue=10_000, flush_secs=3600)
    for step, row in enumerate(history, start=1):
        for key, value in row.items():
            writer.add_scalar(key, value, step, walltime=T0 + step * STEP_S)
    writer.close()
    return where


WANDB_WRITER = """
import json, sys, wandb
history = json.load(open(sys.argv[1]))
run = wandb.init(project="bench", settings=wandb.Settings(x_disable_stats=True))
for step, row in enumerate(history, start=1):
    run.log(row, step=step)
run.finish()
"""


def write_wandb_run(where: Path, history: list[dict[str, float]]) -> Path:
    spec = where / "history.json"
    where.mkdir(parents=True)
    spec.write_text(json.dumps(history))
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(where))
    env.update(WANDB_CONFIG_DIR=str(where / "cfg"), WANDB_CACHE_DIR=str(where / "cache"))
    subprocess.run([sys.executable, "-c", WANDB_WRITER, str(spec)], env=env, check=True)
    return next((where / "wandb").glob("offline-run-*"))


def write_wandb_history(where: Path, history: list[dict[str, float]]) -> Path:
    import pandas as pd

    table = []
    for step, row in enumerate(history, start=1):
        end = T0 + step * STEP_S
        table.append({"_step": step, "_runtime": end - T0, "_timestamp": end, **row})
        for k in range(4):  # W&B samples the system every 15 s
            system = {"_timestamp": end - 15.0 * k, "_runtime": end - 15.0 * k - T0}
            for gpu in range(8):
                system |= {f"system.gpu.{gpu}.gpu": 80.0, f"system.gpu.{gpu}.powerWatts": 500.0,
                           f"system.gpu.{gpu}.memoryAllocatedBytes": 6e10,
                           f"system.gpu.{gpu}.temp": 60.0}  # fmt: skip
            table.append(system)
    where.mkdir(parents=True)
    path = where / "history.csv"
    pd.DataFrame(table).to_csv(path)
    return path


def write_mlflow(where: Path, history: list[dict[str, float]]) -> Path:
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    store = where / "mlruns"
    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    run_id = client.create_run(client.create_experiment("bench")).info.run_id
    batch: list = []
    for step, row in enumerate(history, start=1):
        stamp = int((T0 + step * STEP_S) * 1000)
        batch += [Metric(k, v, stamp, step) for k, v in row.items()]
        if len(batch) >= 1000:
            client.log_batch(run_id, metrics=batch)
            batch = []
    if batch:
        client.log_batch(run_id, metrics=batch)
    return store


WRITERS = {
    "tensorboard": write_tensorboard,
    "wandb-run": write_wandb_run,
    "wandb-history": write_wandb_history,
    "mlflow": write_mlflow,
}


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (wandb's reader is one): what
    the import costs on an otherwise idle core, whatever else loads the machine."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--keys", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", choices=list(WRITERS), default=list(WRITERS))
    args = parser.parse_args()
    history = rows(args.steps, args.keys)
    print(f"{args.steps} steps x {args.keys} keys; medians of {args.repeats}")
    print(f"{'format':<15}{'write s':>9}{'import s':>10}{'cpu s':>8}{'values/s':>12}"
          "  spans, gpu rows")  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="bench-tracker-"))
    try:
        for name in args.only:
            t = time.perf_counter()
            source = WRITERS[name](tmp / name, history)
            written = time.perf_counter() - t
            times, cpus = [], []
            for i in range(args.repeats):
                out = tmp / f"{name}-out-{i}"
                t, cpu = time.perf_counter(), _cpu_s()
                import_files([source], out)
                times.append(time.perf_counter() - t)
                cpus.append(_cpu_s() - cpu)
            from gpuprof.store import load_run

            run = load_run(out)
            median = statistics.median(times)
            values = args.steps * args.keys
            cpu = statistics.median(cpus)
            print(f"{name:<15}{written:>9.1f}{median:>10.2f}{cpu:>8.2f}{values / median:>12,.0f}"
                  f"  {len(run.spans)}, {len(run.gpu)}")  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
