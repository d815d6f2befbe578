"""`simulate(config)`: a simulated RL post-training cluster as a `Run`, with its ground truth;
`simulate_to(config, run_dir)`: the same run written straight into a run directory.

Metrics are generated per GPU group with numpy over the whole sample grid at once: each sample
looks up the segment its group is in (``searchsorted``) and takes that segment's levels, then
each GPU gets its own noise. The noise is the rows of one (GPUs × samples) draw per metric,
handed out one GPU at a time (`gpuprof.sim.noise.RowDraws`), so the run can be made and
written one host and one GPU at a time with the numbers of the whole-run draw: `simulate_to`
holds one GPU's samples and one host's other rows, never the run. No Python loop runs over
samples.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from gpuprof import columnar, store
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
from gpuprof.sim.noise import RowDraws
from gpuprof.sim.pathologies import COMPUTE_PHASES, TAIL_DECAY, Level, build_plan
from gpuprof.sim.timeline import Cost, Group, layout

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
    """Simulate a job in memory; deterministic for ``config.seed``.

    The frames are what `simulate_to` writes host by host, put together as one `Run`.
    """
    gen = _Gen(config)
    parts, gpu_parts = [], []
    for h in range(len(gen.hosts)):
        at_host = []
        for i in gen.host_gpus(h):
            data, util, mem = gen.gpu_data(int(i))
            gpu_parts.append(data)
            at_host.append((util, mem))
        parts.append(dict(gen.host_columns(h, at_host)))
    gpu = _time_ordered(gpu_parts, gen.m)
    frames = {
        t: gen.frame(t, _concat_data([part for p in parts for part in p[t]])) for t in parts[0]
    }
    run = Run(gen.meta(), gpu=gpu, **frames)
    return SimResult(run=run, truth=gen.truth(), config=config)


@dataclass
class SimWritten:
    """What `simulate_to` wrote: the run directory, its files, metadata and ground truth."""

    run_dir: Path
    files: list[Path]
    meta: RunMeta
    truth: list[Truth]
    config: SimConfig
    gpu_samples: int


def simulate_to(
    config: SimConfig, run_dir: str | os.PathLike, *, run_id: str | None = None
) -> SimWritten:
    """Simulate a job straight into a run directory, one host file at a time.

    Writes what ``store.save_run(simulate(config).run, run_dir)`` writes, byte for byte, but
    holds one GPU's samples, then one table of one host's other rows, at a time, never the
    run: memory does not grow with the GPU count, and with the duration only by one GPU's and
    one node's series (the process peaks at ~0.2 GB for an hour, ~0.7 GB for 1.5 days at
    10 Hz: `benchmarks/bench_simulate.py`). ``run_id`` replaces the metadata's ``sim-<seed>``.
    """
    run_dir = Path(run_dir)
    gen = _Gen(config)
    meta = gen.meta()
    if run_id is not None:
        meta.run_id = run_id
    files: list[Path] = []
    samples = 0
    # node0 first: save_run puts the run's metadata in the first host file in name order
    for h in sorted(range(len(gen.hosts)), key=lambda h: gen.hosts[h]):
        files += store.write_host_file(
            run_dir, gen.hosts[h], gen.host_tables(h), meta if h == 0 else None
        )
        samples += len(gen.host_gpus(h)) * gen.m
    return SimWritten(run_dir, files, meta, gen.truth(), config, samples)


def _concat_data(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Column arrays of several parts (hosts, processes, GPUs) as one: arrays and lists
    (attrs) joined; a value the same for every row of every part kept as one value, a value
    per part repeated over the part's rows."""
    sizes = [_rows(p) for p in parts]
    out: dict[str, Any] = {}
    for key, first in parts[0].items():
        values = [p[key] for p in parts]
        if isinstance(first, list):
            out[key] = [x for v in values for x in v]
        elif not any(isinstance(v, np.ndarray) for v in values) and all(
            type(v) is type(first) and v == first for v in values
        ):
            out[key] = first
        else:
            out[key] = np.concatenate([_full(v, k) for v, k in zip(values, sizes)])
    return out


def _rows(part: dict[str, Any]) -> int:
    return next(len(v) for v in part.values() if isinstance(v, np.ndarray | list))


