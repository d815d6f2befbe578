"""A run analysed as parts — one node's share of it each — with one result, the whole run's.

A detector written against `Parts` says where it needs every part (``parts.map(fn, …)``: ``fn``
runs on each part's `AnalysisContext` and returns a small partial figure) and combines the
partials itself, so that a decision that depends on the whole run (a share of the run's
GPU-time, the run's first step, stretches in which *every* GPU idled) is taken once, on the
combined figures, and applied back to each part (``parts.each``). The same code run on one
part — the whole run's context, `Parts.of` — is the single-process diagnosis: there is one
code path, and a diagnosis made node by node equals it (up to the order floating-point sums
are added in, see `tests/test_parts.py`).

A node's share (`by_node`) holds its GPUs' samples, the spans, process samples and events
its processes recorded, and its host samples: everything the labelling of its GPU samples
reads (a GPU's owner runs on the GPU's node), so each part's samples are exactly the whole
run's samples of its GPUs.

The run-wide figures every part needs (`Facts`: GPU-seconds, duration, the first and last
step, how many spans) are combined once, when the parts are made, and set on every part's
context (`AnalysisContext.facts`). The figures of the run as a whole — the efficiency
figures, the notes, the summary — read its metadata and events (`Parts.whole`: the run less
its sampled series and its spans, `whole_view`) and ask the parts for what the samples and
the spans hold (`sampled`, `facts`, ``map``);
`diagnose.diagnose_parts` makes the whole diagnosis that way, and `part_workers` keeps the
parts in worker processes.

The figures are the same to the last bit however the run is cut: a sum over samples that
parts add up is kept exact (`exact_sum`: a fraction, rounded once when the parts' sums are
added), and the run's totals and breakdowns add per-host sums in the order of the hosts'
names.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from gpuprof.analyzers.findings import AnalysisContext, Finding
from gpuprof.model import NODE_READ_TABLES, Run

__all__ = [
    "Facts",
    "Parts",
    "Sampled",
    "WholeContext",
    "by_node",
    "combined_facts",
    "cut",
    "deal",
    "exact_sum",
    "facts",
    "facts_of",
    "median_of_counts",
    "node_groups",
    "partial_facts",
    "sampled",
    "stretches",
    "top_stretches",
    "value_counts",
    "whole_context",
    "whole_view",
]

T = TypeVar("T")

_BY_HOST = ("gpu", "host", "procs", "gpu_procs", "spans", "events", "logs", "threads",
            "stack_samples")  # fmt: skip
"""The run's tables whose rows belong to one node (a ``host`` column); the others (stack
frames and stacks, looked up by id) are shared by every part."""

_SERIES = tuple(t for t in NODE_READ_TABLES if t != "events")
"""The run's sampled series and its spans: what the parts hold and the whole run's view
(`whole_view`) does not, nor its step events — its figures of them come from the parts
(`sampled`, `facts`, `Parts.map`)."""


@dataclass(frozen=True)
class Facts:
    """Figures of the whole run that every part needs.

    ``gpu_s``: GPU-seconds of every GPU sample (`AnalysisContext.total_gpu_s`);
    ``duration_s``: `Run.duration_s` of the whole run (None when nothing is timed);
    ``steps``: per recorded step, the earliest start and latest end of its ``step`` spans
    over every node (``step``, ``start``, ``end``; ns), sorted by start; ``first_span_ns``:
    the earliest start of any span (None without spans); ``t_min_ns``/``t_max_ns``: the
    first and last GPU sample (None without samples); ``phases``: the phase of every span;
    ``spans``: how many spans the run recorded with a host (one without is in no part, and
    never usable), ``valid_spans`` how many of them are usable (`AnalysisContext.spans`),
    ``backwards_spans`` how many end before they start."""

    gpu_s: float
    duration_s: float | None
    steps: pd.DataFrame
    first_span_ns: int | None
    t_min_ns: int | None
    t_max_ns: int | None
    phases: frozenset = frozenset()
    spans: int = 0
    valid_spans: int = 0
    backwards_spans: int = 0


def partial_facts(ctx: AnalysisContext) -> dict[str, Any]:
    """One part's share of `Facts`."""
    from gpuprof.analyzers.breakdown import host_sums

    run = ctx.run
    spans = ctx.spans
    steps = _step_extents(spans)
    s = ctx.samples if len(run.gpu) else None
    t = s["t_ns"].to_numpy(np.int64) if s is not None and len(s) else None
    # the frames' first and last instants count only where the metadata has none
    meta = run.meta
    times = run.extent_ns() if meta.start_ns is None or meta.end_ns is None else (None, None)
    # per host, added in the hosts' order (`breakdown.add_hosts`): the same however cut
    gpu_s = host_sums(s, gpu_s=s["dt_s"].to_numpy(np.float64))["gpu_s"] if s is not None else {}
    recorded = run.spans
    counted, backwards = 0, 0
    if recorded is not None and len(recorded):
        # a span without a host is in no part: counted nowhere (a mask, not a copy)
        hosted = recorded["host"].notna().to_numpy(bool) if "host" in recorded else None
        ends = (recorded["end_ns"] < recorded["start_ns"]).to_numpy(bool)
        counted = int(hosted.sum()) if hosted is not None else len(recorded)
        backwards = int((ends & hosted).sum()) if hosted is not None else int(ends.sum())
    return {
        "gpu_s": gpu_s,
        "steps": steps,
        "spans": counted,
        "valid_spans": len(spans),
        "backwards_spans": backwards,
        "first_span_ns": int(spans["start_ns"].min()) if len(spans) else None,
        "t_min_ns": int(t.min()) if t is not None else None,
        "t_max_ns": int(t.max()) if t is not None else None,
        "extent": times,
        "phases": frozenset(str(p) for p in spans["phase"].unique()) if len(spans) else frozenset(),
    }


