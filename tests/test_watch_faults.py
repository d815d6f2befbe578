"""`gpuprof watch` on a failing disk: full mid-run, full from the start, turned read-only.

Each test mounts a small tmpfs (skipped where mounting is not allowed) so the fault is real:
SQLite and the hooks meet ENOSPC / EROFS from the kernel, not from a mock.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
from conftest import clean_env, gpuprof_cmd, run_gpuprof

from gpuprof import store


@pytest.fixture
def tiny_disk(tmp_path):
    """A 512 KiB tmpfs, unmounted afterwards."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)],
                             capture_output=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(path: os.PathLike) -> None:
    """Write zeros to ``path`` until the file system is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError:
        pass
    finally:
        os.close(fd)


# 30 steps; after step 15 is written the disk fills up, later output needs room; before it
# exits the command frees the disk again (a checkpoint deleted), so the run can say what it lost
STEPS_CHILD = textwrap.dedent(
    """
    import os, sys, time, gpuprof
    filler, free_at_end = sys.argv[1], sys.argv[2] == "1"
    for i in range(30):
        with gpuprof.phase("rollout"):
            time.sleep(0.03)
        gpuprof.step()
        if i == 14:
            time.sleep(1.2)  # steps 0-14 reach the run file
            fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
            try:
                while True:
                    os.write(fd, b"\\0" * 65536)
            except OSError:
                pass
            os.close(fd)
        if i >= 15:
            for _ in range(40):
                print("progress", i, "x" * 400, flush=True)
    time.sleep(1.2)
    if free_at_end:
        os.unlink(filler)
    sys.exit(3)
    """
)


def _watch_steps(run, filler, free_at_end: bool):
    return subprocess.run(
        gpuprof_cmd("watch", "--no-nvml", "--interval", "0.05", "-o", str(run), "--",
                    sys.executable, "-c", STEPS_CHILD, str(filler), "1" if free_at_end else "0"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=clean_env(), text=True,
        timeout=120,
    )  # fmt: skip


def _steps_figure(text: str) -> tuple[int, int]:
    found = re.search(r"(\d+) of (\d+) steps recorded", text)
    assert found, text
    return int(found.group(1)), int(found.group(2))


def test_disk_full_mid_run_says_how_many_steps_were_recorded_and_stores_it(tiny_disk):
    """The end line names the steps recorded out of those the command made; when the disk
    has room again at the end, the run itself says it is incomplete and keeps the exit code."""
    run = tiny_disk / "run"
    proc = _watch_steps(run, tiny_disk / "filler", free_at_end=True)
    assert proc.returncode == 3, proc.stderr
    assert "recording stopped at" in proc.stderr and "disk full" in proc.stderr, proc.stderr
    written, seen = _steps_figure(proc.stderr)
    assert seen == 30 and 10 <= written <= 15, proc.stderr
    assert "run saved" not in proc.stderr and "report:" not in proc.stderr
    assert "holds what was written before, and says so" in proc.stderr

    loaded = store.load_run(run)
    assert loaded.meta.exit_code == 3
    assert loaded.meta.stopped and "disk full" in loaded.meta.stopped
    assert _steps_figure(loaded.meta.stopped) == (written, seen)
    recorded_steps = loaded.spans[loaded.spans["phase"] == "step"]
    assert len(recorded_steps) == written

    summary = run_gpuprof("summary", str(run))
    assert summary.returncode == 0, summary.stderr
    text = summary.stdout + summary.stderr
    assert f"{written} of 30 steps recorded" in text and "exit 3" in text
    assert "incomplete run in" in text and "run saved" not in text


def test_disk_still_full_at_the_end_says_what_is_left(tiny_disk):
    proc = _watch_steps(tiny_disk / "run", tiny_disk / "filler", free_at_end=False)
    assert proc.returncode == 3, proc.stderr
    written, seen = _steps_figure(proc.stderr)
    assert seen == 30 and written <= 15
    assert "holds only what was written before (the command exited 3)" in proc.stderr
    assert "run saved" not in proc.stderr


def test_a_disk_full_from_the_start_leaves_nothing_half_written(tiny_disk):
    """0 bytes free: one line at the time, the command still runs and keeps its exit code,
    and no empty run file or directory is left behind."""
    fill(tiny_disk / "filler")
    run = tiny_disk / "run"
    proc = subprocess.run(
        gpuprof_cmd("watch", "--no-nvml", "-o", str(run), "--",
                    sys.executable, "-c", "print('trained'); raise SystemExit(4)"),
        capture_output=True, env=clean_env(), text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 4, proc.stderr
    assert proc.stdout.strip() == "trained"
    assert "recording stopped at" in proc.stderr and "disk full" in proc.stderr, proc.stderr
    assert "nothing of the run is kept (the command exited 4)" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not run.exists(), list(run.iterdir())


def _read_only(mnt) -> None:
    remount = subprocess.run(["mount", "-o", "remount,ro", str(mnt)], capture_output=True)
    if remount.returncode != 0:
        pytest.skip("cannot remount read-only here")


def test_a_read_only_run_directory_is_said_and_the_command_still_runs(tiny_disk):
    """A run directory on a read-only file system (an existing empty directory, so creating
    it succeeds): one line naming the cause, the command runs and keeps its exit code.

    Turning a file system read-only under open files (ext4's errors=remount-ro) is the
    kernel's doing; `mount -o remount,ro` refuses while files are open for writing, so the
    mid-run case is covered by the reason check below on the same kind of mount."""
    run = tiny_disk / "run"
    run.mkdir()
    _read_only(tiny_disk)
    proc = subprocess.run(
        gpuprof_cmd("watch", "--no-nvml", "-o", str(run), "--",
                    sys.executable, "-c", "import gpuprof\nwith gpuprof.phase('rollout'): pass\n"
                    "gpuprof.step()\nraise SystemExit(5)"),
        capture_output=True, env=clean_env(), text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 5, proc.stderr
    assert "recording stopped at" in proc.stderr, proc.stderr
    assert "read-only file system" in proc.stderr, proc.stderr
    assert "nothing of the run is kept (the command exited 5)" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_failure_reasons_come_from_the_file_system_when_sqlite_says_nothing(tiny_disk):
    """SQLite's "unable to open database file" names no cause: the file system is asked."""
    import sqlite3

    vague = sqlite3.OperationalError("unable to open database file")
    fill(tiny_disk / "filler")
    assert store.failure_reason(vague, tiny_disk / "run.sqlite") == "disk full"
    assert store.failure_reason(vague, tiny_disk / "gone" / "run.sqlite") == (
        "run directory removed"
    )
    os.unlink(tiny_disk / "filler")
    _read_only(tiny_disk)
    assert store.failure_reason(vague, tiny_disk / "run.sqlite") == "read-only file system"
    assert store.failure_reason(OSError(30, "Read-only file system")) == "read-only file system"
