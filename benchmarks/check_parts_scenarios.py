"""Is the diagnosis in worker processes the single process's, over the simulator's scenarios?

    python benchmarks/check_parts_scenarios.py [--scenarios 240] [--seed 0] [--workers 2]
                                               [--merge 1] [--kept] [--drop-spans 0.05]
                                               [--hostless-spans 0.05] [--shift-ns 37]

For every multi-node scenario of `diagnosis.py` (the others are never cut into parts), the
run is diagnosed in this process (`diagnose(run, workers=1)`) and in ``--workers`` parts of
consecutive nodes, each in a forked worker (`part_workers`), whatever its size (the sample
thresholds set to 1). With ``--merge N`` each run is first written and loaded with N GPU
samples merged, as a long run is analysed. The two ``--json`` documents must be the same to
the byte; printed: how many scenarios, how many identical, and the first differing lines of
any that are not. Exits 1 on a difference. With ``--kept`` each run is written, loaded once
(which keeps its form) and diagnosed in parts as ``analyze`` does it: read without its
sampled series, each worker reading its own nodes' from the kept form
(`loader.load_for_diagnosis`). ``--drop-spans F`` drops that share of each run's spans at
random (a full queue, a rank that died: the runs users have), ``--hostless-spans F`` leaves
that share without a host (in no part, counted nowhere). ``--shift-ns N`` moves every GPU
sample by N ns: the simulator's samples fall on multiples of 256 ns, where a time turned to
float64 somewhere loses nothing, and a real clock's do not.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from diagnosis import scenarios  # noqa: E402

from gpuprof import load_cache, store  # noqa: E402
from gpuprof.analyzers import diagnose as diagnose_module  # noqa: E402
from gpuprof.analyzers.parts import node_groups  # noqa: E402
from gpuprof.loader import load_for_analysis, load_for_diagnosis  # noqa: E402
from gpuprof.reports.fmt import render_json  # noqa: E402
from gpuprof.sim import simulate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=240)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--merge", type=int, default=1)
    parser.add_argument("--kept", action="store_true", help="the parts read the kept form")
    parser.add_argument("--drop-spans", type=float, default=0.0)
    parser.add_argument("--hostless-spans", type=float, default=0.0)
    parser.add_argument("--shift-ns", type=int, default=0)
    args = parser.parse_args()
    # every multi-node run to the workers, however small
    diagnose_module.PARTS_MIN_SAMPLES = diagnose_module.PARTS_MIN_SAMPLES_FEW = 1
    diagnose_module.PARTS_MIN_WORKERS = 2
    started = time.monotonic()
    checked, differ = 0, []
    for i, (group, cfg) in enumerate(scenarios(args.scenarios, args.seed)):
        run = _spans_cut(simulate(cfg).run, args.drop_spans, args.hostless_spans, i)
        if args.shift_ns:
            gpu = run.gpu.assign(t_ns=run.gpu["t_ns"] + args.shift_ns)
            run = dataclasses.replace(run, gpu=gpu)
        groups = node_groups(run, args.workers)
        if groups is None or len(groups) < 2:
            continue
        if args.kept:
            one, parts = _from_kept(run, args.workers)
        else:
            if args.merge > 1:
                with tempfile.TemporaryDirectory() as tmp:
                    store.save_run(run, Path(tmp) / "run")
                    run = load_for_analysis(Path(tmp) / "run", merge=args.merge)
            one = render_json(diagnose_module.diagnose(run, workers=1).to_dict())
            parts = render_json(diagnose_module.diagnose(run, workers=args.workers).to_dict())
        checked += 1
        if one != parts:
            lines = difflib.unified_diff(one.splitlines(), parts.splitlines(), lineterm="", n=0)
            changed = [x for x in lines if x[:1] in "+-" and x[:3] not in ("+++", "---")]
            kinds = [p.kind for p in cfg.pathologies]
            print(f"scenario {i} ({group}, {kinds}, {cfg.gpus} GPUs): {changed[:4]}")
            differ.append(i)
    print(f"{checked} multi-node scenarios in {args.workers} parts (merge {args.merge}): "
          f"{checked - len(differ)} identical to one process, {len(differ)} differ "
          f"({time.monotonic() - started:.0f} s)")  # fmt: skip
    if differ:
        raise SystemExit(1)


def _spans_cut(run, drop: float, hostless: float, seed: int):
    """``run`` with a share ``drop`` of its spans dropped and a share ``hostless`` left
    without a host, drawn at random (seeded by the scenario's number)."""
    if not drop and not hostless:
        return run
    import numpy as np

    rng = np.random.default_rng(seed)
    spans = run.spans.copy()
    spans["host"] = spans["host"].astype(object)
    spans.loc[rng.random(len(spans)) < hostless, "host"] = None
    spans = spans[rng.random(len(spans)) >= drop].reset_index(drop=True)
    return dataclasses.replace(run, spans=spans)


def _from_kept(run, workers: int) -> tuple[str, str]:
    """The run written and loaded whole (its form kept), diagnosed in one process; and read
    again without its series, diagnosed in ``workers`` parts that read their own."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        store.save_run(run, run_dir)
        os.environ.pop(load_cache.ENV_CACHE, None)
        whole = load_for_analysis(run_dir)
        one = render_json(diagnose_module.diagnose(whole, workers=1).to_dict())
        light, series = load_for_diagnosis(run_dir, defer_from=1)
        if series is None:
            raise SystemExit("the run's form was not kept")
        parts = diagnose_module.diagnose(light, workers=workers, series=series)
    return one, render_json(parts.to_dict())


if __name__ == "__main__":
    main()
