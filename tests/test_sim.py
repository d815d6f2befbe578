"""The simulated cluster: shape of its frames, determinism, and each pathology's evidence."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

from gpuprof import store
from gpuprof.model import RECORD_TYPES, columns
from gpuprof.sim import STALL_KINDS, Pathology, SimConfig, random_config, simulate

FAST = {"gpus": 8, "steps": 4, "time_scale": 0.25, "seed": 3}


def sim(*pathologies: tuple[str, float], **kw):
    cfg = {**FAST, **kw}
    return simulate(SimConfig(pathologies=[Pathology(k, s) for k, s in pathologies], **cfg))


@pytest.fixture(scope="module")
def healthy():
    return sim()


def in_phase(run, phase: str) -> pd.DataFrame:
    """GPU samples that fall inside a phase span of the GPU's own rank."""
    spans = run.spans[run.spans["phase"] == phase]
    gpu = run.gpu
    mask = np.zeros(len(gpu), dtype=bool)
    t = gpu["t_ns"].to_numpy()
    key = gpu["host"].astype(str).to_numpy() + ":" + gpu["gpu"].astype(str).to_numpy()
    for (host, lr), grp in spans.groupby(["host", "local_rank"]):
        sel = key == f"{host}:{lr}"
        for s, e in zip(grp["start_ns"], grp["end_ns"]):
            mask[sel] |= (t[sel] >= s) & (t[sel] < e)
    return gpu[mask]


def phase_seconds(run, phase: str) -> float:
    s = run.spans[(run.spans["phase"] == phase) & (run.spans["rank"] == 0)]
    return float((s["end_ns"] - s["start_ns"]).sum() / 1e9)


def truth_gs(result, kind: str) -> float:
    return next(t.gpu_seconds for t in result.truth if t.kind == kind)


def test_deterministic_for_a_seed():
    a, b = sim(("reward_bound", 0.5)), sim(("reward_bound", 0.5))
    for table in RECORD_TYPES:
        pd.testing.assert_frame_equal(getattr(a.run, table), getattr(b.run, table))
    assert a.truth == b.truth
    c = sim(("reward_bound", 0.5), seed=4)
    assert not c.run.gpu["util_gpu_pct"].equals(a.run.gpu["util_gpu_pct"])


def test_frames_have_model_columns_and_full_sampling(healthy):
    run, cfg = healthy.run, healthy.config
    for table, rtype in RECORD_TYPES.items():
        assert list(getattr(run, table).columns) == columns(rtype), table
    counts = run.gpu.groupby(["host", "gpu"]).size()
    assert len(counts) == cfg.gpus
    expected = int(np.ceil((run.meta.end_ns - run.meta.start_ns) / 1e9 / cfg.interval_s - 1e-9))
    assert (counts == expected).all()
    assert run.gpu["sm_active_pct"].notna().all()  # H100: GPM
    a100 = sim(gpu_name="NVIDIA A100-SXM4-80GB")
    assert a100.run.gpu["sm_active_pct"].isna().all()
    assert set(run.procs["role"]) >= {"main", "trainer", "dataloader"}
    assert len(run.meta.gpus) == cfg.gpus and run.meta.knobs


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_spans_for_every_phase_step_and_rank(algorithm):
    res = sim(algorithm=algorithm)
    spans = res.run.spans
    phases = ["step", "dataload", "rollout", "reward", "old_logprob", "ref_logprob"]
    phases += ["advantage", "update_actor", "reshard"]
    if algorithm == "ppo":
        phases += ["values", "update_critic"]
    for phase in phases:
        got = spans[spans["phase"] == phase].groupby(["rank", "step"]).size()
        assert len(got) == res.config.gpus * res.config.steps, phase
    assert (spans["end_ns"] >= spans["start_ns"]).all()
    assert "gen" in set(spans["name"]) and "update_weights" in set(spans["name"])
    assert len(res.run.events) == res.config.gpus * res.config.steps


def test_trl_names_and_command():
    res = sim(("memory_headroom", 1.0), framework="trl")
    names = set(res.run.spans["name"])
    assert {"_calculate_rewards", "_move_model_to_vllm"} <= names
    assert res.run.meta.command[:2] == ["accelerate", "launch"]
    assert res.run.meta.knobs["vllm_gpu_memory_utilization"] == 0.3


def test_save_load_round_trip(tmp_path):
    res = sim(("imbalance", 0.5), gpus=4, steps=2, time_scale=0.1)
    store.save_run(res.run, tmp_path)
    loaded = store.load_run(tmp_path)
    for table in RECORD_TYPES:
        a, b = getattr(res.run, table), getattr(loaded, table)
        keys = [c for c in ("t_ns", "start_ns", "host", "gpu", "pid", "phase") if c in a]
        a = a.sort_values(keys, ignore_index=True)
        b = b.sort_values(keys, ignore_index=True)
        pd.testing.assert_frame_equal(a, b, check_dtype=True, obj=table)
    assert loaded.meta.knobs == res.run.meta.knobs


