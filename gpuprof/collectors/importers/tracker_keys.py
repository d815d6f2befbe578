"""What an experiment tracker's run says, turned into a run's parts — shared by the W&B,
TensorBoard and MLflow importers.

Each tracker importer reads its run with the tracker's own library into a `TrackerRun`: every
logged value as one *point* (key, step, wall-clock time, value) plus the run's config, host and
GPU inventory. `to_imported` then maps the keys:

- **phase times per step** — verl's ``timing_s/<name>`` (``timing/<name>`` before verl 0.3) and
  OpenRLHF's ``timing/generation|make_experience|ppo_train|broadcast|step_total`` (``train/``
  prefix as its W&B/TensorBoard loggers write them): one `StepRecord` per step, laid out with
  `frames_from_steps` so that the step *ends* when its values were logged (the tracker's wall
  clock). The framework's own phase maps (`gpuprof.frameworks`) name the phases;
- **profiled calls** — TRL's and ms-swift's ``profiling/Time taken: <Trainer>.<name>`` (seconds
  of one call, logged as it returns): one span ``[logged − seconds, logged]`` per value, nested
  by containment, phases from `gpuprof.frameworks.trl` / `.swift`; the step is the trainer's
  ``train/global_step`` logged last before it (else the tracker's step);
- **GPU metrics** — W&B's system metrics (``system.gpu.N.gpu``, ``…memoryAllocatedBytes``,
  ``…powerWatts``, ``…temp``…; in a ``.wandb`` file without the ``system.`` prefix) and MLflow's
  (``system/gpu_N_utilization_percentage``…) as `GpuSample` rows on the same clock. Trackers
  sample every 10–15 s by default (W&B 15 s, MLflow 10 s), far coarser than ``watch``; a note
  says so, and the diagnosis states the cadence it was judged on;
- **everything else** numeric is kept on the step span's attrs: verl's usual figures
  (``response_length/mean``, ``perf/*``…) at the top level where the analyzers look for them,
  all other keys under ``attrs["metrics"]``; values at steps without phase times become
  ``metrics`` events. Non-finite values (NaN, inf) are skipped and counted in a note.

A run with none of these keys is one `ImportFormatError` line listing what it does hold.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.collectors.importers import Imported, ImportFormatError
from gpuprof.collectors.importers.openrlhf_log import _record as openrlhf_record
from gpuprof.collectors.importers.steplog import (
    LOG_HOST,
    MAX_SECONDS,
    MAX_STEP,
    StepRecord,
    frames_from_steps,
)
from gpuprof.collectors.importers.verl_log import _estimate_tokens
from gpuprof.collectors.importers.verl_log import record_from_pairs as verl_record
from gpuprof.commandline import coerce
from gpuprof.frameworks.openrlhf import LOG_PHASES as OPENRLHF_PHASES
from gpuprof.frameworks.swift import PROFILING_PHASES as SWIFT_PHASES
from gpuprof.frameworks.trl import PROFILING_PHASES as TRL_PHASES
from gpuprof.frameworks.verl import LOG_PHASES as VERL_PHASES
from gpuprof.model import Event, GpuSample, Span, columns, empty_frame
from gpuprof.phases import INHERIT, canonical_phase
from gpuprof.redact import redact_knobs

INSTALL_HINT = "pip install 'gpuprof[trackers]'"
"""What to run when a tracker's library is missing (said in the one-line error)."""

PROFILING_PREFIX = "profiling/Time taken: "
"""TRL's and ms-swift's key prefix for the seconds one profiled call took."""

_VERL_TIMING = re.compile(r"^timing(?:_s)?/(.+)$")
_OPENRLHF_TIMING = re.compile(r"^(?:train/)?timing/(.+)$")
_OPENRLHF_NAMES = frozenset(OPENRLHF_PHASES) | {"step_total"}
_GLOBAL_STEP_KEYS = ("train/global_step", "global_step")