def _step_extents(spans: pd.DataFrame) -> pd.DataFrame:
    """Per recorded step of ``spans``' ``step`` spans (sorted, indexed by ``step``), the
    earliest ``start`` and latest ``end``: ``groupby("step").agg(start=("start_ns", "min"),
    end=("end_ns", "max"))``, found on arrays (a few steps do not pay for a group-by)."""
    is_step = spans["phase"].to_numpy(object) == "step" if len(spans) else np.zeros(0, bool)
    if not is_step.any():
        return pd.DataFrame({"start": [], "end": []})
    step = spans["step"].to_numpy()[is_step]
    kept = ~pd.isna(step)
    step = step[kept]
    starts = spans["start_ns"].to_numpy()[is_step][kept]
    ends = spans["end_ns"].to_numpy()[is_step][kept]
    names, at = np.unique(step, return_inverse=True)
    start = np.full(len(names), np.iinfo(starts.dtype).max, dtype=starts.dtype)
    end = np.full(len(names), np.iinfo(ends.dtype).min, dtype=ends.dtype)
    np.minimum.at(start, at, starts)
    np.maximum.at(end, at, ends)
    return pd.DataFrame({"start": start, "end": end}, index=pd.Index(names, name="step"))


def combined_facts(meta: Any, partials: Sequence[dict[str, Any]]) -> Facts:
    from gpuprof.analyzers.breakdown import add_hosts

    steps = [p["steps"] for p in partials if len(p["steps"])]
    if steps:
        per = pd.concat(steps).groupby(level=0).agg(start=("start", "min"), end=("end", "max"))
        per = per.sort_values("start")
    else:
        per = pd.DataFrame({"start": [], "end": []})

    def pick(key: str, how: Callable) -> int | None:
        values = [p[key] for p in partials if p[key] is not None]
        return how(values) if values else None

    start, end = meta.start_ns, meta.end_ns
    starts = [p["extent"][0] for p in partials if p["extent"][0] is not None]
    ends = [p["extent"][1] for p in partials if p["extent"][1] is not None]
    start = start if start is not None else (min(starts) if starts else None)
    end = end if end is not None else (max(ends) if ends else None)
    duration = None if start is None or end is None else max(0.0, (int(end) - int(start)) / 1e9)
    return Facts(
        gpu_s=add_hosts([p["gpu_s"] for p in partials]),
        duration_s=duration,
        steps=per,
        first_span_ns=pick("first_span_ns", min),
        t_min_ns=pick("t_min_ns", min),
        t_max_ns=pick("t_max_ns", max),
        phases=frozenset().union(*(p["phases"] for p in partials)),
        spans=sum(p["spans"] for p in partials),
        valid_spans=sum(p["valid_spans"] for p in partials),
        backwards_spans=sum(p["backwards_spans"] for p in partials),
    )


