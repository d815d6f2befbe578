"""A watched command's own printed timings become its phases, with no code change: a script
printing NeMo-RL-, slime- or verl-style per-step lines under `gpuprof watch` (simulated GPUs)
gets steps, phases on the watcher's clock, a step composition and GPU-time per phase; where the
run has phase spans of its own, the printed timings are checked against them instead."""

from __future__ import annotations

import json
import sys
import textwrap

import pandas as pd
import pytest
from conftest import clean_env, run_gpuprof
from simnvml import simnvml_env, write_scenario

from gpuprof import printed_timings, store

pytest_plugins = ["simnvml.fixtures"]

GEN_S, TRAIN_S, SYNC_S = 0.5, 0.3, 0.15  # each several samples of 0.1 s
STEPS = 5

NEMO = """
import sys, time
print("Loaded configuration from: examples/configs/grpo_math_1B.yaml", flush=True)
for step in range(1, STEPS + 1):
    print("\\n" + "=" * 25 + f" Step {step}/{STEPS} " + "=" * 25, flush=True)
    t0 = time.perf_counter()
    print("▶ Preparing for generation...", flush=True)
    time.sleep(SYNC_S); sync = time.perf_counter() - t0
    print("▶ Generating responses for batch of size 64...", flush=True)
    time.sleep(GEN_S); gen = time.perf_counter() - t0 - sync
    print("▶ Training policy...", flush=True)
    time.sleep(TRAIN_S); train = time.perf_counter() - t0 - sync - gen
    total = time.perf_counter() - t0
    print("\\n📊 Training Results:\\n  • Loss: 0.0123\\n  • Avg Reward: 0.3100", flush=True)
    print("\\n⏱️  Timing:", flush=True)
    print(f"  • Total step time: {total:.2f}s", flush=True)
    rows = [("generation", gen), ("policy_training", train), ("prepare_for_generation/total", sync)]
    for name, s in sorted(rows, key=lambda r: -r[1]):
        print(f"  • {name}: {s:.2f}s ({100 * s / total:.1f}%)", flush=True)
"""

SLIME = """
import time
for rollout_id in range(STEPS):
    t0 = time.perf_counter(); time.sleep(GEN_S); gen = time.perf_counter() - t0
    t1 = time.perf_counter(); time.sleep(TRAIN_S); train = time.perf_counter() - t1
    t2 = time.perf_counter(); time.sleep(SYNC_S); sync = time.perf_counter() - t2
    perf = {"perf/rollout_time": round(gen, 3), "perf/train_time": round(train, 3),
            "perf/update_weights_time": round(sync, 3), "perf/actor_train_tflops": 101.5}
    print(f"perf {rollout_id}: {perf}", flush=True)
"""

VERL = """
import time
for step in range(1, STEPS + 1):
    t0 = time.perf_counter(); time.sleep(GEN_S); gen = time.perf_counter() - t0
    t1 = time.perf_counter(); time.sleep(TRAIN_S); upd = time.perf_counter() - t1
    t2 = time.perf_counter(); time.sleep(SYNC_S); oldlp = time.perf_counter() - t2
    total = time.perf_counter() - t0
    print(f"(TaskRunner pid=4242) step:{step} - actor/pg_loss:0.01 - timing_s/gen:{gen:.3f} - "
          f"timing_s/old_log_prob:{oldlp:.3f} - timing_s/update_actor:{upd:.3f} - "
          f"timing_s/step:{total:.3f}", flush=True)
"""

PLAIN = """
import time
print("loading model...", flush=True)
for step in range(STEPS):
    print("Generating rollouts...", flush=True)
    time.sleep(GEN_S)
    print("Computing rewards", flush=True)
    time.sleep(SYNC_S)
    print(f"Train step {step}: loss=0.31", flush=True)
    time.sleep(TRAIN_S)
print("Generating rollouts...", flush=True)
print("done", flush=True)
"""


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "loop.py"
    header = f"STEPS, GEN_S, TRAIN_S, SYNC_S = {STEPS}, {GEN_S}, {TRAIN_S}, {SYNC_S}\n"
    path.write_text(header + textwrap.dedent(body), encoding="utf-8")
    return str(path)


def _four_busy_gpus() -> dict:
    gpus = [{"name": "NVIDIA H100 80GB HBM3", "series": {"util_gpu_pct": 90,
             "mem_used_bytes": 40 * 2**30}} for _ in range(4)]  # fmt: skip
    return {"gpus": gpus}


def _watch(tmp_path, lib, body: str, *flags: str):
    scenario = write_scenario(tmp_path / "scenario.txt", _four_busy_gpus())
    run_dir = tmp_path / "run"
    env = simnvml_env(lib, scenario, base=clean_env())
    argv = [sys.executable, _script(tmp_path, body)]
    result = run_gpuprof("watch", "-o", str(run_dir), "--interval", "0.1", "--no-auto", *flags,
                         "--", *argv, env=env, timeout=240)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result, run_dir


def _by_phase(spans: pd.DataFrame) -> dict[str, float]:
    seconds = (spans["end_ns"] - spans["start_ns"]) / 1e9
    return seconds.groupby(spans["phase"]).median().to_dict()


