"""Wall time, CPU and peak memory of the measured process alone, for the benchmarks.

Linux carries a process's peak RSS across ``exec``: the ``ru_maxrss`` that ``wait4`` and
``getrusage`` report for a child starts at the RSS of the process it was forked from. A
benchmark that simulated a 1.5 GB run and then starts ``gpuprof analyze`` would report at least
1.5 GB as the analysis's peak, whatever the analysis used (issue 22: 5 800 MB reported where
``analyze`` alone peaked at 1.2 GB). Two honest ways, both here:

- `run`: start the command from a *spawner*, a fresh ``python -S`` that only starts the
  command, waits for it (``wait4``) and reports its wall time, CPU and ``ru_maxrss``. The
  spawner's own memory (~10 MB) is the floor the command inherits, whatever size the
  benchmark process has grown to; the figure covers the command and the children it waited for
  (the largest of them, not their sum). ``poll=True`` also samples the total RSS of the
  command's whole process tree every 0.1 s, for commands that run several processes at once.
- `hwm_bytes` / `reset_hwm`: a process's own high-water mark (``VmHWM`` of
  /proc/self/status, which ``exec`` starts afresh) and resetting it to the current RSS
  (``/proc/self/clear_refs``), to measure one step of a process that did others first
  (e.g. the diagnosis of a run the same process simulated).

Import it from a benchmark with ``sys.path.insert(0, str(Path(__file__).parent))``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

SPAWNER = """
import json, os, sys, time
t0 = time.perf_counter()
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)
_, status, ru = os.wait4(pid, 0)
wall = time.perf_counter() - t0
with open(sys.argv[1], "w") as f:
    json.dump({"wall_s": wall, "user_s": ru.ru_utime, "sys_s": ru.ru_stime,
               "peak_rss_bytes": ru.ru_maxrss * 1024,
               "returncode": os.waitstatus_to_exitcode(status)}, f)
"""
"""Start ``argv[2:]``, wait for it, write its figures to ``argv[1]`` (run with ``python -S``)."""


def run(
    argv: list[str],
    *,
    cwd: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
    check: bool = True,
    poll: bool = False,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Run ``argv`` from a fresh spawner; its figures and output.

    Returns ``wall_s``, ``user_s``, ``sys_s``, ``peak_rss_bytes`` (the command's own
    high-water mark; see the module docstring), ``returncode``, ``stdout`` and ``stderr``
    (bytes), and with ``poll`` ``tree_rss_bytes``: the largest total RSS of the command and
    its descendants seen at 0.1 s intervals, and ``tree_pss_bytes``: the largest total PSS
    (each page shared by forked processes counted once over all of them, not once in each).
    ``check``: raise `RuntimeError` (with the end of stderr) when the command fails.
    """
    with tempfile.TemporaryDirectory(prefix="gpuprof-measure-") as tmp:
        report = Path(tmp) / "figures.json"
        spawner = [sys.executable, "-S", "-c", SPAWNER, str(report), *argv]
        proc = subprocess.Popen(
            spawner, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env
        )
        peak, done = [0, 0], threading.Event()
        poller = None
        if poll:
            poller = threading.Thread(target=_poll_tree, args=(proc.pid, peak, done), daemon=True)
            poller.start()
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            done.set()
            if poller is not None:
                poller.join()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if not report.exists():
            raise RuntimeError(f"{argv[0]}: no figures (spawner: {err.decode()[-2000:]})")
        figures = json.loads(report.read_text())
    figures.update(stdout=out, stderr=err)
    if poll:
        figures["tree_rss_bytes"], figures["tree_pss_bytes"] = peak
    if check and figures["returncode"] != 0:
        raise RuntimeError(
            f"{' '.join(map(str, argv[:4]))} failed ({figures['returncode']}): "
            f"{err.decode(errors='replace')[-2000:]}"
        )
    return figures


def _poll_tree(spawner_pid: int, peak: list[int], done: threading.Event) -> None:
    """The largest total RSS and PSS of the spawner's descendants (not the spawner), every
    0.1 s, into ``peak``."""
    import psutil

    with contextlib.suppress(psutil.Error):
        root = psutil.Process(spawner_pid)
        while not done.wait(0.1):
            rss = pss = 0
            for proc in root.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    full = proc.memory_full_info()  # smaps_rollup: cheap on Linux
                    rss += full.rss
                    pss += full.pss
            peak[0], peak[1] = max(peak[0], rss), max(peak[1], pss)


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def rss_bytes() -> int:
    """This process's resident set size now (``VmRSS``)."""
    return _status_kb("VmRSS") * 1024


def hwm_bytes() -> int:
    """This process's peak resident set size since it started (or since `reset_hwm`):
    ``VmHWM``, which ``exec`` starts afresh, unlike ``ru_maxrss``."""
    return _status_kb("VmHWM") * 1024


def reset_hwm() -> bool:
    """Set this process's high-water mark to its current RSS (Linux ≥ 4.0); False when the
    kernel does not allow it (then `hwm_bytes` keeps counting from the start)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def mb(n: float) -> str:
    """Bytes as whole megabytes (2**20)."""
    return f"{n / 2**20:,.0f}"


if __name__ == "__main__":  # a check: a 1 GB parent, a small child
    blob = bytearray(1 << 30)  # the parent holds 1 GiB
    blob[::4096] = b"x" * len(blob[::4096])
    child = [sys.executable, "-c", "x = bytearray(200 << 20); x[::4096] = b'y' * len(x[::4096])"]
    r = run(child)
    subprocess.run(child, check=True)  # straight from this process: RUSAGE_CHILDREN
    import resource

    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    print(f"parent {mb(rss_bytes())} MB; the child (200 MB): through the spawner "
          f"{mb(r['peak_rss_bytes'])} MB, straight from this process {mb(kids)} MB")  # fmt: skip
