"""`gpuprof watch --live` under a real pseudo-terminal with simulated GPUs, and the live view's
running figures. The terminal is emulated by pyte to check what a user would see."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import textwrap
import time

import pytest
from conftest import clean_env, gpuprof_cmd, run_gpuprof
from simnvml import simnvml_env, write_scenario

from gpuprof import store
from gpuprof.model import GpuSample, HostSample
from gpuprof.reports.live import REFRESH_HZ, LiveState, status_lines

pytest_plugins = ["simnvml.fixtures"]
pyte = pytest.importorskip("pyte")

ROWS, COLS = 24, 80
HEADER = b"gpuprof live"
CHILD = textwrap.dedent(
    """
    import sys, time, gpuprof
    for step in range(8):
        with gpuprof.phase("rollout"):
            time.sleep(0.2)
        with gpuprof.phase("reward"):
            print(f"child line {step:02d} " + "=" * 50, flush=True)
            time.sleep(0.2)
        gpuprof.step(n=step)
    print("half a line", end="", flush=True)
    time.sleep(0.4)
    print(" and its end", flush=True)
    sys.exit(3)
    """
)


def _gpus() -> dict:
    series = lambda i: {"util_gpu_pct": [(0, 3), (1.2, 70 + i)],  # noqa: E731
                        "mem_used_bytes": (20 + i) * 2**30}  # fmt: skip
    return {"gpus": [{"name": "NVIDIA H100 80GB HBM3", "series": series(i)} for i in range(4)]}


def run_in_pty(argv: list[str], env: dict, timeout: float = 120) -> tuple[int, list]:
    """Run ``argv`` with stdin/stdout/stderr on a ROWS x COLS pty; (exit code, timed chunks)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                            start_new_session=True)  # fmt: skip
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not data:
                    break
                chunks.append((time.monotonic(), data))
            elif proc.poll() is not None:
                break
        return proc.wait(timeout=10), chunks
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()


def screen_of(data: bytes) -> tuple[list[str], list[str]]:
    """(scrolled-off history, visible screen) of a pyte terminal fed ``data``."""
    screen = pyte.HistoryScreen(COLS, ROWS, history=2000)
    pyte.ByteStream(screen).feed(data)
    # pyte keeps history lines as dicts of columns; rebuild them in column order
    history = ["".join(line[x].data for x in sorted(line)).rstrip() for line in screen.history.top]
    return history, [line.rstrip() for line in screen.display]