@pytest.mark.parametrize(
    ("body", "expect"),
    [
        (NEMO, {"rollout": GEN_S, "update_actor": TRAIN_S, "reshard": SYNC_S}),
        (SLIME, {"rollout": GEN_S, "update_actor": TRAIN_S, "reshard": SYNC_S}),
        (VERL, {"rollout": GEN_S, "update_actor": TRAIN_S, "old_logprob": SYNC_S}),
        (PLAIN, {"rollout": GEN_S, "update_actor": TRAIN_S, "reward": SYNC_S}),
    ],
    ids=["nemo-rl", "slime", "verl", "plain-messages"],
)
def test_printed_timings_become_phases_of_a_watched_run(tmp_path, simnvml_lib, body, expect):
    _, run_dir = _watch(tmp_path, simnvml_lib, body)
    run = store.load_run(run_dir)
    printed = run.spans[run.spans["attrs"].map(lambda a: a.get("source") == "printed")]
    assert len(printed) == len(run.spans) > 0
    steps = printed[printed["phase"] == "step"]
    assert len(steps) == STEPS
    medians = _by_phase(printed)
    for phase, seconds in expect.items():
        assert medians[phase] == pytest.approx(seconds, abs=0.12), (phase, medians)
    # on the watcher's clock: each step ends when its line arrived, inside the run
    logs = run.logs
    assert steps["end_ns"].max() <= logs["t_ns"].max()
    assert steps["start_ns"].min() >= run.meta.start_ns
    # the GPUs' samples meet those phases
    analyzed = run_gpuprof("analyze", str(run_dir), "--json", env=clean_env(), timeout=240)
    assert analyzed.returncode == 0, analyzed.stderr
    document = json.loads(analyzed.stdout)
    text = json.dumps(document)
    assert "printed timings" in text
    gpu_s = _gpu_seconds_by_phase(run_dir)
    assert gpu_s.get("rollout", 0) > gpu_s.get("update_actor", 0) > 0, gpu_s


def _gpu_seconds_by_phase(run_dir) -> dict[str, float]:
    from gpuprof.analyzers.labelling import gpu_phase_samples

    run = store.load_run(run_dir)
    samples = gpu_phase_samples(run)
    return samples.groupby("phase")["dt_s"].sum().to_dict()


def test_printed_timings_are_checked_against_the_runs_own_spans():
    """A run with phase spans of its own keeps them; the printed lines are compared."""
    step_ns = 10**9

    def span(step, phase, start, end, source=None):
        attrs = {"source": source} if source else {}
        return {"host": "n", "pid": 1, "tid": 0, "rank": None, "local_rank": None,
                "phase": phase, "name": phase, "step": step, "depth": 0 if phase == "step" else 1,
                "start_ns": start, "end_ns": end, "gpu_start_ns": None, "gpu_end_ns": None,
                "attrs": attrs}  # fmt: skip

    own = pd.DataFrame(
        [span(s, "step", s * step_ns, (s + 1) * step_ns) for s in range(1, 4)]
        + [span(s, "rollout", s * step_ns, s * step_ns + 6 * 10**8) for s in range(1, 4)]
    )
    agree = own.assign(attrs=[{"source": "printed"}] * len(own))
    line = printed_timings.compare(agree, own)
    assert line is not None and " agree over 3 steps" in line and "step time within 0%" in line
    off = agree.copy()
    off.loc[off["phase"] == "rollout", "end_ns"] += 3 * 10**8  # 0.9 s printed, 0.6 s recorded
    line = printed_timings.compare(off, own)
    assert "disagree (most in rollout)" in line and "rollout 33%" in line


def test_printed_timings_with_hooks_are_compared_not_added(tmp_path, simnvml_lib):
    """A loop with gpuprof hooks that also prints verl-style lines: its own spans stay the
    phases, and the notice says how the printed times agree with them."""
    body = """
import time
import gpuprof
for step in range(STEPS):
    t0 = time.perf_counter()
    with gpuprof.phase("rollout"):
        time.sleep(GEN_S)
    gen = time.perf_counter() - t0
    t1 = time.perf_counter()
    with gpuprof.phase("update_actor"):
        time.sleep(TRAIN_S)
    upd = time.perf_counter() - t1
    gpuprof.step(step)
    print(f"step:{step} - timing_s/gen:{gen:.3f} - timing_s/update_actor:{upd:.3f}", flush=True)
"""
    _, run_dir = _watch(tmp_path, simnvml_lib, body)
    run = store.load_run(run_dir)
    assert not run.spans["attrs"].map(lambda a: a.get("source") == "printed").any()
    assert not list(run_dir.glob("*.printed.sqlite"))
    notice = [n for n in printed_timings.notes(run_dir) if "printed timings" in n]
    assert notice and " agree over " in notice[0], printed_timings.notes(run_dir)
    # the analysis shows it among the run's notices
    from gpuprof.loader import load_for_analysis

    assert notice[0] in load_for_analysis(run_dir).meta.notices


def test_nothing_printed_leaves_the_run_as_recorded(tmp_path):
    from gpuprof.model import LogLine, Run, RunMeta, columns

    logs = pd.DataFrame([("h", 10**9 * i, "stdout", f"hello {i}") for i in range(5)],
                        columns=columns(LogLine))  # fmt: skip
    run = Run(meta=RunMeta(run_id="r", hosts=["h"]), logs=logs)
    store.save_run(run, tmp_path / "r")
    assert printed_timings.apply(tmp_path / "r") == []
    # read once: the marker says so; no run file is added and the run reads as before
    assert (tmp_path / "r" / printed_timings.MARKER).exists()
    assert not list((tmp_path / "r").glob("*.printed.sqlite"))
    again = store.load_run(tmp_path / "r")
    assert again.spans.empty and len(again.logs) == 5 and again.meta.run_id == "r"
