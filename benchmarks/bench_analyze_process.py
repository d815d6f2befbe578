"""`gpuprof analyze RUN --json` as a fresh process, whole: interpreter start, imports, loading,
alignment, every detector, recommendations and the JSON on stdout.

    python benchmarks/bench_analyze_process.py [--hours 1] [--gpus 8] [--repeats 7]
                                               [--dir /tmp/gpuprof-process] [--regenerate]
                                               [--bytecode cached|none] [--roots ROOT ...]
                                               [--report]

The run directory is written once (and reused while its parameters match): a simulated GRPO
run (reward-bound and reshard stalls injected, GPU samples every 0.1 s, host and process
samples every 0.5 s) whose samples cover ``--hours`` (the step count is calibrated so that 8
GPUs x 1 h is 8 x 36 000 GPU samples), written as `watch` leaves it: one SQLite host file
with its Parquet side files (see bench_analyze_scale.py). Then, ``--repeats`` times, the
imports alone (``python -c "import gpuprof.cli, gpuprof.api, ..."``: the entry point, the
API, the analyzers and the recommender, with pandas and pyarrow under them) and ``python -m
gpuprof analyze DIR --json`` each run as a fresh process, timed with wall clock and ``wait4``
(user, system CPU and peak RSS); the table gives median, min and max. ``--roots`` times
other checkouts of the project on the same run, interleaved with this one (e.g. a checkout
of the previous commit, for a before/after on the same machine state). The machine's load
average is printed before and after: on a shared machine, compare only figures taken under
similar load, and prefer CPU time (user + sys) to wall time there. ``--report`` times
``python -m gpuprof report DIR -o FILE`` the same way (target: 2 s). The untimed first run
leaves the form the loader keeps beside a finished run (`gpuprof.load_cache`), which the
timed runs read, as an ``analyze`` after ``watch`` does; ``--not-kept`` also times ``analyze``
with ``GPUPROF_LOAD_CACHE=0`` (the run files read every time).

``--bytecode cached`` (default) runs the children as an installed package runs, from
bytecode compiled on a first, untimed run (kept under DIR/pycache, not in the checkout);
``none`` sets PYTHONDONTWRITEBYTECODE=1 so that every run compiles gpuprof's modules again.
Target (issue 22): 1 h x 8 GPUs in <= 1.0 s on the project's 2-vCPU machine (it was 1.5 s).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_MARKER = "bench_analyze_process.json"
_IMPORTS = (
    "import gpuprof.cli, gpuprof.api, gpuprof.analyzers.diagnose, gpuprof.analyzers.recommend"
)


def simulated_run(gpus: int, hours: float, seed: int):
    """A simulated GRPO run whose GPU samples cover ``hours`` (the pathologies lengthen the
    steps, so the step count is calibrated on a first simulation)."""
    # imported here: the timing parent never loads gpuprof or the run (see `prepare`)
    from bench_analyze_scale import PATHOLOGIES

    from gpuprof.sim import SimConfig, simulate
    from gpuprof.sim.config import DEFAULT_PHASE_S

    step_s = sum(v for k, v in DEFAULT_PHASE_S.items() if k not in ("values", "update_critic"))
    steps = max(1, round(hours * 3600 / step_s))
    run = None
    for _ in range(2):
        run = simulate(SimConfig(gpus=gpus, steps=steps, seed=seed, pathologies=PATHOLOGIES)).run
        covered_s = len(run.gpu) / gpus * 0.1
        steps = max(1, round(steps * hours * 3600 / covered_s))
    return run


def write(run_dir: Path, gpus: int, hours: float, seed: int) -> None:
    """Simulate and write the run directory with its marker (in a child process: see main)."""
    sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
    from bench_analyze_scale import write_tiled_run

    t = time.perf_counter()
    run = simulated_run(gpus, hours, seed)
    shutil.rmtree(run_dir, ignore_errors=True)
    n = write_tiled_run(run, 0, run_dir)  # one copy: the run as simulated
    info = {
        "params": {"gpus": gpus, "hours": hours, "seed": seed},
        "gpu_samples": n,
        "spans": len(run.spans),
        "covered_h": n / gpus * 0.1 / 3600,
        "written_s": round(time.perf_counter() - t, 1),
    }
    (run_dir / _MARKER).write_text(json.dumps(info))


def prepare(run_dir: Path, gpus: int, hours: float, seed: int, regenerate: bool) -> dict:
    """Write the run directory unless one with the same parameters is there; its summary.

    The run is simulated in a child process: a parent holding it would pass its memory on to
    every timed child's peak RSS (``ru_maxrss`` counts the forked image).
    """
    params = {"gpus": gpus, "hours": hours, "seed": seed}
    marker = run_dir / _MARKER
    if regenerate or not marker.exists() or json.loads(marker.read_text()).get("params") != params:
        argv = [sys.executable, __file__, "--write", "--dir", str(run_dir.parent),
                "--gpus", str(gpus), "--hours", str(hours), "--seed", str(seed)]  # fmt: skip
        subprocess.run(argv, check=True, cwd=ROOT)
    return json.loads(marker.read_text())


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> dict:
    """Run ``argv`` as a fresh process: wall s, user and system CPU s, peak RSS, stdout."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env)
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed in {cwd}: {err.decode()[-2000:]}")
    return {
        "wall": wall,
        "user": usage.ru_utime,
        "sys": usage.ru_stime,
        "rss_mb": usage.ru_maxrss / 1024,
        "out": out,
    }