@pytest.fixture(scope="module")
def live_watch(simnvml_lib, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("live")
    env = simnvml_env(simnvml_lib, write_scenario(tmp / "scenario.txt", _gpus()),
                      base=clean_env(TERM="xterm-256color"))  # fmt: skip
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    run_dir = tmp / "run"
    argv = gpuprof_cmd("watch", "--live", "--interval", "0.05", "-o", str(run_dir), "--",
                       sys.executable, "-c", CHILD)  # fmt: skip
    code, chunks = run_in_pty(argv, env)
    return code, chunks, run_dir


def test_exit_code_and_run_are_kept(live_watch):
    code, _, run_dir = live_watch
    assert code == 3
    run = store.load_run(run_dir)
    assert len(run.spans[run.spans["phase"] == "reward"]) == 8
    assert run.logs["line"].str.startswith("child line").sum() == 8


def test_status_redraws_at_most_four_times_a_second(live_watch):
    _, chunks, _ = live_watch
    stamps = [t for t, data in chunks for _ in range(data.count(HEADER))]
    assert len(stamps) >= 8, "the status was drawn while the command ran"
    # draws are read back in bursts, so bound the count over the whole span of drawing
    span_s = stamps[-1] - stamps[0]
    assert (len(stamps) - 1) / span_s <= REFRESH_HZ * 1.15
    assert len(stamps) / (span_s + 1.0) >= 1.5  # and it keeps refreshing


def test_child_lines_arrive_whole_and_in_order(live_watch):
    _, chunks, _ = live_watch
    raw = b"".join(data for _, data in chunks)
    for step in range(8):
        # byte for byte: no status drawing ever lands inside one of the command's lines
        assert f"child line {step:02d} {'=' * 50}\r\n".encode() in raw
    history, screen = screen_of(raw)
    shown = [line for line in history + screen if line.startswith("child line")]
    assert shown == [f"child line {step:02d} {'=' * 50}" for step in range(8)]
    # a line written in two pieces with redraws in between still reads as one
    assert "half a line and its end" in history + screen


def test_status_shows_gpus_phases_steps_and_then_goes_away(live_watch):
    _, chunks, _ = live_watch
    raw = b"".join(data for _, data in chunks)
    # the screen as it was at the last redraw before the command ended
    last = raw.rfind(HEADER)
    _, during = screen_of(raw[: raw.find(b"\x1b8", last) + 2])
    status = during[during.index(next(line for line in during if "gpuprof live" in line)) :]
    text = "\n".join(status)
    assert all(f"GPU{i}" in text for i in range(4))
    assert re.search(r"GPU0 +\S+ +7\d% mem", text)  # the simulated utilization
    assert re.search(r"step \d+ +\d+ ms/step", text)
    assert re.search(r"last phase: .*(rollout|reward)", text)
    assert "most idle:" in text
    assert all(len(line) <= COLS for line in during)
    # at the end the status rows are cleared and the whole screen scrolls again
    assert raw.count(b"\x1b[r") >= 1
    _, final = screen_of(raw)
    assert not any("gpuprof live" in line for line in final)
    assert any("run saved to" in line or "full diagnosis" in line for line in final)


def test_without_a_terminal_live_says_so_once_and_goes_on(tmp_path):
    run_dir = tmp_path / "run"
    code = "import gpuprof\nwith gpuprof.phase('rollout'): print('hello')\nraise SystemExit(5)"
    result = run_gpuprof("watch", "--live", "--no-nvml", "-o", str(run_dir), "--",
                         sys.executable, "-c", code)  # fmt: skip
    assert result.returncode == 5
    assert result.stdout == "hello\n"
    notes = [line for line in result.stderr.splitlines() if "--live" in line]
    assert notes == ["gpuprof: --live needs a terminal on stderr: going on without the live view"]
    assert "\x1b" not in result.stderr
    assert len(store.load_run(run_dir).spans) == 1


def _sample(gpu: int, t_ns: int, util: float) -> GpuSample:
    return GpuSample("h", gpu, None, t_ns, util_gpu_pct=util, mem_used_bytes=2**30,
                     mem_total_bytes=8 * 2**30)  # fmt: skip


def test_idle_time_is_charged_to_the_innermost_span():
    state = LiveState(idle_util_pct=10)
    s = 1_000_000_000
    for k in range(41):  # 10 s at 4 Hz; GPU 1 idle from 2 s to 6 s, both idle from 9 s
        t = k * s // 4
        utils = (0 if t >= 9 * s else 90, 0 if 2 * s <= t < 6 * s or t >= 9 * s else 90)
        state.add_readings((t, [_sample(0, t, utils[0]), _sample(1, t, utils[1])], None))
    state.add_spans([(7, 0, "update_actor", 0, 10 * s), (7, 0, "reward", 2 * s, 6 * s),
                     (7, 0, "step", 0, 10 * s)])  # fmt: skip
    idle = state.idle_by_phase()
    assert idle["reward"] == pytest.approx(4.0, abs=0.3)  # one GPU for 4 s
    assert idle["update_actor"] == pytest.approx(2.0, abs=0.6)  # two GPUs for 1 s
    assert state.gpu_s == pytest.approx(20.0)
    # the last phase a rank finished is the one that ended last, whatever its nesting
    assert state.ranks[7].phase == "update_actor" and state.ranks[7].end_ns == 10 * s
    state.add_steps([(7, 0, 3 * s), (7, 0, 5 * s), (7, 0, 7 * s), (8, 1, 7 * s)])
    assert state.lead().rank == 0 and state.step_time_s() == pytest.approx(2.0)
    lines = [line.plain for line in status_lines(state, 80, 11 * s)]
    assert any("most idle: reward" in line for line in lines)
    assert any("r0 update_actor (1s ago)" in line for line in lines)


@pytest.mark.parametrize("gpus, width", [(8, 80), (64, 80), (8, 50), (2, 30)])
def test_status_lines_fit_the_width(gpus, width):
    state = LiveState()
    samples = [_sample(i, 10, 50.0) for i in range(gpus)]
    state.add_readings((10, samples, HostSample("h", 10, cpu_pct=40.0)))
    for rank in range(gpus):
        state.add_spans([(100 + rank, rank, "generate_sequences_long_name", 0, 5)])
    lines = status_lines(state, width, 10)
    assert all(line.cell_len <= width for line in lines)
    assert len(lines) <= 2 + 9 + 2  # header, at most 8 GPU lines + a summary, ranks, finding
    if gpus == 64:
        assert any("+48 more GPUs" in line.plain for line in lines)