def facts(ctx: AnalysisContext | Parts) -> Facts:
    """The run-wide `Facts` of the run ``ctx`` is (a context: the run of the parts it belongs
    to, see `Parts.of`): what its spans hold, however they are divided between parts."""
    return (ctx if isinstance(ctx, Parts) else Parts.of(ctx)).facts


def facts_of(contexts: Sequence[AnalysisContext]) -> Facts:
    """The run-wide `Facts` of ``contexts`` (the parts of one run)."""
    return combined_facts(contexts[0].run.meta, [partial_facts(c) for c in contexts])


class Parts:
    """The parts of one run, each an `AnalysisContext`, with the run-wide `Facts` set on
    each. ``found`` is the run's findings so far, in `diagnose`'s order (shared by the
    parts' contexts)."""

    def __init__(
        self,
        contexts: Sequence[AnalysisContext],
        facts: Facts | None = None,
        *,
        whole: Run | None = None,
    ):
        if not contexts:
            raise ValueError("a run has at least one part")
        self.contexts = list(contexts)
        self.facts = facts if facts is not None else facts_of(self.contexts)
        found = self.contexts[0].found
        for ctx in self.contexts:
            ctx.__dict__["_facts"] = self.facts
            ctx.__dict__["_found"] = found  # one list: a finding is the run's, not a part's
        if len(self.contexts) == 1:
            self.whole = self.contexts[0]
        else:
            # the run's events and metadata, for figures of the run as a whole
            if whole is None:
                raise ValueError("a run of several parts needs the whole run's view (whole=)")
            options = self.contexts[0].__dict__.get("_efficiency_options")
            self.whole = whole_context(whole, self, found, options)
            self.whole.__dict__["_facts"] = self.facts
        self.whole.__dict__["_parts"] = self

    def run_totals(self) -> dict[str, Any]:
        """The run's `breakdown.run_totals`, from every part's (empty without samples)."""
        from gpuprof.analyzers.breakdown import finish_totals

        totals = [t for t in self.map(_totals_part) if t is not None]
        return finish_totals(totals) if totals else {}

    def breakdown(self, by: tuple[str, ...]) -> pd.DataFrame:
        """The run's `breakdown.phase_breakdown` by ``by``, from every part's."""
        from gpuprof.analyzers.breakdown import finish_breakdown

        return finish_breakdown(by, self.map(_breakdown_part, by))

    whole: AnalysisContext
    """The run as a whole for the figures of the whole run (its events, stacks and metadata:
    the efficiency figures, the notes, the summary): the one part itself when there is one,
    else a context of `whole_view` whose figures of the samples and the spans come from the
    parts (`sampled`, `facts`, `Parts.of`)."""

    @classmethod
    def of(cls, ctx: AnalysisContext) -> Parts:
        """The parts ``ctx`` belongs to, as seen from it: the whole run as its one part (the
        single-process diagnosis), or one part of a run analysed part by part, alone — for
        figures of its own (a claim), never for a decision on the run. The whole run's view
        (`Parts.whole`) is the parts it was made for."""
        linked = ctx.__dict__.get("_parts")
        if linked is not None:
            return linked
        return cls([ctx], ctx.facts)

    @classmethod
    def by_node(cls, run: Run, parts: int | None = None) -> Parts:
        """``run`` cut into one part per node, or into ``parts`` of consecutive nodes
        (`by_node`), in this process."""
        return cls([AnalysisContext(p) for p in by_node(run, parts)], whole=run)

    @property
    def count(self) -> int:
        """How many parts the run is cut into."""
        return len(self.contexts)

    @property
    def lead(self) -> AnalysisContext:
        """What every part shares (metadata, facts, findings, the run's totals and
        breakdowns): the run's `whole` view."""
        return self.whole

    @property
    def meta(self) -> Any:
        return self.lead.run.meta

    @property
    def found(self) -> list[Finding]:
        return self.lead.found

    @property
    def total_gpu_s(self) -> float:
        return self.facts.gpu_s

    def share(self, gpu_seconds: float) -> float:
        """``gpu_seconds`` as a share (0–1) of the run's GPU-time."""
        total = self.facts.gpu_s
        return float(min(1.0, max(0.0, gpu_seconds / total))) if total > 0 else 0.0

    def map(self, fn: Callable[..., T], *args: Any) -> list[T]:
        """``fn(ctx, *args)`` on every part, in part order."""
        return [fn(ctx, *args) for ctx in self.contexts]

    def each(self, fn: Callable[..., Any], *args: Any) -> None:
        """``fn(ctx, *args)`` on every part, for its effect (a claim)."""
        for ctx in self.contexts:
            fn(ctx, *args)


