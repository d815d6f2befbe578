"""The default nvidia-smi table and gpustat lines, as people paste them for a stuck GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_gpuprof

from gpuprof import api, store
from gpuprof.collectors.importers import detect, smi_display

PUBLIC = Path(__file__).parent / "labelled" / "public"

# the layout of drivers from 2022 on: wider columns, a third line per GPU, GI/CI columns
MODERN = """\
Tue Nov 25 10:00:00 2025
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
{gpus}+-----------------------------------------------------------------------------------------+
| Processes:                                                                              |
|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |
|        ID   ID                                                               Usage      |
|=========================================================================================|
{procs}+-----------------------------------------------------------------------------------------+
"""
GPU = """\
|   {i}  NVIDIA H100 80GB HBM3          On  |   00000000:{bus:02X}:00.0 Off |                    0 |
| N/A   {t}C    P0            {w}W /  700W |   {mem}MiB /  81559MiB |    {u}%      Default |
|                                         |                        |             Disabled |
"""


def _table(readings, procs="|  No running processes found                                 |\n"):
    gpus = "".join(
        GPU.format(i=i, bus=0x18 + i, t=t, w=w, mem=mem, u=u) for i, (t, w, mem, u) in
        enumerate(readings)
    )  # fmt: skip
    return MODERN.format(gpus=gpus, procs=procs)


def test_public_old_table_reads_every_gpu_with_power_limit_and_memory(tmp_path):
    path = PUBLIC / "nvidia_smi_table_jade_issue59_no_process_busy.txt"
    assert detect(path) is smi_display
    imported = smi_display.parse(path)
    gpu = imported.frames["gpu"].sort_values("gpu")
    text = path.read_text()
    # every GPU line of the paste, read with the figures printed on its reading line
    assert len(gpu) == text.count("Tesla V100-SXM2")
    first = gpu.iloc[0]
    assert (first["util_gpu_pct"], first["temp_c"], first["power_w"]) == (98.0, 66.0, 253.0)
    assert first["mem_used_bytes"] == 9000 * 2**20
    assert imported.meta["gpus"][0]["power_limit_w"] == 300.0
    assert any("one snapshot" in n for n in imported.notes)


def test_public_gpustat_line():
    path = PUBLIC / "gpustat_visedit_issue5_no_process_100pct.txt"
    assert detect(path) is smi_display
    gpu = smi_display.parse(path).frames["gpu"]
    assert gpu[["gpu", "util_gpu_pct", "temp_c"]].values.tolist() == [[6, 100.0, 52.0]]
    assert gpu["mem_used_bytes"].iloc[0] == 10151 * 2**20


def test_watch_loop_snapshots_with_processes_are_a_time_series(tmp_path):
    procs = (
        "|    0   N/A  N/A     41234      C   python                                   60210MiB |\n"
        "|    1   N/A  N/A     41235      C   python                                   60110MiB |\n"
    )
    busy = [(61, 640, 60210, 97), (63, 655, 60110, 99)]
    text = _table(busy, procs) + _table(busy, procs).replace("10:00:00", "10:00:05")
    path = tmp_path / "smi.txt"
    path.write_text(text)
    imported = smi_display.parse(path)
    gpu = imported.frames["gpu"]
    assert len(gpu) == 4 and sorted(set(gpu["t_ns"])) == [0, 5_000_000_000]
    assert any("timestamp" in n for n in imported.notes)
    procs_frame = imported.frames["gpu_procs"]
    assert sorted(set(procs_frame["pid"])) == [41234, 41235]
    assert set(procs_frame["gpu_mem_bytes"]) == {60210 * 2**20, 60110 * 2**20}


def test_stuck_gpus_in_a_pasted_table_are_named_phantom(tmp_path):
    # eight GPUs at 100% with no memory, no process and ~113 W of 700 W, five snapshots
    stuck = [(34, 113, 0, 100)] * 8
    path = tmp_path / "stuck.txt"
    path.write_text("".join(_table(stuck) for _ in range(5)))
    run_dir = tmp_path / "run"
    api.import_files([path], run_dir)
    diagnosis = api.analyze(store.load_run(run_dir))
    kinds = [f.kind for f in diagnosis.findings]
    assert kinds and kinds[0] == "phantom_util", kinds
    # the same GPUs doing work (memory held, power high) are not phantom
    path.write_text("".join(_table([(70, 650, 60000, 100)] * 8) for _ in range(5)))
    busy_dir = tmp_path / "busy"
    api.import_files([path], busy_dir)
    assert "phantom_util" not in [f.kind for f in api.analyze(store.load_run(busy_dir)).findings]


def test_one_snapshot_is_never_called_healthy_nor_judged_with_confidence(tmp_path):
    path = tmp_path / "busy.txt"
    path.write_text(_table([(70, 650, 60000, 97)]))
    run_dir = tmp_path / "run"
    assert run_gpuprof("import", str(path), "-o", str(run_dir)).returncode == 0
    out = " ".join(run_gpuprof("analyze", str(run_dir)).stdout.split())  # the text wraps
    assert "too few to rule one out" in out and "was found" not in out
    # an idle snapshot: what it shows is said, with low confidence and why
    path.write_text(_table([(40, 90, 1200, 3)]))
    idle_dir = tmp_path / "idle"
    api.import_files([path], idle_dir)
    findings = api.analyze(store.load_run(idle_dir)).findings
    assert findings and all(f.confidence <= 0.5 for f in findings)
    assert all("a snapshot rather than a record of the run" in f.summary for f in findings)


@pytest.mark.parametrize("text", ["| 0 no table here |\n", "[x] not gpustat | 1 |\n"])
def test_text_without_gpu_rows_is_not_this_format(tmp_path, text):
    path = tmp_path / "x.txt"
    path.write_text(text)
    assert not smi_display.sniff(text, path)