def child_env(bytecode: str, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROF_")}
    env.pop("PYTHONPATH", None)  # `python -m gpuprof` in a checkout runs that checkout
    if bytecode == "none":
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(cache)
    return env


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{os.cpu_count()} CPUs ({model}), Linux {platform.release()}, "
        f"CPython {platform.python_version()}"
    )


def load() -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def stats(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} {min(values):6.2f} {max(values):6.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/gpuprof-process"))
    parser.add_argument("--regenerate", action="store_true", help="write the run again")
    parser.add_argument("--bytecode", choices=["cached", "none"], default="cached")
    parser.add_argument(
        "--roots", type=Path, nargs="*", default=[],
        help="other checkouts to time on the same run, interleaved with this one",
    )  # fmt: skip
    parser.add_argument(
        "--report", action="store_true",
        help="also time `gpuprof report DIR -o FILE` (the HTML report) the same way",
    )  # fmt: skip
    parser.add_argument(
        "--not-kept", action="store_true",
        help="also time `analyze` with GPUPROF_LOAD_CACHE=0 (reading the run files, not the "
             "form the loader kept beside them)",
    )  # fmt: skip
    parser.add_argument("--write", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    run_dir = args.dir / f"{args.gpus}gpu-{args.hours:g}h"
    if args.write:
        write(run_dir, args.gpus, args.hours, args.seed)
        return
    info = prepare(run_dir, args.gpus, args.hours, args.seed, args.regenerate)
    print(f"machine: {machine()}")
    print(f"run: {run_dir} ({info['gpu_samples']:,} GPU samples over {info['covered_h']:.2f} h "
          f"on {args.gpus} GPUs, {info['spans']:,} spans; Parquet side files)")  # fmt: skip
    roots = [ROOT, *(r.resolve() for r in args.roots)]
    analyze = [sys.executable, "-m", "gpuprof", "analyze", str(run_dir), "--json"]
    imports = [sys.executable, "-c", _IMPORTS]
    envs = {r: child_env(args.bytecode, args.dir / "pycache" / r.name) for r in roots}
    if args.bytecode == "cached":
        for r in roots:  # compile once, untimed
            timed(analyze, r, envs[r])
    print(f"bytecode: {args.bytecode}; load average before: {load()}")
    commands = {"import": imports, "analyze": analyze}
    if args.report:
        html = args.dir / "bench_analyze_process_report.html"
        commands["report"] = [sys.executable, "-m", "gpuprof", "report", str(run_dir), "-o",
                              str(html)]  # fmt: skip
    if args.not_kept:
        commands["not-kept"] = analyze
    results: dict[Path, dict[str, list[dict]]] = {r: {k: [] for k in commands} for r in roots}
    for _ in range(args.repeats):
        for r in roots:
            for what, argv in commands.items():
                env = envs[r]
                if what == "not-kept":
                    env = {**env, "GPUPROF_LOAD_CACHE": "0"}
                results[r][what].append(timed(argv, r, env))
    print(f"load average after: {load()}")
    print(f"{'checkout':24s} {'command':8s} {'wall s: median   min    max':>27s} "
          f"{'user s':>7s} {'sys s':>6s} {'peak RSS MB':>12s}")  # fmt: skip
    for r in roots:
        for what in commands:
            rs = results[r][what]
            print(f"{str(r)[-24:]:24s} {what:8s} {stats([x['wall'] for x in rs]):>27s} "
                  f"{statistics.median(x['user'] for x in rs):7.2f} "
                  f"{statistics.median(x['sys'] for x in rs):6.2f} "
                  f"{max(x['rss_mb'] for x in rs):12.0f}")  # fmt: skip
    docs = {r: json.loads(results[r]["analyze"][0]["out"]) for r in roots}
    for r, doc in docs.items():
        findings = ", ".join(f"{f['kind']} ({f['share']:.3f})" for f in doc["findings"])
        print(f"findings ({r.name}): {findings}")
    outputs = {x["out"] for r in roots for what in ("analyze", "not-kept")
               for x in results[r].get(what, [])}  # fmt: skip
    if len(roots) > 1 or args.not_kept:
        print("JSON documents identical across checkouts and runs:", len(outputs) == 1)


if __name__ == "__main__":
    main()