_WANDB_GPU = re.compile(r"^(?:system\.)?gpu\.(\d+)\.(\w+)$")
_MLFLOW_GPU = re.compile(r"^system/gpu_(\d+)_(\w+)$")
WANDB_GPU_FIELDS: dict[str, tuple[str, float]] = {
    "gpu": ("util_gpu_pct", 1.0),
    "memory": ("util_mem_pct", 1.0),
    "memoryAllocatedBytes": ("mem_used_bytes", 1.0),
    "powerWatts": ("power_w", 1.0),
    "temp": ("temp_c", 1.0),
    "smClock": ("sm_clock_mhz", 1.0),
    "pcieTxBytes": ("pcie_tx_bytes_s", 1.0),
    "pcieRxBytes": ("pcie_rx_bytes_s", 1.0),
}
"""W&B's per-GPU system metric → (`GpuSample` field, factor). ``gpu``: NVML utilization.gpu
(%), ``memory``: utilization.memory (%), ``memoryAllocatedBytes``: memory in use (bytes),
``powerWatts`` (W), ``temp`` (°C), ``smClock`` (MHz), ``pcieTx/RxBytes`` (bytes/s).
``memoryAllocated`` (% of the total) gives bytes when the inventory names the total."""
MLFLOW_GPU_FIELDS: dict[str, tuple[str, float]] = {
    "utilization_percentage": ("util_gpu_pct", 1.0),
    "memory_usage_megabytes": ("mem_used_bytes", 1e6),
    "power_usage_watts": ("power_w", 1.0),
}
"""MLflow's per-GPU system metric → (`GpuSample` field, factor): utilization (%), memory in use
(MB of 10⁶ bytes, as MLflow divides NVML's bytes), power (W). ``memory_usage_percentage`` gives
the total memory alongside the megabytes."""

DEFAULT_CADENCE_S = {"W&B": 15.0, "MLflow": 10.0}
"""The trackers' default system-metric sampling period (s), named in the cadence note."""
COARSE_S = 1.0
"""A GPU sampling period above this (s) is called coarse in the cadence note."""


@dataclass
class TrackerRun:
    """One tracker run, source-independent.

    ``points``: one row per logged value — ``key`` (str), ``step`` (float, NaN where the
    tracker gives none), ``t_ns`` (float ns since the epoch, NaN unknown), ``value`` (float,
    may be NaN/inf: `to_imported` skips and counts those). ``config``: the run's config as
    logged (nested dicts allowed). ``host``: the machine the tracker ran on, when it says.
    ``gpus``: inventory entries (``index``, ``name``, ``uuid``, ``mem_total_bytes``).
    ``tracker``: ``"W&B"``, ``"TensorBoard"`` or ``"MLflow"``. ``skipped``: key → count of values
    the reader could not read as numbers (media, tables, text).
    """

    source: Path
    format: str
    tracker: str
    points: pd.DataFrame
    config: dict[str, Any] = field(default_factory=dict)
    host: str | None = None
    gpus: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)


def points_frame(
    keys: Iterable[str], steps: Iterable[float], t_ns: Iterable[float], values: Iterable[float]
) -> pd.DataFrame:
    """The ``points`` frame of a `TrackerRun` from parallel sequences (steps and times may
    hold NaN)."""
    return pd.DataFrame(
        {
            "key": pd.Categorical(list(keys)),  # few distinct keys, many values
            "step": np.asarray(list(steps), dtype=np.float64),
            "t_ns": np.asarray(list(t_ns), dtype=np.float64),
            "value": np.asarray(list(values), dtype=np.float64),
        }
    )


