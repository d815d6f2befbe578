"""How much memory a diagnosis will hold, estimated before it is made, so that ``analyze``
says so instead of being killed for memory minutes later (and taking a training job on the
same node with it).

The whole-run diagnosis holds each GPU sample of the run's merged form and each span, with
what the detectors derive from them (the labelled samples, the phases' and claims' figures),
divided between its workers but not shrunk by them. Its peak, the PSS of the process tree,
was measured at three sizes (`bench_parts_parent.py`, two workers, docs/PERFORMANCE.md,
session 14):

=========================  ==============  ==========  ===========  =========
run                        merged samples  spans       measured     estimate
=========================  ==============  ==========  ===========  =========
256 GPUs × 1 h             1.30 M          0.24 M      1.17 GB      1.32 GB
256 GPUs × 4 h             1.15 M          0.72 M      1.39 GB      1.45 GB
1 024 GPUs × 30.7 h        17.10 M         18.29 M     19.92 GB     20.98 GB
=========================  ==============  ==========  ===========  =========

(`SAMPLE_BYTES` and `SPAN_BYTES` fitted to the last two, `BASE_BYTES` the interpreter, pandas
and pyarrow of two processes; the estimates as they are now, with `PROCESS_ROW_BYTES`.)
Stretch by stretch (``--by-steps``) holds one stretch per worker instead: 1.44 GB for the
cluster-day in stretches of 24 steps.

Held within a limit (``analyze --max-memory``, `within`), each process keeps only as many
of its nodes in memory as its share of the limit holds and writes the others to disk
(`analyzers.held_parts`): the cluster-day within 2.08 GB on two processes (session 17).
Each worker also holds its own copies of figures of the whole run (what the parts combine,
the run read without its series, touched after the fork). The cluster-day's tree PSS, in
bytes (10⁹ = GB; the benchmarks print MiB and GiB), at this session's code (session 16):
19.40 GB on two workers here (`bench_parts_parent.py`), 22.30, 24.41 and 26.82 GB on 4, 8
and 16 on a 16-core machine (`many_core_check.sh`): 0.3-0.5 GB a worker where `BASE_BYTES`
says 0.16. `PROCESS_ROW_BYTES` a row (merged sample or span) a process covers every one of
these: the estimate is 21.0, 22.4, 25.3 and 31.1 GB (up to 16 % over, on 16 workers).

``report`` and the end of a watch diagnose a long run so, then read it whole for the charts
and render the report: 967 MB at 256 GPUs × 1 h, 15.2 GB at the cluster-day
(`bench_report_phases.py`, session 15), i.e. ~604 B a merged sample, ~296 B a span and one
process — below the diagnosis's estimate on every term, so the one estimate judges all three.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

SAMPLE_BYTES = 650
"""Memory of the whole diagnosis per GPU sample of the run's merged form."""
SPAN_BYTES = 460
"""Memory of the whole diagnosis per span."""
BASE_BYTES = 150 * 2**20
"""Memory of each process of the diagnosis before the run: the interpreter and its libraries."""
PROCESS_ROW_BYTES = 16
"""Memory of each process of the diagnosis per merged sample and span of the whole run: its
copies of the whole run's figures (the cluster-day on 2, 4, 8 and 16 workers)."""

__all__ = [
    "Within",
    "available_bytes",
    "fewer_workers_line",
    "held_bytes",
    "held_process_bytes",
    "held_worker_bytes",
    "part_bytes",
    "process_bytes",
    "whole_diagnosis_bytes",
    "within",
    "workers_that_fit",
]


def whole_diagnosis_bytes(rows: Mapping[str, int], workers: int) -> int:
    """About how much memory (bytes, all processes together) the diagnosis of a whole run
    holds at its peak: ``rows`` the run's rows per table as read for it (its merged GPU
    samples ``gpu``, its ``spans``), diagnosed by ``workers`` processes."""
    samples = int(rows.get("gpu", 0))
    spans = int(rows.get("spans", 0))
    per_process = BASE_BYTES + PROCESS_ROW_BYTES * (samples + spans)
    return SAMPLE_BYTES * samples + SPAN_BYTES * spans + per_process * max(1, int(workers))


def process_bytes(rows: Mapping[str, int]) -> int:
    """About how much memory each process of a diagnosis in parts holds before its parts:
    the interpreter and its libraries, and its copies of the whole run's figures."""
    return BASE_BYTES + PROCESS_ROW_BYTES * (int(rows.get("gpu", 0)) + int(rows.get("spans", 0)))


def part_bytes(samples: int, spans: int) -> int:
    """About how much memory one part holds with what the detectors derive from it: its
    merged GPU samples and its spans."""
    return SAMPLE_BYTES * int(samples) + SPAN_BYTES * int(spans)


