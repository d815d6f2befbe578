"""Device-metric importers: nvidia-smi CSV logs, nvidia-smi dmon output, dcgm-exporter scrapes.

Each format's variants are written out as files the way the tools write them; the imported
samples are checked value by value. Real logs from ``../shared/fixtures`` are imported and
their figures checked against values computed straight from the file with the csv module or a
regular expression. Every parser is fuzzed: arbitrary text or bytes, and mutations of valid
files, end in samples or `ImportFormatError`, never another exception.
"""

from __future__ import annotations

import calendar
import csv
import re
import statistics
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED_FIXTURES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuprof.collectors.importers import (
    ImportFormatError,
    dcgm,
    detect,
    nvidia_smi,
    nvidia_smi_dmon,
    read_head,
)

MIB = 2**20
PARSERS = (nvidia_smi, nvidia_smi_dmon, dcgm)


def write(tmp_path: Path, name: str, text: str, encoding: str = "utf-8") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode(encoding))
    return path


def local_ns(text: str) -> int:
    """An nvidia-smi local timestamp as epoch ns, computed independently of the importer."""
    stamp = datetime.strptime(text, "%Y/%m/%d %H:%M:%S.%f")
    offset = calendar.timegm(stamp.timetuple()) - time.mktime(stamp.timetuple())
    return round((calendar.timegm(stamp.timetuple()) - offset) * 1e9) + stamp.microsecond * 1000


# ---------------------------------------------------------------------------------------------
# nvidia-smi --query-gpu --format=csv

SMI_UNITS = """\
timestamp, index, uuid, name, utilization.gpu [%], utilization.memory [%], memory.used [MiB], \
memory.total [MiB], power.draw [W], clocks.sm [MHz], temperature.gpu, \
clocks_event_reasons.active, pcie.link.gen.current
2024/05/01 12:34:56.789, 0, GPU-aaa, NVIDIA H100 80GB HBM3, 97 %, 40 %, 70000 MiB, 81559 MiB, \
650.25 W, 1980 MHz, 71, 0x0000000000000000, 5
2024/05/01 12:34:56.790, 1, GPU-bbb, NVIDIA H100 80GB HBM3, [N/A], 3 %, 1024 MiB, 81559 MiB, \
[Not Supported], 1980 MHz, 40, 0x0000000000000004, 5
2024/05/01 12:34:57.789, 0, GPU-aaa, NVIDIA H100 80GB HBM3, 12 %, 1 %, 70001 MiB, 81559 MiB, \
120.5 W, 1755 MHz, 70, 0x0000000000000001, 5
2024/05/01 12:34:57.790, 1, GPU-bbb, NVIDIA H100 80GB HBM3, 0 %, 0 %, 1024 MiB, 81559 MiB, \
80 W, 1980 MHz, 40, 0x0000000000000000, 5
"""


def test_smi_with_units_several_gpus(tmp_path):
    path = write(tmp_path, "node7.csv", SMI_UNITS)
    assert detect(path) is nvidia_smi
    part = nvidia_smi.parse(path)
    g = part.frames["gpu"]
    assert part.anchored and part.format == "nvidia-smi-csv"
    assert list(g["gpu"]) == [0, 0, 1, 1]
    assert set(g["host"]) == {"node7"}
    assert list(g["uuid"]) == ["GPU-aaa", "GPU-aaa", "GPU-bbb", "GPU-bbb"]
    assert g["t_ns"].tolist() == [
        local_ns("2024/05/01 12:34:56.789"),
        local_ns("2024/05/01 12:34:57.789"),
        local_ns("2024/05/01 12:34:56.790"),
        local_ns("2024/05/01 12:34:57.790"),
    ]
    assert g["util_gpu_pct"].tolist()[:2] == [97, 12]
    assert np.isnan(g["util_gpu_pct"][2])  # [N/A]
    assert np.isnan(g["power_w"][2])  # [Not Supported]
    assert g["power_w"][0] == 650.25
    assert g["mem_used_bytes"][1] == 70001 * MIB
    assert g["mem_total_bytes"][0] == 81559 * MIB
    assert g["sm_clock_mhz"].tolist() == [1980, 1755, 1980, 1980]
    assert g["temp_c"].tolist() == [71, 70, 40, 40]
    assert g["clock_event_reasons"].tolist() == [0, 1, 4, 0]
    gpus = part.meta["gpus"]
    assert [x["index"] for x in gpus] == [0, 1]
    assert gpus[1]["uuid"] == "GPU-bbb" and gpus[1]["name"] == "NVIDIA H100 80GB HBM3"
    assert gpus[0]["mem_total_bytes"] == 81559 * MIB and gpus[0]["pcie_link_gen"] == 5
    assert part.meta["interval_s"] == pytest.approx(1.0)
    assert any("time zone" in n for n in part.notes)