@dataclass(frozen=True)
class Sampled:
    """What the run's GPU samples hold, for the figures of the run as a whole that read none.

    ``samples``: rows of ``run.gpu``; ``gpus``: distinct (host, gpu) pairs; ``hosts``: the
    distinct hosts with samples, part by part in order of first appearance; ``valued``: the
    columns of `VALUED` with at least one value (not NaN); ``util_finite``: whether any
    utilisation reading is a finite number."""

    samples: int = 0
    gpus: int = 0
    hosts: tuple = ()
    valued: frozenset = frozenset()
    util_finite: bool = False


VALUED = ("util_gpu_pct", "mem_used_bytes", "sm_active_pct")
"""The GPU sample columns whose absence from a whole run the notes state."""


def sampled(ctx: AnalysisContext | Parts) -> Sampled:
    """`Sampled` of the run ``ctx`` is (a context: the run of the parts it belongs to, see
    `Parts.of`), combined from every part once."""
    parts = ctx if isinstance(ctx, Parts) else Parts.of(ctx)
    got = parts.whole.__dict__.get("_sampled")
    if got is None:
        got = [p for p in parts.map(_sampled_part) if p is not None]
        got = Sampled(
            samples=sum(p.samples for p in got),
            gpus=sum(p.gpus for p in got),
            hosts=tuple(h for p in got for h in p.hosts),
            valued=frozenset().union(*(p.valued for p in got)),
            util_finite=any(p.util_finite for p in got),
        )
        parts.whole.__dict__["_sampled"] = got
    return got


def _sampled_part(ctx: AnalysisContext) -> Sampled | None:
    gpu = ctx.run.gpu
    if gpu is None or not len(gpu):
        return None
    try:
        recorded = ctx.recorded_gpus
    except Exception:  # samples that don't align: counted from the rows
        recorded = None
    if recorded is not None:
        count, hosts = recorded
    else:
        count = int(gpu[["host", "gpu"]].drop_duplicates().shape[0])
        hosts = list(gpu["host"].dropna().unique())
    util = pd.to_numeric(gpu["util_gpu_pct"], errors="coerce").to_numpy(np.float64)
    return Sampled(
        samples=len(gpu),
        gpus=int(count),
        hosts=tuple(hosts),
        valued=frozenset(c for c in VALUED if c in gpu and gpu[c].notna().any()),
        util_finite=bool(np.isfinite(util).any()),
    )


