"""What the zero-code bootstrap costs a process that ``gpuprof watch`` starts.

Measures, in fresh interpreters (median of ``--repeat`` runs each, alternating with and
without the bootstrap so drift hits both alike):

* the import of the bootstrap's ``sitecustomize`` itself (``python -X importtime``);
* interpreter start-up to exit (``python -c pass``) with and without the bootstrap;
* ``import torch`` with and without it (torch.distributed is imported by torch: the
  bootstrap only wraps ``init_process_group`` there, and loads gpuprof once a process group
  is initialised);
* ``import trl`` + ``trl.extras.profiling`` with and without it (this one loads gpuprof and
  patches TRL and transformers' Trainer: the price of recording a TRL run).

    python benchmarks/bench_bootstrap.py [--repeat 15]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuprof.integrations import bootstrap_dir  # noqa: E402


def _env(with_bootstrap: bool, run_dir: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROF_")}
    # as installed: pip byte-compiles the bootstrap; without a .pyc it is compiled at every
    # start (~3 ms here), which is what PYTHONDONTWRITEBYTECODE=1 in a source checkout gives
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    paths = [bootstrap_dir(), str(ROOT)] if with_bootstrap else [str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["GPUPROF_RUN_DIR"] = run_dir
    return env


def _wall(code: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def _import_us(env: dict[str, str], module: str) -> float:
    """Cumulative import time (µs) of ``module`` during start-up (0 when not imported)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "pass"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    for line in proc.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[2].strip() == module:
            return float(parts[1])
    return 0.0


def _compare(label: str, code: str, repeat: int, run_dir: str) -> None:
    with_b, without = [], []
    for _ in range(repeat):
        without.append(_wall(code, _env(False, run_dir)))
        with_b.append(_wall(code, _env(True, run_dir)))
    a, b = statistics.median(without), statistics.median(with_b)
    print(
        f"{label:<34} without {a * 1e3:8.1f} ms   with {b * 1e3:8.1f} ms   "
        f"cost {(b - a) * 1e3:+7.1f} ms  (median of {repeat})"
    )


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as run_dir:
        for label, with_b in (("without", False), ("with", True)):
            site = [_import_us(_env(with_b, run_dir), "site") for _ in range(args.repeat)]
            ours = [_import_us(_env(with_b, run_dir), "sitecustomize") for _ in range(args.repeat)]
            print(
                f"{'start-up imports ' + label:<34} site {statistics.median(site):7.0f} µs, "
                f"of which sitecustomize {statistics.median(ours):6.0f} µs"
            )
        _compare("python -c pass", "pass", args.repeat, run_dir)
        if _has("torch"):
            _compare("import torch", "import torch", max(5, args.repeat // 3), run_dir)
        if _has("trl"):
            code = "import trl.extras.profiling, transformers.trainer"
            _compare("import trl (patched on import)", code, max(5, args.repeat // 3), run_dir)


if __name__ == "__main__":
    main()
