"""torch.distributed collectives recorded as spans: two real gloo processes under a run.

The ranks run as under ``gpuprof watch -- torchrun …``: torchrun's workers inherit the bootstrap
on their path and the run in their environment; nothing in the script mentions gpuprof.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT, clean_env

from gpuprof.api import load_run
from gpuprof.integrations import bootstrap_dir

torch = pytest.importorskip("torch")

RANK_SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")  # torchrun's environment: RANK, WORLD_SIZE, MASTER_*
    rank = dist.get_rank()

    x = torch.full((1000,), float(rank + 1))                      # 4000 bytes
    dist.all_reduce(x)
    assert torch.all(x == 3.0)

    b = torch.arange(10, dtype=torch.int64) * (rank + 1)          # 80 bytes
    dist.broadcast(b, src=0)
    assert torch.equal(b, torch.arange(10))

    parts = [torch.empty(250) for _ in range(2)]                  # 2 x 1000 bytes gathered
    dist.all_gather(parts, torch.full((250,), float(rank)))
    assert [float(p[0]) for p in parts] == [0.0, 1.0]

    out = torch.empty(2 * 64, dtype=torch.float64)                # 1024 bytes gathered
    dist.all_gather_into_tensor(out, torch.full((64,), float(rank), dtype=torch.float64))

    for _ in range(3):
        dist.all_reduce(torch.ones(16, dtype=torch.float16))      # 32 bytes, three times

    gathered = [None, None]
    dist.all_gather_object(gathered, {"rank": rank})              # not a wrapped op
    assert gathered == [{"rank": 0}, {"rank": 1}]

    work = dist.all_reduce(torch.ones(8), async_op=True)          # 32 bytes, launch only
    work.wait()
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)  # one write: the two ranks share a pipe
    """
)

EXPECTED = [
    ("all_reduce", 4000),
    ("broadcast", 80),
    ("all_gather", 2000),
    ("all_gather_into_tensor", 1024),
    ("all_reduce", 32),
    ("all_reduce", 32),
    ("all_reduce", 32),
    ("all_reduce", 32),
    ("barrier", 0),
]


def test_every_collective_of_two_gloo_ranks_is_a_span_with_its_bytes(tmp_path):
    """Two ranks started by torchrun, which passes the bootstrap on to its workers."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    script = tmp_path / "ranks.py"
    script.write_text(RANK_SCRIPT)
    env = clean_env(GPUPROF_RUN_DIR=str(run_dir), OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([bootstrap_dir(), str(ROOT)])
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} done" in proc.stdout
    assert "gpuprof:" not in proc.stderr  # no warning: every op was patched

    spans = load_run(run_dir).spans
    assert set(spans["phase"]) == {"collective"}
    assert sorted(spans["rank"].unique()) == [0, 1]
    for rank in (0, 1):
        mine = spans[spans["rank"] == rank].sort_values("start_ns")
        got = [(a["op"], a["bytes"]) for a in mine["attrs"]]
        assert got == EXPECTED
        assert list(mine["name"]) == [op for op, _ in EXPECTED]
        assert all(a["group_size"] == 2 for a in mine["attrs"])
        assert (mine["end_ns"] >= mine["start_ns"]).all()
        asynchronous = [a.get("async", False) for a in mine["attrs"]]
        assert asynchronous == [False] * 7 + [True, False]
    # the two ranks met in each collective: their spans of one op overlap in time
    first = {r: spans[spans["rank"] == r].sort_values("start_ns").iloc[0] for r in (0, 1)}
    assert first[0]["start_ns"] <= first[1]["end_ns"]
    assert first[1]["start_ns"] <= first[0]["end_ns"]


def test_explicit_install_and_uninstall_restore_torch_distributed():
    import torch.distributed as dist

    from gpuprof.integrations import collectives

    before = dist.all_reduce
    try:
        wrapped = collectives.install(dist)
        assert "all_reduce" in wrapped and "broadcast" in wrapped
        assert dist.all_reduce is not before
        assert dist.all_reduce.__wrapped__ is before
        assert collectives.install(dist) == []  # idempotent
    finally:
        collectives.uninstall(dist)
    assert dist.all_reduce is before