def whole_view(run: Run) -> Run:
    """``run`` without its sampled series, its spans (`_SERIES`, left empty with their
    columns) and its step events (which grow with ranks × steps like the spans): its other
    events, stacks and metadata, as the run as a whole is seen by a diagnosis made of parts."""
    tables = {n: getattr(run, n).iloc[:0] for n in _SERIES if getattr(run, n) is not None}
    events = run.events
    if events is not None and len(events) and "kind" in events:
        tables["events"] = events[(events["kind"] != "step").to_numpy(bool)]
    return dataclasses.replace(run, **tables)


def _totals_part(ctx: AnalysisContext) -> dict[str, Any] | None:
    """One part's `breakdown.partial_totals` (None without GPU samples)."""
    from gpuprof.analyzers.breakdown import partial_totals

    if not len(ctx.run.gpu):
        return None
    s = ctx.samples
    return partial_totals(s, ctx.owners, int(s.attrs.get("spans_dropped", 0)))


def _breakdown_part(ctx: AnalysisContext, by: tuple[str, ...]) -> dict[str, Any]:
    """One part's `breakdown.partial_breakdown` by ``by``."""
    from gpuprof.analyzers.breakdown import partial_breakdown

    return partial_breakdown(by, ctx.samples, ctx.spans, ctx.owners, ctx.owner_wall)


class WholeContext(AnalysisContext):
    """A run's `whole_view` as `Parts.whole` holds it: its totals and phase breakdowns are
    its parts' combined, made when first asked (a part's own are its share alone)."""

    def _parts_of(self) -> Parts:
        return self.__dict__["_parts"]

    @cached_property
    def totals(self) -> dict[str, Any]:
        return self._parts_of().run_totals()

    @cached_property
    def by_phase(self) -> pd.DataFrame:
        return self._parts_of().breakdown(("phase",))

    @cached_property
    def by_phase_step(self) -> pd.DataFrame:
        return self._parts_of().breakdown(("phase", "step"))


def whole_context(run: Run, parts: Parts, found: list, options: Any = None) -> WholeContext:
    """`Parts.whole` of ``parts``, cut from ``run``: its view without samples, sharing the
    parts' findings (``found``) and the user's efficiency options (``--gpu``,
    ``--model-params``…: `settings.attach_options`)."""
    whole = WholeContext(whole_view(run))
    whole.__dict__.update(_found=found, _parts=parts)
    if options is not None:
        whole.__dict__["_efficiency_options"] = options
    return whole


def by_node(run: Run, parts: int | None = None) -> list[Run]:
    """``run`` cut into one run per node (host), in order of the hosts' names: each with the
    rows of its node in every per-node table, its GPUs of the metadata's inventory, and the
    rest of the whole run's metadata and shared tables. ``parts``: at most that many runs
    instead, each of consecutive nodes holding about as many GPU samples as the others
    (`deal`).
    A run of one node (or none named), or without a GPU utilisation reading (its detectors
    read the framework's phase times of every node), is its own only part."""
    groups = node_groups(run, parts)
    return [run] if groups is None else [cut(run, group) for group in groups]


