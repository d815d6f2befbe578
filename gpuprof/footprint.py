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
256 GPUs × 1 h             1.30 M          0.24 M      1.17 GB      1.27 GB
256 GPUs × 4 h             1.15 M          0.72 M      1.39 GB      1.40 GB
1 024 GPUs × 30.7 h        17.10 M         18.29 M     19.92 GB     19.84 GB
=========================  ==============  ==========  ===========  =========

(`SAMPLE_BYTES` and `SPAN_BYTES` fitted to the last two, `BASE_BYTES` the interpreter, pandas
and pyarrow of two processes.) Stretch by stretch (``--by-steps``) holds one stretch per
worker instead: 1.44 GB for the cluster-day in stretches of 24 steps.

``report`` and the end of a watch diagnose a long run so, then read it whole for the charts
and render the report: 967 MB at 256 GPUs × 1 h, 15.2 GB at the cluster-day
(`bench_report_phases.py`, session 15), i.e. ~604 B a merged sample, ~296 B a span and one
process — below the diagnosis's estimate on every term, so the one estimate judges all three.
"""

from __future__ import annotations

from collections.abc import Mapping

SAMPLE_BYTES = 650
"""Memory of the whole diagnosis per GPU sample of the run's merged form."""
SPAN_BYTES = 460
"""Memory of the whole diagnosis per span."""
BASE_BYTES = 150 * 2**20
"""Memory of each process of the diagnosis before the run: the interpreter and its libraries."""

__all__ = ["available_bytes", "whole_diagnosis_bytes"]


def whole_diagnosis_bytes(rows: Mapping[str, int], workers: int) -> int:
    """About how much memory (bytes, all processes together) the diagnosis of a whole run
    holds at its peak: ``rows`` the run's rows per table as read for it (its merged GPU
    samples ``gpu``, its ``spans``), diagnosed by ``workers`` processes."""
    samples = int(rows.get("gpu", 0))
    spans = int(rows.get("spans", 0))
    return SAMPLE_BYTES * samples + SPAN_BYTES * spans + BASE_BYTES * max(1, int(workers))


def available_bytes() -> int:
    """Memory the system could give now (bytes: ``MemAvailable``), or 0 when unknown."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # unknown: nothing is judged by it
        return 0
