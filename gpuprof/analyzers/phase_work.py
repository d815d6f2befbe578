"""The model work of each phase: which tokens it processes, its FLOPs per token, and per step
the tokens and wall time of every phase (read from the spans and the step's logged lengths).

- **model FLOPs per token**: ``2·N`` for a forward pass (a generated token in rollout, a token
  of the reference / old log-prob / value passes) and ``6·N`` for forward + backward (a trained
  token of update_actor / update_critic), ``N`` the parameters a token passes through (for a
  mixture of experts, the active ones), plus the attention score FLOPs when the model's
  config gives its layers and attention width and the run gives the sequence lengths
  (forward: ``4·layers·attn_dim`` per token of context; causal training: half the sequence);
- **tokens**: rollout — generated (response) tokens; log-prob and value passes — prompt +
  response tokens; update — trained tokens (prompt + response, × PPO epochs).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.analyzers import attr_columns
from gpuprof.analyzers.grouping import appearance_codes, first_rows, group_rows, stable_order
from gpuprof.analyzers.model_size import ModelSize
from gpuprof.analyzers.settings import num as _num
from gpuprof.intervals import covered_ns

FORWARD_FACTOR = 2.0
"""Model FLOPs per parameter per token of a forward pass (one multiply-add per weight)."""
TRAIN_FACTOR = 6.0
"""Forward + backward: the backward pass costs twice the forward."""

PHASE_WORK: dict[str, tuple[str, float]] = {
    "rollout": ("generated", FORWARD_FACTOR),
    "ref_logprob": ("forward", FORWARD_FACTOR),
    "old_logprob": ("forward", FORWARD_FACTOR),
    "values": ("forward", FORWARD_FACTOR),
    "update_actor": ("trained", TRAIN_FACTOR),
    "update_critic": ("trained", TRAIN_FACTOR),
}
"""Per phase: which tokens it processes and its FLOPs per parameter per token."""

CRITIC_PHASES = ("values", "update_critic")

_RESPONSE_KEYS = ("response_length/mean", "response_length_mean", "rollout/response_length_mean")
_PROMPT_KEYS = ("prompt_length/mean", "prompt_length_mean")
_RESPONSES_ONLY = "rollout/response_length"  # a ``tokens_source`` counting responses only


def step_rows(spans: pd.DataFrame, settings: Mapping[str, Any]) -> pd.DataFrame:
    """One row per step span: step, process, and the step's token counts.

    ``batch_tokens``: prompt + response tokens of the step's batch (the step's ``tokens``,
    unless its source says it counts responses only); ``generated``: response tokens
    (``generated_tokens`` when recorded, else ``tokens`` × response / (prompt + response)
    mean lengths, else response mean × ``data.train_batch_size`` × ``rollout.n``, else
    ``tokens`` when they count responses only); ``trained``: ``trained_tokens`` when recorded,
    else the batch tokens × PPO epochs (verl ``ppo_epochs``, TRL ``num_iterations``).
    """
    cols = ["step", "owner", "batch_tokens", "generated", "trained", "prompt_mean",
            "response_mean"]  # fmt: skip
    rows = np.flatnonzero(spans["phase"].to_numpy(object) == "step") if len(spans) else []
    if not len(rows):
        return pd.DataFrame(columns=cols)
    epochs = _num(settings.get("actor_rollout_ref.actor.ppo_epochs"))
    if epochs is None:
        epochs = _num(settings.get("num_iterations"))
    epochs = epochs if epochs and epochs > 0 else 1.0
    batch = _num(settings.get("data.train_batch_size"))
    n = _num(settings.get("actor_rollout_ref.rollout.n", 1)) or 1.0
    step = pd.to_numeric(pd.Series(spans["step"].to_numpy()[rows]), errors="coerce").to_numpy(
        np.float64, na_value=np.nan
    )
    keep = ~np.isnan(step)
    if not keep.any():
        return pd.DataFrame(columns=cols)
    rows = rows[keep]
    attrs = list(spans["attrs"].to_numpy(object)[rows])
    tokens = attr_columns.number(attrs, "tokens")
    response = attr_columns.first_number(attrs, _RESPONSE_KEYS)
    prompt = attr_columns.first_number(attrs, _PROMPT_KEYS)
    responses_only = np.array(
        [
            isinstance(a, dict) and str(a.get("tokens_source", "")).startswith(_RESPONSES_ONLY)
            for a in attrs
        ],
        dtype=bool,
    )
    batch_tokens = np.where(responses_only, np.nan, tokens)
    generated = attr_columns.number(attrs, "generated_tokens")
    generated = np.where(np.isnan(generated) & responses_only, tokens, generated)
    lengths = np.isnan(generated) & ~np.isnan(response) & ~np.isnan(prompt)
    with np.errstate(divide="ignore", invalid="ignore"):
        from_batch = lengths & ~np.isnan(batch_tokens) & (prompt + response > 0)
        generated = np.where(from_batch, batch_tokens * response / (prompt + response), generated)
        if batch is not None:
            generated = np.where(lengths & ~from_batch, response * batch * n, generated)
        back = np.isnan(batch_tokens) & ~np.isnan(generated) & ~np.isnan(prompt)
        back &= ~np.isnan(response) & (response != 0)
        batch_tokens = np.where(back, generated * (prompt + response) / response, batch_tokens)
    trained = attr_columns.number(attrs, "trained_tokens")
    trained = np.where(np.isnan(trained) & ~np.isnan(batch_tokens), batch_tokens * epochs, trained)
    owner = _process_keys(spans["host"].to_numpy(object)[rows], spans["pid"].to_numpy()[rows])
    columns = (step[keep].astype(np.int64), owner, batch_tokens, generated, trained, prompt,
               response)  # fmt: skip
    return pd.DataFrame({c: _as_column(v) for c, v in zip(cols, columns)})


_TOKEN_COLUMNS = ("batch_tokens", "generated", "trained", "prompt_mean", "response_mean")


def process_keys(spans: pd.DataFrame) -> np.ndarray:
    """Each span's process as ``host:pid`` (object array): the key that figures over several
    processes order their rows by, so that any division of the processes gives one order."""
    return _process_keys(spans["host"], spans["pid"])


def _process_keys(host: Any, pid: Any) -> np.ndarray:
    """`process_keys` of the spans' hosts and pids (columns or arrays: a value reads the same
    from either)."""
    return np.array([f"{h}:{p}" for h, p in zip(host, pid)], dtype=object)


def _as_column(values: Any) -> Any:
    """Float columns with no number at all stay the object column of None that rows of None
    make (what the per-step sums downstream expect)."""
    if isinstance(values, np.ndarray) and values.dtype == np.float64 and np.isnan(values).all():
        return np.full(len(values), None, dtype=object)
    return values


def phase_walls(spans: pd.DataFrame) -> pd.DataFrame:
    """Per (phase, step): wall seconds the phase took (its self time per process, mean over
    the processes that ran it), processes, and tokens the phase's own outermost spans
    recorded (summed over processes; NaN when none did). Vectorised: a day-long run has
    millions of spans. The figures of `wall_sums` of the run's spans (`combine_walls`)."""
    return combine_walls([wall_sums(spans)])