def node_groups(
    run: Run, parts: int | None = None, *, series: Any = None
) -> list[list[str]] | None:
    """The hosts of each part `by_node` cuts ``run`` into, or None when it is not cut.
    ``series``: where the sampled series of a run read without them are (a
    `load_cache.KeptSeries`): what is found in them is found there."""
    if series is not None:
        util_finite, counts, hosts = series.census()
    else:
        util = pd.to_numeric(run.gpu["util_gpu_pct"], errors="coerce") if len(run.gpu) else None
        util_finite = util is not None and bool(np.isfinite(util.to_numpy(np.float64)).any())
        counts, hosts = None, set()
    if not util_finite:
        return None  # phase times alone (a framework's log, a memory-only capture): as one
    listed = [g for g in run.meta.gpus or [] if isinstance(g, dict) and g.get("host") is not None]
    hosts |= {str(g["host"]) for g in listed}
    # every node with rows is in a part: one with spans and no GPU (a CPU-only head running
    # the driver, whose step spans time the run) as much as one with GPUs
    for name in _BY_HOST:
        frame = getattr(run, name)
        if frame is not None and "host" in frame and len(frame):
            hosts |= {str(h) for h in frame["host"].dropna().unique()}
    hosts = sorted(hosts)
    if len(hosts) <= 1 or (parts is not None and parts <= 1):
        return None
    if parts is None:
        return [[h] for h in hosts]
    if counts is None:
        counts = run.gpu["host"].astype(object).value_counts()
    return [[hosts[i] for i in g] for g in deal([counts.get(h, 0) for h in hosts], parts)]


def cut(run: Run, hosts: Sequence[str]) -> Run:
    """The part of ``run`` that ``hosts`` recorded: their rows of every per-node table, their
    GPUs of the inventory (the owners of a part are its GPUs' owners), the rest shared."""
    names = set(hosts)
    gpus = [
        g for g in run.meta.gpus or [] if not isinstance(g, dict) or str(g.get("host")) in names
    ]
    tables: dict[str, Any] = {"meta": dataclasses.replace(run.meta, gpus=gpus)}
    for name in _BY_HOST:
        frame = getattr(run, name)
        if frame is None or "host" not in frame or not len(frame):
            continue
        keep = frame["host"].isin(list(hosts)).to_numpy(bool)
        tables[name] = frame[keep].reset_index(drop=True)
    return dataclasses.replace(run, **tables)


def deal(weights: Sequence[int], n: int) -> list[list[int]]:
    """Items ``0…len(weights)-1`` dealt to at most ``n`` groups of consecutive items, of
    about equal weight (each item weighs one more than its weight: an empty one counts).
    Each cut falls before or after the item that reaches its share of the weight, whichever
    is nearer: a heavy node is a group of its own rather than pulling its light neighbours
    into one group with it (real captures of 90, 1, 224 and 2 619 samples: two groups,
    not one)."""
    count = len(weights)
    n = max(1, min(n, count))
    cum = np.cumsum(np.asarray(weights, dtype=np.float64) + 1.0)
    targets = cum[-1] * np.arange(1, n) / n
    at = np.searchsorted(cum, targets, side="left")  # the item that reaches each share
    before = np.where(at > 0, cum[np.maximum(at - 1, 0)], 0.0)
    cuts = np.where(targets - before < cum[at] - targets, at, at + 1)
    edges = sorted({0, *(int(c) for c in cuts), count})
    return [list(range(a, b)) for a, b in itertools.pairwise(edges) if b > a]


def stretches(
    t: np.ndarray, dt_s: np.ndarray, mask: np.ndarray, weight: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One part's contiguous stretches of masked samples (sample ``i`` covers ``[t_i, t_i +
    dt_s_i]``; touching samples join, as `_phase._sample_intervals` joins them): their
    starts, ends (exclusive, one past the last sample's end) and summed ``weight``."""
    from gpuprof.intervals import union

    if not mask.any():
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    t = t[mask]
    e = t + (dt_s[mask] * 1e9).astype(np.int64)
    a, b = union(t, e + 1)
    where = np.searchsorted(a, t, side="right") - 1
    w = np.bincount(where, weights=np.nan_to_num(weight[mask]), minlength=len(a))
    return a, b, w


def top_stretches(
    partials: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], n: int = 20
) -> list[list[int]]:
    """The heaviest ``n`` stretches of the parts' `stretches` joined (a stretch of one part
    that overlaps or touches another's is one stretch, weighing both), in time order, as
    `intervals.top_intervals` lists them."""
    from gpuprof.intervals import top_intervals, union

    parts = [p for p in partials if len(p[0])]
    if not parts:
        return []
    a = np.concatenate([p[0] for p in parts])
    b = np.concatenate([p[1] for p in parts])
    w = np.concatenate([p[2] for p in parts])
    ua, ub = union(a, b)
    where = np.searchsorted(ua, a, side="right") - 1
    weight = np.bincount(where, weights=w, minlength=len(ua))
    return top_intervals(ua, ub, _tie_safe(weight), n=n)