def _time_ordered(parts: list[dict[str, Any]], m: int) -> pd.DataFrame:
    """Every GPU's samples (``parts``: one GPU each, in order, on the same time grid, as
    `_Gen.gpu_data` makes them) as one frame in time order, GPU by GPU at each time. Each
    column is filled in that order and taken out of ``parts`` as it goes, so the samples are
    held about twice, not four times."""
    n = len(parts)
    data: dict[str, Any] = {}
    for key in list(parts[0]):
        values = [p.pop(key) for p in parts]
        if not any(isinstance(v, np.ndarray) for v in values) and all(
            type(v) is type(values[0]) and v == values[0] for v in values
        ):
            data[key] = values[0]  # one value for every sample (None: not measured)
            continue
        full = [_full(v, m) for v in values]
        out = np.empty((m, n), dtype=full[0].dtype)
        for i, v in enumerate(full):
            out[:, i] = v
        del values, full
        data[key] = out.reshape(-1)
    return typed_frame(GpuSample, data, n * m)


class _Gen:
    """Generates the run one host (and one GPU) at a time.

    Everything that is not per sample — the plan, the timeline, the GPU inventory, the metric
    levels of each GPU group over time, the spans each group emits — is worked out once.
    The per-sample noise comes from one generator stream, drawn in the order of the
    whole-run arrays (`RowDraws`), so any GPU or host can be made alone and still get the
    numbers it has in the whole run.
    """

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        rng = np.random.default_rng(cfg.seed)
        self.plan = plan = build_plan(cfg, rng)
        self.tl = tl = layout(cfg, plan, rng)
        if plan.unused:
            tl.costs["unused_gpu"] = Cost(tl.duration_s * len(plan.unused), [(0.0, tl.duration_s)])
        if plan.phantom:
            tl.costs["phantom_util"] = Cost(
                tl.duration_s * len(plan.phantom), [(0.0, tl.duration_s)]
            )
        n = cfg.gpus
        self.hosts = cfg.hosts
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
        self.removed = {int(p) for p in self.pid[[*plan.unused, *plan.phantom]]}
        # the sample grids: GPU samples, and host / process samples
        self.t = np.arange(0.0, tl.duration_s, cfg.interval_s)
        self.m = len(self.t)
        self.t_ns = cfg.start_ns + np.round(self.t * 1e9).astype(np.int64)
        self.th = np.arange(0.0, tl.duration_s, cfg.host_interval_s)
        self.th_ns = cfg.start_ns + np.round(self.th * 1e9).astype(np.int64)
        # the GPU sample nearest each host sample
        self.gi_idx = np.clip(np.round(self.th / cfg.interval_s).astype(np.int64), 0, self.m - 1)
        self.series = [self._series(g, self.t) for g in tl.groups]
        group_phase = [s["phase"][self.gi_idx] for s in self.series]
        self.procs = [self._host_procs(h, group_phase) for h in range(len(self.hosts))]
        # the noise, in the order the whole-run draws take it from the stream
        m, mh = self.m, len(self.th)
        draws: list[tuple[str, list[int]]] = [("normal", [m] * n)] * 2  # util, SM activity
        draws.append(("normal", [1] * n))  # memory level of each GPU
        draws += [("normal", [m] * n)] * 4  # PCIe, NVLink, power, temperature
        if plan.power_cap is not None:
            draws.append(("uniform", [m] * n))  # power at the cap
        self.host_draw = len(draws)  # then each host: its CPU, then each process's CPU
        draws.append(("normal", [(1 + len(procs)) * mh for _, procs in self.procs]))
        self.noise = RowDraws(rng, draws)
        self.spans = [self._span_calls(g) for g in tl.groups]

    # ---------------------------------------------------------------- the run's description
    def meta(self) -> RunMeta:
        cfg, plan, tl = self.cfg, self.plan, self.tl
        used = cfg.gpus - len(plan.unused) - len(plan.phantom)  # the command asks for these
        argv, knobs = build_command(
            cfg.framework, plan.settings, used, cfg.gpus_per_host, cfg.algorithm
        )
        return RunMeta(
            run_id=f"sim-{cfg.seed}",
            command=argv,
            cwd="/workspace",
            hosts=cfg.hosts,
            gpus=self.inventory,
            driver_version="570.124.06",
            nvml_version="12.570.124.06",
            cuda_driver_version=12080,
            framework=cfg.framework,
            knobs=knobs,
            start_ns=cfg.start_ns,
            end_ns=cfg.start_ns + round(tl.duration_s * 1e9),
            exit_code=0,
            interval_s=cfg.interval_s,
            gpuprof_version="sim",
            notices=[f"simulated run: {tl.placement} placement, {cfg.gpus} GPUs"],
        )

    def truth(self) -> list[Truth]:
        cfg, plan, tl = self.cfg, self.plan, self.tl
        total_gpu_s = cfg.gpus * tl.duration_s
        truth = []
        for p in cfg.pathologies:
            if p.kind == "healthy":
                continue
            cost = tl.costs.get(p.kind)
            phases, gpus = plan.scope.get(p.kind, ([], None))
            gpu_s = float(cost.gpu_seconds) if cost else 0.0
            intervals = [
                (cfg.start_ns + int(a * 1e9), cfg.start_ns + int(b * 1e9))
                for a, b in (cost.intervals if cost else [])
            ]
            truth.append(
                Truth(
                    kind=p.kind,
                    severity=p.severity,
                    gpu_seconds=gpu_s,
                    share=float(gpu_s / total_gpu_s) if total_gpu_s else 0.0,
                    gpus=list(range(cfg.gpus)) if gpus is None else list(gpus),
                    phases=list(phases),
                    intervals_ns=intervals,
                )
            )
        truth.sort(key=lambda t: -t.gpu_seconds)
        return truth

    def host_gpus(self, h: int) -> np.ndarray:
        first = h * self.cfg.gpus_per_host
        return np.arange(first, min(self.cfg.gpus, first + self.cfg.gpus_per_host))

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
        phase = np.where(inside, phase_names[idx], "idle")
        return {
            "util": util,
            "sm_ratio": col("sm_ratio"),
            "mem_frac": np.where(inside, col("mem_frac"), 0.40),
            "pcie": col("pcie_bps") * busy,
            "nvlink": col("nvlink_bps") * busy,
            "power": np.where(inside, 75.0 + (col("power_w") - 75.0) * util / 100.0, 75.0),
            "phase": phase,
            "compute": np.isin(phase, list(COMPUTE_PHASES)),
        }

    # ---------------------------------------------------------------- GPU samples
    def gpu_data(self, i: int) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
        """GPU ``i``'s samples as column arrays (one value where it is the same in every sample:
        host, index, uuid, total memory; None for a metric the GPU lacks), and its utilisation
        and memory at the host sample times (what NVML's per-process figures show)."""
        cfg, plan, m = self.cfg, self.plan, self.m
        s = self.series[self.group_of[i]]
        draw = iter(range(self.host_draw))

        def z() -> np.ndarray:
            return self.noise.row(next(draw), i, m)

        noise = cfg.noise
        util = s["util"] * (1 + noise * z())
        util = np.clip(np.round(util), 0, 100)
        sm = np.clip(util * s["sm_ratio"] * (1 + noise * z()), 0, 100)
        mem_frac = s["mem_frac"] * (1 + 0.02 * self.noise.row(next(draw), i, 1)[0])
        if plan.straggler is not None and plan.straggler[0] == i:
            mem_frac = mem_frac + 0.08  # the straggler holds the longest sequences
        mem = (np.clip(mem_frac, 0.01, 0.99) * MEM_TOTAL_BYTES).astype(np.int64)
        pcie = s["pcie"] * np.abs(1 + noise * z())
        nvl = s["nvlink"] * np.abs(1 + noise * z())
        power = s["power"] * (1 + noise * 0.5 * z())
        clock = np.where(util > 0, MAX_CLOCK_MHZ, IDLE_CLOCK_MHZ)
        reasons = np.where(util < 1, REASON_GPU_IDLE, 0).astype(np.int64)
        temp = 33.0 + 0.05 * power + z()
        if plan.throttle is not None and i in set(np.asarray(plan.throttle[0]).tolist()):
            hot = util > 20
            clock = np.where(hot, np.round(MAX_CLOCK_MHZ * plan.throttle[1] / 15) * 15, clock)
            reasons = np.where(hot, reasons | plan.throttle_bits, reasons)
            temp = np.where(hot, temp + plan.throttle_temp_c, temp)
            power = np.where(hot, np.maximum(power, 690.0), power)
        compute = s["compute"] & (util > 20)
        if plan.power_cap is not None:
            limit, _, ratio = plan.power_cap
            at_cap = compute  # the lowered limit is below what every compute phase draws
            clock = np.where(at_cap, np.round(MAX_CLOCK_MHZ * ratio / 15) * 15, clock)
            power = np.where(at_cap, limit * (0.985 + 0.01 * z()), power)
            reasons = np.where(at_cap, reasons | 0x4, reasons)
        if plan.hot is not None and plan.hot[0] == i:
            _, ratio, extra_c, bits = plan.hot
            clock = np.where(compute, np.round(MAX_CLOCK_MHZ * ratio / 15) * 15, clock)
            reasons = np.where(compute, reasons | bits, reasons)
            temp = temp + extra_c  # hot whether busy or not: its cooling is bad
        at_host = (util[self.gi_idx], mem[self.gi_idx])
        gpm = cfg.has_gpm
        data = {
            "host": self.host_of[i],
            "gpu": self.local[i],
            "uuid": self.uuid[i],
            "t_ns": self.t_ns,
            "util_gpu_pct": util,
            "util_mem_pct": np.clip(util * 0.45, 0, 100),
            "mem_used_bytes": mem,
            "mem_total_bytes": np.int64(MEM_TOTAL_BYTES),
            "pcie_tx_bytes_s": pcie,
            "pcie_rx_bytes_s": pcie * 0.9,
            "nvlink_tx_bytes_s": nvl,
            "nvlink_rx_bytes_s": nvl,
            "power_w": power,
            "sm_clock_mhz": clock.astype(np.float64),
            "temp_c": np.round(temp),
            "clock_event_reasons": reasons,
            "sm_active_pct": sm if gpm else None,
            "sm_occupancy_pct": sm * 0.5 if gpm else None,
            "tensor_active_pct": sm * 0.6 if gpm else None,
            "dram_active_pct": np.clip(util * 0.45, 0, 100) if gpm else None,
        }
        if i in plan.unused:
            self._unuse(data)
        if i in plan.phantom:
            self._unuse(data, stuck=True)
        return data, *at_host

    def _unuse(self, data: dict[str, Any], stuck: bool = False) -> None:
        """An unused GPU: idle, its rank's process absent, no context (a few MiB used).
        ``stuck``: it reads 100 % at P0 clocks and ~115 W instead (phantom utilization)."""
        m = self.m
        for col in ("util_gpu_pct", "util_mem_pct", "pcie_tx_bytes_s", "pcie_rx_bytes_s",
                    "nvlink_tx_bytes_s", "nvlink_rx_bytes_s"):  # fmt: skip
            data[col] = np.zeros(m)
        for col in ("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_active_pct"):
            if data[col] is not None:
                data[col] = np.zeros(m)
        data["mem_used_bytes"] = np.full(m, 2 * 2**20, dtype=np.int64)
        data["power_w"] = np.full(m, 68.0)
        data["sm_clock_mhz"] = np.full(m, IDLE_CLOCK_MHZ)
        data["clock_event_reasons"] = np.full(m, REASON_GPU_IDLE, dtype=np.int64)
        if stuck:  # the public captures: 100 %, 0–1 MiB, P0 at max clocks, 104–127 W
            data["util_gpu_pct"] = np.full(m, 100.0)
            data["mem_used_bytes"] = np.full(m, 2**20, dtype=np.int64)
            data["power_w"] = np.full(m, 115.0)
            data["sm_clock_mhz"] = np.full(m, float(MAX_CLOCK_MHZ))
            data["clock_event_reasons"] = np.zeros(m, dtype=np.int64)
            if data["sm_active_pct"] is not None:
                data["sm_active_pct"] = np.full(m, 100.0)

    def host_tables(self, h: int) -> Iterator[tuple[str, Any]]:
        """Host ``h``'s tables for `store.write_host_file`, made as they are written: the GPU
        samples one GPU at a time, then the host's other tables."""
        at_host: list[tuple[np.ndarray, np.ndarray]] = []

        def gpu_frames() -> Iterator[pa.Table]:
            for i in self.host_gpus(h):
                data, util, mem = self.gpu_data(int(i))
                at_host.append((util, mem))
                table = columnar.from_columns("gpu", data, self.m)
                del data  # the table holds what it needs
                yield table
                del table  # one GPU in memory at a time, not two

        yield "gpu", gpu_frames()
        for table, data in self.host_columns(h, at_host):
            yield table, self.host_arrow(table, data)

    # ---------------------------------------------------------------- spans and events
    def _span_calls(self, g: Group) -> dict[str, Any]:
        """The spans of one GPU of group ``g``, in the order the group records them."""
        cfg, plan = self.cfg, self.plan
        names = PHASE_NAMES.get(cfg.framework, {})
        mean_len, max_len = plan.response_len
        # a run compressed in time (time_scale < 1) does proportionally less work per step,
        # so throughput and MFU stay those of the full-size job
        # every framework's job trains 256 prompts per step per 8 GPUs (its batch knob is spelt
        # per device or per step, so the knob's value is not the job's size); phase times do
        # not depend on the GPU count, so the work per step grows with it
        rows: list[tuple[str, str, int, int, float, float, dict[str, Any]]] = []
        per_rank_tokens = self._per_rank_tokens()
        for st, (s0, s1) in enumerate(self.tl.step_bounds):
            # response lengths ride on the step, as verl logs them on each step line
            step_attrs = {
                "tokens": per_rank_tokens,
                "response_length/mean": round(mean_len, 1),
                "response_length/max": round(max_len, 1),
                "response_length/clip_ratio": round(plan.clip_ratio, 3),
                "prompt_length/mean": PROMPT_LEN,
            }
            rows.append(("step", "step", st, 0, s0, s1, step_attrs))
        for seg in g.segs:
            if seg.kind == "barrier":
                rows.append(("collective", "nccl:barrier", seg.step, 1, seg.start_s, seg.end_s,
                             {"wait": True}))  # fmt: skip
            if seg.kind != "phase":
                continue
            attr: dict[str, Any] = {}
            if seg.phase == "rollout":
                attr = {"tokens": per_rank_tokens}
            elif seg.phase == "reshard":
                attr = {"bytes": MODEL_BYTES}
            name = names.get(seg.phase, seg.phase)
            rows.append((seg.phase, name, seg.step, 1, seg.start_s, seg.end_s, attr))
            if seg.phase in ("update_actor", "update_critic"):
                # the collectives of the update (FSDP all-gather / reduce-scatter)
                c0 = seg.end_s - plan.collective_frac * (seg.end_s - seg.start_s)
                rows.append(("collective", "nccl:reduce_scatter", seg.step, 2, c0, seg.end_s,
                             {"op": "reduce_scatter"}))  # fmt: skip
        phase, name, step, depth, s, e, attrs = zip(*rows)
        return {
            "phase": np.array(phase, dtype=object),
            "name": np.array(name, dtype=object),
            "step": np.array(step, dtype=np.int64),
            "depth": np.array(depth, dtype=np.int64),
            "s": np.array(s, dtype=np.float64),
            "e": np.array(e, dtype=np.float64),
            "attrs": list(attrs),
        }

    def _per_rank_tokens(self) -> int:
        cfg = self.cfg
        prompts = JOB_PROMPTS * cfg.gpus / 8
        mean_len = self.plan.response_len[0]
        num_generations = self.plan.settings["num_generations"]
        tokens = int(prompts * num_generations * mean_len * cfg.time_scale)
        return max(1, tokens // cfg.gpus)

    def _spans_data(self, gpus: np.ndarray) -> dict[str, Any]:
        """The spans of ranks ``gpus`` as column arrays, with ``order``: each row's place in
        the whole run's recording order (group by group, each call of a group for all its
        GPUs), which breaks ties in time as the whole run does."""
        cfg = self.cfg
        parts: dict[str, list] = {k: [] for k in ("gpu", "phase", "name", "step", "depth",
                                                  "s", "e", "order")}  # fmt: skip
        attrs: list[dict[str, Any]] = []
        offset = 0
        for g, calls in zip(self.tl.groups, self.spans):
            n_calls, k = len(calls["s"]), len(g.gpus)
            pos = np.flatnonzero(np.isin(g.gpus, gpus))
            if len(pos):
                here = len(pos)
                parts["gpu"].append(np.tile(g.gpus[pos], n_calls))
                for key in ("phase", "name", "step", "depth", "s", "e"):
                    parts[key].append(np.repeat(calls[key], here))
                parts["order"].append(
                    offset + (np.arange(n_calls)[:, None] * k + pos[None, :]).ravel()
                )
                attrs.extend(dict(a) for a in calls["attrs"] for _ in range(here))
            offset += n_calls * k
        cat = {key: np.concatenate(v) for key, v in parts.items()}
        gpu = cat["gpu"]
        return {
            "host": self.host_of[gpu],
            "pid": self.pid[gpu],
            "tid": self.pid[gpu],
            "rank": gpu,
            "local_rank": self.local[gpu],
            "phase": cat["phase"],
            "name": cat["name"],
            "step": cat["step"],
            "depth": cat["depth"],
            "start_ns": cfg.start_ns + np.round(cat["s"] * 1e9).astype(np.int64),
            "end_ns": cfg.start_ns + np.round(cat["e"] * 1e9).astype(np.int64),
            "attrs": attrs,
            "order": cat["order"],
        }

    def _events_data(self, gpus: np.ndarray) -> dict[str, Any]:
        """Step events: one per rank at each step's end, as gpuprof.step(tokens=…) records."""
        n_steps = len(self.tl.step_bounds)
        ends = np.array([b for _, b in self.tl.step_bounds])
        ranks = np.repeat(gpus, n_steps)
        steps = np.tile(np.arange(n_steps), len(gpus))
        tokens = self._per_rank_tokens()
        return {
            "host": self.host_of[ranks],
            "pid": self.pid[ranks],
            "rank": ranks,
            "t_ns": self.cfg.start_ns + np.round(np.tile(ends, len(gpus)) * 1e9).astype(np.int64),
            "kind": "step",
            "name": "step",
            "attrs": [{"step": int(st), "tokens": tokens} for st in steps],
        }

    # ---------------------------------------------------------------- host, procs, gpu procs
    def _host_procs(
        self, h: int, group_phase: list[np.ndarray]
    ) -> tuple[np.ndarray, list[tuple[int, str, str, np.ndarray]]]:
        """Host ``h``'s phase over the host samples (its first GPU's), and (pid, role, name,
        phase) of each process it shows."""
        first = h * self.cfg.gpus_per_host
        ph = group_phase[self.group_of[first]]
        procs = [(20000 + h, "dataloader", "pt_data_worker", ph)]
        if h == 0:
            procs.insert(0, (1000, "main", "python3", ph))
        for g in self.host_gpus(h):
            group = self.group_of[g]
            role = "inference" if self.tl.groups[group].role == "rollout" else "trainer"
            procs.append((int(self.pid[g]), role, "python3", group_phase[group]))
        return ph, procs

    def host_columns(
        self, h: int, at_host: list[tuple[np.ndarray, np.ndarray]]
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Host ``h``'s host, process, GPU-process, span and event rows as column arrays,
        one table at a time (each made when asked for); ``at_host``: each of its GPUs'
        utilisation and memory at the host sample times."""
        cfg, plan = self.cfg, self.plan
        host, mh, t_ns = self.hosts[h], len(self.th), self.th_ns
        gpus = self.host_gpus(h)
        rng = self.noise.at(self.host_draw, h)
        noise = cfg.noise

        def lookup(table: dict[str, float], phases: np.ndarray) -> np.ndarray:
            keys = np.unique(phases)
            out = np.full(len(phases), table.get("*", 0.0))
            for key in keys:
                out[phases == key] = table.get(str(key), table.get("*", 0.0))
            return out

        ph, procs = self.procs[h]
        cpu = lookup(plan.host_cpu, ph) * (1 + noise * rng.standard_normal(mh))
        yield (
            "host",
            [
                {
                    "host": host,
                    "t_ns": t_ns,
                    "cpu_pct": np.clip(cpu, 0, 100),
                    "n_cpus": 128,
                    "mem_total_bytes": 2 * 2**40,
                    "mem_used_bytes": 300 * 2**30,
                }
            ],
        )
        rows = []
        for pid, role, name, phs in procs:
            pc = lookup(plan.proc_cpu.get(role, {}), phs)
            pc = np.clip(pc * (1 + noise * rng.standard_normal(mh)), 0, 100.0 * 1.02)
            rows.append(
                {
                    "host": host,
                    "t_ns": t_ns,
                    "pid": pid,
                    "ppid": 1000 if pid != 1000 else 1,
                    "role": role,
                    "name": name,
                    "cpu_pct": pc,
                    "rss_bytes": 6 * 2**30 if role != "dataloader" else 2**30,
                    "num_threads": 64,
                }
            )
        yield "procs", rows
        del rows
        # gpu_procs: each rank's process on its GPU, memory and SM share as NVML reports them
        yield (
            "gpu_procs",
            [
                {
                    "host": host,
                    "t_ns": t_ns,
                    "gpu": self.local[i],
                    "pid": self.pid[i],
                    "gpu_mem_bytes": (mem * 0.97).astype(np.int64),
                    "sm_util_pct": util,
                    "watched": True,
                }
                for i, (util, mem) in zip(gpus, at_host)
            ],
        )
        yield "spans", [self._spans_data(gpus)]
        yield "events", [self._events_data(gpus)]

    def host_arrow(self, table: str, parts: list[dict[str, Any]]) -> pa.Table:
        """One host's ``table`` (parts from `host_columns`) as the Arrow table of its side
        file: rows in the file's order (`columnar.SORT_KEYS`, ties as the whole run has them),
        without the processes of unused GPUs."""
        # a process's rows (its pid one value): all of them or none
        parts = [p for p in parts if isinstance(p.get("pid"), np.ndarray)
                 or p.get("pid") not in self.removed]  # fmt: skip
        if table == "procs":
            parts.sort(key=lambda p: p["pid"])  # each process's rows, in time
        if not parts:
            return columnar.schema(table).empty_table()
        data = _concat_data(parts)
        del parts
        n = _rows(data)
        order = None
        if table == "spans":
            order = np.lexsort((data.pop("order"), -data["end_ns"], data["start_ns"]))
        elif table == "events":
            order = np.argsort(data["t_ns"], kind="stable")
        if order is not None and self.removed:
            order = order[~np.isin(data["pid"][order], list(self.removed))]
        if order is not None:
            data = {k: _take(v, order) for k, v in data.items()}
            n = len(order)
        return columnar.from_columns(table, data, n)

    def frame(self, table: str, data: dict[str, Any]) -> pd.DataFrame:
        """The frame of ``table`` from the column arrays of one host or of the whole run,
        in the order the whole run's frame has (time, then recording order), without the
        processes of unused GPUs."""
        record = {"host": HostSample, "procs": ProcSample, "gpu_procs": GpuProcSample,
                  "spans": Span, "events": Event}[table]  # fmt: skip
        n = _rows(data)
        if table == "spans":
            order = np.lexsort((data["order"], -data["end_ns"], data["start_ns"]))
            data = {k: v for k, v in data.items() if k != "order"}
            frame = typed_frame(record, data, n).iloc[order].reset_index(drop=True)
        else:
            frame = typed_frame(record, data, n)
            frame = frame.sort_values("t_ns", kind="stable", ignore_index=True)
        if self.removed and len(frame) and "pid" in frame:
            frame = frame[~frame["pid"].isin(self.removed)].reset_index(drop=True)
        return frame


def _take(value: Any, order: np.ndarray) -> Any:
    """Rows ``order`` of a column (an array, a list of attrs, or one value for every row)."""
    if isinstance(value, np.ndarray):
        return value[order]
    if isinstance(value, list):
        return [value[i] for i in order]
    return value


def _full(value: Any, m: int) -> Any:
    """One value for every row (a host, a GPU index, a pid…) as ``m`` values."""
    if value is None or isinstance(value, np.ndarray):
        return value
    if isinstance(value, str):
        # the one string in every row: np.full would make a string object per row (~60 B)
        out = np.empty(m, dtype=object)
        out[:] = value
        return out
    return np.full(m, value)
