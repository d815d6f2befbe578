"""A run diagnosed stretch by stretch (``analyze RUN --by-steps N``), put together.

Each stretch of N consecutive steps is diagnosed alone (`gpuprof.by_steps`), exactly as
``analyze --steps A:B`` diagnoses it. `combine` puts those diagnoses side by side, in step
order, and adds them up: per stall kind, the GPU-time lost in each stretch and over all of
them, in how many stretches it was found and where first and last; the headline figures
summed over the stretches (GPU-hours, idle time by cause, time per phase); recommendations
merged by knob, with the GPU-time they should win back over the stretches that gave them.

What it is not: the diagnosis of the whole run in one pass. A detector's thresholds and
allowances are applied to each stretch, so a stall too small to report in any one stretch
is not reported, and figures that span stretches (a slow rank over the whole run, the
p95 step time) are per stretch only. Totals are the sums of the stretches' own figures,
and the time outside every stretch (start-up before the first step, the end after the
last) is in none of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

MAX_NOTES = 20
"""Notes of single stretches listed at most (notes every stretch shares are listed once)."""


def combine(diagnoses: Sequence[dict[str, Any]], per: int) -> dict[str, Any]:
    """The stretch-by-stretch document of a run from its stretches' diagnosis documents
    (`Diagnosis.to_dict`, in step order, each of a stretch: ``summary.stretch`` set) made
    ``per`` steps at a time. Pure: no I/O."""
    if not diagnoses:
        raise ValueError("no stretch to combine")
    summaries = [d["summary"] for d in diagnoses]
    first_stretch = summaries[0].get("stretch") or {}
    rows = [_stretch_row(d) for d in diagnoses]
    total_gpu_s = sum(r["gpu_hours"] * 3600.0 for r in rows if r["gpu_hours"] is not None)
    return {
        "schema_version": diagnoses[0].get("schema_version"),
        "by_steps": {
            "steps_per_stretch": per,
            "stretches": len(diagnoses),
            "run_steps": first_stretch.get("run_steps"),
            "run_first": first_stretch.get("run_first"),
            "run_last": first_stretch.get("run_last"),
        },
        "summary": _summary(summaries, total_gpu_s),
        "kinds": _kinds(diagnoses, total_gpu_s),
        "recommendations": _recommendations(diagnoses, total_gpu_s),
        "stretches": [{**row, "diagnosis": d} for row, d in zip(rows, diagnoses, strict=True)],
        "notes": _notes(diagnoses),
    }


def _number(value: Any) -> float | None:
    """``value`` as a finite float, else None (a figure a stretch did not have)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _sum(values: Sequence[Any]) -> float | None:
    """The sum of the figures present; None when no stretch had one."""
    present = [v for v in map(_number, values) if v is not None]
    return sum(present) if present else None


def _weighted(values: Sequence[Any], weights: Sequence[Any]) -> float | None:
    """Mean of the figures present, each weighted by its (GPU-time) weight."""
    pairs = [(v, w) for v, w in zip(map(_number, values), map(_number, weights), strict=True)
             if v is not None and w is not None and w > 0]  # fmt: skip
    weight = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / weight if weight > 0 else None


def _stretch_row(diagnosis: dict[str, Any]) -> dict[str, Any]:
    from gpuprof.analyzers.diagnose import Diagnosis, no_finding_sentence

    s = diagnosis["summary"]
    stretch = s.get("stretch") or {}
    findings = diagnosis.get("findings", [])
    # without a finding, what the stretch's data could show (`no_finding_sentence`)
    sentence = None if findings else no_finding_sentence(Diagnosis([], [], s))[0]
    return {
        "first": stretch.get("first"),
        "last": stretch.get("last"),
        "steps": stretch.get("steps"),
        "duration_s": _number(s.get("duration_s")),
        "gpu_hours": _number(s.get("gpu_hours")),
        "mean_util_gpu_pct": _number(s.get("mean_util_gpu_pct")),
        "idle_gpu_s": _number(s.get("idle_gpu_s")),
        "step_time_p50_s": _number(s.get("step_time_p50_s")),
        "findings": [
            {"kind": f["kind"], "gpu_seconds_lost": f["gpu_seconds_lost"], "share": f["share"]}
            for f in findings
        ],
        "no_finding": sentence,
    }


def _summary(summaries: list[dict[str, Any]], total_gpu_s: float) -> dict[str, Any]:
    gpu_hours = [s.get("gpu_hours") for s in summaries]
    bases = {s.get("basis") for s in summaries}
    return {
        "run_id": summaries[0].get("run_id"),
        "framework": next((s["framework"] for s in summaries if s.get("framework")), None),
        "basis": bases.pop() if len(bases) == 1 else "mixed",
        "gpus": max((int(s.get("gpus") or 0) for s in summaries), default=0),
        "steps": sum(int(s.get("steps") or 0) for s in summaries),
        "duration_s": _sum([s.get("duration_s") for s in summaries]),
        "gpu_hours": total_gpu_s / 3600.0,
        "mean_util_gpu_pct": _weighted([s.get("mean_util_gpu_pct") for s in summaries], gpu_hours),
        "mean_sm_active_pct": _weighted(
            [s.get("mean_sm_active_pct") for s in summaries], gpu_hours
        ),
        "idle_gpu_s": _sum([s.get("idle_gpu_s") for s in summaries]),
        "idle_gpu_s_by_cause": _sum_by_key([s.get("idle_gpu_s_by_cause") for s in summaries]),
        "busy_loss_gpu_s_by_cause": _sum_by_key(
            [s.get("busy_loss_gpu_s_by_cause") for s in summaries]
        ),
        "phases": _phases(summaries),
    }