def test_smi_nounits_any_order_and_utf16_bom(tmp_path):
    text = (
        "memory.used, utilization.gpu, timestamp, clocks.current.sm\n"
        "512, 33, 2024/05/01 00:00:00.000, 1410\n"
        "[N/A], 34, 2024/05/01 00:00:02.500, 1410\n"
    )
    path = write(tmp_path, "ps.csv", "\ufeff" + text, encoding="utf-16-le")
    assert detect(path) is nvidia_smi
    g = nvidia_smi.parse(path).frames["gpu"]
    assert g["util_gpu_pct"].tolist() == [33, 34]
    assert g["mem_used_bytes"][0] == 512 * MIB and np.isnan(g["mem_used_bytes"][1])
    assert g["sm_clock_mhz"].tolist() == [1410, 1410]
    assert int(g["t_ns"][1] - g["t_ns"][0]) == 2_500_000_000
    assert set(g["gpu"]) == {0}  # one GPU, no index column


def test_smi_epoch_timestamps_in_any_unit(tmp_path):
    for digits, scale in ((1_714_560_000, 10**9), (1_714_560_000_123, 10**6)):
        path = write(
            tmp_path,
            f"e{scale}.csv",
            f"timestamp,utilization.gpu\n{digits},5\n{digits + 60 * 10**9 // scale},6\n",
        )
        g = nvidia_smi.parse(path).frames["gpu"]
        assert g["t_ns"].tolist() == [digits * scale, digits * scale + 60 * 10**9]


def test_smi_repeated_and_changed_header(tmp_path):
    text = (
        "timestamp, utilization.gpu [%]\n2024/05/01 00:00:00.000, 1 %\n"
        "timestamp, utilization.gpu [%]\n2024/05/01 00:00:01.000, 2 %\n"
        "timestamp, memory.used [MiB], utilization.gpu [%]\n2024/05/01 00:00:02.000, 7 MiB, 3 %\n"
    )
    g = nvidia_smi.parse(write(tmp_path, "r.csv", text)).frames["gpu"]
    assert g["util_gpu_pct"].tolist() == [1, 2, 3]
    assert g["mem_used_bytes"].isna().tolist() == [True, True, False]


def test_smi_gpus_told_apart_by_uuid_without_index(tmp_path):
    text = "timestamp,uuid,utilization.gpu\n" + "".join(
        f"2024/05/01 00:00:0{t}.000,GPU-{u},{t * 10 + i}\n"
        for t in range(3)
        for i, u in enumerate("xy")
    )
    part = nvidia_smi.parse(write(tmp_path, "u.csv", text))
    g = part.frames["gpu"]
    assert g.groupby("gpu")["uuid"].first().tolist() == ["GPU-x", "GPU-y"]
    assert g[g["gpu"] == 1]["util_gpu_pct"].tolist() == [1, 11, 21]
    assert any("first appearance" in n for n in part.notes)


def test_smi_memory_free_gives_total_and_no_timestamps_means_unanchored(tmp_path):
    text = "memory.used [MiB], memory.free [MiB]\n10 MiB, 90 MiB\n20 MiB, 80 MiB\n"
    part = nvidia_smi.parse(write(tmp_path, "m.csv", text))
    g = part.frames["gpu"]
    assert g["mem_total_bytes"].tolist() == [100 * MIB, 100 * MIB]
    assert not part.anchored
    assert g["t_ns"].tolist() == [0, 1_000_000_000]