def _tie_safe(weight: np.ndarray) -> np.ndarray:
    """Weights rounded to a microsecond of GPU-time: sums of the same samples added in
    another order (part by part) rank the same."""
    return np.round(np.asarray(weight, dtype=np.float64), 6)


def exact_sum(values: Any) -> Fraction:
    """The exact sum of ``values`` (NaN and infinities counted as 0), as a fraction: each
    float is an integer times a power of two, and integers add exactly, so the sums of any
    parts of the values add up to this, and ``float()`` of it is the correctly rounded sum
    (`math.fsum`'s) however the values were divided between parts."""
    v = np.asarray(values, dtype=np.float64).ravel()
    if not v.size:
        return Fraction(0)
    # v = ±mantissa × 2**(exponent − 1075), read off the IEEE-754 bits
    bits = v.view(np.int64)
    exponent = (bits >> 52) & 0x7FF
    mantissa = bits & ((1 << 52) - 1)
    mantissa |= np.where(exponent > 0, 1 << 52, 0)  # the implicit leading bit
    mantissa = np.where((bits < 0) & (exponent < 0x7FF), -mantissa, mantissa)
    mantissa[exponent == 0x7FF] = 0  # NaN and infinities count as 0
    exponent = np.maximum(exponent, 1)  # subnormals share the smallest exponent
    hi = mantissa >> 27
    lo = mantissa - (hi << 27)  # 0 ≤ lo < 2**27, |hi| < 2**27
    total = 0
    for start in range(0, len(v), 1 << 24):  # float sums of < 2**51 stay exact
        part = slice(start, start + (1 << 24))
        n = int(exponent[part].max()) + 1
        sums_hi = np.bincount(exponent[part], weights=hi[part], minlength=n)
        sums_lo = np.bincount(exponent[part], weights=lo[part], minlength=n)
        for k in np.flatnonzero((sums_hi != 0) | (sums_lo != 0)):
            total += ((int(sums_hi[k]) << 27) + int(sums_lo[k])) << int(k)
    return Fraction(total, 1 << 1075)


def median_of_counts(counts: Sequence[tuple[np.ndarray, np.ndarray]]) -> float:
    """The median of values given as the parts' distinct values and their counts
    (``np.unique(…, return_counts=True)`` of each part), as ``np.median`` of all of them
    gives it (the mean of the two middle values of an even count); NaN when there are none."""
    counts = [c for c in counts if len(c[0])]
    if not counts:
        return np.nan
    values = np.concatenate([c[0] for c in counts])
    n = np.concatenate([c[1] for c in counts])
    order = np.argsort(values, kind="stable")
    values, cum = values[order], np.cumsum(n[order])
    total = int(cum[-1])
    lo = values[np.searchsorted(cum, (total - 1) // 2, side="right")]
    hi = values[np.searchsorted(cum, total // 2, side="right")]
    return float(lo) if lo == hi else float(np.mean([lo, hi]))


def value_counts(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct non-NaN ``values`` and how often each occurs (hashed, not sorted: a run's
    sampling intervals take few distinct values), one part's input to `median_of_counts`."""
    values = np.asarray(values, dtype=np.float64)
    counts = pd.Series(values[~np.isnan(values)], copy=False).value_counts(sort=False)
    return counts.index.to_numpy(np.float64), counts.to_numpy(np.int64)