def _evidence(kind: str, res, healthy) -> None:
    run, h = res.run, healthy.run
    if kind == "reward_bound":
        assert phase_seconds(run, "reward") > 3 * phase_seconds(h, "reward")
        assert in_phase(run, "reward")["util_gpu_pct"].mean() < 5
        assert run.host["cpu_pct"].max() > 2 * h.host["cpu_pct"].max()
    elif kind == "reshard_idle":
        assert phase_seconds(run, "reshard") > 3 * phase_seconds(h, "reshard")
        rs = in_phase(run, "reshard")
        assert rs["util_gpu_pct"].mean() < 10 and rs["pcie_tx_bytes_s"].mean() > 5e9
    elif kind == "dataloader_starvation":
        assert phase_seconds(run, "dataload") > 5 * phase_seconds(h, "dataload")
        dl = run.procs[run.procs["role"] == "dataloader"]["cpu_pct"].max()
        assert dl > 90 and in_phase(run, "dataload")["util_gpu_pct"].mean() < 2
        assert run.meta.knobs["data.dataloader_num_workers"] <= 1
    elif kind == "generation_tail":
        r = run.spans[run.spans["phase"] == "rollout"].iloc[0]
        step = run.spans[run.spans["phase"] == "step"].iloc[0]["attrs"]  # as verl logs them
        assert step["response_length/max"] > 5 * step["response_length/mean"]
        g = run.gpu[(run.gpu["host"] == r["host"]) & (run.gpu["gpu"] == r["local_rank"])]
        dur = r["end_ns"] - r["start_ns"]
        late = g[(g["t_ns"] > r["end_ns"] - 0.15 * dur) & (g["t_ns"] < r["end_ns"])]
        early = g[(g["t_ns"] > r["start_ns"]) & (g["t_ns"] < r["start_ns"] + 0.3 * dur)]
        assert late["util_gpu_pct"].mean() < 15 < 80 < early["util_gpu_pct"].mean()
    elif kind == "memory_headroom":
        assert run.gpu["mem_used_bytes"].max() < 0.6 * h.gpu["mem_used_bytes"].max()
    elif kind == "offload_thrash":
        up, hup = in_phase(run, "update_actor"), in_phase(h, "update_actor")
        assert up["pcie_tx_bytes_s"].mean() > 10 * hup["pcie_tx_bytes_s"].mean()
        assert up["sm_active_pct"].mean() < 0.6 * hup["sm_active_pct"].mean()
    elif kind == "comm_bound":
        up, hup = in_phase(run, "update_actor"), in_phase(h, "update_actor")
        assert up["nvlink_tx_bytes_s"].mean() > 2 * hup["nvlink_tx_bytes_s"].mean()
        assert up["sm_active_pct"].mean() < 0.6 * hup["sm_active_pct"].mean()
        coll = run.spans[run.spans["name"] == "nccl:reduce_scatter"]
        hcoll = h.spans[h.spans["name"] == "nccl:reduce_scatter"]
        assert (coll["end_ns"] - coll["start_ns"]).sum() > 4 * (
            hcoll["end_ns"] - hcoll["start_ns"]
        ).sum()
    elif kind == "host_bound":
        up = in_phase(run, "update_actor")["util_gpu_pct"].mean()
        assert 30 < up < 0.8 * in_phase(h, "update_actor")["util_gpu_pct"].mean()
        main = run.procs[run.procs["role"] == "trainer"]["cpu_pct"].max()
        assert main > 95
    elif kind == "imbalance":
        rank = res.truth[0].gpus[0]
        up = run.spans[run.spans["phase"] == "update_actor"]
        dur = (up["end_ns"] - up["start_ns"]).groupby(up["rank"]).mean()
        assert dur.idxmax() == rank and dur.max() > 1.2 * dur.drop(rank).max()
        assert (run.spans["name"] == "nccl:barrier").any()
    elif kind == "throttling":
        assert (run.gpu["clock_event_reasons"] & 0x64).astype(bool).mean() > 0.2
        busy = run.gpu[run.gpu["util_gpu_pct"] > 50]
        assert (
            busy["sm_clock_mhz"].mean()
            < 0.85 * h.gpu[h.gpu["util_gpu_pct"] > 50]["sm_clock_mhz"].mean()
        )
    elif kind == "periodic_stall":
        ck = run.spans[run.spans["phase"] == "checkpoint"]
        assert len(ck) and not (h.spans["phase"] == "checkpoint").any()
        assert in_phase(run, "checkpoint")["util_gpu_pct"].mean() < 5
    elif kind == "idle_unattributed":
        # samples of rank 0 outside every phase span (the step span excluded)
        phases = run.spans[(run.spans["depth"] == 1) & (run.spans["rank"] == 0)]
        g = run.gpu[(run.gpu["host"] == "node0") & (run.gpu["gpu"] == 0)]
        t = g["t_ns"].to_numpy()
        covered = np.zeros(len(t), dtype=bool)
        for s, e in zip(phases["start_ns"], phases["end_ns"]):
            covered |= (t >= s) & (t < e)
        assert (~covered).mean() > 0.1 and g["util_gpu_pct"][~covered].mean() < 2
    elif kind == "pipeline_bubble":
        util = run.gpu.pivot_table(index="t_ns", columns=["host", "gpu"], values="util_gpu_pct")
        busy = util > 50
        mixed = (busy.any(axis=1) & (~busy).any(axis=1)).mean()
        assert mixed > 0.5
    elif kind == "unused_gpu":
        gpus = res.truth[0].gpus
        idle = run.gpu[run.gpu["gpu"].isin(gpus)]
        assert idle["util_gpu_pct"].max() == 0 and idle["mem_used_bytes"].max() < 2**30
        assert not run.spans["rank"].isin(gpus).any()  # no process of the job on them
    elif kind == "phantom_util":
        gpus = res.truth[0].gpus
        stuck = run.gpu[run.gpu["gpu"].isin(gpus)]
        assert stuck["util_gpu_pct"].min() == 100 and stuck["mem_used_bytes"].max() <= 2**20
        assert stuck["power_w"].max() < 0.3 * 700  # P0 clocks, but no work drawing power
        assert not run.spans["rank"].isin(gpus).any()  # no process of the job on them
        assert not run.gpu_procs["gpu"].isin(gpus).any()
    elif kind == "hot_gpu":
        gpu = res.truth[0].gpus[0]
        busy = run.gpu[run.gpu["util_gpu_pct"] > 50]
        mine, peers = busy[busy["gpu"] == gpu], busy[busy["gpu"] != gpu]
        assert mine["temp_c"].median() - peers["temp_c"].median() >= 15
        assert mine["sm_clock_mhz"].mean() < 0.9 * peers["sm_clock_mhz"].mean()
        assert (mine["clock_event_reasons"] & 0x60).astype(bool).mean() > 0.2
    elif kind == "power_cap":
        limit = run.meta.gpus[0]["power_limit_w"]
        assert limit < run.meta.gpus[0]["power_default_limit_w"]
        busy = run.gpu[run.gpu["util_gpu_pct"] > 50]
        assert (busy["power_w"] >= 0.97 * limit).mean() > 0.5
        assert (
            busy["sm_clock_mhz"].mean()
            < 0.95 * h.gpu[h.gpu["util_gpu_pct"] > 50]["sm_clock_mhz"].mean()
        )
    elif kind == "idle_allocation":
        t = res.truth[0].intervals_ns[0]
        during = run.gpu[(run.gpu["t_ns"] >= t[0]) & (run.gpu["t_ns"] < t[1])]
        assert (t[1] - t[0]) / 1e9 >= 300 and during["util_gpu_pct"].max() == 0
        named = run.spans[(run.spans["depth"] > 0) & (run.spans["phase"] != "collective")]
        assert not ((named["start_ns"] < t[1]) & (named["end_ns"] > t[0])).any()
    elif kind == "update_bound":
        up, hup = in_phase(run, "update_actor"), in_phase(h, "update_actor")
        assert up["util_gpu_pct"].mean() > 80  # kernels keep running: busy, but slow
        step = run.spans[run.spans["phase"] == "update_actor"]
        hstep = h.spans[h.spans["phase"] == "update_actor"]
        # the same trained tokens take several times as long
        assert (step["end_ns"] - step["start_ns"]).mean() > 4 * (
            hstep["end_ns"] - hstep["start_ns"]
        ).mean()
        assert run.meta.knobs.get("actor_rollout_ref.actor.use_dynamic_bsz") is False
    elif kind == "rollout_bound":
        ro = in_phase(run, "rollout")
        assert ro["util_gpu_pct"].mean() > 80  # the engine keeps running: busy, but slow
        span = run.spans[run.spans["phase"] == "rollout"]
        hspan = h.spans[h.spans["phase"] == "rollout"]
        # the same generated tokens take longer, with the engine given little memory
        assert (span["end_ns"] - span["start_ns"]).mean() > 3 * (
            hspan["end_ns"] - hspan["start_ns"]
        ).mean()
        knob = next(k for k in run.meta.knobs if k.endswith("gpu_memory_utilization"))
        assert run.meta.knobs[knob] == 0.3
    else:  # pragma: no cover - a new kind must get its evidence check
        raise AssertionError(f"no evidence check for {kind}")