def test_smi_truncated_last_line_is_skipped(tmp_path):
    text = (
        "timestamp, utilization.gpu [%], memory.used [MiB]\n2024/05/01 00:00:00.000, 1 %, 5 MiB\n"
    )
    part = nvidia_smi.parse(write(tmp_path, "t.csv", text + "2024/05/01 00:00:01.000, 2"))
    assert len(part.frames["gpu"]) == 1
    assert any("line 3" in n for n in part.notes)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024/05/01 00:00:00.000, 45, 1024, 30\n", r"t\.csv:1: no header line.*--fields"),
        ("timestamp, utilization.gpu [%]\n2024/05/01 00:00:00.000, lots\n", r"no usable.*line 2"),
        ("timestamp, utilization.gpu\nyesterday, 1\n", r"no usable.*timestamp.*line 2"),
        ("timestamp, memory.used [MiB]\n2024/05/01 00:00:00.000, 1 parsecs\n", r"no usable.*unit"),
        ("timestamp, utilization.gpu\n", r"no samples"),
    ],
)
def test_smi_nothing_usable_is_one_line_naming_file(tmp_path, text, expected):
    path = write(tmp_path, "t.csv", text)
    with pytest.raises(ImportFormatError, match=expected) as info:
        nvidia_smi.parse(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_smi_bad_values_and_lines_are_skipped_and_counted(tmp_path):
    text = (
        "timestamp, index, utilization.gpu [%], memory.used [MiB], temperature.gpu\n"
        "2024/05/01 00:00:00.000, 0, 40 %, 100 MiB, 50\n"
        "2024/05/01 00:00:01.000, 0, lots, 100 MiB, 50\n"  # not a number: that value only
        "2024/05/01 00:00:02.000, 0, 250 %, 100 MiB, 50\n"  # out of range: that value only
        "2024/05/01 00:00:03.000, 0, 41 %, 100\n"  # a wrapped line: the whole line
        "MiB, 51\n"
        "yesterday, 0, 42 %, 100 MiB, 50\n"  # a timestamp that can't be read: the line
        "2024/05/01 00:00:05.000, 0, 43 %, 1 parsecs, 65535\n"  # unit, sentinel temperature
    )
    part = nvidia_smi.parse(write(tmp_path, "t.csv", text))
    g = part.frames["gpu"]
    assert g["util_gpu_pct"].tolist()[::3] == [40, 43]
    assert g["util_gpu_pct"].isna().tolist() == [False, True, True, False]
    assert np.isnan(g["mem_used_bytes"].iloc[-1]) and np.isnan(g["temp_c"].iloc[-1])
    notes = " | ".join(part.notes)
    for expected in (
        "1 utilization.gpu values that are not numbers skipped (first: line 3)",
        "1 utilization.gpu values out of range skipped (first: line 4)",
        "2 lines of the wrong width skipped (first: line 5)",
        "1 lines whose timestamp can't be read skipped (first: line 7)",
        "1 memory.used values in an unknown unit skipped (first: line 8)",
        "1 temperature.gpu values out of range skipped (first: line 8)",
    ):
        assert expected in notes


def test_smi_sniff_rejects_generic_csv(tmp_path):
    path = write(tmp_path, "loss.csv", "timestamp,index,name,loss\n1,2,a,0.5\n")
    assert not nvidia_smi.sniff(read_head(path), path)


# ---------------------------------------------------------------------------------------------
# nvidia-smi dmon

DMON_DT = """\
#Date       Time        gpu    pwr  gtemp  mtemp     sm    mem    enc    dec   mclk   pclk
#YYYYMMDD   HH:MM:SS    Idx      W      C      C      %      %      %      %    MHz    MHz
 20240501   23:59:59      0     43     48      -     10      5      0      0    877   1410
 20240501   23:59:59      1    345     69      -     90     40      0      0    877   1980
 20240502   00:00:00      0     44     48      -      -      5      0      0    877   1410
 20240502   00:00:00      1    346     69      -     80     40      0      0    877   1980
#Date       Time        gpu    pwr  gtemp  mtemp     sm    mem    enc    dec   mclk   pclk
#YYYYMMDD   HH:MM:SS    Idx      W      C      C      %      %      %      %    MHz    MHz
 20240502   00:00:01      0     45     48      -     30      5      0      0    877   1410
"""


def test_dmon_with_date_and_time(tmp_path):
    path = write(tmp_path, "dmon.log", DMON_DT)
    assert detect(path) is nvidia_smi_dmon
    part = nvidia_smi_dmon.parse(path)
    g = part.frames["gpu"]
    assert part.anchored
    zero = g[g["gpu"] == 0]
    start = datetime(2024, 5, 1, 23, 59, 59)
    t0 = round(time.mktime(start.timetuple()) * 1e9)
    assert zero["t_ns"].tolist() == [t0, t0 + 10**9, t0 + 2 * 10**9]
    assert zero["util_gpu_pct"].isna().tolist() == [False, True, False]
    assert zero["util_gpu_pct"].dropna().tolist() == [10, 30]
    assert g[g["gpu"] == 1]["power_w"].tolist() == [345, 346]
    assert g[g["gpu"] == 1]["sm_clock_mhz"].tolist() == [1980, 1980]
    assert g["util_mem_pct"].tolist()[:3] == [5, 5, 5]
    assert [x["index"] for x in part.meta["gpus"]] == [0, 1]


def test_dmon_without_times_is_one_second_apart_and_unanchored(tmp_path):
    plain = (
        "# gpu    pwr  gtemp     sm    mem   fb  rxpci  txpci\n"
        "# Idx      W      C      %      %   MB   MB/s   MB/s\n"
        "    0     43     48     10      5  100      2      3\n"
        "    1     45     49     90     40  200      -      -\n"
        "    0     44     48     20      5  101      2      3\n"
    )
    part = nvidia_smi_dmon.parse(write(tmp_path, "plain.txt", plain))
    g = part.frames["gpu"]
    assert not part.anchored
    assert g[g["gpu"] == 0]["t_ns"].tolist() == [0, 10**9]
    assert g[g["gpu"] == 0]["mem_used_bytes"].tolist() == [100 * MIB, 101 * MIB]
    assert g[g["gpu"] == 0]["pcie_rx_bytes_s"].tolist() == [2e6, 2e6]


def test_dmon_time_only_wraps_at_midnight(tmp_path):
    text = (
        "#Time        gpu     sm\n#HH:MM:SS    Idx      %\n"
        " 23:59:59      0      1\n 00:00:00      0      2\n 00:00:02      0      3\n"
    )
    part = nvidia_smi_dmon.parse(write(tmp_path, "t.txt", text))
    assert part.frames["gpu"]["t_ns"].tolist() == [0, 10**9, 3 * 10**9]
    assert not part.anchored


def test_dmon_malformed_and_pmon(tmp_path):
    bad = "# gpu  sm\n# Idx  %\n 0  5\n 0  x\n 0  6\n 0  7  8\n 0  9\n"
    part = nvidia_smi_dmon.parse(write(tmp_path, "bad.txt", bad))
    util = part.frames["gpu"]["util_gpu_pct"]
    assert util.tolist()[:1] + util.tolist()[2:] == [5, 6, 9] and np.isnan(util[1])
    assert "1 sm values that are not numbers skipped (first: line 4)" in part.notes
    assert "1 rows of the wrong width skipped (first: line 6)" in part.notes
    with pytest.raises(ImportFormatError, match=r"worse\.txt: no samples \(2 rows before"):
        nvidia_smi_dmon.parse(write(tmp_path, "worse.txt", " 0  5\n 0  6\n"))
    pmon = write(
        tmp_path, "pmon.txt", "# gpu   pid  type   sm   mem\n# Idx     #   C/G    %     %\n"
    )
    assert not nvidia_smi_dmon.sniff(read_head(pmon), pmon)


# ---------------------------------------------------------------------------------------------
# dcgm-exporter

LABELS = 'gpu="{g}",UUID="GPU-{g}{g}",device="nvidia{g}",modelName="NVIDIA A100",Hostname="n1"'


def scrape(values: dict[str, list[float]], stamp_ms: int | None = None) -> str:
    out = []
    for metric, per_gpu in values.items():
        out += [f"# HELP {metric} help text.", f"# TYPE {metric} gauge"]
        for g, v in enumerate(per_gpu):
            ts = f" {stamp_ms}" if stamp_ms is not None else ""
            out.append(f"{metric}{{{LABELS.format(g=g)}}} {v}{ts}")
    return "\n".join(out) + "\n"


def test_dcgm_scrapes_split_by_repetition(tmp_path):
    text = "".join(
        scrape(
            {
                "DCGM_FI_DEV_GPU_UTIL": [10 * k, 50],
                "DCGM_FI_DEV_FB_USED": [1000, 2000],
                "DCGM_FI_DEV_FB_FREE": [3000, 2000],
                "DCGM_FI_PROF_SM_ACTIVE": [0.25, 0.5],
                "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": [4, 0],
                "DCGM_FI_DEV_POWER_MGMT_LIMIT": [400, 400],
            }
        )
        for k in range(3)
    )
    path = write(tmp_path, "scrapes.prom", text)
    assert detect(path) is dcgm
    part = dcgm.parse(path)
    g = part.frames["gpu"]
    assert not part.anchored
    zero = g[g["gpu"] == 0]
    assert zero["t_ns"].tolist() == [0, 10**9, 2 * 10**9]
    assert zero["util_gpu_pct"].tolist() == [0, 10, 20]
    assert zero["mem_used_bytes"].tolist() == [1000 * MIB] * 3
    assert zero["mem_total_bytes"].tolist() == [4000 * MIB] * 3
    assert zero["sm_active_pct"].tolist() == [25, 25, 25]
    assert zero["clock_event_reasons"].tolist() == [4, 4, 4]
    assert set(g["host"]) == {"n1"} and set(g["uuid"]) == {"GPU-00", "GPU-11"}
    assert part.meta["hosts"] == ["n1"]
    assert part.meta["gpus"][1] == {
        "host": "n1",
        "index": 1,
        "uuid": "GPU-11",
        "name": "NVIDIA A100",
        "power_limit_w": 400.0,
        "mem_total_bytes": 4000 * MIB,
    }


def test_dcgm_timestamps_anchor_and_cut_lines_are_skipped(tmp_path):
    first = scrape({"DCGM_FI_DEV_GPU_UTIL": [1, 2], "DCGM_FI_DEV_POWER_USAGE": [100.5, 90]}, 1000)
    second = scrape({"DCGM_FI_DEV_GPU_UTIL": [3, 4], "DCGM_FI_DEV_POWER_USAGE": [110, 91]}, 3500)
    text = 'E{gpu="1"} 7\n' + first + second + 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UU'
    part = dcgm.parse(write(tmp_path, "cut.txt", text))
    g = part.frames["gpu"]
    assert part.anchored
    assert g[g["gpu"] == 0]["t_ns"].tolist() == [10**9, 3_500_000_000]
    assert g[g["gpu"] == 0]["util_gpu_pct"].tolist() == [1, 3]
    assert g[g["gpu"] == 1]["power_w"].tolist() == [90, 91]
    assert sum("incomplete" in n for n in part.notes) == 1  # the first line parses as a sample


def test_dcgm_bad_line_in_the_middle_is_skipped_and_named(tmp_path):
    good = scrape({"DCGM_FI_DEV_GPU_UTIL": [1, 2]})
    text = good + "DCGM_FI_DEV_GPU_UTIL{gpu=0} 5\n" + good
    part = dcgm.parse(write(tmp_path, "bad.txt", text))
    assert part.frames["gpu"]["util_gpu_pct"].tolist() == [1, 1, 2, 2]  # two scrapes, 2 GPUs
    assert "1 lines that are not Prometheus samples skipped (first: line 5)" in part.notes


def test_dcgm_without_gpu_samples_is_refused(tmp_path):
    with pytest.raises(ImportFormatError, match="no DCGM per-GPU samples"):
        dcgm.parse(write(tmp_path, "x.txt", "# HELP DCGM_FI_DEV_GPU_UTIL x\nup 1\n"))


# ---------------------------------------------------------------------------------------------
# Fuzzing: only ImportFormatError may escape a parser

VALID = {
    nvidia_smi: SMI_UNITS,
    nvidia_smi_dmon: DMON_DT,
    dcgm: scrape({"DCGM_FI_DEV_GPU_UTIL": [1, 2], "DCGM_FI_DEV_FB_USED": [5, 6]}, 1000) * 2,
}
FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _parse_or_refuse(module, path: Path) -> None:
    try:
        part = module.parse(path)
    except ImportFormatError as exc:
        assert "\n" not in str(exc)
        return
    for frame in part.frames.values():
        assert frame["t_ns"].dtype == np.int64


@pytest.mark.parametrize("module", PARSERS, ids=lambda m: m.FORMAT)
@FUZZ
@given(data=st.binary(max_size=400))
def test_fuzz_bytes(tmp_path, module, data):
    path = tmp_path / "fuzz.bin"
    path.write_bytes(data)
    module.sniff(read_head(path), path)
    _parse_or_refuse(module, path)


@pytest.mark.parametrize("module", PARSERS, ids=lambda m: m.FORMAT)
@FUZZ
@given(data=st.data())
def test_fuzz_mutated_valid_files(tmp_path, module, data):
    text = VALID[module]
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(text)))
        end = data.draw(st.integers(pos, min(len(text), pos + 12)))
        # pieces: separators, digits, odd tokens, and the cut text itself (duplication)
        pieces = [*',.#%[]{}"= \n-0123456789xAN/:', "[N/A]", "0x", "1e309", text[pos:end]]
        insert = "".join(data.draw(st.lists(st.sampled_from(pieces), max_size=5)))
        text = text[:pos] + insert + text[end:]
    path = write(tmp_path, "mutated.txt", text)
    _parse_or_refuse(module, path)


