"""Number formatting shared by the renderers (missing values print as "–") and JSON cleaning."""

from __future__ import annotations

import math
from typing import Any


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


IN_STEP_LABEL = "(in step, no phase)"
"""How every screen names step time no phase covers: the step span's own time (phase
``step`` in the summary's phases) and the rest of the step's composition (``(other)``)."""
OUTSIDE_LABEL = "(outside phases)"
"""How every screen names time outside every phase (phase ``(none)``)."""


def phase_label(phase: Any) -> str:
    """A phase's name as the screens show it: one name for the step's own time (`IN_STEP_LABEL`)
    wherever it appears, so the terminal, the report and ``analyze`` tell one story."""
    name = str(phase)
    if name in ("step", "(other)"):
        return IN_STEP_LABEL
    return OUTSIDE_LABEL if name == "(none)" else name


def seconds(value: float | None) -> str:
    """A duration in s as ``1.5 h`` / ``2.0 min`` / ``3.21 s`` / ``45 ms``."""
    if _missing(value):
        return "–"
    if value >= 3600:
        return f"{value / 3600:.1f} h"
    if value >= 60:
        return f"{value / 60:.1f} min"
    if value >= 1:
        return f"{value:.2f} s"
    return f"{value * 1000:.0f} ms"


def gpu_seconds(value: float | None) -> str:
    """GPU time in GPU-s as ``1.2 GPU-h`` / ``7.7 GPU-min`` / ``30.0 GPU-s``."""
    if _missing(value):
        return "–"
    if value >= 3600:
        return f"{value / 3600:.1f} GPU-h"
    if value >= 60:
        return f"{value / 60:.1f} GPU-min"
    return f"{value:.1f} GPU-s"


def percent(value: Any) -> str:
    """A 0–100 figure as ``42%``; ``n/a`` when it was not measured."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "n/a"
    return "n/a" if math.isnan(value) else f"{value:.0f}%"


def gib(value: Any) -> str:
    """Bytes as GiB with one decimal; ``n/a`` when not measured."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "n/a"
    return "n/a" if math.isnan(value) else f"{value / 2**30:.1f}"


def json_safe(value: Any) -> Any:
    """``value`` made JSON-serialisable: NaN/inf become None, numpy scalars plain numbers,
    unknown objects their ``str``; dict keys become strings."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            return json_safe(value.item())
        except (TypeError, ValueError):
            return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def render_json(document: dict[str, Any]) -> str:
    """A JSON document with NaN written as null (the ``--json`` output of every command)."""
    import json

    return json.dumps(json_safe(document), indent=2, sort_keys=False)


def knob_value(value: Any, default: Any = None) -> str:
    """A knob value as the user would type it (``true``, ``0.6``); an unset knob shows its
    default as ``"<default> (default)"``, or ``?`` when that is unknown too."""
    if value is None:
        return "?" if default is None else f"{knob_value(default)} (default)"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def node_recorded(recorded: dict[str, Any] | None) -> str:
    """A node's ``recorded`` entry (the nodes section) in a few words."""
    if not recorded:
        return "—"
    if recorded.get("watcher"):
        return "from the start"
    since = recorded.get("from_s")
    since_text = "" if since is None else f"from {seconds(since)}"
    if recorded.get("state") == "lost":
        lost = recorded.get("lost_s")
        return f"{since_text}, lost at {seconds(lost)}" if lost is not None else "lost"
    if recorded.get("state") == "never_recorded":
        return "never"
    return since_text or "yes"


def stretches(count: int, per: int) -> str:
    """``12 stretches of 24`` (``1 stretch of 24``)."""
    return f"{count} stretch{'es' if count != 1 else ''} of {per}"


def stretch(steps: dict[str, Any]) -> str:
    """What a diagnosis of a stretch of steps (`RunMeta.steps`, ``--steps``) read: ``steps
    5–9 of 0–22 alone (5 of the 23 recorded steps; --steps)``."""
    first, last = steps.get("first"), steps.get("last")
    which = f"step {first}" if first == last else f"steps {first}–{last}"
    return (
        f"{which} of {steps.get('run_first')}–{steps.get('run_last')} alone "
        f"({steps.get('steps')} of the {steps.get('run_steps')} recorded steps; --steps)"
    )
