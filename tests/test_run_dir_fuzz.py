"""A damaged or hand-edited run directory never makes a command end in a traceback.

Random metadata values (valid JSON of any shape), truncated or foreign Parquet side files and
mis-typed tables go through ``summary``, ``analyze``, ``report``, ``export``, ``compare`` and
``merge``;
each ends with exit 0 or with exit 2 and one line naming the file.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gpuprof import api, loader
from gpuprof.cli import app

COMMANDS = (
    ["summary"],
    ["analyze", "--json"],
    ["report", "-o", "{out}/r.html"],
    ["export", "--format", "perfetto", "-o", "{out}/t.json"],
    ["export", "--format", "parquet", "-o", "{out}/pq"],
)
META_KEYS = ("run_id", "command", "hosts", "gpus", "knobs", "start_ns", "end_ns", "exit_code",
             "interval_s", "notices", "framework", "cuda_driver_version", "stopped")  # fmt: skip
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fuzz") / "run"
    api.demo(out, scenario="reward_bound", gpus=2, duration_s=20.0)
    return out


def _digest(run: Path) -> str:
    """The contents of every file under ``run``, with their names, as one digest."""
    h = hashlib.sha256()
    for path in sorted(p for p in run.rglob("*") if p.is_file()):
        h.update(f"{path.relative_to(run)}\0{path.stat().st_size}\0".encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _files(run: Path) -> tuple[Path, list[Path]]:
    db = next(p for p in run.glob("*.sqlite"))
    return db, sorted(run.glob("*.parquet"))


def _run_all(run: Path, out: Path, base: Path, *, readable: bool = False) -> None:
    """Every command on ``run``: exit 0, or (unless ``readable``) exit 2 with one line."""
    runner = CliRunner()
    # compare reads two runs: the damaged one on either side of a good one
    compares = (
        ["compare", str(base), str(run)],
        ["compare", str(run), str(base), "--json"],
        ["merge", str(run), "-o", "{out}/merged"],
    )
    for command in (*COMMANDS, *compares):
        args = [c.replace("{out}", str(out)) for c in command]
        argv = args if args[0] in ("compare", "merge") else [args[0], str(run), *args[1:]]
        result = runner.invoke(app, argv, catch_exceptions=True)
        text = result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            command, repr(result.exception), text[-500:],
        )  # fmt: skip
        assert "Traceback" not in text, (command, text[-800:])
        assert result.exit_code in ((0,) if readable else (0, 2)), (
            command, result.exit_code, text[-500:],
        )  # fmt: skip
        if result.exit_code == 2:
            assert text.strip().count("\n") == 0 and "gpuprof" in text, (command, text)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(key=st.sampled_from((*META_KEYS, None)), value=JSON_VALUES)
def test_any_metadata_value(base_run, tmp_path_factory, key, value):
    """One field of the stored metadata (or, for ``None``, all of it) replaced by any JSON."""
    run = tmp_path_factory.mktemp("m") / "run"
    shutil.copytree(base_run, run)
    _set_meta(run, key, value)
    out = run.parent / "out"
    out.mkdir()
    _run_all(run, out, base_run)


def _set_meta(run: Path, key: str | None, value) -> None:
    db, _ = _files(run)
    with sqlite3.connect(db) as conn:
        (text,) = conn.execute("SELECT value FROM meta WHERE key = 'run'").fetchone()
        meta = json.loads(text)
        if key is None:
            meta = value
        else:
            meta[key] = value
        conn.execute("UPDATE meta SET value = ? WHERE key = 'run'", (json.dumps(meta),))


_DAMAGED_RUNS_CHECKED: set[str] = set()
"""`_digest`s of the damaged runs every command has gone through in this process: ``cut`` is
not read by the foreign and mistyped damages, and the side files are fewer than ``which``'s
values, so many examples damage the run exactly as one before did. Such an example asks the
same of the same files: it ends there."""


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    which=st.integers(0, 10),
    cut=st.floats(0.0, 0.95),
    damage=st.sampled_from(("foreign", "mistyped", "cut")),
)
def test_damaged_or_foreign_side_files(base_run, tmp_path_factory, which, cut, damage):
    run = tmp_path_factory.mktemp("p") / "run"
    shutil.copytree(base_run, run)
    _, sides = _files(run)
    target = sides[which % len(sides)]
    if damage == "foreign":  # a Parquet file of another shape under the same name
        pq.write_table(pa.table({"x": [1, 2, 3], "host": ["a", "b", "c"]}), target)
    elif damage == "mistyped":  # the right columns, every one of them text
        table = pq.read_table(target)
        pq.write_table(table.cast(pa.schema([(f.name, pa.string()) for f in table.schema])),
                       target)  # fmt: skip
    else:  # cut short, as a full disk or a copy interrupted leaves it
        data = target.read_bytes()
        target.write_bytes(data[: int(len(data) * cut)])
    digest = _digest(run)
    if digest in _DAMAGED_RUNS_CHECKED:
        return
    out = run.parent / "out"
    out.mkdir()
    _run_all(run, out, base_run)
    _DAMAGED_RUNS_CHECKED.add(digest)


def test_wrong_typed_meta_is_one_line_naming_the_run(base_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(base_run, run)
    _set_meta(run, "hosts", 5)
    result = CliRunner().invoke(app, ["analyze", str(run)])
    assert result.exit_code == 2
    assert "bad run metadata" in result.output and "hosts" in result.output


SCALARS = (
    st.none()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats()
    | st.text(max_size=6)
    | st.binary(max_size=4)
)


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(table=st.sampled_from(("gpu", "host", "spans", "events", "procs")), data=st.data())
def test_mistyped_rows_in_the_sqlite_tables(base_run, tmp_path_factory, table, data):
    """Rows of any type in a table's columns (SQLite stores what it is given): a watcher
    killed before compaction, or another tool writing the file, leaves rows the loader reads."""
    run = tmp_path_factory.mktemp("s") / "run"
    shutil.copytree(base_run, run)
    db, _ = _files(run)
    with sqlite3.connect(db) as conn:
        columns = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
        values = [data.draw(SCALARS) for _ in columns]
        marks = ", ".join("?" for _ in columns)
        conn.execute(f"INSERT INTO {table} VALUES ({marks})", values)
    out = run.parent / "out"
    out.mkdir()
    # one stray row must not cost the run: it is read, typed or dropped
    _run_all(run, out, base_run, readable=True)


def test_a_gpu_index_no_device_has_is_dropped_not_overflowed(base_run, tmp_path):
    """Found by the test above: a row whose GPU index is 2**63 - 1 overflowed the report's
    per-GPU keys (an IndexError out of ``report``); such a row is no device's and is dropped."""
    run = tmp_path / "run"
    shutil.copytree(base_run, run)
    db, _ = _files(run)
    with sqlite3.connect(db) as conn:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(gpu)")]
        row = {"host": "x", "gpu": 2**63 - 1, "t_ns": 330, "util_gpu_pct": 50.0}
        conn.execute(f"INSERT INTO gpu VALUES ({', '.join('?' for _ in columns)})",
                     [row.get(c) for c in columns])  # fmt: skip
    out = tmp_path / "out"
    out.mkdir()
    _run_all(run, out, base_run, readable=True)
    assert "x" not in set(loader.load_for_analysis(run).gpu["host"])