def number(value: Any) -> float | None:
    """A logged value as a float (NaN and ±inf kept, for counting); None for no number
    (text, media dicts, booleans, lists)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in ("nan", "inf", "-inf", "infinity"):
        return float(value.strip().lower().replace("infinity", "inf"))
    return None


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted knob names (``actor_rollout_ref.rollout.n``), the way the
    knob catalogue spells them; W&B's ``{"value": …, "desc": …}`` wrappers and its private
    ``_wandb`` entry removed, text values coerced (MLflow keeps params as text), secrets
    redacted."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        key = str(key)
        if not prefix and key.startswith("_wandb"):
            continue
        if isinstance(value, Mapping) and set(value) <= {"value", "desc"} and "value" in value:
            value = value["value"]
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_config(value, f"{name}."))
        elif isinstance(value, list | tuple):
            out[name] = [coerce(v) for v in value] if len(value) <= 64 else f"<{len(value)} items>"
        else:
            out[name] = coerce(value)
    return redact_knobs(out)


def require(module: str, path: Path, what: str, *, load: bool = True) -> Any:
    """``import module`` for a tracker importer (with ``load`` False: only find where it is
    installed, its `ModuleSpec`); `ImportFormatError` naming the install command when it is
    missing (the tracker libraries are an optional extra)."""
    import importlib
    import importlib.util

    try:
        if load:
            return importlib.import_module(module)
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            raise ImportError(module)
        return spec
    except (ImportError, ValueError):
        raise ImportFormatError(
            f"{path}: reading {what} needs the {module.split('.')[0]} package: {INSTALL_HINT}"
        ) from None


# --------------------------------------------------------------------------------------------
# GPU samples


def _gpu_key(key: str) -> tuple[int, str, str] | None:
    """(GPU index, field or '', tracker) of a system GPU key; None for other keys."""
    match = _WANDB_GPU.match(key)
    if match:
        return int(match.group(1)), match.group(2), "W&B"
    match = _MLFLOW_GPU.match(key)
    if match:
        return int(match.group(1)), match.group(2), "MLflow"
    return None


_PCT_WANDB = "<memoryAllocated %>"
_PCT_MLFLOW = "<memory_usage_percentage>"


def _gpu_field(key: str) -> tuple[int, str] | None:
    """(GPU index, `GpuSample` field, or a percent-of-memory marker, or ``?metric`` for a GPU
    metric with no field) of a system GPU key; None for other keys."""
    parsed = _gpu_key(key)
    if parsed is None:
        return None
    index, metric, flavour = parsed
    table = WANDB_GPU_FIELDS if flavour == "W&B" else MLFLOW_GPU_FIELDS
    if metric in table:
        return index, table[metric][0]
    if flavour == "W&B" and metric == "memoryAllocated":
        return index, _PCT_WANDB
    if flavour == "MLflow" and metric == "memory_usage_percentage":
        return index, _PCT_MLFLOW
    return index, f"?{metric}"


def _factor(key: str) -> float:
    parsed = _gpu_key(key)
    if parsed is None:
        return 1.0
    table = WANDB_GPU_FIELDS if parsed[2] == "W&B" else MLFLOW_GPU_FIELDS
    return table.get(parsed[1], ("", 1.0))[1]


def _gpu_frame(
    points: pd.DataFrame, run: TrackerRun, host: str, notes: list[str]
) -> tuple[pd.DataFrame, dict[int, int]]:
    """GPU samples from the system GPU keys among ``points`` (with a time), and the total
    memory per GPU they reveal. Vectorised: keys are parsed once each, values pivoted to one
    row per (GPU, instant)."""
    totals = {int(g["index"]): int(g["mem_total_bytes"]) for g in run.gpus
              if g.get("index") is not None and g.get("mem_total_bytes")}  # fmt: skip
    points = points[points["t_ns"].notna()]
    if points.empty:
        return empty_frame(GpuSample), totals
    codes, uniques = pd.factorize(points["key"])
    parsed = [_gpu_field(k) for k in uniques]
    gpu = np.array([p[0] for p in parsed], dtype=np.int64)[codes]
    field_names = np.array([p[1] for p in parsed], dtype=object)[codes]
    factor = np.array([_factor(k) for k in uniques], dtype=np.float64)[codes]
    unmapped = sorted({p[1][1:] for p in parsed if p[1].startswith("?")})
    if unmapped:
        notes.append(
            f"{len(unmapped)} GPU metric(s) with no gpuprof field not imported: "
            + ", ".join(unmapped[:8])
        )
    long = pd.DataFrame(
        {
            "gpu": gpu,
            "t_ns": points["t_ns"].to_numpy(np.float64).round().astype(np.int64),
            "field": field_names,
            "value": points["value"].to_numpy(np.float64) * factor,
        }
    )
    long = long[~long["field"].str.startswith("?")]
    if long.empty:
        return empty_frame(GpuSample), totals
    wide = long.pivot_table(
        index=["gpu", "t_ns"], columns="field", values="value", aggfunc="last", sort=True
    )
    if _PCT_MLFLOW in wide and "mem_used_bytes" in wide:
        implied = (wide["mem_used_bytes"] * 100.0 / wide[_PCT_MLFLOW]).where(wide[_PCT_MLFLOW] > 0)
        for index, total in implied.groupby(level="gpu").median().dropna().items():
            totals.setdefault(int(index), round(total))
    gpus_of = wide.index.get_level_values("gpu").to_numpy()
    total_col = np.array([totals.get(int(g), np.nan) for g in gpus_of], dtype=np.float64)
    if _PCT_WANDB in wide:
        from_pct = wide[_PCT_WANDB].to_numpy() / 100.0 * total_col
        used = wide["mem_used_bytes"].to_numpy() if "mem_used_bytes" in wide else np.nan
        wide["mem_used_bytes"] = np.where(np.isnan(used), from_pct, used)
    frame = pd.DataFrame(
        {
            "host": host,
            "gpu": gpus_of.astype(np.int64),
            "uuid": [_uuid(run.gpus, int(g)) for g in gpus_of] if run.gpus else None,
            "t_ns": wide.index.get_level_values("t_ns").to_numpy(np.int64),
        }
    )
    for name in {n for n, _ in (*WANDB_GPU_FIELDS.values(), *MLFLOW_GPU_FIELDS.values())}:
        frame[name] = wide[name].to_numpy(np.float64) if name in wide else np.nan
    frame["mem_total_bytes"] = total_col
    return frame, totals


def _uuid(gpus: list[dict[str, Any]], index: int) -> str | None:
    for gpu in gpus:
        if gpu.get("index") == index:
            return gpu.get("uuid")
    return None


def _cadence_note(gpu: pd.DataFrame, tracker: str) -> tuple[str, float | None]:
    gaps = gpu.sort_values(["gpu", "t_ns"]).groupby("gpu")["t_ns"].diff().dropna() / 1e9
    gaps = gaps[gaps > 0]
    interval = float(gaps.median()) if len(gaps) else None
    every = f"every {interval:.3g} s" if interval else "a single sample per GPU"
    default = DEFAULT_CADENCE_S.get(tracker)
    told = f" ({tracker}'s default is {default:g} s)" if default else ""
    note = f"GPU samples from {tracker}'s system metrics, {every}{told}"
    if interval is None or interval > COARSE_S:
        note += (
            ": coarse next to `gpuprof watch` (0.1 s) — phases shorter than a few samples are "
            "judged on few or no samples, and short idle gaps average out"
        )
    return note, interval


# --------------------------------------------------------------------------------------------
# phase times


def _framework(keys: set[str], config: dict[str, Any]) -> str | None:
    """The framework a run's keys (else its config) come from."""
    if any(k.startswith(("timing_s/",)) for k in keys):
        return "verl"
    timing = {m.group(1) for k in keys if (m := _OPENRLHF_TIMING.match(k))}
    if timing & _OPENRLHF_NAMES:
        return "openrlhf"
    if timing:
        return "verl"  # verl before 0.3 logged timing/<name>
    if any(k.startswith(PROFILING_PREFIX) for k in keys):
        return "swift" if _swift_config(config) else "trl"
    if any(k.startswith("actor_rollout_ref.") for k in config):
        return "verl"
    return None


