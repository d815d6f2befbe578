"""Ray: how long a node's sampler takes from being asked for to its first sample.

    python benchmarks/bench_ray_sampler_start.py [--nodes 2] [--repeats 5] [--busy 0]
                                                 [--src DIR]

A real Ray cluster on this machine (`ray.cluster_utils.Cluster`): a head and ``--nodes``
worker nodes, each raylet with its own name (``GPUPROF_HOST``) and one simulated GPU
(tests/simnvml). Each repeat is a fresh job, as a user's is: ``gpuprof watch -- python
driver.py`` on the head, the driver calling ``ray.init(address=…)`` (so the recorder places a
sampler on every worker node, through the job's runtime_env and its setup hook) and waiting
until every sampler has started or been given up (60 s). The cluster stays up between
repeats, as a real one does.

Per node, on the one machine's clock (no skew is injected):

- *placement to first sample*: from the recorder asking Ray for the node's sampler to the
  node's first GPU sample stored in the run;
- *init to first sample*: from the driver's ``ray.init`` returning to that sample — the part
  of a job that the node's record misses.

Figures are medians over every node of every repeat. ``--busy N`` keeps N processes spinning
on the CPU for the whole benchmark (a loaded machine). ``--src DIR`` runs another checkout's
gpuprof (the driver, the watcher and the raylets' workers all import it from ``DIR``) for a
before/after on the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from simnvml import build_library, simnvml_env, write_scenario  # noqa: E402

DRIVER = textwrap.dedent(
    """
    import json, os, time
    import ray

    ray.init(address=os.environ["BENCH_RAY_ADDRESS"])
    init_ns = time.time_ns()
    from gpuprof.integrations import ray_driver

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rec = ray_driver._recorder
        nodes = list(rec.nodes.values()) if rec is not None else []
        if len(nodes) >= int(os.environ["BENCH_NODES"]) + 1 and not any(
            n.state in ("placing", "starting") for n in nodes
        ):
            break
        time.sleep(0.05)
    time.sleep(0.5)  # the first samples taken and stored
    out = {}
    for n in ray_driver._recorder.nodes.values():
        if n.state == "watcher":
            continue
        # the monotonic time it was asked for, on the wall clock
        asked = time.time_ns() - int((time.monotonic() - n.since) * 1e9)
        out[n.name or n.label] = {"asked_ns": getattr(n, "asked_ns", None) or asked,
                                  "state": n.state}
    print("BENCH " + json.dumps({"init_ns": init_ns, "nodes": out}), flush=True)
    """
)

BURN = "while True: pass"


def node_env(src: Path, lib: Path, work: Path, name: str) -> dict[str, str]:
    scenario = write_scenario(work / f"{name}.txt", {"gpus": [{"name": "NVIDIA H100 80GB HBM3"}]})
    env = simnvml_env(lib, scenario, base={})
    env.update(GPUPROF_HOST=name, PYTHONPATH=str(src), GPUPROF_SPOOL_DIR=str(work / "spool"))
    return env


def one_job(src: Path, lib: Path, work: Path, address: str, nodes: int, k: int) -> list[dict]:
    script = work / "driver.py"
    script.write_text(DRIVER)
    run_dir = work / f"run{k}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROF_")}
    env.update(node_env(src, lib, work, "node0"))
    env.update(BENCH_RAY_ADDRESS=address, BENCH_NODES=str(nodes), RAY_USAGE_STATS_ENABLED="0")
    cmd = [sys.executable, "-m", "gpuprof", "watch", "--quiet", "--interval", "0.1", "-o",
           str(run_dir), "--", sys.executable, str(script)]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=src)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("BENCH ")), None)
    if proc.returncode != 0 or line is None:
        sys.exit(f"the job failed:\n{proc.stdout}\n{proc.stderr}")
    seen = json.loads(line[6:])
    sys.path.insert(0, str(src))
    from gpuprof import store

    run = store.load_run(run_dir)
    rows = []
    for name, node in seen["nodes"].items():
        gpu = run.gpu[run.gpu["host"] == name]
        first = int(gpu["t_ns"].min()) if len(gpu) else None
        rows.append({
            "node": name,
            "state": node["state"],
            "placement_s": (first - node["asked_ns"]) / 1e9 if first else None,
            "init_s": (first - seen["init_ns"]) / 1e9 if first else None,
        })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--busy", type=int, default=0, help="CPU-burning processes to run")
    parser.add_argument("--src", type=Path, default=ROOT, help="the gpuprof checkout to run")
    args = parser.parse_args()
    src = args.src.resolve()
    from ray import cluster_utils

    work = Path(tempfile.mkdtemp(prefix="gpuprof-ray-start-"))
    lib = build_library(work / "simnvml")
    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(args.busy)]
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    for name in [n for n in os.environ if n.startswith("GPUPROF_") or n == "RAY_ADDRESS"]:
        del os.environ[name]
    cluster = cluster_utils.Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": False,
            "env_vars": node_env(src, lib, work, "node0"),
        },
    )
    rows: list[dict] = []
    try:
        for i in range(args.nodes):
            cluster.add_node(num_cpus=1, env_vars=node_env(src, lib, work, f"node{i + 1}"))
        cluster.wait_for_nodes()
        time.sleep(2.0)  # the raylets settled
        for k in range(args.repeats):
            got = one_job(src, lib, work, cluster.address, args.nodes, k)
            print(f"repeat {k + 1}: " + "  ".join(
                f"{r['node']} {r['state']} "
                + (f"{r['placement_s']:.2f} s ({r['init_s']:.2f} s after init)"
                   if r["placement_s"] is not None else "no sample")
                for r in got), flush=True)  # fmt: skip
            rows.extend(got)
    finally:
        cluster.shutdown()
        for burner in burners:
            burner.kill()
            burner.wait()
    placed = [r["placement_s"] for r in rows if r["placement_s"] is not None]
    inits = [r["init_s"] for r in rows if r["init_s"] is not None]
    print(f"{args.nodes} worker nodes x {args.repeats} jobs, {args.busy} busy processes, "
          f"src {src}")  # fmt: skip
    if placed:
        print(f"placement to first sample: median {statistics.median(placed):.2f} s, "
              f"max {max(placed):.2f} s")  # fmt: skip
        print(f"ray.init to first sample:  median {statistics.median(inits):.2f} s, "
              f"max {max(inits):.2f} s")  # fmt: skip
    print(f"nodes without a sample: {len(rows) - len(placed)} of {len(rows)}")


if __name__ == "__main__":
    main()
