"""Speed of the tolerant per-step timings reader and of format detection that reads a whole file.

    python benchmarks/bench_step_timings.py [--steps 2000] [--chatter-mb 50] [--repeats 3]

Writes, in a temporary directory:

- ``nemo_console``: ``--steps`` NeMo-RL steps as printed (a ``Step N/M`` header, vLLM progress
  lines, the results and ``Timing:`` blocks with a nested timer);
- ``slime_perf``: ``--steps`` slime ``perf N: {…}`` dict lines (trainer side);
- ``jsonl``: ``--steps`` JSON lines with nested ``timing/…`` keys and throughputs;
- ``verl_late``: ``--chatter-mb`` MB of start-up chatter (Ray / vLLM lines) and then 200 verl
  step lines: the first step far past the detection head.

and times, medians over ``--repeats``: ``detect`` (the format, reading as far as it takes) and
``parse`` (the importer alone). Steps/s is of ``parse``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuprof.collectors.importers import detect  # noqa: E402


def nemo_console(steps: int) -> str:
    out = []
    for s in range(1, steps + 1):
        out.append(f"\n{'=' * 25} Step {s}/{steps} {'=' * 25}")
        out.append("▶ Generating responses for batch of size 512...")
        out.append("Processed prompts: 100%|██████████| 512/512 [00:30<00:00, 16.7it/s]")
        out.append("\n📊 Training Results:\n  • Loss: 0.0123\n  • Avg Reward: 0.3100")
        out.append("\n⏱️  Timing:\n  • Total step time: 60.12s")
        rows = [("generation", 30.5), ("policy_training", 20.25), ("prepare_for_generation/total",
                3.0), ("prepare_for_generation/transfer_and_update_weights", 2.5),
                ("data_processing", 0.1)]  # fmt: skip
        out.extend(f"  • {n}: {v:.2f}s ({100 * v / 60.12:.1f}%)" for n, v in rows)
    return "\n".join(out) + "\n"


def slime_perf(steps: int) -> str:
    return "".join(
        f"(MegatronTrainRayActor pid=4242) [2026-01-05 12:20:29] train_metric_utils.py:44 - "
        f"perf {s}: {{'perf/sleep_time': 4.03, 'perf/update_weights_time': 0.33, "
        f"'perf/wake_up_time': 1.94, 'perf/train_wait_time': 11.33, 'perf/log_probs_time': "
        f"0.10, 'perf/actor_train_time': 1.02, 'perf/train_time': 2.84, "
        f"'perf/actor_train_tflops': 3.1, 'perf/step_time': 14.18}}\n"
        for s in range(steps)
    )


def jsonl(steps: int) -> str:
    return "".join(
        f'{{"step": {s}, "timing": {{"rollout": 4.0, "rollout/decode": 3.0, "reward": 0.5, '
        f'"update": 2.0, "total": 6.7}}, "throughput/tokens_per_sec": 1234.5, "loss": 0.1}}\n'
        for s in range(steps)
    )


def verl_late(chatter_mb: int) -> str:
    line = ("(WorkerDict pid=4242) INFO 06-01 12:00:00 model_runner.py:1008] Loading model "
            "weights took 12.5 GB and 3.2 seconds\n")  # fmt: skip
    chatter = line * (chatter_mb * 2**20 // len(line))
    steps = "".join(
        f"(TaskRunner pid=1) step:{s} - actor/pg_loss:0.01 - timing_s/gen:40.1 - "
        f"timing_s/update_actor:20.2 - timing_s/step:61.0\n"
        for s in range(1, 201)
    )
    return chatter + steps


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--chatter-mb", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    files = {
        "nemo_console": (nemo_console(args.steps), args.steps),
        "slime_perf": (slime_perf(args.steps), args.steps),
        "jsonl": (jsonl(args.steps), args.steps),
        "verl_late": (verl_late(args.chatter_mb), 200),
    }
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'file':14} {'MB':>7} {'format':>14} {'detect s':>9} {'parse s':>8} {'steps/s':>9}")
        for name, (text, steps) in files.items():
            path = Path(tmp) / f"{name}.log"
            path.write_text(text, encoding="utf-8")
            module = detect(path)
            detect_s = timed(lambda p=path: detect(p), args.repeats)
            parse_s = timed(lambda p=path, m=module: m.parse(p), args.repeats)
            size = path.stat().st_size / 2**20
            print(f"{name:14} {size:7.1f} {module.FORMAT:>14} {detect_s:9.3f} {parse_s:8.3f} "
                  f"{steps / parse_s:9.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