_WALL_SUMS = ["phase", "step", "covered_ns", "processes", "tokens", "token_processes"]


def wall_sums(spans: pd.DataFrame, self_ns: np.ndarray | None = None) -> pd.DataFrame:
    """`phase_walls`' partial figures of some processes' spans, exact whatever processes they
    are, per (phase, step): the phase's working time (`work_self_ns`: its spans less the
    spans of other phases nested in them, so TRL's update is not charged for the generation
    its training step encloses, but with the collectives it waits on) summed over the
    processes (int), the processes, the outermost spans' tokens summed over them (a float
    when every value is a whole number, which any order sums exactly, else an exact
    `Fraction`), and the processes with tokens. ``self_ns``: the spans' `spans.self_ns` when
    the caller has them (the same rows), which are their working time when no span is a
    collective. `combine_walls` adds those of disjoint processes into `phase_walls`.

    Figured on arrays and integer group codes: the group-bys this takes on a frame cost more
    than the figures for the few spans of a short run."""
    if not len(spans):
        return pd.DataFrame(columns=_WALL_SUMS)
    own_ns = work_self_ns(spans, self_ns)
    phase = spans["phase"].to_numpy(object)
    step = spans["step"].to_numpy()
    keep = np.isin(phase, list(PHASE_WORK)) & pd.notna(step)
    if not keep.any():
        return pd.DataFrame(columns=_WALL_SUMS)
    work = np.flatnonzero(keep)
    phase = phase[work]
    step = _as_int64(step[work])
    host = spans["host"].to_numpy(object)[work]
    pid = pd.to_numeric(spans["pid"]).to_numpy()[work].astype(np.int64)
    own = np.asarray(own_ns)[work]
    depth = pd.to_numeric(spans["depth"], errors="coerce").to_numpy()[work]
    depth = np.where(np.isnan(depth), 0, depth) if depth.dtype.kind == "f" else depth
    tokens = attr_columns.number(spans["attrs"].to_numpy(object)[work], "tokens")
    # per process and (phase, step), in order of first appearance
    g = appearance_codes([phase, step, host, pid])
    n = int(g.max()) + 1
    first = first_rows(g)
    # a process's instants each belong to one innermost span: self times add up to the
    # phase's time without double counting nested or overlapping spans
    covered = np.zeros(n, dtype=np.int64)
    np.add.at(covered, g, own.astype(np.int64, copy=False))
    least = np.full(n, np.inf)
    np.minimum.at(least, g, depth.astype(np.float64))
    outer_tokens = np.where(depth == least[g], tokens, np.nan)
    proc_tokens = _sums_min_count_1(g, n, outer_tokens)
    # per (phase, step), sorted
    p_codes, p_names = pd.factorize(phase[first], sort=True)
    s_names, s_codes = np.unique(step[first], return_inverse=True)
    keys, at = np.unique(p_codes * len(s_names) + s_codes, return_inverse=True)
    m = len(keys)
    covered_ns = np.zeros(m, dtype=np.int64)
    np.add.at(covered_ns, at, covered)
    has = ~np.isnan(proc_tokens)
    return pd.DataFrame(
        {
            "phase": pd.Series(np.asarray(p_names, dtype=object)[keys // len(s_names)]),
            "step": s_names[keys % len(s_names)],
            "covered_ns": covered_ns,
            "processes": np.bincount(at, minlength=m),
            "tokens": _exact_group_sums(at, m, proc_tokens),
            "token_processes": np.bincount(at[has], minlength=m),
        }
    )


def _as_int64(values: np.ndarray) -> np.ndarray:
    """``values`` as int64, as ``Series.astype("int64")`` turns them."""
    if values.dtype.kind in "iuf":
        return values.astype(np.int64)
    return pd.Series(values).astype("int64").to_numpy()


def _sums_min_count_1(group: np.ndarray, n: int, values: np.ndarray) -> np.ndarray:
    """Per group (codes ``0…n-1``, each used) the sum of its values that are not NaN, NaN
    when none is: ``groupby(group).sum(min_count=1)``, on one array when every value is a
    whole number (token counts: any order sums those exactly, as the group-by does)."""
    v = values[~np.isnan(values)]
    if bool((v == np.floor(v)).all()) and float(np.abs(v).sum(initial=0.0)) < 2.0**53:
        ok = ~np.isnan(values)
        out = _weighted_counts(group[ok], values[ok], n)
        out[np.bincount(group[ok], minlength=n) == 0] = np.nan
        return out
    return pd.Series(values, copy=False).groupby(group).sum(min_count=1).to_numpy()


def _weighted_counts(group: np.ndarray, weights: np.ndarray, n: int) -> np.ndarray:
    """``np.bincount`` of ``group`` with ``weights``, float64 even when there are none."""
    return np.bincount(group, weights=weights, minlength=n).astype(np.float64, copy=False)


def _exact_group_sums(group: np.ndarray, n: int, values: np.ndarray) -> np.ndarray:
    """Per group (codes ``0…n-1``, each used), the sum of its finite values: float when
    every value is a whole number (any order and any division of the values sums those
    exactly), else an exact `Fraction` (an object array)."""
    ok = np.isfinite(values)
    v = values[ok]
    if bool((v == np.floor(v)).all()) and float(np.abs(v).sum(initial=0.0)) < 2.0**53:
        return _weighted_counts(group[ok], v, n)
    from gpuprof.analyzers.parts import exact_sum

    return pd.Series(values, copy=False).groupby(group).agg(exact_sum).to_numpy()


TRANSPARENT_PHASES = frozenset({"collective"})
"""Spans that are part of the phase enclosing them rather than a phase of the step: the
collectives an update waits on are its work (exposed communication is ``comm_bound``'s)."""


def work_self_ns(spans: pd.DataFrame, known: np.ndarray | None = None) -> np.ndarray:
    """Each valid span's working time in ns: its self time (`spans.self_ns`, the nesting
    recomputed within each thread) with the `TRANSPARENT_PHASES` spans nested in it counted
    as its own (theirs is 0). ``known``: the spans' self times when the caller has them, used
    as they are when no span is transparent."""
    from gpuprof.analyzers.spans import self_ns
    from gpuprof.model import span_depths

    phase = spans["phase"].astype(object).to_numpy()
    keep = ~np.isin(phase, list(TRANSPARENT_PHASES))
    if known is not None and len(known) == len(spans) and keep.all():
        return np.asarray(known, dtype=np.int64)
    frame = pd.DataFrame(
        {
            "host": spans["host"].astype(object).to_numpy()[keep],
            "pid": pd.to_numeric(spans["pid"]).to_numpy(np.int64)[keep],
            "tid": (pd.to_numeric(spans["tid"], errors="coerce").to_numpy(np.float64)
                    if "tid" in spans else np.full(len(spans), np.nan))[keep],
            "start_ns": pd.to_numeric(spans["start_ns"]).to_numpy(np.int64)[keep],
            "end_ns": pd.to_numeric(spans["end_ns"]).to_numpy(np.int64)[keep],
        }
    )  # fmt: skip
    frame["depth"] = span_depths(frame)
    frame["is_step"] = phase[keep] == "step"
    out = np.zeros(len(spans), dtype=np.int64)
    out[keep] = self_ns(frame)
    return out


def _exact_sums(values: pd.Series, grouped: Any) -> pd.Series:
    """Per group, the sum of its finite values: float when every value is a whole number (any
    order and any division of the values sums those exactly), else an exact `Fraction`."""
    v = values.to_numpy(np.float64)
    v = v[np.isfinite(v)]
    if bool((v == np.floor(v)).all()) and float(np.abs(v).sum(initial=0.0)) < 2.0**53:
        return grouped.sum(min_count=0)
    from gpuprof.analyzers.parts import exact_sum

    return grouped.agg(exact_sum)


def combine_walls(sums: list[pd.DataFrame]) -> pd.DataFrame:
    """`phase_walls` from the `wall_sums` of disjoint sets of processes: the same figures
    however the processes are divided (integer nanoseconds and exact token sums)."""
    cols = ["phase", "step", "wall_s", "processes", "span_tokens"]
    sums = [f for f in sums if len(f)]
    if not sums:
        return pd.DataFrame(columns=cols)
    frame = pd.concat(sums, ignore_index=True) if len(sums) > 1 else sums[0]
    # per (phase, step), sorted, as a sorted group-by on them
    phase, step = frame["phase"], frame["step"]
    p_codes = pd.factorize(phase, sort=True)[0]
    s_names, s_codes = np.unique(step.to_numpy(), return_inverse=True)
    keys, at = np.unique(p_codes * len(s_names) + s_codes, return_inverse=True)
    m = len(keys)
    first = np.full(m, len(at), dtype=np.int64)
    np.minimum.at(first, at, np.arange(len(at)))

    def total(column: str) -> np.ndarray:  # integer sums: exact in any order
        out = np.zeros(m, dtype=np.int64)
        np.add.at(out, at, frame[column].to_numpy(np.int64))
        return out

    covered, processes, token_processes = (
        total(c) for c in ("covered_ns", "processes", "token_processes")
    )
    tokens = frame["tokens"]
    if tokens.dtype == object:  # exact fractions: added exactly, rounded once
        tokens = tokens.groupby(at).agg(lambda t: float(sum(t))).to_numpy(np.float64)
    else:
        tokens = _float_group_sums(at, m, tokens.to_numpy(np.float64))
    return pd.DataFrame(
        {
            "phase": phase.iloc[first].reset_index(drop=True),
            "step": step.iloc[first].reset_index(drop=True),
            "wall_s": covered.astype(np.float64) / processes.astype(np.float64) / 1e9,
            "processes": processes,
            "span_tokens": np.where(token_processes > 0, tokens, np.nan),
        }
    )


def _float_group_sums(group: np.ndarray, n: int, values: np.ndarray) -> np.ndarray:
    """Per group (codes ``0…n-1``, each used) the sum of its values, NaN counted as 0, as a
    group-by sums them: on one array when every value is a whole number (any order sums
    those exactly)."""
    v = values[~np.isnan(values)]
    if bool((v == np.floor(v)).all()) and float(np.abs(v).sum(initial=0.0)) < 2.0**53:
        return _weighted_counts(group, np.nan_to_num(values, nan=0.0), n)
    return pd.Series(values, copy=False).groupby(group).sum().to_numpy()


def _sum_min_count_1(values: pd.Series, grouped: Any) -> pd.Series:
    """``grouped.agg(lambda s: s.sum(min_count=1))``, without a Python call per group when
    the values are whole numbers (token counts): any order sums those exactly, so the group-by's
    own sum gives the same figures."""
    if values.dtype.kind in "fiu":
        v = values.to_numpy(np.float64)
        v = v[np.isfinite(v)]
        if bool((v == np.floor(v)).all()) and float(np.abs(v).sum(initial=0.0)) < 2.0**53:
            return grouped.sum(min_count=1)
    if values.dtype == np.float64:
        return _series_sums(values, grouped)
    if values.dtype == object and values.isna().all():  # a column of None: no group has one
        return pd.Series(np.nan, index=grouped.size().index, name=values.name)
    return grouped.agg(lambda s: s.sum(min_count=1))


def _series_sums(values: pd.Series, grouped: Any) -> pd.Series:
    """``grouped.agg(lambda s: s.sum(min_count=1))`` of float64 ``values``: each group's
    values summed as ``Series.sum`` sums them (NaN as 0, then numpy's sum of the group's
    values in row order; NaN when none is a number), one numpy sum per group of several rows
    instead of a Series and a Python call per group."""
    group = grouped.ngroup().to_numpy()
    index = grouped.size().index
    v = values.to_numpy(np.float64)
    read = ~np.isnan(v)
    out = np.where(np.bincount(group[read], minlength=len(index)) > 0, 0.0, np.nan)
    order = np.argsort(group, kind="stable")
    counts = np.bincount(group, minlength=len(index))
    ends = np.cumsum(counts)
    one = np.flatnonzero(counts == 1)
    only = v[order[ends[one] - 1]]
    out[one] = np.where(np.isnan(only), out[one], only + 0.0)  # numpy's sum starts from 0.0
    for g in np.flatnonzero(counts > 1):  # a step several processes logged
        rows = order[ends[g] - counts[g] : ends[g]]
        if read[rows].any():
            out[g] = np.where(read[rows], v[rows], 0.0).sum()
    return pd.Series(out, index=index, name=values.name)


def valid_spans(spans: pd.DataFrame) -> pd.DataFrame:
    """Spans with a host, a pid, a start and an end not before it (attrs kept)."""
    if spans.empty:
        return spans
    start = _numbers(spans["start_ns"])
    end = _numbers(spans["end_ns"])
    ok = start.notna() & end.notna() & (end >= start) & spans["host"].notna()
    ok &= _numbers(spans["pid"]).notna()
    ok = ok.to_numpy(dtype=bool)
    return spans if ok.all() else spans[ok]  # every span usable: the frame as it is


def _numbers(column: pd.Series) -> pd.Series:
    """`pd.to_numeric` with ``errors="coerce"`` (a numpy column of numbers as it is)."""
    if isinstance(column.dtype, np.dtype) and column.dtype.kind in "iuf":
        return column
    return pd.to_numeric(column, errors="coerce")


def steps_wall_s(spans: pd.DataFrame) -> float | None:
    """Wall seconds of the run's steps (union of step spans per process, mean over
    processes); None without step spans."""
    return combine_steps_wall([steps_wall_sums(spans)])


def steps_wall_sums(spans: pd.DataFrame) -> tuple[int, int]:
    """`steps_wall_s`' partial figures of some processes' spans: their step spans' covered
    nanoseconds summed over the processes, and the processes."""
    rows = np.flatnonzero(spans["phase"].to_numpy(object) == "step") if len(spans) else []
    if not len(rows):
        return 0, 0
    starts = spans["start_ns"].to_numpy()[rows].astype(np.int64)
    ends = spans["end_ns"].to_numpy()[rows].astype(np.int64)
    # each process's step spans (positions among the step spans), as a group-by on them
    by_proc = group_rows([spans["host"].to_numpy(object)[rows], spans["pid"].to_numpy()[rows]])
    walls = [covered_ns(starts[r], ends[r]) for r in by_proc.values()]
    return int(sum(walls)), len(walls)


def combine_steps_wall(sums: list[tuple[int, int]]) -> float | None:
    """`steps_wall_s` from the `steps_wall_sums` of disjoint sets of processes."""
    covered = sum(c for c, _ in sums)
    processes = sum(n for _, n in sums)
    if not processes:
        return None
    value = covered / processes / 1e9
    return value if value > 0 else None


def combine_step_rows(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """`step_rows` of disjoint sets of processes as one frame, the rows in the order of their
    processes (``owner``), each process's in its own order: the same frame however the
    processes are divided."""
    frames = [f for f in frames if len(f)] or frames[:1]
    if len(frames) == 1:
        frame = frames[0]
    else:
        frame = pd.concat(frames, ignore_index=True)
        for column in _TOKEN_COLUMNS:  # a part with no figure held a column of None
            values = pd.to_numeric(frame[column], errors="coerce").to_numpy(np.float64)
            frame[column] = _as_column(values)
    if len(frame) < 2:
        return frame.reset_index(drop=True)
    order = stable_order(frame["owner"].to_numpy(dtype=object))
    return frame.take(order).reset_index(drop=True)


def attention_flops(
    phase: str, model: ModelSize, prompt: float | None, response: float | None
) -> float | None:
    """Attention score FLOPs per token of ``phase`` (QKᵀ and AV: 4 FLOPs per layer per
    attention channel per token of context); None without the model's shape or the mean
    prompt / response lengths. Mean lengths make it a lower bound (Σs² ≥ (Σs)²/n)."""
    if not (model.layers and model.attn_dim) or prompt is None or response is None:
        return None
    per_context = 4.0 * model.layers * model.attn_dim
    if phase == "rollout":  # a decoded token attends to the prompt and the response so far
        return per_context * (prompt + response / 2.0)
    forward = per_context * (prompt + response) / 2.0  # causal: half the sequence on average
    return forward * (3.0 if PHASE_WORK[phase][1] == TRAIN_FACTOR else 1.0)