@pytest.mark.parametrize("module", PARSERS, ids=lambda m: m.FORMAT)
@FUZZ
@given(text=st.text(max_size=300))
def test_fuzz_text(tmp_path, module, text):
    path = write(tmp_path, "fuzz.txt", text)
    _parse_or_refuse(module, path)


# ---------------------------------------------------------------------------------------------
# Real files from ../shared/fixtures

needs_fixtures = pytest.mark.skipif(not SHARED_FIXTURES.is_dir(), reason="no shared fixtures")


def _csv_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    """Header and data rows read with the csv module (repeated headers dropped)."""
    with path.open(newline="", encoding="utf-8") as fh:
        rows = [[c.strip() for c in r] for r in csv.reader(fh) if r]
    header = rows[0]
    return header, [r for r in rows[1:] if r != header]


def _number(cell: str) -> float:
    return float(cell.split()[0])


@needs_fixtures
@pytest.mark.parametrize(
    "name", ["epoch_custom_header.csv", "rtx4090_inference.csv", "repeated_header.csv"]
)
def test_fixture_nvidia_smi(name):
    path = SHARED_FIXTURES / "nvidia_smi" / name
    assert detect(path) is nvidia_smi
    part = nvidia_smi.parse(path)
    g = part.frames["gpu"]
    header, rows = _csv_rows(path)
    col = {h.split(" [")[0]: i for i, h in enumerate(header)}
    assert len(g) == len(rows)
    util = [_number(r[col["utilization.gpu"]]) for r in rows]
    assert g["util_gpu_pct"].mean() == pytest.approx(statistics.fmean(util))
    used = [_number(r[col["memory.used"]]) * MIB for r in rows]
    assert g["mem_used_bytes"].max() == max(used)
    stamps = [r[col["timestamp"]] for r in rows]
    if re.fullmatch(r"\d+", stamps[0]):
        span_ns = (int(stamps[-1]) - int(stamps[0])) * 10**9
    else:
        span_ns = local_ns(stamps[-1]) - local_ns(stamps[0])
    assert int(g["t_ns"].max() - g["t_ns"].min()) == span_ns
    if "power.draw" in col:
        power = [_number(r[col["power.draw"]]) for r in rows]
        assert g["power_w"].sum() == pytest.approx(sum(power))
    if "name" in col:
        assert part.meta["gpus"][0]["name"] == rows[0][col["name"]]


