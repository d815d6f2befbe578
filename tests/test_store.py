"""The run store: schema, many writers, crash safety, clear errors on bad files."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap

import pytest
from conftest import clean_env, run_gpuprof

from gpuprof import store
from gpuprof.model import SCHEMA_VERSION, GpuSample, RunMeta, Span


def _write_small_run(run_dir, host="hostA", n=5):
    writer = store.BufferedWriter(store.host_file(run_dir, host))
    writer.set_meta("run", RunMeta(run_id="r1", hosts=[host], start_ns=1, end_ns=10**9).to_dict())
    writer.add_records(
        "gpu",
        [GpuSample(host, 0, "GPU-0", 1000 + i, util_gpu_pct=50.0 + i, mem_used_bytes=None)
         for i in range(n)],
    )  # fmt: skip
    writer.add_records(
        "spans",
        [Span(host, 1, 1, 0, 0, "rollout", "gen", 0, 0, 100, 200, attrs={"tokens": 7})],
    )
    writer.close()


def test_round_trip_keeps_values_and_missing_as_nan(tmp_path):
    _write_small_run(tmp_path)
    run = store.load_run(tmp_path)
    assert run.meta.run_id == "r1"
    assert list(run.gpu["util_gpu_pct"]) == [50.0, 51.0, 52.0, 53.0, 54.0]
    assert run.gpu["mem_used_bytes"].isna().all()  # None is NaN, never 0
    assert run.gpu["t_ns"].dtype == "int64"
    span = run.spans.iloc[0]
    assert (span["phase"], span["name"], span["attrs"]) == ("rollout", "gen", {"tokens": 7})


def test_host_files_merge_into_one_run(tmp_path):
    _write_small_run(tmp_path, "hostA", 3)
    _write_small_run(tmp_path, "hostB", 4)
    run = store.load_run(tmp_path)
    assert sorted(run.gpu["host"].unique()) == ["hostA", "hostB"]
    assert len(run.gpu) == 7
    assert run.meta.hosts == ["hostA", "hostB"]
    assert run.gpu["t_ns"].is_monotonic_increasing


def test_span_depth_is_derived_from_nesting(tmp_path):
    writer = store.BufferedWriter(store.host_file(tmp_path, "h"))
    spans = [  # thread 1: step ⊃ rollout ⊃ gen, then reward; thread 2 independent
        Span("h", 1, 1, None, None, "step", "step", 0, 0, 0, 100),
        Span("h", 1, 1, None, None, "rollout", "rollout", 0, 0, 0, 50),
        Span("h", 1, 1, None, None, "rollout", "gen", 0, 0, 10, 40),
        Span("h", 1, 1, None, None, "reward", "reward", 0, 0, 50, 90),
        Span("h", 1, 2, None, None, "dataload", "dataload", 0, 0, 20, 30),
    ]
    writer.add_records("spans", spans)
    writer.close()
    run = store.load_run(tmp_path)
    depth = dict(zip(run.spans["name"] + "@" + run.spans["tid"].astype(str), run.spans["depth"]))
    assert depth == {"step@1": 0, "rollout@1": 1, "gen@1": 2, "reward@1": 1, "dataload@2": 0}


WRITER = textwrap.dedent(
    """
    import sys, gpuprof
    gpuprof.init(sys.argv[1])
    for i in range(int(sys.argv[2])):
        with gpuprof.phase("rollout", i=i):
            pass
    """
)


def test_four_processes_write_ten_thousand_spans_each_none_lost(tmp_path):
    env = clean_env(
        GPUPROF_DB=str(store.host_file(tmp_path, "shared")), GPUPROF_WATCHER_MACHINE=_hostname()
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), "10000"], env=env)
        for _ in range(4)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    assert [p.name for p in tmp_path.glob("*.sqlite")] == ["shared.sqlite"]  # one shared file
    run = store.load_run(tmp_path)
    spans = run.spans[run.spans["phase"] == "rollout"]
    assert len(spans) == 40_000
    assert spans.groupby("pid").size().tolist() == [10_000] * 4
    per_pid = spans.groupby("pid")["attrs"].apply(lambda a: sorted(x["i"] for x in a))
    assert all(v == list(range(10_000)) for v in per_pid)


def _hostname():
    import socket

    return socket.gethostname()


def _bad_run(tmp_path, kind):
    path = tmp_path / f"{_hostname()}.sqlite"
    if kind == "corrupt":
        path.write_bytes(b"this is not a database at all" * 100)
    elif kind == "truncated":
        _write_small_run(tmp_path, _hostname(), 2000)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3])
    elif kind == "newer":
        _write_small_run(tmp_path, _hostname())
        conn = sqlite3.connect(path)
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 5}")
        conn.close()
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "foreign":
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE t (x)")
        conn.close()
    return path


@pytest.mark.parametrize("kind", ["corrupt", "truncated", "newer", "empty", "foreign"])
def test_bad_run_file_gives_one_clear_line_and_exit_2(tmp_path, kind):
    path = _bad_run(tmp_path, kind)
    with pytest.raises(store.RunError) as info:
        store.load_run(tmp_path)
    assert str(path) in str(info.value)
    result = run_gpuprof("summary", str(tmp_path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpuprof: error: ") and str(path) in lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    if kind == "newer":
        assert "newer gpuprof" in lines[0]


def test_missing_run_dir_is_a_clear_error(tmp_path):
    result = run_gpuprof("summary", str(tmp_path / "nope"))
    assert result.returncode == 2
    assert "no such run directory" in result.stderr
    assert "Traceback" not in result.stderr


def test_network_filesystem_detection(tmp_path):
    # /proc is procfs: not a network filesystem; the parser finds the longest mount prefix
    assert store.filesystem_type("/proc/self") == "proc"
    assert not store.is_network_filesystem(tmp_path)


def test_a_process_on_another_host_writes_its_own_file_and_merges(tmp_path):
    """A Ray worker on another node inherits the watcher's variables but not its host: it must
    not write the watcher's file (SQLite's WAL index can't be shared across hosts)."""
    watcher_file = store.host_file(tmp_path, "watcher-node")
    _write_small_run(tmp_path, "watcher-node")
    code = "import gpuprof\nwith gpuprof.phase('update_weights'): pass"
    env = clean_env(
        GPUPROF_RUN_DIR=str(tmp_path),
        GPUPROF_DB=str(watcher_file),
        GPUPROF_WATCHER_MACHINE="another-machine",
    )
    before = watcher_file.read_bytes()
    proc = subprocess.run([sys.executable, "-c", code], env=env, timeout=60)
    assert proc.returncode == 0
    assert watcher_file.read_bytes() == before
    own = [p.name for p in tmp_path.glob(f"{_hostname()}.*.sqlite")]
    assert len(own) == 1
    run = store.load_run(tmp_path)
    assert sorted(run.spans["phase"]) == ["reshard", "rollout"]
    assert run.meta.run_id == "r1"  # the watcher's metadata is the run's


