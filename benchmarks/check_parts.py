"""Do the stall detectors find the same node by node as on the whole run, at scale?

    python benchmarks/check_parts.py [--run /tmp/gpuprof-scale256/4h] [--repeats 1]

The run is loaded once (`gpuprof.loader.load_for_analysis`, its kept form when there is one).
Then, in this process, start-up and every stall detector written against `analyzers.parts`
(`IN_PARTS`, in `STALLS` order) run twice: on the whole run as its one part, and on the run
cut into one part per node (`parts.by_node`), parts in one process one after the other. The
findings (and the start-up entry and the claimed samples) must be equal, floats to 1e-9 (the
parts add sums in another order). Printed: the nodes, the CPU seconds of each way (the parts'
includes cutting the run and labelling each node's samples), and what differs, if anything.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuprof import loader  # noqa: E402
from gpuprof.analyzers.findings import AnalysisContext, Thresholds  # noqa: E402
from gpuprof.analyzers.parts import Parts, by_node  # noqa: E402
from gpuprof.analyzers.stalls import STALLS  # noqa: E402
from gpuprof.analyzers.stalls._startup import claim_startup  # noqa: E402

IN_PARTS = tuple(s.kind for s in STALLS)


def diagnosed(parts: Parts, th: Thresholds) -> tuple[dict | None, list]:
    """Start-up, then the detectors of `IN_PARTS` in `diagnose`'s order."""
    startup = claim_startup(parts)
    found = []
    for stall in STALLS:
        if stall.kind not in IN_PARTS:
            continue
        finding = stall.detect(parts, th)
        if finding is not None and finding.share >= th.min_share:
            found.append(finding)
            parts.found.append(finding)
    return startup, found


def differences(a, b, path: str = "") -> list[str]:
    """Where ``a`` and ``b`` differ (floats to 1e-9 relative)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if sorted(a) != sorted(b):
            return [f"{path}: keys {sorted(a)} != {sorted(b)}"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, int | float) and not isinstance(b, bool):
        same = (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9)
        return [] if same else [f"{path}: {a!r} != {b!r}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="/tmp/gpuprof-scale256/4h")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    if not Path(args.run).is_dir():
        print(f"check_parts: {args.run}: no such run directory", file=sys.stderr)
        return 2
    run = loader.load_for_analysis(args.run)
    th = Thresholds()
    whole_s, parts_s, bad = [], [], []
    for _ in range(args.repeats):
        t = time.process_time()
        whole = Parts.of(AnalysisContext(run))
        got_w = diagnosed(whole, th)
        whole_s.append(time.process_time() - t)
        t = time.process_time()
        pieces = by_node(run)
        parts = Parts([AnalysisContext(p) for p in pieces], whole=run)
        got_p = diagnosed(parts, th)
        parts_s.append(time.process_time() - t)
        doc_w = [got_w[0], [f.to_dict() for f in got_w[1]]]
        doc_p = [got_p[0], [f.to_dict() for f in got_p[1]]]
        bad = differences(doc_p, doc_w)
        claimed = np.concatenate([c.claimed for c in parts.contexts])
        if not (claimed == whole.lead.claimed).all():
            bad.append("claimed samples differ")
    print(f"run {args.run}: {len(pieces)} nodes, {len(run.gpu):,} GPU samples as loaded")
    print(f"findings: {', '.join(f.kind for f in got_w[1]) or 'none'}")
    n = args.repeats
    print(f"whole run, one part:  {statistics.median(whole_s):.2f} CPU s (median of {n})")
    print(f"node by node, serial: {statistics.median(parts_s):.2f} CPU s")
    for line in bad[:20]:
        print("DIFFERS", line)
    print("same findings" if not bad else f"{len(bad)} differences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