@pytest.mark.parametrize("kind", STALL_KINDS)
def test_pathology_evidence_and_cost_scale(kind, healthy):
    strong = sim((kind, 1.0))
    _evidence(kind, strong, healthy)
    costs = [truth_gs(sim((kind, s)), kind) for s in (0.05, 0.5, 1.0)]
    if kind in ("unused_gpu", "phantom_util"):  # whole GPUs: one until severity 0.7, then two
        assert costs[0] == costs[1] < costs[2], costs
    else:
        assert costs[0] < costs[1] < costs[2], costs
        assert costs[0] < 0.15 * costs[2]  # a near miss loses little
    t = strong.truth[0]
    assert t.kind == kind and 0 < t.share < 1 and t.intervals_ns and t.gpus


def test_pathologies_combine():
    res = sim(("reward_bound", 0.6), ("throttling", 0.5), ("periodic_stall", 0.4))
    assert {t.kind for t in res.truth} == {"reward_bound", "throttling", "periodic_stall"}
    assert sum(t.share for t in res.truth) < 1


def test_random_config_simulates():
    rng = np.random.default_rng(0)
    for _ in range(10):
        cfg = random_config(rng, time_scale=(0.02, 0.05), gpus=(1, 2, 8))
        res = simulate(cfg)
        assert {t.kind for t in res.truth} == {p.kind for p in cfg.pathologies}


