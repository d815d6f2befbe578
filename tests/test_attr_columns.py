"""Reading span attrs one key at a time as columns gives what the per-span loops it replaced
gave: the same numbers, the same column types, the same order of keys (random attrs with the
values users' logs hold: numbers as text, booleans, NaN, infinities, missing keys, no dict)."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpuprof.analyzers import attr_columns
from gpuprof.analyzers.basis import _NOT_COUNTERS, _counters
from gpuprof.analyzers.efficiency import _framework_metrics, framework_metrics, perf_values
from gpuprof.analyzers.findings import AnalysisContext
from gpuprof.analyzers.phase_work import (
    _PROMPT_KEYS,
    _RESPONSE_KEYS,
    combine_step_rows,
    combine_steps_wall,
    combine_walls,
    phase_walls,
    step_rows,
    steps_wall_s,
    steps_wall_sums,
    wall_sums,
)
from gpuprof.analyzers.settings import num
from gpuprof.analyzers.stalls._bound import _step_attr_means
from gpuprof.model import Run, RunMeta

# --------------------------------------------------------------------------------------------
# Reference implementations: the loops as they were


def ref_first(attrs: Mapping[str, Any], keys: tuple[str, ...]) -> float | None:
    for key in keys:
        value = num(attrs.get(key))
        if value is not None:
            return value
    return None


def ref_step_rows(spans: pd.DataFrame, settings: Mapping[str, Any]) -> pd.DataFrame:
    cols = ["step", "owner", "batch_tokens", "generated", "trained", "prompt_mean",
            "response_mean"]  # fmt: skip
    steps = spans[spans["phase"] == "step"] if len(spans) else spans
    if steps.empty:
        return pd.DataFrame(columns=cols)
    epochs = num(settings.get("actor_rollout_ref.actor.ppo_epochs"))
    if epochs is None:
        epochs = num(settings.get("num_iterations"))
    epochs = epochs if epochs and epochs > 0 else 1.0
    batch = num(settings.get("data.train_batch_size"))
    n = num(settings.get("actor_rollout_ref.rollout.n", 1)) or 1.0
    rows = []
    for host, pid, step, attrs in zip(steps["host"], steps["pid"], steps["step"], steps["attrs"]):
        if step is None or step is pd.NA or (isinstance(step, float) and math.isnan(step)):
            continue
        attrs = attrs if isinstance(attrs, Mapping) else {}
        tokens = num(attrs.get("tokens"))
        response = ref_first(attrs, _RESPONSE_KEYS)
        prompt = ref_first(attrs, _PROMPT_KEYS)
        responses_only = str(attrs.get("tokens_source", "")).startswith("rollout/response_length")
        batch_tokens = None if responses_only else tokens
        generated = num(attrs.get("generated_tokens"))
        if generated is None and responses_only:
            generated = tokens
        if generated is None and response is not None and prompt is not None:
            if batch_tokens is not None and prompt + response > 0:
                generated = batch_tokens * response / (prompt + response)
            elif batch is not None:
                generated = response * batch * n
        if batch_tokens is None and generated is not None and response and prompt is not None:
            batch_tokens = generated * (prompt + response) / response
        trained = num(attrs.get("trained_tokens"))
        if trained is None and batch_tokens is not None:
            trained = batch_tokens * epochs
        rows.append((int(step), f"{host}:{pid}", batch_tokens, generated, trained, prompt,
                     response))  # fmt: skip
    return pd.DataFrame(rows, columns=cols)


def ref_perf_values(step_attrs: list[Any]) -> dict[str, list[float]]:
    values: dict[str, list[float]] = {}
    for attrs in step_attrs:
        if not isinstance(attrs, Mapping):
            continue
        for key, value in attrs.items():
            number = num(value)
            if str(key).startswith("perf/") and number is not None:
                values.setdefault(str(key), []).append(number)
    return values


def ref_step_attr_means(attrs_list: list[Any], keys: tuple[str, ...]) -> dict[str, float]:
    values: dict[str, list[float]] = {}
    for attrs in attrs_list:
        if not isinstance(attrs, dict):
            continue
        for key in keys:
            v = num(attrs.get(key))
            if v is not None:
                values.setdefault(key, []).append(v)
    return {k: float(np.mean(v)) for k, v in values.items() if v}


def ref_counters(attrs_list: list[Any]) -> list[str]:
    names: set[str] = set()
    for attrs in attrs_list:
        if isinstance(attrs, dict):
            names.update(
                k
                for k, v in attrs.items()
                if k not in _NOT_COUNTERS and isinstance(v, int | float) and not isinstance(v, bool)
            )
    return sorted(names, key=lambda name: (not name.startswith("perf/"), name))


# --------------------------------------------------------------------------------------------
# Random attrs as logs give them

_VALUES: list[Any] = [
    None, True, False, 0, 0.0, 3, -2, 1234, 2.5, 900.0, float("nan"), float("inf"),
    -float("inf"), "12", "3.5", "abc", "", [1], {"x": 1}, np.float64(7.0), np.int64(5),
]  # fmt: skip
_KEYS = [
    "tokens", "generated_tokens", "trained_tokens", "response_length/mean",
    "response_length_mean", "rollout/response_length_mean", "prompt_length/mean",
    "prompt_length_mean", "response_length/max", "perf/mfu/actor", "perf/throughput",
    "timing_per_token_ms/gen", "framework", "other",
]  # fmt: skip


def random_attrs(rng: random.Random, plain: bool) -> Any:
    if rng.random() < 0.05:
        return None if rng.random() < 0.5 else "not a dict"
    attrs: dict[str, Any] = {}
    for key in rng.sample(_KEYS, rng.randint(0, len(_KEYS))):
        if plain:  # numbers and gaps only: the fast path
            attrs[key] = rng.choice([None, 0, 3, 1234, 2.5, 900.0, float("nan"), 512])
        else:
            attrs[key] = rng.choice(_VALUES)
    if rng.random() < 0.2:
        attrs["tokens_source"] = rng.choice(
            ["rollout/response_length/mean", "perf/total_num_tokens", None, 3]
        )
    return attrs


def random_spans(seed: int, n: int = 300) -> pd.DataFrame:
    rng = random.Random(seed)
    plain = seed % 2 == 0
    phases = ["step", "rollout", "update_actor", "ref_logprob"]
    steps: list[Any] = [rng.randint(0, 40) for _ in range(n)]
    if seed % 3 == 0:  # an object column with gaps, as imports can leave it
        steps = [None if rng.random() < 0.1 else float(s) for s in steps]
    start = np.array([rng.randint(0, 10**9) for _ in range(n)], dtype=np.int64)
    return pd.DataFrame(
        {
            "host": [rng.choice(["a", "b"]) for _ in range(n)],
            "pid": [rng.choice([1, 2, 3]) for _ in range(n)],
            "phase": [rng.choice(phases) for _ in range(n)],
            "step": steps,
            "depth": 0,
            "start_ns": start,
            "end_ns": start + np.array([rng.randint(0, 10**8) for _ in range(n)]),
            "attrs": [random_attrs(rng, plain) for _ in range(n)],
        }
    )


# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_numbers_read_each_value_as_num_does(seed):
    rng = random.Random(seed)
    pool = _VALUES if seed % 2 else [None, 0, 3, 2.5, float("nan"), float("inf"), 10**15]
    raw = [rng.choice(pool) for _ in range(rng.randint(0, 50))]
    expected = [np.nan if num(v) is None else num(v) for v in raw]
    np.testing.assert_array_equal(attr_columns.numbers(raw), np.array(expected, dtype=float))


@pytest.mark.parametrize("seed", range(24))
def test_step_rows_match_the_row_loop(seed):
    spans = random_spans(seed)
    settings: dict[str, Any] = [
        {},
        {"data.train_batch_size": 64, "actor_rollout_ref.rollout.n": 4},
        {"actor_rollout_ref.actor.ppo_epochs": 2, "data.train_batch_size": "32"},
        {"num_iterations": 3},
    ][seed % 4]
    got, want = step_rows(spans, settings), ref_step_rows(spans, settings)
    pd.testing.assert_frame_equal(got, want)


def test_step_rows_with_no_usable_step():
    spans = random_spans(1, n=20)
    spans["step"] = None
    pd.testing.assert_frame_equal(step_rows(spans, {}), ref_step_rows(spans, {}))


@pytest.mark.parametrize("seed", range(12))
def test_phase_walls_tokens_as_the_loop_read_them(seed):
    spans = random_spans(seed)
    spans = spans[spans["step"].notna()]
    walls = phase_walls(spans)
    work = spans[spans["phase"].isin(["rollout", "update_actor", "ref_logprob"])]
    tokens = pd.Series(
        pd.to_numeric(
            pd.Series([num(a.get("tokens")) if isinstance(a, Mapping) else None
                       for a in work["attrs"]], dtype=object),
            errors="coerce",
        ).to_numpy(),
        index=work.index,
    )  # fmt: skip
    # every phase and step whose spans recorded tokens reports them; none else does
    has = tokens.notna().groupby([work["phase"], work["step"].astype("int64")]).any()
    reported = walls.set_index(["phase", "step"])["span_tokens"].notna()
    assert reported.sort_index().to_dict() == has.sort_index().to_dict()


def _steps_by_process(spans: pd.DataFrame) -> list[Any]:
    """The step spans' attrs process by process (host:pid), each process's in their order:
    how figures over the steps read them, the same however the run is cut into parts."""
    step_spans = spans[spans["phase"] == "step"]
    owner = step_spans["host"] + ":" + step_spans["pid"].astype(str)
    return list(step_spans["attrs"].iloc[np.argsort(owner.to_numpy(object), kind="stable")])


@pytest.mark.parametrize("seed", range(12))
def test_perf_metrics_match_the_loop(seed):
    spans = random_spans(seed)
    run = Run(meta=RunMeta(run_id="r"), spans=spans)
    got = _framework_metrics(run.spans, run.events, "verl")["metrics"]
    steps = _steps_by_process(spans)
    want = {
        key: {"mean": math.fsum(v) / len(v), "min": float(np.min(v)), "max": float(np.max(v)),
              "steps": len(v)}
        for key, v in sorted(ref_perf_values(steps).items())
    }  # fmt: skip
    assert got == want
    assert list(got) == list(want)


@pytest.mark.parametrize("seed", range(12))
def test_step_attr_means_match_the_loop_in_order(seed):
    spans = random_spans(seed)
    ctx = AnalysisContext(Run(meta=RunMeta(run_id="r"), spans=spans))
    keys = ("timing_per_token_ms/gen", "response_length/max", "perf/mfu/actor", "tokens")
    got = _step_attr_means(ctx, keys)
    want = ref_step_attr_means(_steps_by_process(spans), keys)
    assert list(got.items()) == list(want.items())


@pytest.mark.parametrize("seed", range(12))
def test_counters_match_the_loop(seed):
    spans = random_spans(seed)
    events = pd.DataFrame(
        {"kind": ["step", "other"], "attrs": [{"perf/x": 1, "tokens": True}, {"zz": 2}]}
    )
    attrs = [*spans.loc[spans["phase"] == "step", "attrs"], {"perf/x": 1, "tokens": True}]
    assert _counters(spans, events) == ref_counters(attrs)


def test_values_reads_dicts_and_anything_else_from_any_iterable():
    rows = [{"k": 1}, {}, {"k": "2"}, None, float("nan"), {"k": None}, {"j": 3}]
    want = [1, None, "2", None, None, None, None]
    assert attr_columns.values(rows, "k") == want
    assert attr_columns.values(iter(rows), "k") == want  # one pass: the fallback still sees all
    assert attr_columns.values(pd.Series(rows, dtype=object), "k") == want
    dicts = [r for r in rows if isinstance(r, dict)]
    assert attr_columns.values((d for d in dicts), "k") == [1, None, "2", None, None]


def _by_process(spans: pd.DataFrame, seed: int) -> list[pd.DataFrame]:
    """The spans divided into random disjoint sets of processes, each set's in span order."""
    rng = random.Random(seed)
    owners = sorted(set(zip(spans["host"], spans["pid"])))
    groups: dict[tuple, int] = {o: rng.randrange(3) for o in owners}
    which = np.array([groups[o] for o in zip(spans["host"], spans["pid"])])
    return [spans[which == k] for k in range(3)]