def _swift_config(config: dict[str, Any]) -> bool:
    return "rlhf_type" in config or any(str(k).startswith("swift") for k in config)


_VERL_KEPT_PREFIXES = ("test_score/", "val/", "val-core/", "perf/")
_VERL_KEPT = ("response_length/", "prompt_length/")


def _step_groups(
    points: pd.DataFrame,
) -> list[tuple[int, float | None, dict[str, float]]]:
    """(step, latest time or None, {key: value}) per step, in step order; the last value of a
    key logged twice in one step wins."""
    ordered = points.sort_values(["step", "t_ns"], kind="stable", na_position="first")
    out: list[tuple[int, float | None, dict[str, float]]] = []
    steps = ordered["step"].to_numpy()
    times = ordered["t_ns"].to_numpy()
    keys = ordered["key"].to_numpy()
    values = ordered["value"].to_numpy()
    bounds = np.flatnonzero(np.diff(steps)) + 1
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(steps)]):
        if hi <= lo:
            continue
        t = times[lo:hi]
        t = t[~np.isnan(t)]
        latest = float(t.max()) if len(t) else None
        out.append((int(steps[lo]), latest, dict(zip(keys[lo:hi].tolist(), values[lo:hi]))))
    return out


def _phase_records(
    run: TrackerRun, points: pd.DataFrame, framework: str, knobs: dict[str, Any], notes: list[str]
) -> tuple[list[StepRecord], list[tuple[int, float | None, dict[str, float]]], set[str]]:
    """Step records of a verl/OpenRLHF run, the steps without phase times, and the keys kept
    under ``attrs['metrics']``."""
    records: list[StepRecord] = []
    bare: list[tuple[int, float | None, dict[str, float]]] = []
    other: set[str] = set()
    for step, latest, values in _step_groups(points):
        try:
            if framework == "openrlhf":
                status = {k.removeprefix("train/"): v for k, v in values.items()}
                timing = {k for k in values if _OPENRLHF_TIMING.match(k)}
                record = openrlhf_record(step, status, run.source, None) if timing else None
            else:
                pairs = [(k, v) for k, v in values.items() if _VERL_TIMING.match(k)]
                timing = {k for k, _ in pairs}
                record = verl_record(step, pairs, run.source, None) if pairs else None
        except ImportFormatError as exc:  # name the step: a tracker run has no lines
            where = f"{run.source}: step {step}"
            raise ImportFormatError(str(exc).replace(f"{run.source}:None", where)) from None
        if record is None:
            bare.append((step, latest, values))
            continue
        record.line = None
        record.end_ns = round(latest) if latest is not None else None
        for key, value in values.items():
            if key in timing or key in record.attrs or key in _GLOBAL_STEP_KEYS:
                continue
            if framework == "verl" and key.startswith(_VERL_KEPT_PREFIXES + _VERL_KEPT):
                record.attrs[key] = value  # the analyzers read these at the top level
            else:
                record.attrs.setdefault("metrics", {})[key] = value
                other.add(key)
        tokens = record.attrs.get("perf/total_num_tokens")
        if record.tokens is None and tokens is not None:
            record.tokens = tokens
            record.attrs["tokens_source"] = "perf/total_num_tokens"
        records.append(record)
    if framework == "verl":
        _estimate_tokens(records, knobs)
    return records, bare, other


