"""nvidia-smi / dmon / DCGM variants as users have them: their own CSV headers, header-less
captures, pasted dmon blocks, MIG scrapes.

Real captures from public pages live in ``tests/fixtures_public`` (origins in its README); the
expected figures are computed from those files with the csv module or a regular expression,
not copied from the importer's output.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from conftest import run_gpuprof

from gpuprof.collectors.importers import (
    ImportFormatError,
    dcgm,
    detect,
    nvidia_smi,
    nvidia_smi_dmon,
    read_head,
    smi_columns,
)

MIB = 2**20
PUBLIC = Path(__file__).parent / "fixtures_public"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# Headers written by users' own scripts


def test_custom_header_of_the_issue_maps_by_meaning(tmp_path):
    text = (
        "timestamp,gpu_index,temperature_C,utilization_gpu_pct,memory_used_MiB,power_W,"
        "power_limit_W,host_note\n"
        "2024-05-01T12:00:00Z,0,61,97,70000,690.5,700,a\n"
        "2024-05-01T12:00:00Z,1,45,12,1024,120.0,700,b\n"
        "2024-05-01T12:00:05Z,0,62,98,70010,699.0,700,c\n"
    )
    path = write(tmp_path, "mine.csv", text)
    assert detect(path) is nvidia_smi
    part = nvidia_smi.parse(path)
    g = part.frames["gpu"]
    zero = g[g["gpu"] == 0]
    assert zero["util_gpu_pct"].tolist() == [97, 98]
    assert zero["temp_c"].tolist() == [61, 62]
    assert zero["mem_used_bytes"].tolist() == [70000 * MIB, 70010 * MIB]
    assert zero["power_w"].tolist() == [690.5, 699.0]
    assert int(zero["t_ns"].iloc[1] - zero["t_ns"].iloc[0]) == 5 * 10**9
    assert zero["t_ns"].iloc[0] == 1714564800 * 10**9  # ISO with Z: UTC, no zone note
    assert [x["power_limit_w"] for x in part.meta["gpus"]] == [700.0, 700.0]
    assert any("host_note" in n and "not imported" in n for n in part.notes)


@pytest.mark.parametrize(
    ("header", "field"),
    [
        ("util_pct", "utilization.gpu"),
        ("gpu_util", "utilization.gpu"),
        ("GPU Utilization (%)", "utilization.gpu"),
        ("mem_used_mb", "memory.used"),
        ("Memory Used [MiB]", "memory.used"),
        ("gpu_id", "index"),
        ("temp_c", "temperature.gpu"),
        ("Power Draw (W)", "power.draw"),
        ("sm_clock_MHz", "clocks.sm"),
        ("enforced.power.limit", "power.limit"),
    ],
)
def test_header_spellings(header, field):
    assert smi_columns.column(header).field == field


def test_a_unit_that_contradicts_the_name_leaves_the_column_unknown():
    col = smi_columns.column("memory_used_pct")  # used/total in %: not memory.used
    assert col.field is None and col.unit == "%"


def test_training_csvs_are_not_taken_for_gpu_logs(tmp_path):
    for text in (
        "step,loss,reward,gpu_util\n1,0.5,0.1,90\n",
        "timestamp,index,name,loss\n1,0,a,2\n",
    ):
        path = write(tmp_path, "train.csv", text)
        assert not nvidia_smi.sniff(read_head(path), path)


def test_epoch_milliseconds_and_mb_in_a_custom_header(tmp_path):
    text = "ts_ms,gpu,util,mem_used_mb\n1714560000123,0,5,100\n1714560001123,0,6,200\n"
    g = nvidia_smi.parse(write(tmp_path, "e.csv", text)).frames["gpu"]
    assert g["t_ns"].tolist() == [1714560000123 * 10**6, 1714560001123 * 10**6]
    assert g["mem_used_bytes"].tolist() == [100 * MIB, 200 * MIB]


# ---------------------------------------------------------------------------------------------
# Header-less captures

_ROW = re.compile(r"^(\d+), (P\d+), (\d+) %, (\d+) MiB, ([\d.]+) W")


def _rows(path: Path) -> list[tuple[int, str, float, float, float]]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        m = _ROW.match(line)
        if m:
            out.append((int(m[1]), m[2], float(m[3]), float(m[4]), float(m[5])))
    return out


@pytest.mark.parametrize("name", ["phantom_noheader_node1.csv", "phantom_noheader_node3.csv"])
def test_public_noheader_captures(name):
    path = PUBLIC / name
    assert detect(path) is nvidia_smi
    part = nvidia_smi.parse(path)
    g = part.frames["gpu"].sort_values("gpu")
    rows = _rows(path)
    assert g["gpu"].tolist() == [r[0] for r in rows]
    assert g["util_gpu_pct"].tolist() == [r[2] for r in rows]
    assert g["mem_used_bytes"].tolist() == [r[3] * MIB for r in rows]
    assert g["power_w"].tolist() == [r[4] for r in rows]
    annotated = sum("#" in ln and _ROW.match(ln) is not None for ln in path.read_text().split("\n"))
    assert f"{annotated} line(s) with a comment after the values: comment ignored" in part.notes
    if "node3" in name:  # the pasted command names the columns
        assert any("pasted --query-gpu list (line 2)" in n for n in part.notes)
    else:
        inferred = next(n for n in part.notes if n.startswith("no header"))
        for field in ("index", "pstate", "utilization.gpu", "memory.used", "power.draw"):
            assert field in inferred


def test_noheader_with_units_infers_limit_and_total(tmp_path):
    text = (
        "2024/05/01 10:00:00.000, 0, GPU-aa, NVIDIA H100 80GB HBM3, 97 %, 40 %, 70000 MiB, "
        "81559 MiB, 690.12 W, 700.00 W, 1755 MHz, 65\n"
        "2024/05/01 10:00:00.000, 1, GPU-bb, NVIDIA H100 80GB HBM3, 95 %, 41 %, 69000 MiB, "
        "81559 MiB, 540.00 W, 700.00 W, 1980 MHz, 60\n"
    )
    part = nvidia_smi.parse(write(tmp_path, "n.csv", text))
    g = part.frames["gpu"]
    assert g["util_gpu_pct"].tolist() == [97, 95] and g["util_mem_pct"].tolist() == [40, 41]
    assert g["mem_used_bytes"].tolist() == [70000 * MIB, 69000 * MIB]
    assert g["mem_total_bytes"].tolist() == [81559 * MIB] * 2
    assert g["power_w"].tolist() == [690.12, 540.0] and g["temp_c"].tolist() == [65, 60]
    assert g["sm_clock_mhz"].tolist() == [1755, 1980]
    assert part.meta["gpus"][0]["power_limit_w"] == 700.0
    assert part.meta["gpus"][1]["uuid"] == "GPU-bb"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("0, NVIDIA GeForce RTX 3060, 0, 12288, 0, 42\n", "small whole numbers"),
        ("0, NVIDIA GeForce RTX 3060, 20.5, 12288.0, 42\n", "numbers without units"),
        ("0, 10 MHz, 20 MHz\n", "MHz columns"),
        ("0, 5 %, 7 %, 9 %\n", "% columns"),
        ("0, 5 %, 9 %\n0, 9 %, 5 %\n", "neither always the larger"),
    ],
)
def test_ambiguous_noheader_asks_for_fields(tmp_path, text, why):
    path = write(tmp_path, "a.csv", text)
    with pytest.raises(ImportFormatError, match=rf"a\.csv:1: no header line.*{why}.*--fields"):
        nvidia_smi.parse(path)


def test_fields_name_the_columns(tmp_path):
    text = (
        "0, NVIDIA GeForce RTX 3060, 0, 12288, 0, 42\n"
        "1, NVIDIA RTX 5060 Ti, 15868, 16311, 100, 67\n"
    )
    path = write(tmp_path, "a.csv", text)
    fields = "index,name,memory.used,memory.total,utilization.gpu,temp_c"  # an alias too
    part = nvidia_smi.parse(path, fields=fields)
    g = part.frames["gpu"]
    assert g["mem_used_bytes"].tolist() == [0, 15868 * MIB]
    assert g["util_gpu_pct"].tolist() == [0, 100] and g["temp_c"].tolist() == [42, 67]
    assert part.meta["gpus"][1]["name"] == "NVIDIA RTX 5060 Ti"
    with pytest.raises(ImportFormatError, match="names no columns"):
        nvidia_smi.parse(path, fields=" , ")


def test_cli_noheader_exits_2_with_one_line_then_imports_with_fields(tmp_path):
    src = write(tmp_path, "g.csv", "0, NVIDIA GeForce RTX 3060, 0, 12288, 0, 42\n")
    out = tmp_path / "run"
    bad = run_gpuprof("import", str(src), "-o", str(out))
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1 and "--fields" in bad.stderr
    assert "Traceback" not in bad.stderr and not out.exists()
    assert not list(tmp_path.glob(".run.importing-*"))  # nothing half-written
    ok = run_gpuprof(
        "import", str(src), "-o", str(out), "--fields",
        "index,name,memory.used,memory.total,utilization.gpu,temperature.gpu",
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "1 GPU samples" in ok.stderr and out.is_dir() and any(out.iterdir())


def test_public_lms_capture_with_pstate():
    path = PUBLIC / "smi_lms_pstate.csv"
    part = nvidia_smi.parse(path)
    g = part.frames["gpu"]
    lines = path.read_text().splitlines()[1:]
    used = [float(ln.split(", ")[7].split()[0]) * MIB for ln in lines]
    assert g["mem_used_bytes"].tolist() == used
    assert g["temp_c"].tolist() == [float(ln.split(", ")[2]) for ln in lines]
    # 4 ms apart: the -lms rate, read from the millisecond timestamps
    assert part.meta["interval_s"] == pytest.approx(0.0045, abs=0.001)
    assert "fields not imported: pstate" in part.notes


# ---------------------------------------------------------------------------------------------
# dmon


def _dmon_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    header: list[str] = []
    rows = []
    for line in path.read_text().splitlines():
        if line.startswith("#") and not header:
            header = line.lstrip("#").lower().split()
        elif line.strip() and not line.startswith("#"):
            rows.append(line.split())
    return header, rows


def test_public_dmon_default_and_phantom_gpu():
    path = PUBLIC / "phantom_dmon_node1.txt"
    assert detect(path) is nvidia_smi_dmon
    part = nvidia_smi_dmon.parse(path)
    g = part.frames["gpu"].set_index("gpu")
    header, rows = _dmon_rows(path)
    for row in rows:
        gpu = int(row[header.index("gpu")])
        assert g.loc[gpu, "util_gpu_pct"] == float(row[header.index("sm")])
        assert g.loc[gpu, "util_mem_pct"] == float(row[header.index("mem")])
        assert g.loc[gpu, "power_w"] == float(row[header.index("pwr")])
        assert g.loc[gpu, "sm_clock_mhz"] == float(row[header.index("pclk")])
    assert not part.anchored


def test_public_dmon_mutc_with_date_time_and_a_blank_line():
    path = PUBLIC / "dmon_mutc_TD.txt"
    part = nvidia_smi_dmon.parse(path)
    g = part.frames["gpu"]
    header, rows = _dmon_rows(path)
    assert len(g) == len(rows) and part.anchored
    assert g["mem_used_bytes"].tolist() == [float(r[header.index("fb")]) * MIB for r in rows]
    assert g["pcie_rx_bytes_s"].tolist() == [float(r[header.index("rxpci")]) * 1e6 for r in rows]
    assert (np.diff(g["t_ns"]) == 10**9).all()
    assert any("bar1" in n and "not imported" in n for n in part.notes)


def test_dmon_selection_changed_halfway_and_violations(tmp_path):
    text = (
        "#Date       Time        gpu    pwr  gtemp     sm    mem\n"
        "#YYYYMMDD   HH:MM:SS    Idx      W      C      %      %\n"
        " 20240501   10:00:00      0    300     60     90     40\n"
        "#Date       Time        gpu    pwr  gtemp  pviol  tviol\n"
        "#YYYYMMDD   HH:MM:SS    Idx      W      C      %      %\n"
        " 2024/05/01 10:00:01      0    700     61     35      0\n"
        " 2024-05-01 10:00:02      0    700     88      0     12\n"
    )
    part = nvidia_smi_dmon.parse(write(tmp_path, "d.txt", text))
    g = part.frames["gpu"]
    assert g["power_w"].tolist() == [300, 700, 700]
    assert g["util_gpu_pct"].isna().tolist() == [False, True, True]
    assert g["clock_event_reasons"].isna().tolist() == [True, False, False]
    assert g["clock_event_reasons"].tolist()[1:] == [0x4, 0x20]
    assert any("columns changed halfway" in n for n in part.notes)


# ---------------------------------------------------------------------------------------------
# DCGM with MIG

_SAMPLE = re.compile(r"^(DCGM_\w+)\{([^}]*)\} (\S+)$")


def _labelled(path: Path) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in path.read_text().splitlines():
        m = _SAMPLE.match(line)
        if m:
            out.append((m[1], dict(re.findall(r'(\w+)="([^"]*)"', m[2])), float(m[3])))
    return out


@pytest.mark.parametrize("name", ["dcgm_mig_h100_excerpt.txt", "dcgm_mig_a100_excerpt.txt"])
def test_public_mig_scrapes_count_each_gpu_once(name):
    path = PUBLIC / name
    assert detect(path) is dcgm
    part = dcgm.parse(path)
    samples = _labelled(path)
    g = part.frames["gpu"]
    physical = {int(lab["gpu"]) for _, lab, _ in samples}
    assert sorted(g["gpu"]) == sorted(physical)  # one row per physical GPU, not per instance
    instances = [lab for _, lab, _ in samples]
    assert part.meta["gpus"][0]["mig_instances"] == len({lab["GPU_I_ID"] for lab in instances})
    # utilization: each 1g instance is 1/7 of the GPU (A100/H100), its activity weighted so
    expected = sum(v * 100 / 7 for _, _, v in samples)
    assert g["util_gpu_pct"].iloc[0] == pytest.approx(expected)
    assert any("MIG mode" in n for n in part.notes)


def test_public_a30_mig_memory_is_summed_per_gpu():
    part = dcgm.parse(PUBLIC / "dcgm_mig_a30_fb_free_excerpt.txt")
    counts = {g["index"]: g["mig_instances"] for g in part.meta["gpus"]}
    assert counts == {0: 4, 1: 2}  # the cut last line is not an instance
    assert len(part.frames["gpu"]) == 2


def test_mig_board_readings_taken_once_memory_summed_whole_gpu_preferred(tmp_path):
    base = 'gpu="0",UUID="GPU-x",modelName="NVIDIA A100-SXM4-80GB",Hostname="n1"'
    lines = []
    for inst, prof, act, used in (("1", "3g.40gb", 0.5, 30000), ("2", "4g.40gb", 0.25, 10000)):
        lab = f'{base},GPU_I_PROFILE="{prof}",GPU_I_ID="{inst}"'
        lines += [
            f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{lab}}} {act}",
            f"DCGM_FI_DEV_FB_USED{{{lab}}} {used}",
            f"DCGM_FI_DEV_POWER_USAGE{{{lab}}} 250.5",
            f"DCGM_FI_DEV_GPU_TEMP{{{lab}}} 61",
        ]
    lines.append(f"DCGM_FI_DEV_POWER_USAGE{{{base}}} 251.0")  # a whole-GPU reading wins
    part = dcgm.parse(write(tmp_path, "mig.txt", "\n".join(lines) + "\n"))
    g = part.frames["gpu"].iloc[0]
    assert len(part.frames["gpu"]) == 1
    assert g["util_gpu_pct"] == pytest.approx(100 * (0.5 * 3 / 7 + 0.25 * 4 / 7))
    assert g["mem_used_bytes"] == (30000 + 10000) * MIB  # partitioned: summed
    assert g["temp_c"] == 61  # the board's: once, not 122
    assert g["power_w"] == 251.0
    assert part.meta["gpus"][0]["mig_profiles"] == ["3g.40gb", "4g.40gb"]


def test_mixed_gpus_without_an_index_are_told_apart_by_name():
    # bpytop issue #26: a desktop's GTX 1080 Ti and GTX 1060 in a pasted query, no index column
    from pathlib import Path

    from gpuprof.importing import parse_file

    path = Path(__file__).parent / "labelled" / "public" / "nvidia_smi_bpytop_issue26_query_csv.txt"
    imported = parse_file(path)
    names = {g["name"] for g in imported.meta["gpus"]}
    assert len(imported.meta["gpus"]) == 2 and any("1080" in n for n in names)
    assert any("told apart by their names" in n for n in imported.notes)
