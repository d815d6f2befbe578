"""Python stacks of the watched processes, sampled from the watcher with py-spy.

py-spy (a sampling profiler in Rust, ``pip install py-spy``) reads another process's Python
stacks from its memory without touching it. The watcher runs one ``py-spy record`` per
sampled process, in rounds of up to `ROUND_S` seconds::

    py-spy record --pid PID --rate R --duration D --format chrometrace --output FILE \\
                  --nonblocking --idle --threads

- ``--nonblocking``: the process is never paused, so sampling adds nothing to the training's
  step (native frames need a paused process: py-spy refuses ``--native`` with it, so only
  Python frames are sampled);
- ``--idle``: every thread is recorded at every sample, idle or not, so each thread's
  timeline has no holes (whether it was busy or blocked comes from its scheduler times, read
  by the host collector, see `gpuprof.model.ThreadSample`: ``record`` marks no sample idle);
- ``--threads``: each stack starts with ``thread (TID): NAME``, the OS thread id and the
  Python thread's name;
- ``chrometrace``: begin/end events with their times, so a round of many seconds still gives
  the stacks of each second (the ``raw`` and ``speedscope`` formats sum a round up, or lose
  its times).

A round ends at its duration, when the process exits, or when the watcher interrupts it
(SIGINT: py-spy then writes what it has). Its file becomes rows of wall seconds per (window,
thread, stack) (`StackSample`, windows of `WINDOW_S`), with interned frames and stacks. The
rate is `RATE_HZ` per process while the GPUs work and `IDLE_RATE_HZ` while they idle (the
sampler's latest GPU readings say which): a round at the low rate is cut short when the
GPUs go idle. Only the main (unless a launcher) and trainer processes and those using CPU get
the idle rate, and all of them together at most `IDLE_BUDGET_HZ` samples a second. At most
`MAX_PROCESSES` processes are sampled at once, ranked by role (the main process, trainers,
data-loader workers, inference engines, others; a launcher such as torchrun, whose ranks do
the work, last). Each py-spy runs in a session of its own, so the command's signals never
reach it; one left behind by a watcher killed with SIGKILL ends with its round.

The GIL flag py-spy can filter on (``--gil``) is not recorded: in ``record`` mode it drops the
other samples instead of marking them, and the timelines need every sample.

On a Ray cluster the sampler actor of each other node (`gpuprof.integrations.ray_cluster.
sampler.NodeSampler`) runs one of these over its node's Ray workers, at the watcher's rates
(`RunMeta.stacks`); Ray's own processes (raylet, agents, idle pool workers: `Target.infra`),
py-spy itself and the sampling process are never sampled. A Ray worker's threads block
SIGINT, which a child inherits: py-spy is started with it unblocked, so SIGINT still ends a
round with its stacks written.

Where py-spy is missing, may not attach (no ptrace permission: a container without
``SYS_PTRACE``, ``kernel.yama.ptrace_scope``), or does not support the Python, one notice says
why and how to allow it, and the run goes on without stacks. A process that is not Python
(a shell, a launcher written in C) is left alone silently.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuprof.model import Event, Stack, StackFrame, StackSample
from gpuprof.nodes import now_ns

ENV_PYSPY = "GPUPROF_PYSPY"
"""Path of the py-spy executable to use (default: the one installed beside this Python, else
``py-spy`` on the ``PATH``)."""
RATE_HZ = 2
"""Samples per second per process while the GPUs work (what the ≤ 1%-of-a-core budget of the
watcher is measured at, docs/PERFORMANCE.md)."""
IDLE_RATE_HZ = 20
"""Samples per second per process while most GPUs idle (the time stacks explain), for the
main and trainer processes and those using CPU (`BUSY_PROCESS_CPU_PCT`), within
`IDLE_BUDGET_HZ`."""
IDLE_BUDGET_HZ = 50
"""Samples per second over all processes at the idle rate: the idle rate is shared out when
more processes want it (at 20 Hz, 2.5 of them)."""
BUSY_PROCESS_CPU_PCT = 5.0
"""A process using at least this percent of a core is sampled at the idle rate while the
GPUs idle (an idle loader worker stays at the low rate)."""
WINDOW_S = 1.0
"""Stack samples are summed per window of this many seconds (aligned on the epoch)."""
ROUND_S = 30
"""Longest round of one py-spy process (each start costs ~10 ms of CPU; a watcher killed
mid-round loses that round's stacks)."""
IDLE_ROUND_S = 10
"""Longest round at the idle rate (the rate falls back this long after the GPUs work again)."""
MIN_ROUND_S = 2.0
"""A round at the low rate runs at least this long before the GPUs going idle cuts it short."""
MAX_PROCESSES = 8
"""Processes sampled at once, by role (`ROLE_ORDER`), then oldest first."""
ROLE_ORDER = ("main", "trainer", "dataloader", "inference", "other")
IDLE_UTIL_PCT = 10.0
"""A GPU reading below this utilisation is idle (`Thresholds.idle_util_pct`)."""
POLL_S = 0.5
"""How often the sampler looks at its rounds, the processes and the GPUs' state."""
STOP_WAIT_S = 5.0
"""How long `StackSampler.stop` waits for each py-spy to write its round after SIGINT."""
NON_PYTHON_NAMES = frozenset({
    "sh", "bash", "dash", "zsh", "fish", "tee", "sleep", "env", "timeout", "time", "raylet",
    "gcs_server", "srun", "mpirun", "orted", "nvidia-smi", "ninja", "cc1", "cc1plus", "gcc",
    "ld", "make", "git", "ssh", "py-spy",
})  # fmt: skip
"""Process names never given to py-spy (anything else is tried once)."""

_THREAD_FRAME = re.compile(r"^thread \(([^)]*)\)(?::\s?(.*))?$", re.DOTALL)
_MASK63 = (1 << 63) - 1


def frame_id(name: str, file: str, line: int | None) -> int:
    """The interned id of a frame: 63 bits of a hash of its name, file and line, the same in
    every process and run (so files of several hosts merge by id)."""
    text = f"{name}\0{file}\0{'' if line is None else int(line)}".encode("utf-8", "replace")
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & _MASK63


def stack_id(frame_ids: Sequence[int]) -> int:
    """The interned id of a stack (its frame ids, outermost first)."""
    text = " ".join(map(str, frame_ids)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & _MASK63


def find_pyspy() -> tuple[str | None, str | None]:
    """(path of the py-spy executable, None) or (None, why it is not there).

    `ENV_PYSPY` when set; else ``py-spy`` beside this Python (where ``pip install`` puts it;
    a pyenv shim on the PATH would cost a shell per round); else the ``PATH``'s.
    """
    given = os.environ.get(ENV_PYSPY)
    if given:
        if os.path.isfile(given) and os.access(given, os.X_OK):
            return given, None
        return None, f"py-spy not found at {given} ({ENV_PYSPY})"
    candidates = [os.path.join(sysconfig.get_path("scripts") or "", "py-spy"),
                  os.path.join(os.path.dirname(sys.executable), "py-spy")]  # fmt: skip
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path, None
    found = shutil.which("py-spy")
    if found:
        return found, None
    return None, "py-spy not found (pip install 'gpuprof[stacks]', or pip install py-spy)"


@dataclass(frozen=True)
class Target:
    """A watched process the host collector offers for sampling."""

    pid: int
    role: str
    name: str
    start_s: float = 0.0
    """When it started (seconds since the epoch): among equal roles, older processes first."""
    cpu_pct: float | None = None
    """Its CPU at the host collector's last sample, percent of one core."""
    launcher: bool = False
    """A launcher (torchrun, deepspeed, accelerate…) whose ranks do the work: sampled last."""
    infra: bool = False
    """Ray's own machinery (raylet, dashboard and agents, idle pool workers): not sampled."""

    @property
    def wants_idle_rate(self) -> bool:
        """Worth the idle rate while the GPUs idle: the driver (not a launcher), a trainer,
        or busy."""
        driver = self.role == "trainer" or (self.role == "main" and not self.launcher)
        return driver or (self.cpu_pct or 0.0) >= BUSY_PROCESS_CPU_PCT


# --------------------------------------------------------------------------------------------
# py-spy's chrometrace output → seconds per (window, thread, stack)

Frame = tuple[str, str, int | None]
"""(function name, file, line) as py-spy names them."""


Key = tuple[int, int | None, str, tuple[Frame, ...]]
"""(window start ns, OS thread id, thread name, frames outermost first)."""


@dataclass
class Parsed:
    """One round's stacks: per `Key`, [wall seconds, first seen ns, last seen end ns]."""

    seconds: dict[Key, list] = field(default_factory=dict)
    threads: int = 0


def parse_chrometrace(events: Iterable[dict[str, Any]], start_ns: int,
                      window_ns: int) -> Parsed:  # fmt: skip
    """Seconds per (window, thread, stack) from the events of ``py-spy record --format
    chrometrace --idle --threads``: ``ts`` is in µs since the recording started
    (``start_ns``); per Python thread (``tid``), each sample's ``E`` events close the frames
    that left the stack (innermost first) and its ``B`` events open the new ones (outermost
    first), all at the sample's time; at the end every open frame is closed. A stack lasts
    from the sample that showed it to the thread's next change."""
    out = Parsed()
    open_frames: dict[Any, list[Frame]] = {}
    since: dict[Any, tuple[int, tuple[Frame, ...]]] = {}
    events = list(events)
    n, i = len(events), 0
    while i < n:
        tid, ts = events[i].get("tid"), events[i].get("ts")
        stack = open_frames.setdefault(tid, [])
        while i < n and events[i].get("tid") == tid and events[i].get("ts") == ts:
            event = events[i]
            if event.get("ph") == "B":
                args = event.get("args") or {}
                line = args.get("line")
                stack.append((str(event.get("name", "")), str(args.get("filename") or ""),
                              int(line) if isinstance(line, int) else None))  # fmt: skip
            elif event.get("ph") == "E" and stack:
                stack.pop()
            i += 1
        if not isinstance(ts, int | float):
            continue
        t_ns = start_ns + int(ts * 1000)
        if tid in since:
            _add(out, since[tid][0], t_ns, since[tid][1], window_ns)
        since[tid] = (t_ns, tuple(stack))
    out.threads = len(open_frames)
    return out


def _add(out: Parsed, t0: int, t1: int, stack: tuple[Frame, ...], window_ns: int) -> None:
    """Add [t0, t1) in ``stack`` to the windows it covers."""
    if t1 <= t0 or not stack:
        return
    os_tid, thread, frames = None, "", stack
    match = _THREAD_FRAME.match(stack[0][0]) if not stack[0][1] else None
    if match:
        raw = match.group(1)
        os_tid = int(raw) if raw.isdigit() else None
        thread, frames = (match.group(2) or "").strip(), stack[1:]
    if not frames:
        return
    t = t0
    while t < t1:
        w = t - t % window_ns
        end = min(t1, w + window_ns)
        key = (w, os_tid, thread, frames)
        got = out.seconds.get(key)
        if got is None:
            out.seconds[key] = [(end - t) / 1e9, t, end]
        else:
            got[0] += (end - t) / 1e9
            got[2] = end
        t = end


# --------------------------------------------------------------------------------------------
# The rounds


@dataclass
class _Round:
    target: Target
    rate_hz: int
    proc: subprocess.Popen
    out_path: str
    log_path: str
    started_ns: int
    started_s: float
    idle: bool
    interrupted: bool = False


def _signal(rnd: _Round, signum: int) -> None:
    """Send ``signum`` to a round's py-spy unless it has been reaped. Not `Popen.send_signal`:
    that polls first, and a py-spy that had just exited would be reaped there, its CPU time
    (what `_reap` adds up from ``wait4``) lost. Unreaped, its pid cannot have been reused."""
    if rnd.proc.returncode is None:
        with contextlib.suppress(OSError):
            os.kill(rnd.proc.pid, signum)


class StackSampler:
    """Samples the Python stacks of the processes ``targets()`` offers into ``writer``.

    ``gpu_idle()`` says whether the GPUs idle now (None: no GPU readings). ``notify(line)``
    prints a notice as it happens. After `stop`, ``notices`` holds what the run should say,
    and ``pyspy_cpu_s`` / ``cpu_s`` what sampling cost (py-spy processes; this thread).
    """

    def __init__(
        self,
        writer: Any,
        host: str,
        targets: Callable[[], list[Target]],
        gpu_idle: Callable[[], bool | None] = lambda: None,
        *,
        pyspy: str,
        rate_hz: int = RATE_HZ,
        idle_rate_hz: int = IDLE_RATE_HZ,
        idle_budget_hz: int = IDLE_BUDGET_HZ,
        window_s: float = WINDOW_S,
        round_s: int = ROUND_S,
        idle_round_s: int = IDLE_ROUND_S,
        max_processes: int = MAX_PROCESSES,
        notify: Callable[[str], None] | None = None,
    ) -> None:
        self.writer = writer
        self.host = host
        self.targets = targets
        self.gpu_idle = gpu_idle
        self.pyspy = pyspy
        self.rate_hz = max(1, int(rate_hz))
        self.idle_rate_hz = max(self.rate_hz, int(idle_rate_hz))
        self.idle_budget_hz = max(self.idle_rate_hz, int(idle_budget_hz))
        self.window_ns = max(1, int(window_s * 1e9))
        self.window_s = window_s
        self.round_s = max(1, int(round_s))
        self.idle_round_s = max(1, int(idle_round_s))
        self.max_processes = max_processes
        self.notify = notify or (lambda line: None)
        self.notices: list[str] = []
        self.rounds = 0
        self.rows = 0
        self.pyspy_cpu_s = 0.0
        self.cpu_s = 0.0
        self.processes: set[int] = set()
        self._running: dict[int, _Round] = {}
        self._excluded: set[int] = set()
        self._failures: dict[int, int] = {}
        self._said: set[str] = set()
        self._frames: set[int] = set()
        self._stacks: set[int] = set()
        self._tmp = tempfile.mkdtemp(prefix="gpuprof-stacks-")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuprof-stacks", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End every round (py-spy writes what it has), store it, and stop."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=STOP_WAIT_S * 2 + 5)
        shutil.rmtree(self._tmp, ignore_errors=True)

    def cost_event(self) -> Event:
        """What sampling cost and did, as an event of the run (kind ``collector``)."""
        attrs = {
            "pyspy_cpu_s": round(self.pyspy_cpu_s, 4),
            "thread_cpu_s": round(self.cpu_s, 4),
            "rounds": self.rounds,
            "processes": len(self.processes),
            "rows": self.rows,
            "rate_hz": self.rate_hz,
            "idle_rate_hz": self.idle_rate_hz,
            "window_s": self.window_s,
        }
        return Event(self.host, os.getpid(), None, now_ns(), "collector", "stacks", attrs)

    # -- the loop ----------------------------------------------------------------------------

    def _run(self) -> None:
        cpu0 = time.thread_time()
        try:
            while not self._stop.is_set():
                try:
                    self._tick()
                except Exception as exc:  # sampling must never end the watch
                    self._say(f"Python stacks: sampling failed ({type(exc).__name__}: {exc})")
                self._stop.wait(POLL_S)
            self._finish_all()
        finally:
            self.cpu_s = time.thread_time() - cpu0

    def _tick(self) -> None:
        for pid, rnd in list(self._running.items()):
            if self._reap(rnd, block=False):
                self._done(pid)
        idle = bool(self.gpu_idle())
        wanted = self._choose()
        boosted = [t for t in wanted if idle and t.wants_idle_rate]
        idle_rate = self.idle_rate_for(len(boosted))
        now_s = time.monotonic()
        for target in wanted:
            boost = idle and target.wants_idle_rate and idle_rate > self.rate_hz
            rnd = self._running.get(target.pid)
            if rnd is None:
                self._begin(target, boost, idle_rate)
            elif boost and not rnd.idle and not rnd.interrupted and (
                    now_s - rnd.started_s >= MIN_ROUND_S):  # fmt: skip
                rnd.interrupted = True  # the GPUs went idle: restart at the idle rate
                _signal(rnd, signal.SIGINT)

    def idle_rate_for(self, processes: int) -> int:
        """The idle rate of each of ``processes`` processes wanting it: `idle_rate_hz`,
        shared out within ``idle_budget_hz``, never below the low rate."""
        share = self.idle_budget_hz // max(1, processes)
        return max(self.rate_hz, min(self.idle_rate_hz, share))

    def _choose(self) -> list[Target]:
        """The processes to sample now: by role, then oldest first, at most
        ``max_processes`` (those already sampled keep their place)."""
        me = os.getpid()  # a Ray node's sampler is a Ray worker in the tree it watches
        offered = [t for t in self.targets() if t.pid not in self._excluded and t.pid != me]
        offered = [t for t in offered if t.name not in NON_PYTHON_NAMES and not t.infra]
        rank = {role: i for i, role in enumerate(ROLE_ORDER)}
        offered.sort(key=lambda t: (t.pid not in self._running, t.launcher,
                                    rank.get(t.role, len(rank)), t.start_s, t.pid))  # fmt: skip
        return offered[: self.max_processes]

    def _begin(self, target: Target, idle: bool, idle_rate: int) -> None:
        rate = idle_rate if idle else self.rate_hz
        duration = self.idle_round_s if idle else self.round_s
        stem = os.path.join(self._tmp, f"{target.pid}-{self.rounds}")
        out_path, log_path = stem + ".json", stem + ".log"
        cmd = [self.pyspy, "record", "--pid", str(target.pid), "--rate", str(rate),
               "--duration", str(duration), "--format", "chrometrace", "--output", out_path,
               "--nonblocking", "--idle", "--threads"]  # fmt: skip
        started_ns, started_s = now_ns(), time.monotonic()
        try:
            with open(log_path, "wb") as log, _sigint_unblocked():
                proc = subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,  # the command's signals are not py-spy's
                )  # fmt: skip
        except OSError as exc:
            self._say(f"Python stacks: py-spy could not start ({exc.strerror or exc}): the run "
                      "goes on without stacks")  # fmt: skip
            self._excluded.add(target.pid)
            return
        self.rounds += 1
        self._running[target.pid] = _Round(target, rate, proc, out_path, log_path, started_ns,
                                           started_s, idle)  # fmt: skip

    def _reap(self, rnd: _Round, block: bool) -> bool:
        """Collect a finished py-spy's exit status and CPU time (True once it has exited)."""
        if rnd.proc.returncode is not None:
            return True
        try:
            pid, status, usage = os.wait4(rnd.proc.pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            rnd.proc.returncode = rnd.proc.returncode if rnd.proc.returncode is not None else -1
            return True
        if pid == 0:
            return False
        rnd.proc.returncode = os.waitstatus_to_exitcode(status)
        self.pyspy_cpu_s += usage.ru_utime + usage.ru_stime
        return True

    def _done(self, pid: int) -> None:
        rnd = self._running.pop(pid)
        self._reap(rnd, block=True)
        try:
            self._store(rnd)
        finally:
            for path in (rnd.out_path, rnd.log_path):
                with contextlib.suppress(OSError):
                    os.unlink(path)

    def _store(self, rnd: _Round) -> None:
        events = None
        with contextlib.suppress(OSError, ValueError), open(rnd.out_path, "rb") as handle:
            events = json.load(handle)
        if not isinstance(events, list):
            self._failed(rnd)
            return
        self._failures.pop(rnd.target.pid, None)
        self.processes.add(rnd.target.pid)
        parsed = parse_chrometrace(events, rnd.started_ns, self.window_ns)
        frames_out, stacks_out, samples = [], [], []
        for (_, tid, thread, frames), (seconds, first, last) in parsed.seconds.items():
            ids = []
            for name, file, line in frames:
                fid = frame_id(name, file, line)
                if fid not in self._frames:
                    self._frames.add(fid)
                    frames_out.append(StackFrame(fid, name, file, line))
                ids.append(fid)
            sid = stack_id(ids)
            if sid not in self._stacks:
                self._stacks.add(sid)
                stacks_out.append(Stack(sid, " ".join(map(str, ids))))
            samples.append(StackSample(self.host, first, round((last - first) / 1e9, 6),
                                       self.window_s, rnd.target.pid, tid, thread,
                                       rnd.target.role, sid, round(seconds, 6),
                                       float(rnd.rate_hz)))  # fmt: skip
        self.writer.add_records("stack_frames", frames_out)
        self.writer.add_records("stacks", stacks_out)
        self.writer.add_records("stack_samples", samples)
        self.rows += len(samples)

    def _failed(self, rnd: _Round) -> None:
        """A round without output: say why once, and leave a process py-spy can't read."""
        pid, name = rnd.target.pid, rnd.target.name
        try:
            text = Path(rnd.log_path).read_text(errors="replace")
        except OSError:
            text = ""
        cut = rnd.interrupted or self._stop.is_set()
        if cut and (not text.strip() or "Control-C" in text or "process exited" in text):
            return  # cut before its first sample: nothing lost
        why = pyspy_failure(text)
        if why in ("not_python", "gone"):
            self._excluded.add(pid)
            return
        if why == "permission":
            self._excluded.add(pid)
            self._say(
                f"Python stacks: py-spy may not read process {pid} ({name}): permission denied "
                "(ptrace). Allow it with `--cap-add SYS_PTRACE` (Docker; Kubernetes: "
                "securityContext.capabilities.add [SYS_PTRACE]) or `sysctl "
                "kernel.yama.ptrace_scope=0`; the run goes on without its stacks",
                key="permission",
            )
            return
        if why == "unsupported":
            self._excluded.add(pid)
            self._say(f"Python stacks: py-spy does not support the Python of process {pid} "
                      f"({name}): {_first_error(text)}; the run goes on without its stacks",
                      key="unsupported")  # fmt: skip
            return
        self._failures[pid] = self._failures.get(pid, 0) + 1
        if self._failures[pid] >= 3:
            self._excluded.add(pid)
            self._say(f"Python stacks: py-spy failed on process {pid} ({name}): "
                      f"{_first_error(text) or f'exit code {rnd.proc.returncode}'}; the run "
                      "goes on without its stacks", key=f"failed:{pid}")  # fmt: skip

    def _finish_all(self) -> None:
        for rnd in self._running.values():
            rnd.interrupted = True
            _signal(rnd, signal.SIGINT)
        deadline = time.monotonic() + STOP_WAIT_S
        for pid, rnd in list(self._running.items()):
            while not self._reap(rnd, block=False) and time.monotonic() < deadline:
                time.sleep(0.02)
            if rnd.proc.returncode is None:  # stuck: its round is lost
                _signal(rnd, signal.SIGKILL)
                self._say(f"Python stacks: py-spy did not stop within {STOP_WAIT_S:g} s of "
                          f"SIGINT: the last {self.round_s} s of stacks of process "
                          f"{rnd.target.pid} ({rnd.target.name}) at most are lost",
                          key="stuck")  # fmt: skip
            try:
                self._done(pid)
            except Exception as exc:
                self._say(f"Python stacks: a round was lost ({type(exc).__name__}: {exc})")

    def _say(self, line: str, key: str | None = None) -> None:
        key = key or line
        if key in self._said:
            return
        self._said.add(key)
        self.notices.append(line)
        self.notify(line)


@contextlib.contextmanager
def _sigint_unblocked():
    """SIGINT unblocked in this thread while py-spy is started: a child inherits the
    starting thread's signal mask, and a Ray worker's threads block SIGINT, which py-spy is
    stopped with (it then writes its round)."""
    try:
        old = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    except (AttributeError, OSError, ValueError):
        old = None
    try:
        yield
    finally:
        if old is not None and signal.SIGINT in old:
            with contextlib.suppress(OSError, ValueError):
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def pyspy_failure(text: str) -> str:
    """What a py-spy error says: ``permission``, ``not_python``, ``unsupported``, ``gone`` or
    ``other``."""
    low = text.lower()
    if "permission denied" in low or "operation not permitted" in low or "os error 1)" in low:
        return "permission"
    if "unsupported version of python" in low:
        return "unsupported"
    if "failed to find python version" in low or "not a python" in low:
        return "not_python"
    if "no such file or directory" in low or "no such process" in low or "os error 3)" in low:
        return "gone"
    return "other"


def _first_error(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("Error:"):
            return line[len("Error:") :].strip()[:200]
    return ""


def gpus_idle(samples: Sequence[Any], idle_util_pct: float = IDLE_UTIL_PCT) -> bool | None:
    """Whether most GPUs read idle in one tick's samples (None: no utilisation reading)."""
    utils = [s.util_gpu_pct for s in samples if getattr(s, "util_gpu_pct", None) is not None]
    if not utils:
        return None
    return sum(u < idle_util_pct for u in utils) * 2 >= len(utils)