def _length_ns(record: StepRecord) -> int:
    """Nanoseconds `frames_from_steps` lays a record out over (step, then its after-phases)."""
    inner = sum(round(s * 1e9) for _, s in record.phases)
    step = round(record.step_s * 1e9) if record.step_s is not None else inner
    return max(step, inner) + sum(round(s * 1e9) for _, s in record.after)


def _untangle(records: list[StepRecord]) -> int:
    """Make anchored steps follow one another: a step whose logged end comes too early for
    its duration (the tracker got a burst of steps at once, a replayed log) ends its own
    length after the previous one. Returns how many steps moved."""
    moved = 0
    previous_end: int | None = None
    for record in records:
        assert record.end_ns is not None
        length = _length_ns(record)
        if previous_end is not None and record.end_ns - length < previous_end:
            record.end_ns = previous_end + length
            moved += 1
        previous_end = record.end_ns
    return moved


_LOGPS_NAMES = frozenset({"_get_per_token_logps_and_entropies", "_get_per_token_logps"})
"""TRL's / ms-swift's log-prob helper: the old-policy pass, the reference pass or the update's
own forward, by where it is called."""


def _nest(calls: list[list]) -> list[int]:
    """Each call's enclosing call (index, -1 at the top), from the order they were logged: a
    profiled call is logged as it returns, so its children are logged before it (post-order).
    ``calls``: ``[start, end, …]`` in logged order. A call logged earlier whose middle lies
    inside a later call is its child (the middle, not its start: the logged times are rounded
    to the clock's resolution, which can push a child's start before its parent's)."""
    parent = [-1] * len(calls)
    pending: list[int] = []  # calls logged so far whose parent is not known yet
    for i, (start, end, *_) in enumerate(calls):
        while pending:
            j = pending[-1]
            if (calls[j][0] + calls[j][1]) / 2 < start or calls[j][1] > end:
                break
            parent[pending.pop()] = i
        pending.append(i)
    return parent


def _logps_phase(name: str, parent_phase: str | None, rank: int, siblings: int,
                 config: Mapping[str, Any]) -> str | None:  # fmt: skip
    """Which log-prob pass a logged call of TRL's log-prob helper was, as the live capture
    tells by its caller (`gpuprof.integrations.trl`): inside the update it is the policy's
    own forward; inside the generation step TRL computes the old policy's pass first (when
    it needs one) and the reference pass next (when ``beta`` is not 0), so with two calls the
    first is the old and the second the reference pass, with one ``beta`` says which."""
    if name not in _LOGPS_NAMES or parent_phase != "rollout":
        return None
    if siblings >= 2:
        return "old_logprob" if rank == 0 else "ref_logprob"
    beta = number(config.get("beta"))
    return "ref_logprob" if beta is not None and beta != 0 else "old_logprob"