def test_512_gpus_simulate_fast():
    t0 = time.perf_counter()
    res = simulate(SimConfig(gpus=512, steps=2, time_scale=0.75, seed=1))
    elapsed = time.perf_counter() - t0
    duration = (res.run.meta.end_ns - res.run.meta.start_ns) / 1e9
    assert duration >= 55
    assert res.run.gpu.groupby(["host", "gpu"]).ngroups == 512
    assert elapsed < 5, elapsed


def test_healthy_run_is_mostly_busy(healthy):
    gpu = healthy.run.gpu
    assert healthy.truth == []
    assert (gpu["util_gpu_pct"] < 5).mean() < 0.08
    assert not (gpu["clock_event_reasons"] & 0x64).any()
    assert gpu["mem_used_bytes"].max() > 0.8 * gpu["mem_total_bytes"].max()


def test_split_placement_and_bubble():
    base = sim(placement="split")
    bubble = sim(("pipeline_bubble", 1.0))
    roll = bubble.config.n_rollout_gpus
    assert roll == 4 and base.config.n_rollout_gpus == 4
    spans = bubble.run.spans
    assert not ((spans["phase"] == "update_actor") & (spans["rank"] < roll)).any()
    assert not ((spans["phase"] == "rollout") & (spans["rank"] >= roll)).any()

    def idle_share(res):
        g = res.run.gpu
        return (g["util_gpu_pct"] < 5).mean()

    assert idle_share(bubble) > idle_share(base) + 0.2
    knobs = bubble.run.meta.knobs
    assert knobs.get("actor_rollout_ref.rollout.gpu_memory_utilization") == 0.85


@pytest.mark.parametrize("framework", ["verl", "trl", "swift", "openrlhf", "pytorch"])
def test_knobs_show_the_pathology(framework):
    res = sim(("memory_headroom", 1.0), ("offload_thrash", 0.8), framework=framework)
    knobs, cmd = res.run.meta.knobs, " ".join(res.run.meta.command)
    gmu = {
        "verl": "actor_rollout_ref.rollout.gpu_memory_utilization",
        "trl": "vllm_gpu_memory_utilization",
        "swift": "vllm_gpu_memory_utilization",
        "openrlhf": "vllm.gpu_memory_utilization",
    }.get(framework)
    if gmu:
        assert knobs[gmu] == 0.3 and gmu in cmd
    offload = {
        "verl": "actor_rollout_ref.actor.fsdp_config.param_offload",
        "swift": "offload_model",
        "openrlhf": "ds.adam_offload",
    }.get(framework)
    if offload:
        assert knobs[offload] is True and offload in cmd


@pytest.mark.parametrize("gpus", [1, 12])
def test_odd_shapes(gpus):
    res = sim(("throttling", 0.8), ("reward_bound", 0.3), gpus=gpus, steps=2)
    assert res.run.gpu.groupby(["host", "gpu"]).ngroups == gpus
    assert res.run.meta.hosts == [f"node{i}" for i in range(-(-gpus // 8))]
    assert all(t.gpu_seconds > 0 for t in res.truth)