@pytest.mark.parametrize("seed", range(12))
def test_span_figures_of_processes_add_up_to_the_whole(seed):
    """The spans' figures of disjoint sets of processes, added, are the whole run's to the
    bit, however the processes are divided (how a run cut into nodes gets them)."""
    spans = random_spans(seed, n=600)
    spans["host"] = [f"h{i % 5}" for i in range(len(spans))]  # more processes than parts
    spans["attrs"] = [
        {**a, "perf/mfu/actor": i / 7} if isinstance(a, dict) and i % 3 else a
        for i, a in enumerate(spans["attrs"])
    ]
    pieces = _by_process(spans, seed)
    settings = {"data.train_batch_size": 64, "actor_rollout_ref.rollout.n": 4}
    pd.testing.assert_frame_equal(combine_walls([wall_sums(p) for p in pieces]), phase_walls(spans))
    assert combine_steps_wall([steps_wall_sums(p) for p in pieces]) == steps_wall_s(spans)
    pd.testing.assert_frame_equal(
        combine_step_rows([step_rows(p, settings) for p in pieces]),
        combine_step_rows([step_rows(spans, settings)]),
    )
    events = pd.DataFrame()
    assert framework_metrics([perf_values(p) for p in pieces], [], "verl") == (
        _framework_metrics(spans, events, "verl")
    )


