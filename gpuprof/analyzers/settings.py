"""What a run was set up with, as the analyzers read it: the launch command's knobs and the
recorded settings (`run_settings`), and what the user or the caller adds to the analysis
(`EfficiencyOptions`: a GPU-hour price, the model's size or its ``config.json``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuprof.analyzers.findings import AnalysisContext
from gpuprof.commandline import coerce, parse_knobs

__all__ = ["EfficiencyOptions", "attach_options", "num", "options_of", "run_settings"]


def num(value: Any) -> float | None:
    """``value`` as a finite float; None for booleans, None, text that is no number, NaN, ±inf."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def run_settings(meta: Any) -> dict[str, Any]:
    """The run's settings: the parsed command line, then recorded knobs (which win)."""
    values: dict[str, Any] = {}
    for key, value in parse_knobs(list(meta.command or [])).items():
        values[str(key).replace("-", "_")] = coerce(value)
    for key, value in (meta.knobs or {}).items():
        values[str(key).replace("-", "_")] = coerce(value)
    return values


@dataclass(frozen=True)
class EfficiencyOptions:
    """What the user or the caller adds: ``gpu_hour_price`` (the user's currency per
    GPU-hour), ``model_params`` (an explicit parameter count), ``gpu_name`` (the GPU model
    the user names, ``--gpu``: it wins over the run's inventory), ``model_config`` (the parsed
    ``config.json`` found at the model path, read by the caller) and where it was read."""

    gpu_hour_price: float | None = None
    model_params: float | None = None
    gpu_name: str | None = None
    model_config: Mapping[str, Any] | None = None
    model_config_path: str | None = None


def attach_options(ctx: AnalysisContext, options: EfficiencyOptions | None) -> AnalysisContext:
    """Give ``ctx`` the efficiency options its summary and the busy-time stalls read; returns
    it."""
    ctx.__dict__["_efficiency_options"] = options or EfficiencyOptions()
    ctx.__dict__.pop("_efficiency", None)
    return ctx


def options_of(ctx: AnalysisContext) -> EfficiencyOptions:
    """The options attached to ``ctx`` (defaults when none were)."""
    return ctx.__dict__.get("_efficiency_options") or EfficiencyOptions()