def test_save_run_round_trips_a_whole_run(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _write_small_run(tmp_path / "a", "hostA", 4)
    _write_small_run(tmp_path / "b", "hostB", 3)
    merged = store.load_run(tmp_path / "a")
    other = store.load_run(tmp_path / "b")
    merged.gpu = __import__("pandas").concat([merged.gpu, other.gpu], ignore_index=True)
    merged.meta.hosts = ["hostA", "hostB"]
    written = store.save_run(merged, tmp_path / "out")
    assert sorted(p.name for p in written) == [
        "hostA.gpu.parquet", "hostA.spans.parquet", "hostA.sqlite", "hostB.gpu.parquet",
        "hostB.sqlite",
    ]  # fmt: skip
    assert not list((tmp_path / "out").glob("*.partial*"))
    again = store.load_run(tmp_path / "out")
    assert len(again.gpu) == 7 and again.gpu["mem_used_bytes"].isna().all()
    assert list(again.gpu["util_gpu_pct"]) == list(merged.gpu.sort_values("t_ns")["util_gpu_pct"])
    assert again.spans.iloc[0]["attrs"] == {"tokens": 7}
    assert again.meta.run_id == "r1"


def _gpu_rows(conn_path):
    with sqlite3.connect(conn_path) as conn:
        return conn.execute("SELECT count(*) FROM gpu").fetchone()[0]


def test_compaction_moves_samples_to_parquet_and_loads_the_same_run(tmp_path):
    _write_small_run(tmp_path, "hostA", 6)
    before = store.load_run(tmp_path)
    written = store.compact_run(tmp_path)
    assert written == ["hostA.gpu.parquet", "hostA.spans.parquet"]
    assert _gpu_rows(tmp_path / "hostA.sqlite") == 0
    after = store.load_run(tmp_path)
    assert list(after.gpu.columns) == list(before.gpu.columns)
    for col in ("t_ns", "util_gpu_pct", "host", "uuid"):
        assert after.gpu[col].tolist() == before.gpu[col].tolist(), col
    assert after.gpu["mem_used_bytes"].isna().all()
    assert after.spans.iloc[0]["attrs"] == {"tokens": 7}
    assert store.count_rows(tmp_path, "gpu") == 6
    # rows written after compaction are merged on load and by the next compaction
    _write_small_run(tmp_path, "hostA", 2)
    assert store.count_rows(tmp_path, "gpu") == 8
    assert len(store.load_run(tmp_path).gpu) == 8
    store.compact_run(tmp_path)
    assert _gpu_rows(tmp_path / "hostA.sqlite") == 0
    assert len(store.load_run(tmp_path).gpu) == 8


def test_streaming_gpu_samples_gives_one_sorted_frame_per_gpu(tmp_path):
    writer = store.BufferedWriter(store.host_file(tmp_path, "h"))
    writer.add_records(
        "gpu", [GpuSample("h", i % 3, None, 10_000 - i, util_gpu_pct=float(i)) for i in range(30)]
    )
    writer.close()
    store.compact_run(tmp_path)
    writer = store.BufferedWriter(store.host_file(tmp_path, "h"))  # later rows stay in SQLite
    writer.add_records("gpu", [GpuSample("h", 0, None, 20_000, util_gpu_pct=99.0)])
    writer.close()
    frames = list(store.iter_gpu_samples(tmp_path))
    assert [int(f["gpu"].iloc[0]) for f in frames] == [0, 1, 2, 0]
    assert all(f["t_ns"].is_monotonic_increasing and f["gpu"].nunique() == 1 for f in frames)
    assert sum(len(f) for f in frames) == 31


def test_a_crash_before_the_listing_leaves_samples_in_sqlite(tmp_path):
    _write_small_run(tmp_path, "hostA", 4)
    # the side file was written but the transaction that lists it never ran
    from gpuprof import columnar

    columnar.write(tmp_path / "hostA.gpu.parquet", "gpu", store.load_run(tmp_path).gpu)
    run = store.load_run(tmp_path)
    assert len(run.gpu) == 4  # the unlisted file is ignored: no duplicates


def test_a_listed_side_file_that_is_missing_or_damaged_is_one_clear_error(tmp_path):
    _write_small_run(tmp_path, "hostA", 4)
    store.compact_run(tmp_path)
    side = tmp_path / "hostA.gpu.parquet"
    side.write_bytes(b"PAR1 not really")
    with pytest.raises(store.RunError, match="hostA"):
        store.load_run(tmp_path)
    side.unlink()
    with pytest.raises(store.RunError, match="missing"):
        store.load_run(tmp_path)
    result = run_gpuprof("analyze", str(tmp_path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_compaction_keeps_nanosecond_timestamps(tmp_path):
    t = 1_767_225_600_026_401_323  # not representable in float64
    writer = store.BufferedWriter(store.host_file(tmp_path, "h"))
    writer.add_records("gpu", [GpuSample("h", 0, None, t + i, util_gpu_pct=1.0) for i in range(3)])
    writer.add_records("spans", [Span("h", 1, 1, None, None, "rollout", "r", 0, 0, t, t + 1)])
    writer.close()
    store.compact_run(tmp_path)
    run = store.load_run(tmp_path)
    assert run.gpu["t_ns"].tolist() == [t, t + 1, t + 2]
    assert (run.spans["start_ns"].iloc[0], run.spans["end_ns"].iloc[0]) == (t, t + 1)


def _chunked_run(run_dir, host="nodeR"):
    """A node file as the Ray recorder writes it: rows in Arrow chunks, plus one plain row."""
    from gpuprof import columnar

    writer = store.BufferedWriter(store.host_file(run_dir, host))
    writer.set_meta("run", RunMeta(run_id="r1", hosts=[host], start_ns=1, end_ns=10**9).to_dict())
    for part in range(3):  # three pulls of two GPUs
        rows = [(host, g, f"GPU-{g}", 10**18 + 100 * part + i, 10.0 * g + i) + (None,) * 15
                for g in range(2) for i in range(4)]  # fmt: skip
        writer.add_chunk("gpu", len(rows), columnar.encode_chunk("gpu", rows))
    span = Span(host, 7, 7, 3, 0, "rollout", "gen", 2, 0, 10**18, 10**18 + 5, attrs={"k": 1})
    writer.add_records("spans", [span])
    writer.add_chunk("spans", 1, columnar.encode_chunk("spans", [store._ROW_OF["spans"](span)]))
    writer.close()


def test_rows_shipped_as_arrow_chunks_load_count_stream_and_compact(tmp_path):
    _chunked_run(tmp_path)
    run = store.load_run(tmp_path)
    assert len(run.gpu) == 24 and set(run.gpu["gpu"]) == {0, 1}
    assert run.gpu["t_ns"].dtype == "int64" and run.gpu["mem_used_bytes"].isna().all()
    assert len(run.spans) == 2 and all(a == {"k": 1} for a in run.spans["attrs"])
    assert store.count_rows(tmp_path, "gpu") == 24 and store.count_rows(tmp_path, "spans") == 2
    assert sorted(store.gpu_keys(tmp_path)["gpu"]) == [0, 1]
    streamed = list(store.iter_gpu_samples(tmp_path))
    assert [len(f) for f in streamed] == [12, 12] and all(f["t_ns"].is_monotonic_increasing
                                                          for f in streamed)  # fmt: skip
    before = run.gpu.sort_values(["gpu", "t_ns"], ignore_index=True)
    store.compact_run(tmp_path)
    conn = sqlite3.connect(tmp_path / "nodeR.sqlite")
    assert conn.execute("SELECT count(*) FROM chunks").fetchone()[0] == 0  # moved, not copied
    conn.close()
    after = store.load_run(tmp_path)
    assert len(after.spans) == 2
    pd_after = after.gpu.sort_values(["gpu", "t_ns"], ignore_index=True)
    # read from chunks or from the side file: the same frame, every column, every dtype
    assert pd_after.dtypes.equals(before.dtypes)
    assert pd_after.equals(before)
    spans_before = run.spans.sort_values("start_ns", ignore_index=True)
    spans_after = after.spans.sort_values("start_ns", ignore_index=True)
    assert spans_after.dtypes.equals(spans_before.dtypes) and spans_after.equals(spans_before)


def test_a_schema_1_file_without_chunks_still_loads(tmp_path):
    _write_small_run(tmp_path)
    conn = sqlite3.connect(tmp_path / "hostA.sqlite")
    conn.execute("DROP TABLE chunks")
    conn.execute("PRAGMA user_version=1")
    conn.commit()
    conn.close()
    assert len(store.load_run(tmp_path).gpu) == 5
    assert store.count_rows(tmp_path, "gpu") == 5
    store.compact_run(tmp_path)
    assert len(store.load_run(tmp_path).gpu) == 5


def test_a_damaged_chunk_is_one_clear_error(tmp_path):
    _chunked_run(tmp_path)
    conn = sqlite3.connect(tmp_path / "nodeR.sqlite")
    conn.execute("INSERT INTO chunks (tbl, n, data) VALUES ('gpu', 3, x'00ff00ff')")
    conn.commit()
    conn.close()
    with pytest.raises(store.RunError, match=r"nodeR\.sqlite: damaged data"):
        store.load_run(tmp_path)
    proc = run_gpuprof("analyze", str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_compact_command_moves_every_node_file_at_once_and_can_repeat(tmp_path):
    # a Ray run whose driver was killed: node files still holding their chunks
    for host in ("nodeA", "nodeB", "nodeC"):
        _chunked_run(tmp_path, host)
    before = store.load_run(tmp_path)
    proc = run_gpuprof("compact", str(tmp_path), "--jobs", "2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("s") and ": 3 run files, 6 tables moved" in proc.stdout
    for host in ("nodeA", "nodeB", "nodeC"):
        conn = sqlite3.connect(tmp_path / f"{host}.sqlite")
        assert conn.execute("SELECT count(*) FROM chunks").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM spans").fetchone() == (0,)
        conn.close()
        assert (tmp_path / f"{host}.gpu.parquet").exists()
    after = store.load_run(tmp_path)
    key = ["host", "gpu", "t_ns"]
    assert after.gpu.sort_values(key, ignore_index=True).equals(
        before.gpu.sort_values(key, ignore_index=True)
    )
    assert len(after.spans) == len(before.spans) == 6
    again = run_gpuprof("compact", str(tmp_path))  # nothing left to move: the same run
    assert again.returncode == 0 and ": 3 run files, 0 tables moved" in again.stdout
    assert len(store.load_run(tmp_path).gpu) == len(before.gpu)


@pytest.mark.parametrize("case", ["missing", "damaged"])
def test_compact_command_bad_input_is_one_line(tmp_path, case):
    target = tmp_path / "run"
    if case == "damaged":
        target.mkdir()
        (target / "nodeA.sqlite").write_bytes(b"not a database at all" * 100)
    proc = run_gpuprof("compact", str(target))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("gpuprof: error: ")


def test_recorded_nodes_are_the_ray_recorders_files_of_this_run(tmp_path):
    def node_file(host, **meta):
        writer = store.BufferedWriter(store.host_file(tmp_path, host))
        writer.set_meta("run", RunMeta(run_id=meta.pop("run_id", "r1"), hosts=[host],
                                       **meta).to_dict())  # fmt: skip
        writer.close()

    node_file("head")  # the watcher's own
    node_file("n1", reference_node="head")
    node_file("n2", reference_node="head")
    node_file("n3", reference_node="other-head")  # another watcher's Ray run
    node_file("n4", reference_node="head", run_id="r0")  # an earlier run in the directory
    (tmp_path / "junk.sqlite").write_bytes(b"garbage")
    names = [p.name for p in store.recorded_nodes(tmp_path, "r1", "head")]
    assert names == ["n1.sqlite", "n2.sqlite"]
