"""Hand-labelled runs in public formats, written as the tools that make them write them.

Each builder writes one file a user would import (a verl console log, a PyTorch-profiler
trace, an nvidia-smi CSV log) with a stall whose cause is known because the file describes a
situation users have reported; the tests import it with ``gpuprof import`` and check that the
diagnosis names that cause and no other.
"""

from __future__ import annotations

import gzip
import json
import random
from datetime import datetime, timedelta
from pathlib import Path

VERL_LAUNCH = (
    "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=gae "
    "data.train_batch_size=1024 data.max_response_length=1024 "
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct "
    "actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.gpu_memory_utilization=0.6 "
    "trainer.n_gpus_per_node=8 trainer.nnodes=2 trainer.save_freq={save} trainer.test_freq={test} "
    "trainer.total_epochs=1"
)


def _verl_line(step: int, timing: dict[str, float], metrics: dict[str, float]) -> str:
    parts = [f"step:{step}"]
    parts += [f"{k}:{v:.3f}" for k, v in metrics.items()]
    parts += [f"timing_s/{k}:{v:.3f}" for k, v in timing.items()]
    return "(TaskRunner pid=4242) " + " - ".join(parts)


def verl_periodic_checkpoint(
    path: Path, steps: int = 40, seed: int = 0, named: bool = True
) -> Path:
    """PPO on 2 × 8 GPUs, ~11 s steps; every 10th step also saves a checkpoint and validates
    (~15 s more: ~26 s on those steps). ``named=False``: the extra time is inside the step's
    own timer with no key of its own (a hook the framework does not time)."""
    rng = random.Random(seed)
    lines = [VERL_LAUNCH.format(save=10, test=10)]
    for step in range(1, steps + 1):
        t = {
            "gen": 4.2 * rng.uniform(0.95, 1.05),
            "reward": 0.3 * rng.uniform(0.9, 1.1),
            "old_log_prob": 1.1 * rng.uniform(0.95, 1.05),
            "ref": 1.0 * rng.uniform(0.95, 1.05),
            "values": 0.9 * rng.uniform(0.95, 1.05),
            "adv": 0.1,
            "update_critic": 1.6 * rng.uniform(0.95, 1.05),
            "update_actor": 1.8 * rng.uniform(0.95, 1.05),
        }
        t["step"] = sum(t.values())
        if step % 10 == 0 and named:
            t["save_checkpoint"] = 9.0 * rng.uniform(0.95, 1.05)
            t["testing"] = 6.0 * rng.uniform(0.95, 1.05)
        elif step % 10 == 0:
            t["step"] += 15.0 * rng.uniform(0.95, 1.05)
        metrics = {"response_length/mean": 310.0, "response_length/max": 1024.0,
                   "prompt_length/mean": 120.0, "response_length/clip_ratio": 0.02}  # fmt: skip
        lines.append(_verl_line(step, t, metrics))
    path.write_text("\n".join(lines) + "\n")
    return path


VERL_PPO_7B_LAUNCH = (
    "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=gae "
    "data.train_batch_size=1024 data.max_prompt_length=512 data.max_response_length=512 "
    "actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct critic.model.path=Qwen/Qwen2-7B-Instruct "
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 "
    "critic.ppo_micro_batch_size_per_gpu=2 "
    "actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.tensor_model_parallel_size=2 "
    "trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.save_freq=-1 trainer.test_freq=-1 "
    "trainer.total_epochs=1"
)


def verl_critic_bound(path: Path, steps: int = 70, seed: int = 4) -> Path:
    """PPO of Qwen2-7B on 8 GPUs whose critic update takes 47 % of each step, three times the
    next phase (generation, 16 %), at a third of the actor's MFU by verl's own count (0.085
    against 0.25): the figures issue 41 quotes from a public verl log (update_critic bounds
    the step; the critic is slow for the tokens it trains). The critic's micro-batch (2 per
    GPU against the actor's 16) is this builder's stand-in for a cause."""
    rng = random.Random(seed)
    lines = [VERL_PPO_7B_LAUNCH]
    for step in range(1, steps + 1):
        t = {
            "gen": 16.0 * rng.uniform(0.95, 1.05),
            "reward": 2.0 * rng.uniform(0.9, 1.1),
            "old_log_prob": 5.0 * rng.uniform(0.95, 1.05),
            "ref": 5.0 * rng.uniform(0.95, 1.05),
            "values": 8.0 * rng.uniform(0.95, 1.05),
            "adv": 1.0,
            "update_critic": 47.0 * rng.uniform(0.97, 1.03),
            "update_actor": 15.0 * rng.uniform(0.95, 1.05),
        }
        t["step"] = sum(t.values()) + 1.0
        metrics = {"perf/mfu/actor": 0.25 * rng.uniform(0.97, 1.03),
                   "perf/mfu/critic": 0.085 * rng.uniform(0.97, 1.03),
                   "response_length/mean": 240.0, "response_length/max": 512.0,
                   "prompt_length/mean": 110.0, "response_length/clip_ratio": 0.01}  # fmt: skip
        lines.append(_verl_line(step, t, metrics))
    path.write_text("\n".join(lines) + "\n")
    return path


