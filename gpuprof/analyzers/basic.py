"""First-order figures of a run: per-GPU utilisation, time per phase, step times."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gpuprof.model import Run
from gpuprof.nodes import natural_key
from gpuprof.phases import CANONICAL_PHASES


def gpu_table(run: Run) -> pd.DataFrame:
    """One row per (host, gpu): samples, mean ``util_gpu_pct`` and ``sm_active_pct`` (NaN when
    the GPU has no GPM), peak and total memory in bytes, mean power in W, and ``lost``."""
    cols = ["host", "gpu", "uuid", "name", "samples", "util_gpu_pct", "sm_active_pct",
            "mem_peak_bytes", "mem_total_bytes", "power_w", "lost"]  # fmt: skip
    inventory = {(g.get("host"), g.get("index")): g for g in run.meta.gpus}
    frame = run.gpu
    if frame.empty:
        rows = [
            {"host": h, "gpu": i, "uuid": g.get("uuid"), "name": g.get("name"), "samples": 0,
             "lost": bool(g.get("lost"))}
            for (h, i), g in inventory.items()
        ]  # fmt: skip
        return pd.DataFrame(rows, columns=cols)
    grouped = frame.groupby(["host", "gpu"], sort=True)
    table = grouped.agg(
        uuid=("uuid", "first"),
        samples=("t_ns", "size"),
        util_gpu_pct=("util_gpu_pct", "mean"),
        sm_active_pct=("sm_active_pct", "mean"),
        mem_peak_bytes=("mem_used_bytes", "max"),
        mem_total_bytes=("mem_total_bytes", "max"),
        power_w=("power_w", "mean"),
    ).reset_index()
    table["name"] = [inventory.get((h, g), {}).get("name") for h, g in zip(table.host, table.gpu)]
    lost_events = run.events[
        (run.events["kind"] == "nvml_fault") & (run.events["name"] == "gpu_lost")
    ]
    lost_gpus = {(h, a.get("gpu")) for h, a in zip(lost_events["host"], lost_events["attrs"])}
    table["lost"] = [
        bool(inventory.get((h, g), {}).get("lost")) or (h, g) in lost_gpus
        for h, g in zip(table.host, table.gpu)
    ]
    return table[cols]


def phase_table(run: Run) -> pd.DataFrame:
    """One row per phase, by **self time** (a span less the spans of other phases nested in
    it: TRL's training step less the generation it encloses; `spans.self_ns`), so the rows
    add up: span count, processes that ran it, ``total_s`` (self seconds summed over the
    processes), ``mean_s`` (per span), ``per_process_s``, ``share`` = per-process time over
    the run's wall time (0–1) and ``step_share`` = the phase's self time in the steps over
    the steps' time (0–1; NaN without step spans), counted on the processes that record steps.
    The ``step`` row is step time no phase covers."""
    from gpuprof.analyzers.spans import valid_spans

    cols = ["phase", "spans", "processes", "total_s", "mean_s", "per_process_s", "share",
            "step_share"]  # fmt: skip
    spans, _ = valid_spans(run)
    if spans.empty:
        return pd.DataFrame(columns=cols)
    own_s = spans["self_ns"].to_numpy(np.float64) / 1e9
    proc = spans["host"].astype(str) + ":" + spans["pid"].astype(str)
    frame = pd.DataFrame({"phase": spans["phase"], "own_s": own_s, "proc": proc})
    table = frame.groupby("phase").agg(
        spans=("own_s", "size"),
        processes=("proc", "nunique"),
        total_s=("own_s", "sum"),
        mean_s=("own_s", "mean"),
    )
    table["per_process_s"] = table["total_s"] / table["processes"]
    wall = run.duration_s or float(own_s.sum()) or 1.0
    table["share"] = (table["per_process_s"] / wall).clip(upper=1.0)
    table["step_share"] = _step_shares(spans, frame).reindex(table.index)
    order = {name: i for i, name in enumerate(CANONICAL_PHASES)}
    table = table.reset_index()
    table["_order"] = [order.get(p, len(order)) for p in table["phase"]]
    table = table.sort_values(["_order", "total_s"], ascending=[True, False])
    return table[cols].reset_index(drop=True)


def _step_shares(spans: pd.DataFrame, frame: pd.DataFrame) -> pd.Series:
    """Per phase: its self seconds inside the step spans of the processes that record them,
    over those steps' seconds (empty without step spans)."""
    from gpuprof.analyzers.spans import self_in_steps_ns

    is_step = spans["is_step"].to_numpy(bool)
    step_s = float(((spans["end_ns"] - spans["start_ns"])[is_step]).sum()) / 1e9
    if step_s <= 0:
        return pd.Series(dtype=np.float64)
    inside_s = self_in_steps_ns(spans).astype(np.float64) / 1e9
    return (pd.Series(inside_s).groupby(frame["phase"].to_numpy()).sum() / step_s).clip(upper=1.0)


def step_times(run: Run) -> pd.DataFrame:
    """One row per recorded step (``step`` spans): step number, process, duration in s and
    tokens (NaN when not reported)."""
    spans = run.spans
    steps = spans[spans["phase"] == "step"] if len(spans) else spans
    if steps.empty:
        return pd.DataFrame(columns=["step", "host", "pid", "duration_s", "tokens"])
    tokens = [a.get("tokens") if isinstance(a, dict) else None for a in steps["attrs"]]
    return pd.DataFrame(
        {
            "step": steps["step"].to_numpy(),
            "host": steps["host"].to_numpy(),
            "pid": steps["pid"].to_numpy(),
            "duration_s": ((steps["end_ns"] - steps["start_ns"]) / 1e9).to_numpy(),
            "tokens": pd.to_numeric(pd.Series(tokens, dtype=object), errors="coerce").to_numpy(),
        }
    )


def tokens_per_s(steps: pd.DataFrame) -> float | None:
    """The job's throughput from `step_times`: tokens summed over every process's steps, over
    the time of one process's steps (processes step in parallel); None when no step reports
    tokens."""
    if steps.empty:
        return None
    tokens = steps["tokens"].to_numpy(dtype=float)
    durations = steps["duration_s"].to_numpy(dtype=float)
    ok = np.isfinite(tokens) & np.isfinite(durations)
    if not ok.any() or durations[ok].sum() <= 0:
        return None
    processes = max(1, steps.loc[ok, ["host", "pid"]].drop_duplicates().shape[0])
    return float(tokens[ok].sum() / (durations[ok].sum() / processes))


def run_summary(run: Run) -> dict[str, Any]:
    """The headline figures: duration (s), GPU count, mean utilisation, step-time p50/p95 (s),
    tokens/s, exit code, plus the per-GPU and per-phase tables as lists of dicts."""
    gpus = gpu_table(run)
    phases = phase_table(run)
    steps = step_times(run)
    durations = steps["duration_s"].to_numpy(dtype=float) if len(steps) else np.array([])
    return {
        "run_id": run.meta.run_id,
        "command": run.meta.command,
        "duration_s": run.duration_s,
        "exit_code": run.meta.exit_code,
        "n_gpus": len(gpus),
        "mean_util_gpu_pct": finite_or_none(gpus["util_gpu_pct"].mean()) if len(gpus) else None,
        "steps": int(steps["step"].nunique()) if len(steps) else 0,
        "step_time_p50_s": finite_or_none(np.percentile(durations, 50)) if len(durations) else None,
        "step_time_p95_s": finite_or_none(np.percentile(durations, 95)) if len(durations) else None,
        "tokens_per_s": tokens_per_s(steps),
        "gpus": gpus.to_dict("records"),
        "phases": phases.to_dict("records"),
        "notices": list(run.meta.notices),
        "nodes": node_accounts(run),
    }


def node_accounts(run: Run) -> list[dict[str, Any]]:
    """How each node of a Ray cluster run was recorded (`RunMeta.nodes`), the watcher's own
    node first: ``node``, ``state`` (``recorded``, ``lost``, ``never_recorded``),
    ``from_s`` / ``lost_s`` (seconds into the run, None when unknown), ``why``, ``notice``
    (the run's notice that says it) and ``watcher`` (the watcher's node: recorded from the
    start). Empty for a run with no such nodes (one node, torchrun, an imported run)."""
    accounts = run.meta.nodes or {}
    if not accounts:
        return []
    start = run.meta.start_ns

    def rel(t: Any) -> float | None:
        if start is None or not isinstance(t, int) or isinstance(t, bool):
            return None
        return max(0.0, (t - start) / 1e9)

    out = []
    reference = run.meta.reference_node
    if reference and reference not in accounts:
        out.append({"node": reference, "state": "recorded", "from_s": 0.0, "lost_s": None,
                    "why": None, "notice": None, "watcher": True})  # fmt: skip
    for node in sorted(accounts, key=natural_key):
        status = accounts[node]
        out.append({
            "node": node,
            "state": str(status.get("state") or "recorded"),
            "from_s": rel(status.get("from_ns")),
            "lost_s": rel(status.get("lost_ns")),
            "why": status.get("why"),
            "notice": status.get("notice"),
            "watcher": False,
        })  # fmt: skip
    return out


def finite_or_none(value: Any) -> float | None:
    """``value`` as a float, or None when it is missing, NaN or infinite (JSON has no NaN)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if np.isfinite(value) else None