def _profiled_spans(
    points: pd.DataFrame,
    framework: str,
    host: str,
    tracker_steps: bool,
    config: Mapping[str, Any] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Spans of TRL/ms-swift profiled calls (and a step span around each step's calls) plus
    step events; needs wall-clock times.

    Each call is ``[logged − seconds, logged]``, nested by the order the calls were logged
    (`_nest`) and held inside its parent (the tracker's rounded clock may push a child a
    millisecond past it), so that the phase of every instant is its innermost call's, as in a
    live capture. A name that is not a phase takes its caller's phase (TRL's reward
    functions, timed under their own names inside ``_calculate_rewards``); the log-prob
    helper is the pass `_logps_phase` says. The step of a call is the trainer's
    ``train/global_step`` logged last before it; without that key, the tracker's step when
    ``tracker_steps`` (MLflow and TensorBoard get the trainer's step; W&B's own counter grows
    with every ``wandb.log`` and means nothing here). ``config``: the run's flattened config
    (TRL's ``beta``). A step lasts as long as TRL's own ``step_time`` says, where logged.
    """
    config = config or {}
    phase_map = SWIFT_PHASES if framework == "swift" else TRL_PHASES
    prof = points[points["key"].str.startswith(PROFILING_PREFIX) & points["t_ns"].notna()]
    trainer_steps = points[points["key"].isin(_GLOBAL_STEP_KEYS) & points["t_ns"].notna()]
    prof = prof.sort_values("t_ns", kind="stable")
    if len(trainer_steps):
        marks = trainer_steps.sort_values("t_ns")
        index = np.searchsorted(marks["t_ns"].to_numpy(), prof["t_ns"].to_numpy(), side="right")
        logged = marks["value"].to_numpy()
        steps = np.where(index > 0, logged[np.maximum(index - 1, 0)], 0.0)
    elif tracker_steps:
        steps = prof["step"].to_numpy()
    else:
        steps = np.full(len(prof), np.nan)
    calls: list[list] = []
    for key, t, seconds, step in zip(prof["key"], prof["t_ns"], prof["value"], steps):
        if not 0 <= seconds <= MAX_SECONDS:
            continue
        qualified = key[len(PROFILING_PREFIX) :]
        name = qualified.split(".", 1)[1] if "." in qualified else qualified
        end = int(t)
        calls.append([end - round(seconds * 1e9), end, name, None if np.isnan(step) else int(step)])
    # logged order: by time, and at one (rounded) time the shorter call first: a child returns
    # before its parent
    calls.sort(key=lambda c: (c[1], c[1] - c[0]))
    parent = _nest(calls)
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parent):
        children.setdefault(p, []).append(i)
    # each log-prob call's place among its parent's log-prob calls of the same name, and
    # how many there are (the calls of one parent are in the order they ran)
    logps_rank: dict[int, tuple[int, int]] = {}
    for kids in children.values():
        by_name: dict[str, list[int]] = {}
        for k in kids:
            if calls[k][2] in _LOGPS_NAMES:
                by_name.setdefault(calls[k][2], []).append(k)
        for same in by_name.values():
            logps_rank.update({k: (rank, len(same)) for rank, k in enumerate(same)})
    spans: list[tuple] = []
    phases: dict[int, str] = {}
    depth: dict[int, int] = {}
    todo = list(reversed(children.get(-1, [])))  # parents before their children
    while todo:
        i = todo.pop()
        start, end, name, step = calls[i]
        up = parent[i]
        if up >= 0:  # held inside the parent: containment exact for the analysis
            start = max(start, calls[up][0])
            end = max(start, min(end, calls[up][1]))
            calls[i][0], calls[i][1] = start, end
        parent_phase = phases.get(up)
        mapped = phase_map.get(name)
        phase = mapped or canonical_phase(name)
        rank, siblings = logps_rank.get(i, (0, 1))
        logps = _logps_phase(name, parent_phase, rank, siblings, config)
        if logps is not None:
            phase = logps
        elif phase == INHERIT or (mapped is None and phase == name and parent_phase):
            phase = parent_phase or canonical_phase(name)
        phases[i], depth[i] = phase, 1 + depth.get(up, 0)
        attrs = {"framework": framework, "source": "tracker"}
        spans.append((host, 0, 0, None, None, phase, name, step, depth[i], start, end,
                      None, None, attrs))  # fmt: skip
        todo.extend(reversed(sorted(children.get(i, []), key=lambda k: calls[k][0])))
    spans.sort(key=lambda row: (row[9], -row[10]))
    events: list[tuple] = []
    by_step: dict[int, list[int]] = {}
    for span in spans:
        if span[7] is not None:
            bounds = by_step.setdefault(span[7], [span[9], span[10]])
            bounds[0], bounds[1] = min(bounds[0], span[9]), max(bounds[1], span[10])
    _stretch_to_step_time(points, by_step)
    for step, (start, end) in sorted(by_step.items()):
        spans.append((host, 0, 0, None, None, "step", "step", step, 0, start, end, None, None,
                      {"framework": framework, "source": "tracker"}))  # fmt: skip
        events.append((host, 0, None, end, "step", str(step), {}))
    return _typed(Span, spans), _typed(Event, events)


_STEP_TIME_KEYS = ("step_time", "train/step_time")
"""TRL's own seconds per optimizer step (its ``training_step`` calls of the step, summed over
gradient accumulation), logged with the step's other figures after the step."""


def _stretch_to_step_time(points: pd.DataFrame, by_step: dict[int, list[int]]) -> None:
    """Make each step span as long as TRL's own ``step_time`` for it, where logged: the
    profiled calls cover generation, scoring and the loss, not the backward pass nor the
    optimizer step, which then read as step time no phase covers. A value belongs to the
    last step whose calls ended before it was logged; a step is never made shorter than
    its calls."""
    logged = points[points["key"].isin(_STEP_TIME_KEYS) & points["t_ns"].notna()]
    if logged.empty or not by_step:
        return
    order = sorted(by_step, key=lambda k: by_step[k][1])
    ends = np.array([by_step[k][1] for k in order], dtype=np.float64)
    for t, seconds in zip(logged["t_ns"].to_numpy(np.float64), logged["value"]):
        i = int(np.searchsorted(ends, t, side="right")) - 1
        if i < 0 or not 0 < seconds <= MAX_SECONDS:
            continue
        bounds = by_step[order[i]]
        bounds[1] = max(bounds[1], bounds[0] + round(seconds * 1e9))


def _typed(record_type: type, rows: list[tuple]) -> pd.DataFrame:
    empty = empty_frame(record_type)
    if not rows:
        return empty
    return pd.DataFrame(rows, columns=columns(record_type)).astype(empty.dtypes.to_dict())


def _metric_events(
    bare: list[tuple[int, float | None, dict[str, float]]], host: str
) -> tuple[pd.DataFrame, int]:
    """``metrics`` events for steps without phase times (validation before training…); the
    count of those steps that had no time and so could not be kept."""
    rows = []
    lost = 0
    for step, latest, values in bare:
        if latest is None:
            lost += 1
            continue
        rows.append((host, 0, None, round(latest), "metrics", str(step), dict(values)))
    return _typed(Event, rows), lost


# --------------------------------------------------------------------------------------------
# the whole run


def to_imported(run: TrackerRun) -> Imported:
    """The run's parts (see the module doc); `ImportFormatError` when no key is usable."""
    notes = list(run.notes)
    points = run.points
    host = run.host or LOG_HOST
    finite = np.isfinite(points["value"].to_numpy()) if len(points) else np.array([], bool)
    if len(points) and not finite.all():
        bad = points.loc[~finite, "key"]
        worst = bad.value_counts().head(3)
        which = ", ".join(f"{k} ×{n}" for k, n in worst.items())
        notes.append(f"{len(bad)} NaN/inf value(s) skipped ({which})")
        points = points[finite]
    plausible = points["step"].isna() | points["step"].between(0, MAX_STEP)
    if not plausible.all():
        notes.append(f"{int((~plausible).sum())} value(s) at an impossible step skipped")
        points = points[plausible]
    if run.skipped:
        names = ", ".join(sorted(run.skipped)[:5])
        notes.append(f"{len(run.skipped)} key(s) with values that are no numbers not imported "
                     f"(media, tables, text: {names})")  # fmt: skip
    all_keys = set(points["key"].unique()) if len(points) else set()
    codes, uniques = pd.factorize(points["key"])
    is_gpu = np.array([_gpu_key(k) is not None for k in uniques], dtype=bool)[codes]
    gpu_points, metric_points = points[is_gpu], points[~is_gpu]
    system = metric_points["key"].str.startswith(("system.", "system/")).to_numpy(bool)
    if system.any():
        # host figures (CPU, memory, disk, network) sampled on their own clock: no field of
        # a step, and `host` samples need the whole machine's CPU, which trackers mix up
        names = sorted(metric_points.loc[system, "key"].unique())
        notes.append(
            f"{len(names)} non-GPU system metric(s) not imported ("
            + ", ".join(names[:4])
            + (", …)" if len(names) > 4 else ")")
        )
        metric_points = metric_points[~system]
    gpu, totals = _gpu_frame(gpu_points, run, host, notes)
    knobs = flatten_config(run.config)
    metric_keys = set(metric_points["key"].unique()) if len(metric_points) else set()
    framework = _framework(metric_keys, knobs)
    frames: dict[str, pd.DataFrame] = {}
    anchored = True
    step_values = metric_points[metric_points["step"].notna()]
    if framework in ("verl", "openrlhf") and not step_values.empty:
        records, bare, other = _phase_records(run, step_values, framework, knobs, notes)
        if records:
            anchored = all(r.end_ns is not None for r in records)
            if not anchored:  # a time for some steps only: one time axis or none
                for record in records:
                    record.end_ns = None
                notes.append("the run has no wall-clock times: steps are laid end to end from 0")
            moved = _untangle(records) if anchored else 0
            if moved:
                notes.append(f"{moved} step(s) logged before the previous step could have "
                             "ended (values written in a burst): each moved to start where "
                             "the previous one ended")  # fmt: skip
            phase_map = OPENRLHF_PHASES if framework == "openrlhf" else VERL_PHASES
            frames = frames_from_steps(records, framework=framework, phase_map=phase_map,
                                       host=host)  # fmt: skip
            for span_attrs in frames["spans"]["attrs"]:
                span_attrs["source"] = "tracker"
            if any(r.step_s is None for r in records):
                notes.append("no step-total key: each step lasts its phases' sum")
            if other:
                shown = ", ".join(sorted(other)[:6])
                more = f", +{len(other) - 6} more" if len(other) > 6 else ""
                notes.append(f"{len(other)} other key(s) kept on the step spans' "
                             f"attrs['metrics'] ({shown}{more})")  # fmt: skip
            if bare and anchored:
                events, _ = _metric_events(bare, host)
                frames["events"] = pd.concat([frames["events"], events], ignore_index=True)
                notes.append(f"{len(bare)} step(s) without phase times (steps "
                             f"{_steps_text([b[0] for b in bare])}): their values kept as "
                             "'metrics' events")  # fmt: skip
            elif bare:
                notes.append(f"{len(bare)} step(s) without phase times and without wall-clock "
                             "times not imported")  # fmt: skip
    elif framework in ("trl", "swift"):
        spans, events = _profiled_spans(metric_points, framework, host, run.tracker != "W&B", knobs)
        if len(spans):
            frames = {"spans": spans, "events": events}
            if not len(events):
                notes.append("no trainer step for the profiled calls: no step spans")
            notes.append("phase spans from profiled calls (profiling/Time taken: …): each ends "
                         "when its value was logged")  # fmt: skip
            if metric_keys & set(_STEP_TIME_KEYS):
                notes.append("steps as long as the trainer's own step_time: its backward pass "
                             "and optimizer step, which no profiled call times, read as step "
                             "time no phase covers")  # fmt: skip
    if not frames and gpu.empty:
        shown = ", ".join(sorted(all_keys)[:6]) or "none"
        more = f", +{len(all_keys) - 6} more" if len(all_keys) > 6 else ""
        raise ImportFormatError(
            f"{run.source}: no usable keys in this {run.tracker} run — no phase times "
            f"(timing_s/…, timing/…, {PROFILING_PREFIX}…) and no GPU metrics (keys: {shown}{more})"
        )
    meta: dict[str, Any] = {"knobs": knobs}
    if framework:
        meta["framework"] = framework
    if run.host:
        meta["hosts"] = [run.host]
    inventory = []
    for entry in run.gpus:
        if entry.get("index") is None:
            continue
        item = {"host": host, **{k: v for k, v in entry.items() if v is not None}}
        if totals.get(int(entry["index"])) and "mem_total_bytes" not in item:
            item["mem_total_bytes"] = totals[int(entry["index"])]
        inventory.append(item)
    known = {int(g["index"]) for g in inventory}
    for index in sorted(set(gpu["gpu"].astype(int)) - known) if len(gpu) else []:
        item = {"host": host, "index": index}
        if totals.get(index):
            item["mem_total_bytes"] = totals[index]
        inventory.append(item)
    meta["gpus"] = inventory
    if len(gpu):
        note, interval = _cadence_note(gpu, run.tracker)
        notes.append(note)
        if interval:
            meta["interval_s"] = interval
        if "spans" not in frames:
            notes.append("no phase-time keys: GPU samples only")
        frames["gpu"] = gpu
    imported = Imported(source=run.source, format=run.format, frames=frames, meta=meta,
                        anchored=anchored)  # fmt: skip
    imported.notes.extend(notes)
    return imported


def _steps_text(steps: list[int]) -> str:
    shown = ", ".join(str(s) for s in steps[:5])
    return shown + (f", … {len(steps) - 5} more" if len(steps) > 5 else "")
