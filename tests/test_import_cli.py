"""`gpuprof import`: merging parts of several files into one run, and the command itself.

The merge is tested on parts built as importers build them (GPU samples from a metrics log,
spans from a framework log with or without wall-clock times); the command is run as a user runs
it, on files written the way the tools write them and on the real files in ``../shared``, and
the imported run then goes through ``analyze``, ``report`` and ``compare``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import SHARED_FIXTURES, run_gpuprof

from gpuprof import api, store
from gpuprof.collectors.importers import Imported, ImportFormatError
from gpuprof.importing import import_files, merge
from gpuprof.model import Span, columns

T0 = 1_714_521_600_000_000_000  # 2024-05-01 00:00:00 UTC, in ns
S = 1_000_000_000

SMI = (
    "timestamp, index, uuid, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB]\n"
    + "".join(
        f"{T0 // S + t}, {g}, GPU-{g}, NVIDIA A100, {u} %, 1000 MiB, 40960 MiB\n"
        for t in range(60)
        for g, u in ((0, 95 if t % 20 < 12 else 2), (1, 90 if t % 20 < 12 else 3))
    )
)
"""Two GPUs over a minute, busy 12 s of every 20 s (Unix-epoch timestamps)."""


def gpu_part(name: str, host: str, gpus=(0, 1), anchored: bool = True) -> Imported:
    rows = [
        {"host": host, "gpu": g, "uuid": f"GPU-{g}", "t_ns": T0 * anchored + t * S,
         "util_gpu_pct": 50.0}
        for t in range(10)
        for g in gpus
    ]  # fmt: skip
    return Imported(
        source=Path(name),
        format="test-gpu",
        frames={"gpu": pd.DataFrame(rows)},
        meta={"gpus": [{"host": host, "index": g} for g in gpus]},
        anchored=anchored,
        notes=["a note"],
    )


def span_part(name: str, anchored: bool, framework: str | None = "verl") -> Imported:
    t0 = T0 + 3 * S if anchored else 0
    spans = [
        Span("(log)", 0, 0, None, None, phase, phase, 1, 1, t0 + a * S, t0 + b * S)
        for phase, a, b in (("rollout", 0, 4), ("update_actor", 4, 6))
    ]
    frame = pd.DataFrame([[getattr(s, c) for c in columns(Span)] for s in spans],
                         columns=columns(Span))  # fmt: skip
    meta = {"framework": framework, "knobs": {"trainer.n_gpus_per_node": 2}} if framework else {}
    return Imported(Path(name), "test-log", {"spans": frame}, meta, anchored, [])


# ---------------------------------------------------------------------------------------------
# merge


def test_unanchored_spans_start_with_the_anchored_samples():
    run = merge([gpu_part("smi.csv", "smi"), span_part("verl.log", False)], "r", ["gpuprof"])
    assert run.spans["start_ns"].tolist() == [T0, T0 + 4 * S]
    assert run.spans["end_ns"].tolist() == [T0 + 4 * S, T0 + 6 * S]
    assert run.spans["start_ns"].dtype == np.int64
    assert (run.meta.start_ns, run.meta.end_ns) == (T0, T0 + 9 * S)
    assert any("verl.log" in n and "approximate" in n for n in run.meta.notices)
    assert "smi.csv: a note" in run.meta.notices
    # one machine: the log's stand-in host joins the GPUs' host, so phases reach the GPUs
    assert set(run.spans["host"]) == {"smi"} and run.meta.hosts == ["smi"]
    assert run.meta.framework == "verl" and run.meta.knobs == {"trainer.n_gpus_per_node": 2}
    assert [g["index"] for g in run.meta.gpus] == [0, 1]


def test_anchored_spans_keep_their_times_and_nothing_anchored_stays_at_zero():
    run = merge([gpu_part("smi.csv", "smi"), span_part("v.log", True)], "r", [])
    assert run.spans["start_ns"].tolist() == [T0 + 3 * S, T0 + 7 * S]
    alone = merge([span_part("v.log", False)], "r", [])
    assert alone.spans["start_ns"].tolist() == [0, 4 * S]
    assert any("times count from the start" in n for n in alone.meta.notices)
    # two unanchored parts both land on the anchored start
    both = merge([gpu_part("dmon.txt", "d", anchored=False), span_part("v.log", False)], "r", [])
    assert both.gpu["t_ns"].min() == 0 and both.spans["start_ns"].min() == 0


def test_files_of_different_machines_keep_their_hosts():
    # the same GPU index in two GPU logs: two machines, not one
    run = merge([gpu_part("a.csv", "a"), gpu_part("b.csv", "b"), span_part("v.log", True)], "r", [])
    assert sorted(run.gpu["host"].unique()) == ["a", "b"]
    assert set(run.spans["host"]) == {"(log)"}
    assert len(run.meta.gpus) == 4
    # a host named by a file wins over file-name stand-ins
    told = gpu_part("dcgm.txt", "node3", gpus=(2,))
    told.meta["hosts"] = ["node3"]
    run = merge([gpu_part("a.csv", "a"), told], "r", [])
    assert set(run.gpu["host"]) == {"node3"}


def test_merged_run_saves_and_loads_with_exact_times(tmp_path):
    run = merge([gpu_part("smi.csv", "smi"), span_part("verl.log", False)], "r", ["gpuprof"])
    store.save_run(run, tmp_path / "run")
    back = store.load_run(tmp_path / "run")
    assert back.gpu["t_ns"].tolist() == run.gpu["t_ns"].tolist()
    assert back.spans["start_ns"].tolist() == run.spans["start_ns"].tolist()
    assert back.meta.framework == "verl"


# ---------------------------------------------------------------------------------------------
# import_files: errors leave nothing behind


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def test_bad_second_file_writes_nothing(tmp_path):
    good = tmp_path / "smi.csv"
    good.write_text(SMI)
    bad = tmp_path / "bad.csv"
    # nothing usable: the one value is no number (one bad value among good ones is skipped)
    bad.write_text("timestamp, utilization.gpu [%]\n1714521601, oops\n")
    out = tmp_path / "run"
    with pytest.raises(ImportFormatError, match=r"bad\.csv: no usable samples.*line 2"):
        import_files([good, bad], out)
    assert not out.exists() and not _leftovers(tmp_path)


def test_failure_while_writing_leaves_nothing(tmp_path, monkeypatch):
    good = tmp_path / "smi.csv"
    good.write_text(SMI)

    def broken(run, run_dir):
        (Path(run_dir) / "half.sqlite").write_bytes(b"x")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "save_run", broken)
    with pytest.raises(ImportFormatError, match="No space left"):
        import_files([good], tmp_path / "run")
    assert not (tmp_path / "run").exists() and not _leftovers(tmp_path)


def test_empty_output_directory_is_used(tmp_path):
    good = tmp_path / "smi.csv"
    good.write_text(SMI)
    (tmp_path / "run").mkdir()
    assert import_files([good, good], tmp_path / "run") == tmp_path / "run"
    run = api.load_for_analysis(tmp_path / "run")
    assert len(run.gpu) == 120  # the file named twice is imported once
    assert run.meta.command == ["gpuprof", "import", "smi.csv", "smi.csv"]
    assert run.meta.run_id == "run"


def test_progress_advances_by_each_file_size(tmp_path):
    smi = tmp_path / "smi.csv"
    smi.write_text(SMI)
    dmon = tmp_path / "dmon.txt"
    dmon.write_text("# gpu sm\n# Idx %\n 0 5\n 0 6\n")
    done: list[int] = []
    import_files([smi, dmon], tmp_path / "run", advance=done.append)
    assert done == [smi.stat().st_size, dmon.stat().st_size]


# ---------------------------------------------------------------------------------------------
# the command


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["import", "-o", "{out}"], "no files given"),
        (["import", "{dir}/notes.txt", "-o", "{out}"], "notes.txt: format not recognised"),
        (["import", "{dir}/missing.csv", "-o", "{out}"], "missing.csv: no such file"),
        (["import", "{dir}/headerless.csv", "-o", "{out}"], "headerless.csv:1: no header line"),
        (["import", "{dir}/smi.csv", "-o", "{dir}"], "already exists and is not empty"),
        (["import", "{dir}/smi.csv"], "no run directory given"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, expected):
    (tmp_path / "notes.txt").write_text("just some words\n")
    # bare numbers: GPU index, temperature or memory? (with units it would be inferred)
    (tmp_path / "headerless.csv").write_text("2024/05/01 00:00:00.000, 0, 45, 1024\n")
    (tmp_path / "smi.csv").write_text(SMI)
    out = tmp_path / "out"
    result = run_gpuprof(*(a.format(dir=tmp_path, out=out) for a in args), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and lines[0].startswith("gpuprof: error:")
    assert "Traceback" not in result.stderr
    assert not out.exists() and not _leftovers(tmp_path)


def test_import_then_analyze_report_compare(tmp_path):
    smi = tmp_path / "node1.csv"
    smi.write_text(SMI)
    dcgm = tmp_path / "dcgm.prom"
    dcgm.write_text(
        "".join(
            f'DCGM_FI_DEV_GPU_UTIL{{gpu="{g}",UUID="GPU-9{g}",Hostname="node2"}} {u} '
            f"{(T0 // S + t) * 1000}\n"
            for t in range(30)
            for g, u in ((0, 10), (1, 20))
        )
    )
    first = run_gpuprof("import", str(smi), "-o", str(tmp_path / "a"))
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == str(tmp_path / "a")
    assert "120 GPU samples" in first.stderr
    second = run_gpuprof("import", str(smi), str(dcgm), "-o", str(tmp_path / "b"))
    assert second.returncode == 0, second.stderr

    analyzed = run_gpuprof("analyze", str(tmp_path / "b"), "--json")
    assert analyzed.returncode == 0, analyzed.stderr
    summary = json.loads(analyzed.stdout)["summary"]
    assert summary["gpus"] == 4
    # busy 12 s of each 20 s on node1 (95 %, 90 %), 10 % and 20 % on node2
    run = api.load_for_analysis(tmp_path / "b")
    assert sorted(run.meta.hosts) == ["node1", "node2"]
    node1 = run.gpu[run.gpu["host"] == "node1"]
    assert node1.groupby("gpu")["util_gpu_pct"].mean().round(6).tolist() == [
        round((95 * 36 + 2 * 24) / 60, 6),
        round((90 * 36 + 3 * 24) / 60, 6),
    ]
    assert (run.meta.start_ns, run.meta.end_ns) == (T0, T0 + 59 * S)

    report = run_gpuprof("report", str(tmp_path / "b"))
    assert report.returncode == 0, report.stderr
    html = (tmp_path / "b" / "report.html").read_text()
    assert "node2" in html and "gpuprof import" in html
    assert "not recorded (imported from files)" in html  # no exit status to report

    compared = run_gpuprof("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json")
    assert compared.returncode == 0, compared.stderr
    document = json.loads(compared.stdout)
    assert (document["before"], document["after"]) == ("a", "b")


needs_fixtures = pytest.mark.skipif(not SHARED_FIXTURES.is_dir(), reason="no shared fixtures")


@needs_fixtures
def test_real_files_import_together(tmp_path):
    files = sorted((SHARED_FIXTURES / "nvidia_smi").glob("*.csv"))
    files += sorted((SHARED_FIXTURES / "dcgm").glob("*.txt"))
    out = import_files(files, tmp_path / "run")
    run = api.load_for_analysis(out)
    # three single-GPU logs (each GPU 0 of its own machine) and a 4-GPU DCGM node
    assert sorted(run.meta.hosts) == [
        "epoch_custom_header",
        "r6i3n0",
        "repeated_header",
        "rtx4090_inference",
    ]
    assert len(run.meta.gpus) == 7
    counts = run.gpu.groupby("host").size().to_dict()
    assert counts == {
        "epoch_custom_header": 90,
        "r6i3n0": 1,
        "repeated_header": 224,
        "rtx4090_inference": 2619,
    }
    assert any("v100_node_scrape_excerpt.txt" in n and "approximate" in n for n in run.meta.notices)
    diagnosis = api.analyze(run)
    assert diagnosis.summary["gpus"] >= 4


@needs_fixtures
def test_real_framework_log_and_gpu_log_become_one_run(tmp_path):
    """Phases from a verl console log (no timestamps) land on the GPU of an nvidia-smi log."""
    log = SHARED_FIXTURES / "verl" / "gemma2b_ppo_2gpu_old_format.log"
    smi = SHARED_FIXTURES / "nvidia_smi" / "rtx4090_inference.csv"
    out = import_files([log, smi], tmp_path / "run")
    run = api.load_for_analysis(out)
    assert run.meta.framework == "verl" and run.meta.knobs
    assert run.meta.hosts == ["rtx4090_inference"]
    assert set(run.spans["host"]) == {"rtx4090_inference"}
    assert run.spans["start_ns"].min() == run.gpu["t_ns"].min() == run.meta.start_ns
    steps = run.spans[run.spans["phase"] == "step"]
    # the log's steps, laid end to end from the GPU log's first sample
    assert len(steps) == len(set(steps["step"]))
    assert (steps["start_ns"].to_numpy()[1:] == steps["end_ns"].to_numpy()[:-1]).all()
    diagnosis = api.analyze(run)
    assert diagnosis.summary["steps"] == len(steps)
    assert any("approximate" in n for n in run.meta.notices)
