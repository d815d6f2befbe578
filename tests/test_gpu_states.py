"""GPU states visible in plain logs: phantom utilization, a hot GPU, a power cap.

The phantom finding is checked on the public captures of stuck GPUs (tests/fixtures_public),
the expected GPUs read from the files themselves; hot GPUs and power caps on nvidia-smi CSVs
written the way nvidia-smi writes them, and on the simulator's ground truth.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuprof.analyzers.diagnose import diagnose
from gpuprof.importing import merge, parse_file
from gpuprof.sim import Pathology, SimConfig, simulate

PUBLIC = Path(__file__).parent / "fixtures_public"
MIB = 2**20


def run_of(*paths: Path):
    return merge([parse_file(p) for p in paths], run_id="t", command=[])


def findings(run) -> dict:
    return {f.kind: f for f in diagnose(run).findings}


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# phantom_util


@pytest.mark.parametrize("name", ["phantom_noheader_node1.csv", "phantom_noheader_node3.csv"])
def test_public_stuck_gpus_are_phantom_not_work(name):
    path = PUBLIC / name
    stuck = [
        f"{path.name.split('.')[0]}:{int(m[1])}"
        for m in re.finditer(r"^(\d+), P0, 100 %, 0 MiB", path.read_text(), re.M)
    ]
    found = findings(run_of(path))
    phantom = found["phantom_util"]
    assert phantom.evidence["gpus"] == stuck
    assert phantom.evidence["memory_measured"] is True
    assert phantom.evidence["mem_used_bytes_max"] == 0
    assert phantom.evidence["working_gpus"] == 8 - len(stuck)
    assert "reset" in phantom.summary
    # the stuck GPUs are no "busy peers" that make the idle ones look like stragglers
    assert "imbalance" not in found


def test_public_dmon_stuck_gpu_found_with_less_confidence():
    found = findings(run_of(PUBLIC / "phantom_dmon_node1.txt"))
    phantom = found["phantom_util"]
    assert phantom.evidence["gpus"] == ["phantom_dmon_node1:5"]
    assert phantom.evidence["memory_measured"] is False  # dmon -s default: no fb column
    csv = findings(run_of(PUBLIC / "phantom_noheader_node1.csv"))["phantom_util"]
    assert phantom.confidence < csv.confidence


def _smi(tmp_path: Path, rows: list[str], header: str) -> Path:
    stamps = [f"2024/05/01 10:00:{s:02d}.000" for s in range(30)]
    body = "".join(f"{t}, {r}\n" for t in stamps for r in rows)
    return write(tmp_path, "node.csv", f"timestamp, {header}\n{body}")


def test_busy_gpu_with_memory_is_work_not_phantom(tmp_path):
    header = "index, utilization.gpu [%], memory.used [MiB], power.draw [W], power.limit [W]"
    rows = ["0, 100 %, 60000 MiB, 650 W, 700 W", "1, 100 %, 60000 MiB, 660 W, 700 W"]
    assert "phantom_util" not in findings(run_of(_smi(tmp_path, rows, header)))


def test_high_power_rules_out_phantom(tmp_path):
    # 0 MiB would say stuck, but 600 of 700 W is a GPU doing work (a memory reading glitch)
    header = "index, utilization.gpu [%], memory.used [MiB], power.draw [W], power.limit [W]"
    rows = ["0, 100 %, 0 MiB, 600 W, 700 W", "1, 100 %, 60000 MiB, 650 W, 700 W"]
    assert "phantom_util" not in findings(run_of(_smi(tmp_path, rows, header)))


def test_sim_phantom_matches_truth():
    res = simulate(SimConfig(gpus=8, steps=6, time_scale=0.1, seed=5,
                             pathologies=[Pathology("phantom_util", 0.8)]))  # fmt: skip
    truth = res.truth[0]
    found = findings(res.run)["phantom_util"]
    assert sorted(found.evidence["gpus"]) == [f"node0:{g}" for g in truth.gpus]
    assert found.gpu_seconds_lost == pytest.approx(truth.gpu_seconds, rel=0.05)
    assert found.evidence["processes_seen"] is False  # per-process data existed: none there


# ---------------------------------------------------------------------------------------------
# hot_gpu

_HOT_HEADER = (
    "index, utilization.gpu [%], memory.used [MiB], temperature.gpu, clocks.sm [MHz], "
    "power.draw [W], clocks_event_reasons.active"
)


def _hot_rows(hot_temp: int, hot_clock: int, hot_util: int = 98) -> list[str]:
    rows = [f"{i}, 97 %, 60000 MiB, {60 + i % 3}, 1980 MHz, 640 W, 0x0" for i in range(7)]
    reason = "0x20" if hot_clock < 1980 else "0x0"
    rows.append(f"7, {hot_util} %, 60000 MiB, {hot_temp}, {hot_clock} MHz, 600 W, {reason}")
    return rows


def test_hot_gpu_named_with_its_clock_loss(tmp_path):
    run = run_of(_smi(tmp_path, _hot_rows(82, 1500), _HOT_HEADER))
    found = findings(run)
    hot = found["hot_gpu"]
    assert hot.evidence["gpus"] == ["node:7"]
    assert hot.evidence["temp_c_above_peers"] == pytest.approx(82 - 61, abs=1)
    assert hot.evidence["sm_clock_mhz"] == 1500 and hot.evidence["peer_sm_clock_mhz"] == 1980
    assert hot.evidence["thermal_reasons_share"] == 1.0
    # its 1 - 1500/1980 of each busy second, and all 8 GPUs wait for it
    gpu_s = run.gpu.groupby("gpu")["t_ns"].count().iloc[0]  # 30 samples of 1 s
    assert hot.gpu_seconds_lost == pytest.approx((gpu_s - 1) * (1 - 1500 / 1980) * 8, rel=0.1)
    assert "throttling" not in found  # its GPU is hot_gpu's


def test_hot_gpu_without_clock_loss_is_a_note_not_a_finding(tmp_path):
    diagnosis = diagnose(run_of(_smi(tmp_path, _hot_rows(82, 1980), _HOT_HEADER)))
    assert "hot_gpu" not in {f.kind for f in diagnosis.findings}
    assert any("node:7 runs 21 °C above 7 peer(s)" in n for n in diagnosis.notes)


@pytest.mark.parametrize(("temp", "util"), [(70, 98), (82, 40)])
def test_no_hot_gpu_within_the_spread_or_at_another_load(tmp_path, temp, util):
    diagnosis = diagnose(run_of(_smi(tmp_path, _hot_rows(temp, 1500, util), _HOT_HEADER)))
    assert "hot_gpu" not in {f.kind for f in diagnosis.findings}
    assert not any("above" in n and "peer" in n for n in diagnosis.notes)


def test_sim_hot_gpu_matches_truth():
    res = simulate(SimConfig(gpus=8, steps=6, time_scale=0.1, seed=3,
                             pathologies=[Pathology("hot_gpu", 0.8)]))  # fmt: skip
    truth = res.truth[0]
    found = findings(res.run)
    assert found["hot_gpu"].evidence["gpus"] == [f"node0:{truth.gpus[0]}"]
    assert found["hot_gpu"].gpu_seconds_lost == pytest.approx(truth.gpu_seconds, rel=0.1)
    assert "throttling" not in found and "imbalance" not in found


# ---------------------------------------------------------------------------------------------
# power_cap

_CAP_HEADER = (
    "index, utilization.gpu [%], memory.used [MiB], power.draw [W], power.limit [W], "
    "power.default_limit [W], clocks.sm [MHz]"
)


def test_power_cap_at_a_lowered_limit(tmp_path):
    lines = [f"timestamp, {_CAP_HEADER}"]
    for sec in range(30):
        for i in range(4):  # the first second uncapped (the clock they reach), then at 450 W
            power, clock = (300.0, 1980) if sec == 0 else (448 + i * 0.3, 1410)
            lines.append(
                f"2024/05/01 10:00:{sec:02d}.000, {i}, 99 %, 60000 MiB, {power:.1f} W, "
                f"450.00 W, 700.00 W, {clock} MHz"
            )
    found = findings(run_of(write(tmp_path, "node.csv", "\n".join(lines) + "\n")))
    cap = found["power_cap"]
    assert cap.evidence["gpus"] == [f"node:{i}" for i in range(4)]
    assert cap.evidence["lowered_limit"] is True and cap.evidence["power_limit_w"] == 450
    assert cap.evidence["loss_measure"] == "clock"
    assert cap.evidence["sm_clock_mhz_capped"] == 1410 and cap.evidence["sm_clock_mhz_max"] == 1980
    assert cap.evidence["capped_share_of_busy"] > 0.9
    assert cap.gpu_seconds_lost == pytest.approx(4 * 29 * (1 - 1410 / 1980), rel=0.05)
    assert "throttling" not in found


def test_power_cap_without_clocks_uses_the_limit_ratio(tmp_path):
    header = "index, utilization.gpu [%], power.draw [W], power.limit [W], power.default_limit [W]"
    rows = [f"{i}, 99 %, 349.0 W, 350.00 W, 700.00 W" for i in range(2)]
    cap = findings(run_of(_smi(tmp_path, rows, header)))["power_cap"]
    assert cap.evidence["loss_measure"] == "power_ratio"
    busy_s = 29 * 2  # 30 samples 1 s apart, two GPUs (the last sample stands for the median)
    assert cap.gpu_seconds_lost == pytest.approx((busy_s + 2) * (1 - 0.5 ** (1 / 3)), rel=0.05)


def test_no_power_cap_below_the_limit_or_without_one(tmp_path):
    header = "index, utilization.gpu [%], power.draw [W], power.limit [W], clocks.sm [MHz]"
    below = [f"{i}, 99 %, 500.0 W, 700.00 W, 1980 MHz" for i in range(2)]
    assert "power_cap" not in findings(run_of(_smi(tmp_path, below, header)))
    header = "index, utilization.gpu [%], power.draw [W], clocks.sm [MHz]"
    unknown = [f"{i}, 99 %, 700.0 W, 1500 MHz" for i in range(2)]
    assert "power_cap" not in findings(run_of(_smi(tmp_path, unknown, header)))


def test_sim_power_cap_matches_truth_and_throttling_stays_throttling():
    res = simulate(SimConfig(gpus=8, steps=6, time_scale=0.1, seed=3,
                             pathologies=[Pathology("power_cap", 0.8)]))  # fmt: skip
    found = findings(res.run)
    assert found["power_cap"].gpu_seconds_lost == pytest.approx(res.truth[0].gpu_seconds, rel=0.1)
    assert "throttling" not in found
    res = simulate(SimConfig(gpus=8, steps=6, time_scale=0.1, seed=3,
                             pathologies=[Pathology("throttling", 0.8)]))  # fmt: skip
    found = findings(res.run)
    assert "throttling" in found and "power_cap" not in found  # no limit known: reasons only