@pytest.mark.parametrize("seed", range(6))
def test_phase_walls_are_each_process_self_time_averaged(seed):
    """Wall seconds per (phase, step): each process's time with the phase as its innermost
    span (`phase_work.work_self_ns`), averaged over the processes that ran the phase in that
    step (a loop over the groups as reference); where a process's spans of the phase overlap
    no span of another phase, that is the union of those spans."""
    from gpuprof.analyzers.phase_work import valid_spans as usable
    from gpuprof.analyzers.phase_work import work_self_ns

    spans = random_spans(seed)
    spans = usable(spans[spans["step"].notna()])
    walls = phase_walls(spans).set_index(["phase", "step"])
    own = pd.Series(work_self_ns(spans), index=spans.index)
    work = spans[spans["phase"].isin(["rollout", "update_actor", "ref_logprob"])]
    others = spans[spans["phase"] != "step"]
    for (phase, step), group in work.groupby(["phase", work["step"].astype("int64")]):
        seconds = []
        for (host, pid), proc in group.groupby(["host", "pid"]):
            seconds.append(int(own[proc.index].sum()) / 1e9)
            rivals = others[(others["host"] == host) & (others["pid"] == pid)
                            & (others["phase"] != phase)]  # fmt: skip
            overlapped = any(
                ((rivals["start_ns"] < e) & (rivals["end_ns"] > s)).any()
                for s, e in zip(proc["start_ns"], proc["end_ns"])
            )
            if not overlapped and len(proc) == len(
                spans[(spans["host"] == host) & (spans["pid"] == pid) & (spans["phase"] == phase)]
            ):
                blocks = sorted(zip(proc["start_ns"], proc["end_ns"]))
                total, (lo, hi) = 0, blocks[0]
                for s, e in blocks[1:]:
                    if s > hi:
                        total, lo, hi = total + hi - lo, s, e
                    else:
                        hi = max(hi, e)
                assert seconds[-1] == pytest.approx((total + hi - lo) / 1e9, abs=1e-9)
        row = walls.loc[(phase, step)]
        assert row["processes"] == len(seconds)
        assert row["wall_s"] == pytest.approx(sum(seconds) / len(seconds), rel=1e-12)
