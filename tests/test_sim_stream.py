"""The simulator writing as it goes: the same run, byte for byte, in bounded memory."""

from __future__ import annotations

import hashlib
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from gpuprof import store
from gpuprof.model import RECORD_TYPES
from gpuprof.sim import MAX_GPUS, Pathology, SimConfig, simulate, simulate_to
from gpuprof.sim.noise import RowDraws


def digests(run_dir: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in run_dir.iterdir()}


CASES = {
    # three hosts, a straggler and a hot GPU, an unused GPU (its process absent)
    "hosts": {
        "gpus": 20,
        "pathologies": [
            Pathology("imbalance", 0.6),
            Pathology("hot_gpu", 0.5),
            Pathology("unused_gpu", 0.5),
        ],
    },
    # split placement, a power cap (its own noise draw), odd host size, no GPM
    "split": {
        "gpus": 7,
        "gpus_per_host": 3,
        "placement": "split",
        "gpu_name": "NVIDIA A100-SXM4-80GB",
        "pathologies": [Pathology("power_cap", 0.6), Pathology("throttling", 0.5)],
    },
    # phantom GPUs (the last two: node1's only GPU has no process), PPO, a hang, checkpoints
    "phantom": {
        "gpus": 9,
        "algorithm": "ppo",
        "pathologies": [
            Pathology("phantom_util", 0.9),
            Pathology("idle_allocation", 0.5),
            Pathology("periodic_stall", 0.6),
        ],
    },
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_streamed_run_is_the_saved_run(tmp_path, case):
    cfg = SimConfig(steps=3, time_scale=0.1, seed=5, **CASES[case])
    whole = simulate(cfg)
    store.save_run(whole.run, tmp_path / "whole")
    written = simulate_to(cfg, tmp_path / "stream")
    assert digests(tmp_path / "stream") == digests(tmp_path / "whole")
    assert written.truth == whole.truth
    assert written.gpu_samples == len(whole.run.gpu)
    assert sorted(p.name for p in written.files) == sorted(digests(tmp_path / "whole"))
    if case == "phantom":  # no rank runs on node1: no spans, events or GPU processes there
        assert not list((tmp_path / "stream").glob("node1.spans.*"))


def test_streamed_run_loads_as_the_run(tmp_path):
    cfg = SimConfig(gpus=12, steps=2, time_scale=0.1, seed=1,
                    pathologies=[Pathology("unused_gpu", 0.5)])  # fmt: skip
    res = simulate(cfg)
    written = simulate_to(cfg, tmp_path, run_id="mine")
    loaded = store.load_run(tmp_path)
    assert loaded.meta.run_id == written.meta.run_id == "mine"
    for table in RECORD_TYPES:
        a, b = getattr(res.run, table), getattr(loaded, table)
        assert len(a) == len(b), table
    assert loaded.gpu.groupby(["host", "gpu"]).ngroups == 12


def test_memory_does_not_grow_with_the_gpus(tmp_path):
    """simulate_to holds one GPU's samples and one host's other rows: the peak of Python and
    numpy memory is the same for 8 and 32 GPUs, far below the run's size."""
    cfg = dict(steps=10, seed=2, pathologies=[Pathology("reward_bound", 0.5)])
    simulate_to(SimConfig(gpus=2, steps=2, time_scale=0.1), tmp_path / "warm")  # lazy imports
    peaks = {}
    for gpus in (8, 32):
        tracemalloc.start()
        arrow0 = pa.total_allocated_bytes()
        written = simulate_to(SimConfig(gpus=gpus, **cfg), tmp_path / str(gpus))
        peaks[gpus] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert pa.total_allocated_bytes() <= arrow0 + 2**20  # nothing left behind in Arrow
    run_bytes = written.gpu_samples * 20 * 8  # 20 numeric columns of the GPU samples alone
    assert peaks[32] < 1.3 * peaks[8], peaks
    assert peaks[32] < run_bytes / 8, (peaks, run_bytes)


def test_gpu_limit():
    SimConfig(gpus=MAX_GPUS, steps=1)
    with pytest.raises(ValueError, match="gpus"):
        SimConfig(gpus=MAX_GPUS + 1)


def test_row_draws_replay_the_whole_draw():
    """Any row of a sequence of draws, alone, as the whole draws have it; the generator ends
    where the whole draws leave it."""
    whole = np.random.default_rng(7)
    a = whole.standard_normal((5, 1000))
    b = whole.standard_normal((5, 1))
    c = whole.random((5, 333))
    d = whole.standard_normal(2500)  # one row of unequal length
    after = whole.standard_normal(3)

    rng = np.random.default_rng(7)
    draws = RowDraws(rng, [("normal", [1000] * 5), ("normal", [1] * 5), ("uniform", [333] * 5),
                           ("normal", [2500])])  # fmt: skip
    np.testing.assert_array_equal(rng.standard_normal(3), after)
    for i in (4, 0, 2):
        np.testing.assert_array_equal(draws.row(0, i, 1000), a[i])
        np.testing.assert_array_equal(draws.row(1, i, 1), b[i])
        np.testing.assert_array_equal(draws.row(2, i, 333), c[i])
    gen = draws.at(3, 0)  # drawn in pieces, as a host's processes take it
    np.testing.assert_array_equal(np.concatenate([gen.standard_normal(n) for n in (700, 1800)]), d)
    with pytest.raises(ValueError):
        RowDraws(np.random.default_rng(0), [("poisson", [3])])


@pytest.mark.parametrize("table", ["gpu", "procs", "spans"])
def test_from_columns_is_to_arrow_of_the_frame(table):
    """Arrow straight from column arrays equals what the frame of those columns gives."""
    from gpuprof import columnar
    from gpuprof.model import RECORD_TYPES, column_kinds
    from gpuprof.sim.cluster import typed_frame

    n = 5
    kinds = column_kinds(RECORD_TYPES[table])
    values = {
        "int": [np.arange(n) * 10**12, 7, None, np.array([1.0, np.nan, 3.0, 4.0, 5.0])],
        "float": [np.array([0.5, np.nan, 2.0, 3.0, 4.0]), 2.5, None, np.arange(n)],
        "str": ["node3", None, np.array(["a", None, "b", "c", "d"], dtype=object)],
        "bool": [True, None, np.array([True, False, True, False, True])],
        "json": [None, [{"tokens": 3}, {}, {"a": [1, 2]}, "{}", {"b": None}]],
    }
    for variant in range(5):
        data = {}
        for i, (name, kind) in enumerate(kinds.items()):
            options = values[kind]
            data[name] = options[(i + variant) % len(options)]
        want = columnar.to_arrow(table, typed_frame(RECORD_TYPES[table], data, n))
        got = columnar.from_columns(table, data, n)
        assert got.equals(want), (table, variant)