def _sum_by_key(dicts: list[dict[str, Any] | None]) -> dict[str, float]:
    out: dict[str, float] = {}
    for d in dicts:
        for key, value in (d or {}).items():
            number = _number(value)
            if number is not None:
                out[key] = round(out.get(key, 0.0) + number, 3)
    return dict(sorted(out.items(), key=lambda item: -item[1]))


def _phases(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each phase's wall time, GPU-time and idle GPU-time summed over the stretches, its
    utilisation weighted by GPU-time, its share of the phases' GPU-time (of their wall
    time when no stretch had GPU samples)."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for s in summaries:
        for p in s.get("phases") or []:
            rows.setdefault(p["phase"], []).append(p)
    out = []
    for phase, got in rows.items():
        out.append(
            {
                "phase": phase,
                "wall_s": _sum([p.get("wall_s") for p in got]),
                "gpu_s": _sum([p.get("gpu_s") for p in got]),
                "idle_gpu_s": _sum([p.get("idle_gpu_s") for p in got]),
                "util_gpu_pct": _weighted(
                    [p.get("util_gpu_pct") for p in got], [p.get("gpu_s") for p in got]
                ),
            }
        )
    by = "gpu_s" if any(p["gpu_s"] for p in out) else "wall_s"
    whole = sum(p[by] or 0.0 for p in out)
    for p in out:
        p["share"] = (p[by] or 0.0) / whole if whole > 0 else None
    return sorted(out, key=lambda p: -(p["share"] or 0.0))


def _kinds(diagnoses: Sequence[dict[str, Any]], total_gpu_s: float) -> list[dict[str, Any]]:
    """Per stall kind found in any stretch: GPU-seconds lost in each stretch (0 where it was
    not found) and over all, its share of the stretches' GPU-time, where it was found."""
    kinds: dict[str, list[float]] = {}
    for i, d in enumerate(diagnoses):
        for f in d.get("findings", []):
            lost = kinds.setdefault(f["kind"], [0.0] * len(diagnoses))
            lost[i] += float(f["gpu_seconds_lost"])
    out = []
    for kind, lost in kinds.items():
        found = [i for i, v in enumerate(lost) if v > 0]
        found = found or [i for i, d in enumerate(diagnoses)
                          if any(f["kind"] == kind for f in d.get("findings", []))]  # fmt: skip
        stretch = [diagnoses[i]["summary"].get("stretch") or {} for i in found]
        total = sum(lost)
        out.append(
            {
                "kind": kind,
                "gpu_seconds_lost": round(total, 3),
                "share": round(total / total_gpu_s, 5) if total_gpu_s > 0 else None,
                "stretches_found": len(found),
                "first_step": stretch[0].get("first") if stretch else None,
                "last_step": stretch[-1].get("last") if stretch else None,
                "per_stretch_gpu_s": [round(v, 3) for v in lost],
            }
        )
    return sorted(out, key=lambda k: (-k["gpu_seconds_lost"], k["kind"]))


def _recommendations(
    diagnoses: Sequence[dict[str, Any]], total_gpu_s: float
) -> list[dict[str, Any]]:
    """The stretches' recommendations, one per (kind, framework, knob): the GPU-seconds they
    should win back summed over the stretches that gave it, the values and rationale of the
    stretch where it would win the most, and in how many stretches it was given."""
    merged: dict[tuple, dict[str, Any]] = {}
    for d in diagnoses:
        stretch = d["summary"].get("stretch") or {}
        for r in d.get("recommendations", []):
            key = (r.get("kind"), r.get("framework"), r.get("knob"))
            gain = _number(r.get("expected_gain_gpu_s")) or 0.0
            got = merged.get(key)
            if got is None:
                merged[key] = got = {"best": r, "gain": 0.0, "stretches": 0, "from": stretch}
            elif gain > (_number(got["best"].get("expected_gain_gpu_s")) or 0.0):
                got["best"], got["from"] = r, stretch
            got["gain"] += gain
            got["stretches"] += 1
    out = []
    for got in merged.values():
        r = dict(got["best"])
        r["expected_gain_gpu_s"] = round(got["gain"], 3)
        r["expected_gain_share"] = (
            round(got["gain"] / total_gpu_s, 5) if total_gpu_s > 0 else r.get("expected_gain_share")
        )
        r["stretches_given"] = got["stretches"]
        r["values_from_steps"] = [got["from"].get("first"), got["from"].get("last")]
        out.append(r)
    return sorted(
        out,
        key=lambda r: (-(r["expected_gain_gpu_s"] * (_number(r.get("confidence")) or 0.0)),
                       str(r.get("knob"))),
    )  # fmt: skip


def _notes(diagnoses: Sequence[dict[str, Any]]) -> list[str]:
    """Notes every stretch gave, once; then the others with their stretch, up to
    `MAX_NOTES` (each stretch's own "steps A–B alone" notice left out: the table says it)."""
    labels = [_label(d["summary"].get("stretch") or {}) for d in diagnoses]
    per = [[n for n in dict.fromkeys(d.get("notes", [])) if not n.startswith(f"{label} alone")]
           for d, label in zip(diagnoses, labels, strict=True)]  # fmt: skip
    shared = [n for n in per[0] if all(n in notes for notes in per[1:])]
    out = list(shared)
    rest = []
    for label, notes in zip(labels, per, strict=True):
        for n in notes:
            if n not in shared:
                rest.append(f"{label}: {n}")
    out.extend(rest[:MAX_NOTES])
    if len(rest) > MAX_NOTES:
        out.append(f"… and {len(rest) - MAX_NOTES} more notes of single stretches (--json)")
    return out


def _label(stretch: dict[str, Any]) -> str:
    first, last = stretch.get("first"), stretch.get("last")
    return f"step {first}" if first == last else f"steps {first}–{last}"