def verl_long_tail(path: Path, steps: int = 12, seed: int = 1) -> Path:
    """GRPO with long responses: per-worker generation spans from ~170 s (fastest) to ~690 s
    (slowest), generation 55% of the step, 90% of responses cut at the length limit."""
    rng = random.Random(seed)
    lines = [VERL_LAUNCH.format(save=-1, test=-1).replace("gae", "grpo")]
    for step in range(1, steps + 1):
        gen = 690.0 * rng.uniform(0.97, 1.03)
        rest = gen * 0.45 / 0.55
        t = {
            "gen": gen,
            "generation_timing/max": gen * 0.99,
            "generation_timing/min": 170.0 * rng.uniform(0.95, 1.05),
            "generation_timing/topk_ratio": 0.125,
            "reward": 0.02 * rest,
            "old_log_prob": 0.18 * rest,
            "ref": 0.18 * rest,
            "adv": 0.01 * rest,
            "update_actor": 0.61 * rest,
        }
        t["step"] = gen + rest
        metrics = {"response_length/mean": 7800.0, "response_length/max": 8192.0,
                   "prompt_length/mean": 300.0, "response_length/clip_ratio": 0.9}  # fmt: skip
        lines.append(_verl_line(step, t, metrics))
    path.write_text("\n".join(lines) + "\n")
    return path


def nvidia_smi_unused_second_gpu(path: Path, minutes: int = 20, seed: int = 2) -> Path:
    """Two GPUs logged once a second: GPU 0 trains (70–100%), GPU 1 sits at 0% with 15 MiB
    used for the whole run (a launcher started one process)."""
    rng = random.Random(seed)
    t0 = datetime(2026, 3, 2, 9, 0, 0)
    header = ("timestamp, index, name, utilization.gpu [%], memory.used [MiB], "
              "memory.total [MiB], power.draw [W]")  # fmt: skip
    rows = [header]
    for i in range(minutes * 60):
        ts = (t0 + timedelta(seconds=i)).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
        util = rng.randint(70, 100)
        rows.append(f"{ts}, 0, NVIDIA A100-SXM4-80GB, {util} %, 61234 MiB, 81920 MiB, "
                    f"{200 + 2 * util:.2f} W")  # fmt: skip
        rows.append(f"{ts}, 1, NVIDIA A100-SXM4-80GB, 0 %, 15 MiB, 81920 MiB, 58.31 W")
    path.write_text("\n".join(rows) + "\n")
    return path


def kineto_resnet_num_workers_0(path: Path, steps: int = 8) -> Path:
    """A PyTorch-profiler trace of ResNet-50 training on one GPU with a ``num_workers=0``
    DataLoader: each ~150 ms step spends ~60 ms in the loader's ``__next__`` on the main
    thread (decoding and augmenting images) while the GPU waits, then ~90 ms of kernels."""
    pid, tid = 3071, 3071
    t = 1_700_000_000_000_000.0  # µs
    events: list[dict] = []
    corr = 1
    for step in range(steps):
        start = t
        step_us = 150_000.0
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}",
                       "pid": pid, "tid": tid, "ts": start, "dur": step_us})  # fmt: skip
        load = 58_000.0 + 2_000.0 * (step % 3)
        events.append({"ph": "X", "cat": "cpu_op",
                       "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                       "pid": pid, "tid": tid, "ts": start + 100, "dur": load})  # fmt: skip
        k = start + load + 500
        end = start + step_us - 300
        while k < end:
            dur = 850.0
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                           "pid": pid, "tid": tid, "ts": k - 20, "dur": 5.0,
                           "args": {"correlation": corr}})  # fmt: skip
            events.append({"ph": "X", "cat": "kernel",
                           "name": "sm80_xmma_fprop_implicit_gemm_indexed_f16f16",
                           "pid": 0, "tid": 7, "ts": k, "dur": dur,
                           "args": {"device": 0, "stream": 7, "correlation": corr}})  # fmt: skip
            corr += 1
            k += dur + 40
        events.append({"ph": "X", "cat": "cpu_op", "name": "Optimizer.step#SGD.step",
                       "pid": pid, "tid": tid, "ts": end - 2_000, "dur": 1_500})  # fmt: skip
        t += step_us
    doc = {
        "schemaVersion": 1,
        "deviceProperties": [
            {"id": 0, "name": "NVIDIA A100-SXM4-40GB", "totalGlobalMem": 42_505_273_344}
        ],
        "traceEvents": events,
        "displayTimeUnit": "ms",
    }
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    return path


def nvidia_smi_one_gpu_underused(path: Path, minutes: int = 15, seed: int = 3) -> Path:
    """Four GPUs of one data-parallel job logged once a second: GPUs 0-2 at 85-100%, GPU 3 at
    20-35% with as much memory (it gets a small share of every batch)."""
    rng = random.Random(seed)
    t0 = datetime(2026, 3, 4, 14, 0, 0)
    rows = ["timestamp, index, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB]"]
    for i in range(minutes * 60):
        ts = (t0 + timedelta(seconds=i)).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
        for gpu in range(4):
            util = rng.randint(20, 35) if gpu == 3 else rng.randint(85, 100)
            rows.append(f"{ts}, {gpu}, NVIDIA H100 80GB HBM3, {util} %, 70112 MiB, 81559 MiB")
    path.write_text("\n".join(rows) + "\n")
    return path
