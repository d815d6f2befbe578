"""Before/after comparison of two runs: the figures a tuning change should move."""

from __future__ import annotations

from typing import Any

import pandas as pd

from gpuprof.analyzers.basic import finite_or_none
from gpuprof.analyzers.diagnose import Diagnosis
from gpuprof.analyzers.findings import STALL_KINDS

COLUMNS = ["metric", "unit", "before", "after", "delta", "delta_pct", "better"]


def compare(before: Diagnosis, after: Diagnosis) -> pd.DataFrame:
    """One row per figure: mean utilisation, step time p50/p95, tokens/s, wall time per
    phase, GPU-seconds lost per stall kind; ``delta`` = after − before, ``delta_pct`` relative
    to before, ``better`` True when the change goes the good way (None when it can't tell)."""
    rows: list[dict[str, Any]] = []
    a, b = before.summary, after.summary

    def add(metric: str, unit: str, x: Any, y: Any, higher_is_better: bool | None) -> None:
        x = finite_or_none(x)
        y = finite_or_none(y)
        delta = None if x is None or y is None else y - x
        pct = None if delta is None or not x else 100.0 * delta / abs(x)
        better = None
        if delta is not None and higher_is_better is not None and delta != 0:
            better = (delta > 0) == higher_is_better
        rows.append(dict(zip(COLUMNS, [metric, unit, x, y, delta, pct, better])))

    add("mean GPU utilization", "%", a.get("mean_util_gpu_pct"), b.get("mean_util_gpu_pct"), True)
    add("mean SM activity", "%", a.get("mean_sm_active_pct"), b.get("mean_sm_active_pct"), True)
    add("step time p50", "s", a.get("step_time_p50_s"), b.get("step_time_p50_s"), False)
    add("step time p95", "s", a.get("step_time_p95_s"), b.get("step_time_p95_s"), False)
    add("tokens/s", "tokens/s", a.get("tokens_per_s"), b.get("tokens_per_s"), True)
    add("idle GPU time", "GPU-s", a.get("idle_gpu_s"), b.get("idle_gpu_s"), False)
    phases_a = {p["phase"]: p for p in a.get("phases", [])}
    phases_b = {p["phase"]: p for p in b.get("phases", [])}
    for phase in list(dict.fromkeys([*phases_a, *phases_b])):
        pa, pb = phases_a.get(phase, {}), phases_b.get(phase, {})
        add(f"phase {phase}", "s", pa.get("wall_s"), pb.get("wall_s"), False)
    lost_a = {f.kind: f.gpu_seconds_lost for f in before.findings}
    lost_b = {f.kind: f.gpu_seconds_lost for f in after.findings}
    for kind in STALL_KINDS:
        if kind in lost_a or kind in lost_b:
            add(f"lost: {kind}", "GPU-s", lost_a.get(kind, 0.0), lost_b.get(kind, 0.0), False)
    return pd.DataFrame(rows, columns=COLUMNS)