HELD_SHARE = 0.95
"""Share of a limit the processes and their parts are given when a diagnosis is held within
it (`within`): the rest for the estimate's error."""

HELD_BASE_BYTES = 300_000_000
"""Memory of the first process of a diagnosis held within a limit besides its parts'
budget (the one that takes every decision on the combined figures): the interpreter and
its libraries, what a call holds at once (the part in use being labelled, the replies of
every part)..."""

HELD_ROW_BYTES = 14
"""...and the whole run's figures it combines, per merged sample and span of the run."""

HELD_WORKER_BASE_BYTES = 150_000_000
"""Memory of each further process (a worker) besides its parts' budget..."""

HELD_WORKER_ROW_BYTES = 3
"""...per merged sample and span of the run. The four fitted to the tree PSS of two runs,
each measured held within a budget on two and on four processes (`bench_parts_parent.py
--budget`, session 18; two workers more add two workers' memory): 256 GPUs × 4 h (1.87 M
rows; 0.84 and 1.15 GB with 0.36 GB for the parts) gives 0.32 GB for the first process
and 0.16 GB a worker; the cluster-day (35.4 M rows; 1.59 and 2.08 GB with 0.56 GB) 0.78
and 0.25 GB."""


def held_process_bytes(rows: Mapping[str, int]) -> int:
    """About how much memory the first process of a diagnosis held within a limit holds
    besides its parts (`HELD_BASE_BYTES`, `HELD_ROW_BYTES`)."""
    return HELD_BASE_BYTES + HELD_ROW_BYTES * _merged_rows(rows)


def held_worker_bytes(rows: Mapping[str, int]) -> int:
    """About how much memory each further process holds besides its parts
    (`HELD_WORKER_BASE_BYTES`, `HELD_WORKER_ROW_BYTES`)."""
    return HELD_WORKER_BASE_BYTES + HELD_WORKER_ROW_BYTES * _merged_rows(rows)


def _merged_rows(rows: Mapping[str, int]) -> int:
    """The run's merged GPU samples and spans together."""
    return int(rows.get("gpu", 0)) + int(rows.get("spans", 0))


def held_bytes(rows: Mapping[str, int], processes: int) -> int:
    """About how much memory ``processes`` processes of a diagnosis held within a limit hold
    together besides their parts."""
    return held_process_bytes(rows) + (max(1, int(processes)) - 1) * held_worker_bytes(rows)


class Within(NamedTuple):
    """How a diagnosis is held within a memory limit: on ``processes`` processes whose parts
    hold at most ``budget`` bytes together (`analyzers.held_parts`)."""

    processes: int
    budget: int


def within(rows: Mapping[str, int], limit: int, workers: int, largest_node: float) -> Within | None:
    """The most processes, up to ``workers``, on which the diagnosis of the run read with
    ``rows`` holds at most ``limit`` bytes, node by node (`within`: each process keeps at
    least the node in use), and the budget left to their parts; None when not even one
    process fits. ``largest_node``: the share (0–1) of the run's samples the largest node
    recorded (its spans taken to be in the same share)."""
    node = part_bytes(
        int(rows.get("gpu", 0)) * largest_node, int(rows.get("spans", 0)) * largest_node
    )
    for processes in range(max(1, int(workers)), 0, -1):
        budget = int(limit * HELD_SHARE) - held_bytes(rows, processes)
        if budget >= processes * node:
            return Within(processes, budget)
    return None


def workers_that_fit(rows: Mapping[str, int], workers: int, free: int) -> int:
    """The most processes, fewer than ``workers``, whose whole diagnosis of the run read with
    ``rows`` fits in ``free`` bytes; 0 when none does (two at the least: one process reads
    the run whole, `analyzers.diagnose`)."""
    for fewer in range(int(workers) - 1, 1, -1):
        if whole_diagnosis_bytes(rows, fewer) <= free:
            return fewer
    return 0


def fewer_workers_line(run_dir: object, rows: Mapping[str, int], fewer: int, workers: int,
                       free: int) -> str:  # fmt: skip
    """The line saying the run is diagnosed on ``fewer`` workers than ``workers``, and why."""
    fits = whole_diagnosis_bytes(rows, fewer)
    return (f"gpuprof: {run_dir} is diagnosed on {fewer} workers, not {workers}: about "
            f"{fits / 1e9:.1f} GB, and {free / 1e9:.1f} GB of memory are free")  # fmt: skip


def available_bytes() -> int:
    """Memory the system could give now (bytes: ``MemAvailable``), or 0 when unknown."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # unknown: nothing is judged by it
        return 0