@needs_fixtures
def test_fixture_dcgm_scrape_excerpt():
    path = SHARED_FIXTURES / "dcgm" / "v100_node_scrape_excerpt.txt"
    assert detect(path) is dcgm
    part = dcgm.parse(path)
    text = path.read_text()
    complete = [ln for ln in text.splitlines() if re.fullmatch(r"DCGM_\w+\{[^}]*\} \S+", ln)]
    labels = [dict(re.findall(r'(\w+)="([^"]*)"', ln)) for ln in complete]
    assert sorted(int(g["index"]) for g in part.meta["gpus"]) == sorted(
        {int(lab["gpu"]) for lab in labels}
    )
    assert {g["uuid"] for g in part.meta["gpus"]} == {lab["UUID"] for lab in labels}
    assert part.meta["hosts"] == sorted({lab["Hostname"] for lab in labels})
    util = [ln for ln in complete if ln.startswith("DCGM_FI_DEV_GPU_UTIL{")]
    g = part.frames["gpu"]
    assert len(g) == len(util)
    assert g["util_gpu_pct"].tolist() == [float(ln.rsplit(" ", 1)[1]) for ln in util]
    limits = {
        int(lab["gpu"]): float(ln.rsplit(" ", 1)[1])
        for ln, lab in zip(complete, labels)
        if ln.startswith("DCGM_FI_DEV_POWER_MGMT_LIMIT{")
    }
    assert {g["index"]: g["power_limit_w"] for g in part.meta["gpus"] if "power_limit_w" in g} == (
        limits
    )
    assert any("incomplete last line" in n for n in part.notes)
