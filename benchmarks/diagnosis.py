"""Diagnosis accuracy over randomised simulated scenarios: per-kind precision and recall,
top-1 accuracy, healthy false positives, and both-in-top-3 for two pathologies.

    python benchmarks/diagnosis.py [--scenarios 240] [--seed 0] [--json FILE] [--merge N]

Scenarios come from `gpuprof.sim.random_config` (kind, severity, GPU count 1–32, framework,
step count, time scale, seed) with the noise level also drawn at random (2–15%), in three
groups: single pathologies (one per scenario, every kind in turn), healthy runs, and pairs.
"Injected" means the simulator's truth says the stall cost ≥ 5% of the run's GPU-time (a
smaller one is a near miss nobody should be told about); a finding counts when its kind is
reported at all. Targets (issue 3): top-1 ≥ 95% on single pathologies losing ≥ 5%; ≤ 2% of
healthy runs with any finding; both of two pathologies in the top 3 in ≥ 90%.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuprof import store
from gpuprof.analyzers.diagnose import diagnose
from gpuprof.loader import load_for_analysis
from gpuprof.sim import (
    STALL_KINDS,  # the kinds the simulator can inject
    random_config,
    simulate,
)

MATTERS_SHARE = 0.05


def scenarios(n: int, seed: int):
    """(group, config) pairs: 60% single, 15% healthy, 25% pairs."""
    rng = np.random.default_rng(seed)
    n_single, n_healthy = int(n * 0.6), int(n * 0.15)
    n_pair = n - n_single - n_healthy
    for i in range(n_single):
        kind = STALL_KINDS[i % len(STALL_KINDS)]
        cfg = random_config(rng, kinds=[kind], max_pathologies=1, healthy_share=0.0)
        yield "single", dataclasses.replace(cfg, noise=float(rng.uniform(0.02, 0.15)))
    for _ in range(n_healthy):
        cfg = random_config(rng, kinds=list(STALL_KINDS), healthy_share=1.0)
        yield "healthy", dataclasses.replace(cfg, noise=float(rng.uniform(0.02, 0.15)))
    for _ in range(n_pair):
        cfg = random_config(rng, max_pathologies=2, healthy_share=0.0)
        while len(cfg.pathologies) != 2:
            cfg = random_config(rng, max_pathologies=2, healthy_share=0.0)
        yield "pair", dataclasses.replace(cfg, noise=float(rng.uniform(0.02, 0.15)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=240)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--merge", type=int, default=1, metavar="N",
        help="analyse each run as a long run is analysed: written to disk, then loaded with "
        "N consecutive GPU samples merged within phases (gpuprof.loader)",
    )  # fmt: skip
    args = parser.parse_args()
    merged = [0, 0]  # GPU samples analysed, recorded

    tp, fp, fn = Counter(), Counter(), Counter()
    top1 = [0, 0]
    healthy = [0, 0]
    pair_top3 = [0, 0]
    misses: list[str] = []
    t0 = time.perf_counter()
    for group, cfg in scenarios(args.scenarios, args.seed):
        result = simulate(cfg)
        run = result.run
        if args.merge > 1:
            with tempfile.TemporaryDirectory() as tmp:
                store.save_run(run, tmp)
                total = len(run.gpu)
                run = load_for_analysis(tmp, merge=args.merge)
                merged[0] += len(run.gpu)
                merged[1] += total
        found = [f.kind for f in diagnose(run).findings]
        matters = {t.kind for t in result.truth if t.share >= MATTERS_SHARE}
        injected = {t.kind for t in result.truth}
        for kind in STALL_KINDS:
            if kind in found and kind in injected:
                tp[kind] += 1
            elif kind in found:
                fp[kind] += 1
            elif kind in matters:
                fn[kind] += 1
        if group == "single" and matters:
            top1[1] += 1
            hit = bool(found) and found[0] in matters
            top1[0] += hit
            if not hit:
                misses.append(
                    f"{sorted(matters)} -> {found[:3]} ({cfg.framework}, {cfg.gpus} GPUs)"
                )
        elif group == "healthy":
            healthy[1] += 1
            healthy[0] += bool(found)
        elif group == "pair" and len(matters) == 2:
            pair_top3[1] += 1
            both = matters <= set(found[:3])
            pair_top3[0] += both
            if not both:
                misses.append(
                    f"pair {sorted(matters)} -> {found[:3]} ({cfg.framework}, {cfg.gpus} GPUs)"
                )
    elapsed = time.perf_counter() - t0

    def pct(a: int, b: int) -> str:
        return f"{100 * a / b:5.1f}% ({a}/{b})" if b else "  n/a"

    print(f"{args.scenarios} scenarios in {elapsed:.0f} s (seed {args.seed})")
    if args.merge > 1:
        print(f"analysed after merging: {merged[0]:,} of {merged[1]:,} GPU samples "
              f"({merged[1] / max(1, merged[0]):.1f}x fewer)")  # fmt: skip
    print(f"{'kind':24s} {'precision':>16s} {'recall':>16s}")
    per_kind = {}
    for kind in STALL_KINDS:
        p = pct(tp[kind], tp[kind] + fp[kind])
        r = pct(tp[kind], tp[kind] + fn[kind])
        per_kind[kind] = {"tp": tp[kind], "fp": fp[kind], "fn": fn[kind]}
        print(f"{kind:24s} {p:>16s} {r:>16s}")
    print(f"top-1 on single pathologies losing >= 5%: {pct(*top1)}   (target >= 95%)")
    print(f"healthy runs with any finding:            {pct(*healthy)}   (target <= 2%)")
    print(f"pairs with both in the top 3:             {pct(*pair_top3)}   (target >= 90%)")
    for line in misses[:25]:
        print("  missed:", line)
    if args.json:
        args.json.write_text(json.dumps({"per_kind": per_kind, "top1": top1, "healthy": healthy,
                                         "pair_top3": pair_top3}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
