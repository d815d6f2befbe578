"""`simulate(config)`: a simulated RL post-training cluster as a `Run`, with its ground truth.

Metrics are generated per GPU group with numpy over the whole sample grid at once: each sample
looks up the segment its group is in (``searchsorted``) and takes that segment's levels, then
per-GPU noise is added to a (GPUs × samples) array. No Python loop runs over samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.model import (
    Event,
    GpuProcSample,
    GpuSample,
    HostSample,
    ProcSample,
    Run,
    RunMeta,
    Span,
    column_kinds,
    columns,
    empty_frame,
)
from gpuprof.sim.config import SimConfig
from gpuprof.sim.frameworks import PHASE_NAMES, build_command
from gpuprof.sim.pathologies import COMPUTE_PHASES, TAIL_DECAY, Level, Plan, build_plan
from gpuprof.sim.timeline import Cost, Group, Timeline, layout

MEM_TOTAL_BYTES = 81559 * 2**20  # H100 80GB HBM3 as NVML reports it
IDLE_CLOCK_MHZ, MAX_CLOCK_MHZ = 345.0, 1980.0
REASON_GPU_IDLE = 0x1
JOB_PROMPTS = 256
"""Prompts per training step of every simulated job, per 8 GPUs."""
PROMPT_LEN = 300.0
"""Mean prompt length in tokens (GSM8K-like math prompts with a chat template)."""
MODEL_BYTES = 15_231_233_024  # a 7B model in bf16: what each weight sync moves


@dataclass
class Truth:
    """One injected stall as the simulator computed it.

    ``gpu_seconds`` is the GPU time the stall costs (wall seconds added × GPUs kept waiting,
    or the idle share of a degraded phase); ``share`` is that over the run's total GPU time.
    ``intervals_ns`` are ``(start_ns, end_ns)`` on the run's clock.
    """

    kind: str
    severity: float
    gpu_seconds: float
    share: float
    gpus: list[int]
    phases: list[str]
    intervals_ns: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class SimResult:
    run: Run
    truth: list[Truth]
    config: SimConfig


def typed_frame(record_type: type, data: dict[str, Any], n: int) -> pd.DataFrame:
    """A frame with exactly the record's columns and the dtypes `store.load_run` gives.

    Integers without gaps are int64 (with gaps float64), floats float64, bools bool,
    strings and attribute dicts object; absent columns are all-missing.
    """
    if n == 0:
        return empty_frame(record_type)
    kinds = column_kinds(record_type)
    out = {}
    for name in columns(record_type):
        kind = kinds[name]
        value = data.get(name)
        if kind in ("int", "float"):
            if value is None:
                out[name] = np.full(n, np.nan)
                continue
            arr = np.broadcast_to(np.asarray(value), (n,))
            if kind == "int" and arr.dtype.kind in "iub":
                out[name] = arr.astype(np.int64)
            else:
                out[name] = arr.astype(np.float64)
        elif kind == "bool":
            out[name] = np.broadcast_to(np.asarray(False if value is None else value), (n,))
        elif kind == "json":
            out[name] = value if value is not None else [{} for _ in range(n)]
        else:
            arr = np.empty(n, dtype=object)
            arr[:] = value if value is not None else None
            out[name] = pd.Series(arr, dtype=object)  # as load_run: object, not inferred str
    return pd.DataFrame(out)


def simulate(config: SimConfig) -> SimResult:
    """Simulate a job; deterministic for ``config.seed``."""
    rng = np.random.default_rng(config.seed)
    plan = build_plan(config, rng)
    tl = layout(config, plan, rng)
    gen = _Gen(config, plan, tl, rng)
    gpu, series = gen.gpu_frame()
    spans, events = gen.spans_events()
    host, procs, gpu_procs = gen.host_frames(series)
    if plan.unused:
        gpu, spans, events, procs, gpu_procs = gen.unuse(gpu, spans, events, procs, gpu_procs)
        tl.costs["unused_gpu"] = Cost(tl.duration_s * len(plan.unused), [(0.0, tl.duration_s)])
    if plan.phantom:
        gpu, spans, events, procs, gpu_procs = gen.unuse(
            gpu, spans, events, procs, gpu_procs, gpus=plan.phantom, stuck=True
        )
        tl.costs["phantom_util"] = Cost(tl.duration_s * len(plan.phantom), [(0.0, tl.duration_s)])
    end_ns = config.start_ns + round(tl.duration_s * 1e9)
    used = config.gpus - len(plan.unused) - len(plan.phantom)  # the command asks for these
    argv, knobs = build_command(
        config.framework, plan.settings, used, config.gpus_per_host, config.algorithm
    )
    meta = RunMeta(
        run_id=f"sim-{config.seed}",
        command=argv,
        cwd="/workspace",
        hosts=config.hosts,
        gpus=gen.inventory,
        driver_version="570.124.06",
        nvml_version="12.570.124.06",
        cuda_driver_version=12080,
        framework=config.framework,
        knobs=knobs,
        start_ns=config.start_ns,
        end_ns=end_ns,
        exit_code=0,
        interval_s=config.interval_s,
        gpuprof_version="sim",
        notices=[f"simulated run: {tl.placement} placement, {config.gpus} GPUs"],
    )
    run = Run(
        meta, gpu=gpu, host=host, procs=procs, gpu_procs=gpu_procs, spans=spans, events=events
    )
    total_gpu_s = config.gpus * tl.duration_s
    truth = []
    for p in config.pathologies:
        if p.kind == "healthy":
            continue
        cost = tl.costs.get(p.kind)
        phases, gpus = plan.scope.get(p.kind, ([], None))
        gpu_s = float(cost.gpu_seconds) if cost else 0.0
        intervals = [
            (config.start_ns + int(a * 1e9), config.start_ns + int(b * 1e9))
            for a, b in (cost.intervals if cost else [])
        ]
        truth.append(
            Truth(
                kind=p.kind,
                severity=p.severity,
                gpu_seconds=gpu_s,
                share=float(gpu_s / total_gpu_s) if total_gpu_s else 0.0,
                gpus=list(range(config.gpus)) if gpus is None else list(gpus),
                phases=list(phases),
                intervals_ns=intervals,
            )
        )
    truth.sort(key=lambda t: -t.gpu_seconds)
    return SimResult(run=run, truth=truth, config=config)


class _Gen:
    """Turns a `Timeline` into frames."""

    def __init__(self, cfg: SimConfig, plan: Plan, tl: Timeline, rng: np.random.Generator):
        self.cfg, self.plan, self.tl, self.rng = cfg, plan, tl, rng
        n = cfg.gpus
        self.host_of = np.array([f"node{i // cfg.gpus_per_host}" for i in range(n)], dtype=object)
        self.local = np.arange(n) % cfg.gpus_per_host
        raw = rng.integers(0, 16, size=(n, 32))
        hexd = ["".join(f"{x:x}" for x in row) for row in raw]
        self.uuid = np.array(
            [f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}" for h in hexd], dtype=object
        )
        self.inventory = [
            {
                "host": self.host_of[i],
                "index": int(self.local[i]),
                "uuid": self.uuid[i],
                "name": cfg.gpu_name,
                "mem_total_bytes": MEM_TOTAL_BYTES,
                "gpm": cfg.has_gpm,
                # PCIe Gen4 x16: what most public A100/H100 PCIe hosts report
                "pcie_link_gen_max": 4,
                "pcie_link_width_max": 16,
                "max_sm_clock_mhz": MAX_CLOCK_MHZ,
            }
            for i in range(n)
        ]
        if plan.power_cap is not None:  # a lowered limit, as nvidia-smi -q -d POWER shows
            for entry in self.inventory:
                entry["power_limit_w"] = plan.power_cap[0]
                entry["power_default_limit_w"] = plan.power_cap[1]
        self.group_of = np.zeros(n, dtype=np.int64)
        for gi, g in enumerate(tl.groups):
            self.group_of[g.gpus] = gi
        self.pid = 10000 + np.arange(n)

    # ---------------------------------------------------------------- per-group level series
    def _level(self, seg_phase: str, kind: str) -> Level:
        if kind == "idle":
            return Level(0.0, 0.0, 0.40, 0.0, 0.0, 75.0)
        if kind == "barrier":  # NCCL spin-wait: a kernel is "running", SMs mostly idle
            mem = self.plan.levels[seg_phase].mem_frac  # still holding that phase's memory
            return Level(100.0, 0.03, mem, 0.1e9, 1e9, 160.0)
        return self.plan.levels[seg_phase]

    def _series(self, g: Group, t: np.ndarray) -> dict[str, np.ndarray]:
        """Noise-free metric levels of a group at times ``t`` (seconds from start)."""
        segs = g.segs
        starts = np.array([s.start_s for s in segs])
        ends = np.array([s.end_s for s in segs])
        idx = np.clip(np.searchsorted(starts, t, side="right") - 1, 0, len(segs) - 1)
        inside = t < ends[idx]
        levels = [self._level(s.phase, s.kind) for s in segs]

        def col(attr: str) -> np.ndarray:
            return np.array([getattr(lv, attr) for lv in levels])[idx]

        util = np.where(inside, col("util"), 0.0)
        # tail: over the last tail_frac of a span, util decays toward tail_floor × util
        pos = (t - starts[idx]) / np.maximum(ends[idx] - starts[idx], 1e-9)
        tail_frac, floor = col("tail_frac"), col("tail_floor")
        x = np.clip((pos - (1 - tail_frac)) / np.maximum(tail_frac, 1e-9), 0.0, 1.0)
        in_tail = (tail_frac > 0) & (pos > 1 - tail_frac)
        decay = floor + (1 - floor) * np.exp(-TAIL_DECAY * x)
        util = np.where(in_tail, util * decay, util)
        busy = np.where(inside, 1.0, 0.0)
        phase_names = np.array([s.phase if s.kind == "phase" else s.kind for s in segs], object)
        return {
            "util": util,
            "sm_ratio": col("sm_ratio"),
            "mem_frac": np.where(inside, col("mem_frac"), 0.40),
            "pcie": col("pcie_bps") * busy,
            "nvlink": col("nvlink_bps") * busy,
            "power": np.where(inside, 75.0 + (col("power_w") - 75.0) * util / 100.0, 75.0),
            "phase": np.where(inside, phase_names[idx], "idle"),
        }

    def gpu_frame(self) -> tuple[pd.DataFrame, dict[int, dict[str, np.ndarray]]]:
        cfg, rng = self.cfg, self.rng
        t = np.arange(0.0, self.tl.duration_s, cfg.interval_s)
        n, m = cfg.gpus, len(t)
        per_group = [self._series(g, t) for g in self.tl.groups]
        gi = self.group_of

        def stack(key: str) -> np.ndarray:
            return np.stack([s[key] for s in per_group])[gi]  # (n, m) by each GPU's group

        noise = cfg.noise
        util = stack("util") * (1 + noise * rng.standard_normal((n, m)))
        util = np.clip(np.round(util), 0, 100)
        sm = np.clip(util * stack("sm_ratio") * (1 + noise * rng.standard_normal((n, m))), 0, 100)
        mem_frac = stack("mem_frac") * (1 + 0.02 * rng.standard_normal((n, 1)))
        if self.plan.straggler is not None:  # the straggler holds the longest sequences
            mem_frac[self.plan.straggler[0]] += 0.08
        mem = (np.clip(mem_frac, 0.01, 0.99) * MEM_TOTAL_BYTES).astype(np.int64)
        pcie = stack("pcie") * np.abs(1 + noise * rng.standard_normal((n, m)))
        nvl = stack("nvlink") * np.abs(1 + noise * rng.standard_normal((n, m)))
        power = stack("power") * (1 + noise * 0.5 * rng.standard_normal((n, m)))
        clock = np.where(util > 0, MAX_CLOCK_MHZ, IDLE_CLOCK_MHZ)
        reasons = np.where(util < 1, REASON_GPU_IDLE, 0).astype(np.int64)
        temp = 33.0 + 0.05 * power + rng.standard_normal((n, m))
        if self.plan.throttle is not None:
            gpus, ratio = self.plan.throttle
            hot = np.zeros((n, m), dtype=bool)
            hot[gpus] = util[gpus] > 20
            clock = np.where(hot, np.round(MAX_CLOCK_MHZ * ratio / 15) * 15, clock)
            reasons = np.where(hot, reasons | self.plan.throttle_bits, reasons)
            temp = np.where(hot, temp + self.plan.throttle_temp_c, temp)
            power = np.where(hot, np.maximum(power, 690.0), power)
        compute = np.isin(stack("phase"), list(COMPUTE_PHASES)) & (util > 20)
        if self.plan.power_cap is not None:
            limit, _, ratio = self.plan.power_cap
            at_cap = compute  # the lowered limit is below what every compute phase draws
            clock = np.where(at_cap, np.round(MAX_CLOCK_MHZ * ratio / 15) * 15, clock)
            power = np.where(at_cap, limit * (0.985 + 0.01 * rng.random((n, m))), power)
            reasons = np.where(at_cap, reasons | 0x4, reasons)
        if self.plan.hot is not None:
            gpu, ratio, extra_c, bits = self.plan.hot
            hot = np.zeros((n, m), dtype=bool)
            hot[gpu] = compute[gpu]
            clock = np.where(hot, np.round(MAX_CLOCK_MHZ * ratio / 15) * 15, clock)
            reasons = np.where(hot, reasons | bits, reasons)
            temp[gpu] += extra_c  # hot whether busy or not: its cooling is bad
        t_ns = self.cfg.start_ns + np.round(t * 1e9).astype(np.int64)
        gpm = cfg.has_gpm
        data = {
            "host": np.repeat(self.host_of, m),
            "gpu": np.repeat(self.local, m),
            "uuid": np.repeat(self.uuid, m),
            "t_ns": np.tile(t_ns, n),
            "util_gpu_pct": util.ravel(),
            "util_mem_pct": np.clip(util * 0.45, 0, 100).ravel(),
            "mem_used_bytes": mem.ravel(),
            "mem_total_bytes": np.int64(MEM_TOTAL_BYTES),
            "pcie_tx_bytes_s": pcie.ravel(),
            "pcie_rx_bytes_s": (pcie * 0.9).ravel(),
            "nvlink_tx_bytes_s": nvl.ravel(),
            "nvlink_rx_bytes_s": nvl.ravel(),
            "power_w": power.ravel(),
            "sm_clock_mhz": clock.ravel().astype(np.float64),
            "temp_c": np.round(temp).ravel(),
            "clock_event_reasons": reasons.ravel(),
            "sm_active_pct": sm.ravel() if gpm else None,
            "sm_occupancy_pct": (sm * 0.5).ravel() if gpm else None,
            "tensor_active_pct": (sm * 0.6).ravel() if gpm else None,
            "dram_active_pct": np.clip(util * 0.45, 0, 100).ravel() if gpm else None,
        }
        frame = typed_frame(GpuSample, data, n * m)
        order = np.lexsort((np.repeat(np.arange(n), m), frame["t_ns"].to_numpy()))
        frame = frame.iloc[order].reset_index(drop=True)
        return frame, {"util": util, "mem": mem, "t": t, "per_group": per_group}

    def unuse(
        self,
        gpu: pd.DataFrame,
        *frames: pd.DataFrame,
        gpus: list[int] | None = None,
        stuck: bool = False,
    ) -> tuple[pd.DataFrame, ...]:
        """The frames with the plan's unused GPUs (or ``gpus``) idle and their rank processes
        absent: no context on the GPU (a few MiB used), no spans, events or process samples.
        ``stuck``: the GPUs read 100 % at P0 clocks and ~115 W instead (phantom utilization)."""
        unused = np.asarray(self.plan.unused if gpus is None else gpus, dtype=np.int64)
        keys = pd.MultiIndex.from_arrays([gpu["host"], gpu["gpu"]])
        off = keys.isin(pd.MultiIndex.from_arrays([self.host_of[unused], self.local[unused]]))
        gpu = gpu.copy()
        for col in ("util_gpu_pct", "util_mem_pct", "pcie_tx_bytes_s", "pcie_rx_bytes_s",
                    "nvlink_tx_bytes_s", "nvlink_rx_bytes_s"):  # fmt: skip
            gpu.loc[off, col] = 0.0
        for col in ("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_active_pct"):
            if gpu[col].notna().any():
                gpu.loc[off, col] = 0.0
        gpu.loc[off, "mem_used_bytes"] = 2 * 2**20
        gpu.loc[off, "power_w"] = 68.0
        gpu.loc[off, "sm_clock_mhz"] = IDLE_CLOCK_MHZ
        gpu.loc[off, "clock_event_reasons"] = REASON_GPU_IDLE
        if stuck:  # the public captures: 100 %, 0–1 MiB, P0 at max clocks, 104–127 W
            gpu.loc[off, "util_gpu_pct"] = 100.0
            gpu.loc[off, "mem_used_bytes"] = 2**20
            gpu.loc[off, "power_w"] = 115.0
            gpu.loc[off, "sm_clock_mhz"] = float(MAX_CLOCK_MHZ)
            gpu.loc[off, "clock_event_reasons"] = 0
            if gpu["sm_active_pct"].notna().any():
                gpu.loc[off, "sm_active_pct"] = 100.0
        pids = set(self.pid[unused].tolist())
        out = [gpu]
        for frame in frames:
            if frame is not None and len(frame) and "pid" in frame:
                frame = frame[~frame["pid"].isin(pids)].reset_index(drop=True)
            out.append(frame)
        return tuple(out)

    # ---------------------------------------------------------------- spans and events
    def spans_events(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        cfg, plan = self.cfg, self.plan
        names = PHASE_NAMES.get(cfg.framework, {})
        cols: dict[str, list] = {k: [] for k in ("gpu", "phase", "name", "step", "depth", "s", "e")}
        attrs: list[dict[str, Any]] = []
        mean_len, max_len = plan.response_len
        # a run compressed in time (time_scale < 1) does proportionally less work per step,
        # so throughput and MFU stay those of the full-size job
        # every framework's job trains 256 prompts per step per 8 GPUs (its batch knob is spelt
        # per device or per step, so the knob's value is not the job's size); phase times do
        # not depend on the GPU count, so the work per step grows with it
        prompts = JOB_PROMPTS * cfg.gpus / 8
        tokens = int(prompts * plan.settings["num_generations"] * mean_len * cfg.time_scale)
        per_rank_tokens = max(1, tokens // cfg.gpus)

        def emit(
            gpus: np.ndarray,
            phase: str,
            name: str,
            step: int,
            depth: int,
            s: float,
            e: float,
            attr: dict[str, Any],
        ) -> None:
            k = len(gpus)
            cols["gpu"].append(gpus)
            for key, val in (
                ("phase", phase),
                ("name", name),
                ("step", step),
                ("depth", depth),
                ("s", s),
                ("e", e),
            ):
                cols[key].append(np.full(k, val, dtype=object if isinstance(val, str) else None))
            attrs.extend(dict(attr) for _ in range(k))  # one dict per row: safe to mutate

        for g in self.tl.groups:
            for st, (s0, s1) in enumerate(self.tl.step_bounds):
                # response lengths ride on the step, as verl logs them on each step line
                step_attrs = {
                    "tokens": per_rank_tokens,
                    "response_length/mean": round(mean_len, 1),
                    "response_length/max": round(max_len, 1),
                    "response_length/clip_ratio": round(plan.clip_ratio, 3),
                    "prompt_length/mean": PROMPT_LEN,
                }
                emit(g.gpus, "step", "step", st, 0, s0, s1, step_attrs)
            for seg in g.segs:
                if seg.kind == "barrier":
                    emit(
                        g.gpus,
                        "collective",
                        "nccl:barrier",
                        seg.step,
                        1,
                        seg.start_s,
                        seg.end_s,
                        {"wait": True},
                    )
                if seg.kind != "phase":
                    continue
                attr: dict[str, Any] = {}
                if seg.phase == "rollout":
                    attr = {"tokens": per_rank_tokens}
                elif seg.phase == "reshard":
                    attr = {"bytes": MODEL_BYTES}
                name = names.get(seg.phase, seg.phase)
                emit(g.gpus, seg.phase, name, seg.step, 1, seg.start_s, seg.end_s, attr)
                if seg.phase in ("update_actor", "update_critic"):
                    # the collectives of the update (FSDP all-gather / reduce-scatter)
                    c0 = seg.end_s - plan.collective_frac * (seg.end_s - seg.start_s)
                    emit(
                        g.gpus,
                        "collective",
                        "nccl:reduce_scatter",
                        seg.step,
                        2,
                        c0,
                        seg.end_s,
                        {"op": "reduce_scatter"},
                    )
        gpu = np.concatenate(cols["gpu"])
        s = np.concatenate(cols["s"]).astype(np.float64)
        e = np.concatenate(cols["e"]).astype(np.float64)
        start_ns = cfg.start_ns + np.round(s * 1e9).astype(np.int64)
        end_ns = cfg.start_ns + np.round(e * 1e9).astype(np.int64)
        k = len(gpu)
        data = {
            "host": self.host_of[gpu],
            "pid": self.pid[gpu],
            "tid": self.pid[gpu],
            "rank": gpu,
            "local_rank": self.local[gpu],
            "phase": np.concatenate(cols["phase"]),
            "name": np.concatenate(cols["name"]),
            "step": np.concatenate(cols["step"]).astype(np.int64),
            "depth": np.concatenate(cols["depth"]).astype(np.int64),
            "start_ns": start_ns,
            "end_ns": end_ns,
            "attrs": attrs,
        }
        spans = typed_frame(Span, data, k)
        order = np.lexsort((-spans["end_ns"].to_numpy(), spans["start_ns"].to_numpy()))
        spans = spans.iloc[order].reset_index(drop=True)
        # step events: one per rank at each step's end, as gpuprof.step(tokens=…) records
        n, n_steps = cfg.gpus, len(self.tl.step_bounds)
        ends = np.array([b for _, b in self.tl.step_bounds])
        ranks = np.repeat(np.arange(n), n_steps)
        steps = np.tile(np.arange(n_steps), n)
        ev = {
            "host": self.host_of[ranks],
            "pid": self.pid[ranks],
            "rank": ranks,
            "t_ns": cfg.start_ns + np.round(np.tile(ends, n) * 1e9).astype(np.int64),
            "kind": "step",
            "name": "step",
            "attrs": [{"step": int(st), "tokens": per_rank_tokens} for st in steps],
        }
        events = typed_frame(Event, ev, n * n_steps)
        events = events.sort_values("t_ns", kind="stable", ignore_index=True)
        return spans, events

    # ---------------------------------------------------------------- host, procs, gpu procs
    def host_frames(self, series: dict) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        cfg, plan, rng = self.cfg, self.plan, self.rng
        th = np.arange(0.0, self.tl.duration_s, cfg.host_interval_s)
        m = len(th)
        t_ns = cfg.start_ns + np.round(th * 1e9).astype(np.int64)
        # the GPU sample nearest each host sample
        gi_idx = np.clip(np.round(th / cfg.interval_s).astype(np.int64), 0, len(series["t"]) - 1)
        group_phase = [s["phase"][gi_idx] for s in series["per_group"]]

        def lookup(table: dict[str, float], phases: np.ndarray) -> np.ndarray:
            keys = np.unique(phases)
            out = np.full(len(phases), table.get("*", 0.0))
            for key in keys:
                out[phases == key] = table.get(str(key), table.get("*", 0.0))
            return out

        hosts, host_rows, proc_rows = cfg.hosts, [], []
        noise = cfg.noise
        for h, host in enumerate(hosts):
            first = h * cfg.gpus_per_host
            local_gpus = np.arange(first, min(cfg.gpus, first + cfg.gpus_per_host))
            ph = group_phase[self.group_of[first]]
            cpu = lookup(plan.host_cpu, ph) * (1 + noise * rng.standard_normal(m))
            host_rows.append(
                {"host": np.full(m, host, object), "t_ns": t_ns, "cpu_pct": np.clip(cpu, 0, 100)}
            )
            procs = [(20000 + h, "dataloader", "pt_data_worker", ph)]
            if h == 0:
                procs.insert(0, (1000, "main", "python3", ph))
            for g in local_gpus:
                gph = group_phase[self.group_of[g]]
                role = (
                    "inference"
                    if self.tl.groups[self.group_of[g]].role == "rollout"
                    else ("trainer")
                )
                procs.append((int(self.pid[g]), role, "python3", gph))
            for pid, role, name, phs in procs:
                pc = lookup(plan.proc_cpu.get(role, {}), phs)
                pc = np.clip(pc * (1 + noise * rng.standard_normal(m)), 0, 100.0 * 1.02)
                proc_rows.append(
                    {
                        "host": np.full(m, host, object),
                        "t_ns": t_ns,
                        "pid": np.full(m, pid),
                        "ppid": np.full(m, 1000 if pid != 1000 else 1),
                        "role": np.full(m, role, object),
                        "name": np.full(m, name, object),
                        "cpu_pct": pc,
                        "rss_bytes": np.full(m, 6 * 2**30 if role != "dataloader" else 2**30),
                        "num_threads": np.full(m, 64),
                    }
                )
        host = _concat(
            HostSample,
            host_rows,
            extra={"n_cpus": 128, "mem_total_bytes": 2 * 2**40, "mem_used_bytes": 300 * 2**30},
        )
        procs_frame = _concat(ProcSample, proc_rows)
        # gpu_procs: each rank's process on its GPU, memory and SM share as NVML reports them
        n = cfg.gpus
        util, mem = series["util"][:, gi_idx], series["mem"][:, gi_idx]
        gp = {
            "host": np.repeat(self.host_of, m),
            "t_ns": np.tile(t_ns, n),
            "gpu": np.repeat(self.local, m),
            "pid": np.repeat(self.pid, m),
            "gpu_mem_bytes": (mem * 0.97).astype(np.int64).ravel(),
            "sm_util_pct": util.ravel(),
            "watched": np.ones(n * m, dtype=bool),
        }
        gpu_procs = typed_frame(GpuProcSample, gp, n * m)
        host = host.sort_values("t_ns", kind="stable", ignore_index=True)
        procs_frame = procs_frame.sort_values("t_ns", kind="stable", ignore_index=True)
        gpu_procs = gpu_procs.sort_values("t_ns", kind="stable", ignore_index=True)
        return host, procs_frame, gpu_procs


def _concat(record_type: type, rows: list[dict], extra: dict | None = None) -> pd.DataFrame:
    merged: dict[str, Any] = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
    n = len(next(iter(merged.values())))
    merged.update(extra or {})
    return typed_frame(record_type, merged, n)
