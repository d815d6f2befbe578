"""Host collector: system CPU and memory, and the watched process tree, read with psutil.

`HostCollector.sample` is called about ten times a second by the watcher process, so it is
kept cheap: `psutil.Process` objects are cached between calls, each process is read inside
`Process.oneshot()`, and the tree (``children(recursive=True)``) plus every process's command
line and role are refreshed only every ``tree_refresh_s`` seconds (a process caught between
``exec`` and its arguments sooner: see the end of Roles).

Roles
-----
`classify_role` gives each watched process one of ``main``, ``trainer``, ``dataloader``,
``inference`` or ``other``. It looks only at the process's command line (which is where
``setproctitle`` titles show up), its name and its parent's command line — never at the
environment, which gpuprof neither stores nor depends on. The first rule that matches wins:

1. ``main`` — the root of the tree, the command ``gpuprof watch`` runs. A launcher root
   (``torchrun``, ``python -m torch.distributed.run``/``.launch``, ``deepspeed``,
   ``accelerate launch``, the ``ray`` CLI, ms-swift's ``swift`` CLI) is ``main`` too.
   ``python -m verl.trainer.main_ppo`` is not a launcher: it is the driver and is ``main``.
2. ``other`` — Ray infrastructure: ``raylet``, ``gcs_server``, the dashboard and its agent,
   ``log_monitor``, the autoscaler monitor, idle pool workers (``ray::IDLE``, spill/restore
   I/O workers, ``default_worker.py`` before it takes an actor's title), Ray's own actors
   and agents (``ray::JobSupervisor``, ``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``,
   names starting with ``_``); and multiprocessing's resource tracker
   (``-c from multiprocessing.resource_tracker import main``).
3. ``inference`` — vLLM and SGLang engines and the RL frameworks' rollout servers:
   vLLM v1 titles its processes ``VLLM::EngineCore`` / ``VLLM::EngineCore_DP<n>`` and its
   workers ``VLLM::Worker_TP<n>…`` (the ``VLLM`` prefix is configurable, so ``EngineCore``
   alone also counts); SGLang titles ``sglang::scheduler``, ``sglang::scheduler_TP<n>``,
   ``sglang::detokenizer``…; servers started as programs (``vllm serve``,
   ``python -m vllm.entrypoints…``, ``python -m sglang.launch_server``, ``trl vllm-serve``,
   ms-swift's ``swift rollout`` / ``swift deploy``); Ray actors whose class mentions vLLM,
   SGLang or rollout (verl's ``ray::vLLMHttpServer``, ``ray::AsyncvLLMServer``,
   ``ray::SGLangHttpServer``; OpenRLHF's ``ray::LLMRayActor``; vLLM's ``ray::RayWorkerWrapper``).
   Only the program (its title, executable, ``-m`` module, script or subcommand) is looked
   at, not its arguments: a trainer started with ``--use_vllm`` is not an inference engine.
4. ``dataloader`` — a fork of its parent: the same command line as the parent (torch
   DataLoader workers under the ``fork`` start method), or the same Ray actor class when
   a Ray worker forks.
5. ``trainer`` — a Ray actor of a training framework: verl's ``ray::WorkerDict…`` (its
   colocated actor/rollout/ref worker, whose title changes with the method it runs, e.g.
   ``ray::WorkerDict.actor_rollout_generate_sequences``) and ``ray::TaskRunner`` (verl's
   single controller, which runs the training loop), OpenRLHF's ``ray::PolicyModelActor``
   and other ``…Actor…``, ``…Critic…``, ``…Trainer…``, ``…Learner…`` classes.
6. ``other`` — a launcher that is not the root (deepspeed's per-node
   ``deepspeed.launcher.launch``, a ``torchrun`` started by a shell script).
7. ``trainer`` — a Python process whose parent is a launcher (or any process, when the
   launcher was given ``--no-python``): the ranks started by torchrun, deepspeed,
   accelerate or ms-swift.
8. ``dataloader`` — a process running multiprocessing's ``spawn`` or ``forkserver``
   machinery (``-c from multiprocessing.spawn import spawn_main … --multiprocessing-fork``,
   ``-c from multiprocessing.forkserver import main``): DataLoader workers under those start
   methods. A vLLM engine is such a process until it sets its title, so it reads
   ``dataloader`` until the next tree refresh after that.
9. ``other`` — everything else (shells, reward sandboxes, compilers…).

A process caught between ``exec`` and its new arguments has no command line yet: the kernel
swaps in the new executable and closes the close-on-exec files (which is when the parent's
``subprocess.Popen`` returns, its rank's pid in hand) before it lays out the arguments, and on
a loaded machine the process may wait tens of milliseconds for a core in between. Such a
process is classified from its executable alone (a Python rank of a launcher reads
``trainer``, as it will with its arguments), and its command line, name and role are read
again at every `HostCollector.sample` until the arguments are there, not only at the next
tree refresh.

Known limits: ``torch.multiprocessing.spawn`` ranks look exactly like spawned DataLoader
workers and read ``dataloader``; Ray worker processes that are not descendants of the watched
command (a cluster started with ``ray start`` outside it) are not watched at all.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import psutil

from gpuprof.model import HostSample, ProcSample, ThreadSample

__all__ = ["HostCollector", "classify_role", "is_launcher", "read_threads"]

NAME_MAX_CHARS = 64
"""`ProcSample.name` is the psutil process name cut to this many characters."""
THREAD_MIN_PROCESS_CPU_PCT = 5.0
"""Threads are read only of processes that used at least this percent of a core since their
previous sample: an idler process's threads were all idle, and a busy trainer has dozens."""
THREAD_MIN_CPU_PCT = 1.0
"""A thread below this percent of a core over an interval is not recorded (it was idle)."""
THREAD_NAMES_S = 10.0
"""Thread names are read again this often (a thread may rename itself after it starts)."""
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

_PYTHON_RE = re.compile(r"^(python|pypy)[0-9.]*[dmw]?$")
# Interpreter options that consume the next argument; anything else before the script is a flag.
_PYTHON_OPTS_WITH_VALUE = {"-W", "-X", "-Q", "--check-hash-based-pycs"}

_TORCH_LAUNCHER_MODULES = {"torch.distributed.run", "torch.distributed.launch"}
_DEEPSPEED_LAUNCHER_MODULES = {"deepspeed.launcher.runner", "deepspeed.launcher.launch"}
_ACCELERATE_LAUNCH_MODULES = {"accelerate.commands.launch"}
_ACCELERATE_CLI_MODULES = {"accelerate.commands.accelerate_cli"}
_NO_PYTHON_FLAGS = {"--no-python", "--no_python"}

_RAY_INFRA_NAMES = {"raylet", "gcs_server"}
# Script paths of Ray's own Python daemons (dashboard, agents, log monitor, autoscaler monitor,
# idle default_worker.py) and its client server.
_RAY_INFRA_PATH_RE = re.compile(r"/ray/(_private|dashboard|autoscaler|core|util/client)/")
_RAY_INFRA_CLASS_RE = re.compile(
    r"^(IDLE|_|JobSupervisor$|DashboardAgent$|RuntimeEnvAgent$)|(Spill|Restore|Delete)Worker"
)
_RAY_INFERENCE_CLASS_RE = re.compile(
    r"vllm|sglang|rollout|enginecore|LLMRayActor|RayWorkerWrapper", re.IGNORECASE
)
_RAY_TRAINER_CLASS_RE = re.compile(r"WorkerDict|TaskRunner|Actor|Critic|Trainer|Learner")
_INFERENCE_WORD_RE = re.compile(r"vllm|sglang|enginecore", re.IGNORECASE)
_SWIFT_INFERENCE_RE = re.compile(r"(^|[/.])swift[/.]cli[/.](rollout|deploy)(\.py)?$")
_SWIFT_INFERENCE_SUBCOMMANDS = {"rollout", "deploy"}


class _Program(NamedTuple):
    """What a command line runs, as far as the role rules care."""

    kind: str
    """``exec`` (a program or a process title), ``module`` (``python -m``), ``script``
    (``python path``), ``code`` (``python -c``) or ``python`` (a bare interpreter)."""
    program: str
    """Executable or title for ``exec``, module for ``module``, script stem for ``script``,
    the code for ``code``."""
    path: str
    """argv[0] for ``exec``, the script path for ``script``, else empty."""
    args: list[str]
    """The arguments after the program."""


def _parse(cmdline: list[str]) -> _Program:
    if not cmdline:
        return _Program("exec", "", "", [])
    argv0 = cmdline[0]
    base = os.path.basename(argv0)
    if not _PYTHON_RE.match(base):
        return _Program("exec", base, argv0, cmdline[1:])
    i = 1
    while i < len(cmdline):
        arg = cmdline[i]
        if arg in ("-m", "-c"):
            value = cmdline[i + 1] if i + 1 < len(cmdline) else ""
            kind = "module" if arg == "-m" else "code"
            return _Program(kind, value, "", cmdline[i + 2 :])
        if arg.startswith("-m") and len(arg) > 2:
            return _Program("module", arg[2:], "", cmdline[i + 1 :])
        if arg.startswith("-c") and len(arg) > 2:
            return _Program("code", arg[2:], "", cmdline[i + 1 :])
        if arg == "-" or not arg.startswith("-"):
            stem = os.path.basename(arg)
            stem = stem[:-3] if stem.endswith(".py") else stem
            return _Program("script", stem, arg, cmdline[i + 1 :])
        i += 2 if arg in _PYTHON_OPTS_WITH_VALUE else 1
    return _Program("python", base, "", [])


def _subcommand(prog: _Program) -> str:
    """The first argument after the program when it is not an option (``launch``, ``serve``)."""
    if prog.args and not prog.args[0].startswith("-"):
        return prog.args[0]
    return ""


def _ray_class(cmdline: list[str]) -> str | None:
    """The actor (or task) name in a Ray worker title ``ray::Class.method()``, else None."""
    if not cmdline or not cmdline[0].startswith("ray::"):
        return None
    return re.split(r"[.(\s]", cmdline[0][5:], maxsplit=1)[0]


def is_launcher(cmdline: list[str] | None) -> bool:
    """Whether a command line runs a distributed launcher whose children are training ranks.

    Launchers: ``torchrun``, ``python -m torch.distributed.run`` / ``torch.distributed.launch``,
    ``deepspeed`` (and its per-node ``deepspeed.launcher.launch``), ``accelerate launch``, the
    ``ray`` CLI and ms-swift's ``swift`` CLI (which runs the training script, through
    ``torchrun`` when ``NPROC_PER_NODE`` is set). A training driver such as
    ``python -m verl.trainer.main_ppo`` is not one.
    """
    if not cmdline:
        return False
    prog = _parse(cmdline)
    name = prog.program
    if prog.kind in ("exec", "script"):
        if name in ("torchrun", "deepspeed", "ray", "swift", "accelerate-launch"):
            return True
        return name == "accelerate" and _subcommand(prog) == "launch"
    if prog.kind == "module":
        if name in _TORCH_LAUNCHER_MODULES | _DEEPSPEED_LAUNCHER_MODULES:
            return True
        if name in _ACCELERATE_LAUNCH_MODULES or name in ("ray.scripts.scripts", "swift.cli.main"):
            return True
        return name in _ACCELERATE_CLI_MODULES and _subcommand(prog) == "launch"
    return False


def _is_python(cmdline: list[str]) -> bool:
    return bool(cmdline) and bool(_PYTHON_RE.match(os.path.basename(cmdline[0])))


def _is_ray_infrastructure(cmdline: list[str], name: str, prog: _Program) -> bool:
    ray_class = _ray_class(cmdline)
    if ray_class is not None:
        return bool(_RAY_INFRA_CLASS_RE.search(ray_class))
    if name in _RAY_INFRA_NAMES or prog.program in _RAY_INFRA_NAMES:
        return True
    if prog.kind == "script" and _RAY_INFRA_PATH_RE.search(prog.path):
        return True
    return prog.kind == "module" and prog.program.startswith("ray.") and not is_launcher(cmdline)


def _is_inference(cmdline: list[str], name: str, prog: _Program) -> bool:
    ray_class = _ray_class(cmdline)
    if ray_class is not None:
        # Only the class: the method part of a title changes with each call.
        return bool(_RAY_INFERENCE_CLASS_RE.search(ray_class))
    if name and _INFERENCE_WORD_RE.search(name):
        return True
    if prog.kind in ("exec", "module", "script"):
        # Names only, not directories: a script in ~/vllm-experiments/ is not an engine.
        if _INFERENCE_WORD_RE.search(prog.program):
            return True
        sub = _subcommand(prog)
        if sub and _INFERENCE_WORD_RE.search(sub):  # trl vllm-serve
            return True
        if prog.program == "swift" and sub in _SWIFT_INFERENCE_SUBCOMMANDS:
            return True
        target = prog.path if prog.kind == "script" else prog.program
        return bool(_SWIFT_INFERENCE_RE.search(target))
    return False


def _is_fork(cmdline: list[str], parent_cmdline: list[str] | None) -> bool:
    if not cmdline or not parent_cmdline:
        return False
    if cmdline == parent_cmdline:
        return True
    ray_class = _ray_class(cmdline)
    return ray_class is not None and ray_class == _ray_class(parent_cmdline)


def _is_mp_spawn(prog: _Program) -> bool:
    if "--multiprocessing-fork" in prog.args:
        return True
    return prog.kind == "code" and (
        "multiprocessing.spawn" in prog.program or "multiprocessing.forkserver" in prog.program
    )


def classify_role(
    cmdline: list[str],
    name: str,
    parent_cmdline: list[str] | None,
    is_root: bool,
    root_is_launcher: bool,
) -> str:
    """The role of one watched process: ``main``, ``trainer``, ``dataloader``, ``inference``
    or ``other``; the rules, in order, are in this module's docstring.

    ``cmdline`` is the process's command line as psutil reads it (a ``setproctitle`` title
    appears as its first element), ``name`` its psutil name, ``parent_cmdline`` the parent's
    command line or None when it is unknown (the parent is outside the watched tree, or
    gone). ``is_root`` marks the watched command itself; ``root_is_launcher`` says whether
    the watched command is a launcher (see `is_launcher`). A launcher parent is normally
    recognised from ``parent_cmdline``, which also covers launchers deeper in the tree;
    ``root_is_launcher`` stands in for it when the parent's command line is unknown, which
    is the case for the ranks of a launcher root that has just exited.
    """
    if is_root:
        return "main"
    prog = _parse(cmdline)
    if _is_ray_infrastructure(cmdline, name, prog):
        return "other"
    if prog.kind == "code" and "multiprocessing.resource_tracker" in prog.program:
        return "other"
    if _is_inference(cmdline, name, prog):
        return "inference"
    if _is_fork(cmdline, parent_cmdline):
        return "dataloader"
    ray_class = _ray_class(cmdline)
    if ray_class is not None:
        return "trainer" if _RAY_TRAINER_CLASS_RE.search(ray_class) else "other"
    if is_launcher(cmdline):
        return "other"
    if parent_cmdline is None:
        parent_launches = root_is_launcher
        no_python = False
    else:
        parent_launches = is_launcher(parent_cmdline)
        no_python = any(arg in _NO_PYTHON_FLAGS for arg in parent_cmdline)
    if parent_launches and (no_python or _is_python(cmdline)):
        return "trainer"
    if _is_mp_spawn(prog):
        return "dataloader"
    return "other"


def _exe_only(proc: psutil.Process) -> list[str]:
    """The command line of a live process whose arguments are not laid out yet (it is
    between ``exec`` and its new stack): its new executable alone, or nothing when it is
    exiting (its memory, and with it the executable, already released)."""
    try:
        exe = proc.exe()
    except psutil.Error:
        return []
    return [exe] if exe else []


def _busy_and_total_s(times: Any) -> tuple[float, float]:
    """Busy and total CPU seconds summed over all cores since boot, psutil's convention:
    idle and iowait are idle; steal counts as busy; guest time is already inside user/nice."""
    total = sum(times)
    total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total


@dataclass(slots=True)
class _Tracked:
    """One watched process and what the previous sample read from it."""

    proc: psutil.Process
    ppid: int | None
    name: str
    role: str
    infra: bool = False
    """Ray's own machinery (raylet, dashboard, idle pool workers…): never stack-sampled."""
    last_t_s: float | None = None
    """`time.monotonic()` at the previous reading."""
    last_cpu_s: float | None = None
    """User + system CPU seconds at the previous reading."""
    last_io: tuple[int, int] | None = None
    """Storage read/write bytes at the previous reading."""
    io_readable: bool = True
    """False once ``/proc/<pid>/io`` was denied or missing; not tried again."""
    start_s: float = 0.0
    """When the process started (seconds since the epoch)."""
    cpu_pct: float | None = None
    """Its CPU at the last sample, percent of one core."""
    threads: dict[int, ThreadTimes] | None = None
    """Thread id → its times at the last reading of the process's threads."""
    thread_names: dict[int, str] | None = None
    """Thread id → ``comm``, read once per thread (and again every `THREAD_NAMES_S`)."""
    thread_names_s: float = 0.0
    unread: bool = False
    """Its command line was empty at the last reading (it is between ``exec`` and its new
    arguments): read again at the next sample."""


_HAS_IO_COUNTERS = hasattr(psutil.Process, "io_counters")


class ThreadTimes(NamedTuple):
    """One thread's name and cumulative seconds on a CPU and waiting for one (None: not
    kept by this kernel)."""

    name: str
    cpu_s: float
    runq_s: float | None


def read_threads(pid: int, names: dict[int, str] | None = None) -> dict[int, ThreadTimes]:
    """Every thread of ``pid``: its ``comm`` and its time on a CPU and waiting for one, from
    ``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds); where the kernel keeps no scheduler
    statistics, CPU time from ``…/stat`` (10 ms ticks) and no run-queue time. ``names``
    caches thread names by id: ``stat`` is read only for threads not in it (and updated).
    Empty where there is no such directory (not Linux, or the process is gone)."""
    base = f"/proc/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return {}
    out: dict[int, ThreadTimes] = {}
    for entry in tids:
        tid = int(entry)
        cpu = runq = None
        try:
            with open(f"{base}/{entry}/schedstat", "rb", buffering=0) as handle:
                fields = handle.read(128).split()
            cpu, runq = int(fields[0]) / 1e9, int(fields[1]) / 1e9
        except (OSError, ValueError, IndexError):
            pass
        name = names.get(tid) if names is not None else None
        if name is None or cpu is None:
            try:
                with open(f"{base}/{entry}/stat", "rb", buffering=0) as handle:
                    data = handle.read(1024)
            except OSError:  # the thread ended meanwhile
                continue
            close = data.rfind(b")")
            fields = data[close + 2 :].split()
            if close < 0 or len(fields) < 13:
                continue
            name = data[data.find(b"(") + 1 : close].decode("utf-8", "replace")
            if names is not None:
                names[tid] = name
            if cpu is None:
                cpu = (int(fields[11]) + int(fields[12])) / _CLK_TCK
        out[tid] = ThreadTimes(name, cpu, runq)
    return out


class HostCollector:
    """Samples the host and the process tree rooted at ``root_pid``.

    The watched tree is the root and all its descendants. New descendants are picked up at
    the next tree refresh (the first `sample` call, then every ``tree_refresh_s`` seconds);
    roles and names are re-read at each refresh, since processes retitle themselves after
    starting. A process that exits simply stops appearing; a descendant whose parent exits
    (re-parented to init or a subreaper) stays watched until it exits.
    """

    def __init__(
        self, host: str, root_pid: int, *, tree_refresh_s: float = 2.0, threads: bool = False
    ) -> None:
        self.host = host
        self.root_pid = root_pid
        self.tree_refresh_s = tree_refresh_s
        self.threads = threads
        """Read the threads of busy processes (`take_threads`)."""
        self._thread_rows: list[ThreadSample] = []
        self._n_cpus = psutil.cpu_count(logical=True)
        self._last_busy_total = _busy_and_total_s(psutil.cpu_times())
        self._tracked: dict[int, _Tracked] = {}
        self._next_refresh_s = float("-inf")
        self._root_is_launcher = False
        self._cmdlines: dict[int, list[str]] = {}
        """Pid → command line at the last reading, for the parents of processes read again."""
        self._unread = False
        """Some tracked process is `_Tracked.unread`."""
        try:
            self._root: psutil.Process | None = psutil.Process(root_pid)
        except psutil.NoSuchProcess:
            self._root = None

    def watched_pids(self) -> set[int]:
        """Pids of the watched tree (root + descendants) as of the last tree refresh,
        minus those seen exiting since; empty before the first `sample`."""
        return set(self._tracked)

    def stack_targets(self) -> list[Any]:
        """The watched processes as `gpuprof.collectors.stacks.Target` (pid, role, name, start
        time, CPU at the last sample), for the stack sampler; safe to call from another
        thread."""
        from gpuprof.collectors.stacks import Target

        launcher = self._root_is_launcher
        return [Target(pid, t.role, t.name, t.start_s, t.cpu_pct,
                       launcher=launcher and pid == self.root_pid, infra=t.infra)
                for pid, t in list(self._tracked.items())]  # fmt: skip

    def take_threads(self) -> list[ThreadSample]:
        """The busy threads read since the previous call (see `ThreadSample`)."""
        rows, self._thread_rows = self._thread_rows, []
        return rows

    def sample(self, t_ns: int) -> tuple[HostSample, list[ProcSample]]:
        """Read the host and every watched process now; ``t_ns`` stamps the records.

        `HostSample.cpu_pct` is the busy share of all cores (0–100) since the previous call
        (the first call: since construction), None when no CPU time has been accounted
        since then (calls closer together than the kernel's 10 ms tick).
        `HostSample.mem_used_bytes` is total minus available memory (what ``free`` calls used).
        Per process, `ProcSample.cpu_pct` is percent of one core and the I/O figures are
        bytes/s read from / written to storage (``/proc/<pid>/io`` ``read_bytes`` and
        ``write_bytes``), all since the previous sample of that process: None on its first
        sighting, and the I/O figures None where the kernel does not give them.
        CPU time is counted in 10 ms ticks, so at 10 Hz a process's ``cpu_pct`` moves in
        steps of about 10. ``ppid`` is read at tree refreshes: psutil's ``ppid()`` re-reads
        the process to rule out pid reuse, which would double the per-sample cost, and a
        parent only changes when the old one exits.
        """
        now_s = time.monotonic()
        if now_s >= self._next_refresh_s:
            self._refresh_tree()
            self._next_refresh_s = now_s + self.tree_refresh_s
        elif self._unread:
            self._read_unread()
        host_sample = self._sample_host(t_ns)
        records: list[ProcSample] = []
        gone: list[int] = []
        for pid, tracked in self._tracked.items():
            record = self._sample_process(tracked, t_ns)
            if record is None:
                gone.append(pid)
            else:
                records.append(record)
        for pid in gone:
            del self._tracked[pid]
        return host_sample, records

    def _sample_host(self, t_ns: int) -> HostSample:
        busy, total = _busy_and_total_s(psutil.cpu_times())
        last_busy, last_total = self._last_busy_total
        cpu_pct = None
        if total > last_total:
            cpu_pct = min(100.0, max(0.0, 100.0 * (busy - last_busy) / (total - last_total)))
            self._last_busy_total = (busy, total)
        memory = psutil.virtual_memory()
        return HostSample(
            host=self.host,
            t_ns=t_ns,
            cpu_pct=cpu_pct,
            mem_used_bytes=int(memory.total - memory.available),
            mem_total_bytes=int(memory.total),
            n_cpus=self._n_cpus,
        )

    def _sample_process(self, tracked: _Tracked, t_ns: int) -> ProcSample | None:
        """One process's record, or None when it has exited (or is a zombie awaiting reaping)."""
        proc = tracked.proc
        cpu_pct = read_s = write_s = None
        rss = threads = None
        try:
            with proc.oneshot():
                if proc.status() == psutil.STATUS_ZOMBIE:
                    return None
                times = proc.cpu_times()
                now_s = time.monotonic()
                rss = proc.memory_info().rss
                threads = proc.num_threads()
                io = self._read_io(tracked)
        except psutil.NoSuchProcess:  # includes ZombieProcess
            return None
        except psutil.AccessDenied:
            # Another user's process in the tree: keep it visible, without figures.
            return self._record(tracked, t_ns)
        cpu_s = times.user + times.system
        last_t_s = tracked.last_t_s
        if last_t_s is not None and now_s > last_t_s:
            dt_s = now_s - last_t_s
            if tracked.last_cpu_s is not None:
                cpu_pct = max(0.0, 100.0 * (cpu_s - tracked.last_cpu_s) / dt_s)
            if io is not None and tracked.last_io is not None:
                read_s = max(0.0, (io[0] - tracked.last_io[0]) / dt_s)
                write_s = max(0.0, (io[1] - tracked.last_io[1]) / dt_s)
            if self.threads and cpu_pct is not None:
                self._sample_threads(tracked, t_ns, dt_s, cpu_pct)
        tracked.cpu_pct = cpu_pct
        tracked.last_t_s = now_s
        tracked.last_cpu_s = cpu_s
        tracked.last_io = io
        return self._record(tracked, t_ns, cpu_pct, rss, read_s, write_s, threads)

    def _sample_threads(self, tracked: _Tracked, t_ns: int, dt_s: float, cpu_pct: float) -> None:
        """Rows for the threads that used CPU over the last ``dt_s`` seconds (at least
        `THREAD_MIN_CPU_PCT`), of a process busy enough to read
        (`THREAD_MIN_PROCESS_CPU_PCT`). A thread's CPU since its previous
        reading is put in this interval: when the process was skipped since, it was nearly
        idle then, so little of it belongs earlier."""
        if cpu_pct < THREAD_MIN_PROCESS_CPU_PCT:
            return
        pid = tracked.proc.pid
        clock = time.monotonic()
        if tracked.thread_names is None or clock - tracked.thread_names_s > THREAD_NAMES_S:
            tracked.thread_names, tracked.thread_names_s = {}, clock
        now = read_threads(pid, tracked.thread_names)
        before, tracked.threads = tracked.threads, now
        if before is None:
            return  # the first reading is the baseline
        for tid, times in now.items():
            last = before.get(tid)
            if last is None or times.cpu_s <= last.cpu_s:
                continue
            pct = min(100.0, 100.0 * (times.cpu_s - last.cpu_s) / dt_s)
            if pct < THREAD_MIN_CPU_PCT:
                continue
            runq = None
            if times.runq_s is not None and last.runq_s is not None:
                waited = 100.0 * max(0.0, times.runq_s - last.runq_s) / dt_s
                runq = round(min(100.0 - pct, waited), 2)
            row = ThreadSample(self.host, t_ns, pid, tid, times.name, round(pct, 2), runq,
                               round(dt_s, 4))  # fmt: skip
            self._thread_rows.append(row)

    @staticmethod
    def _read_io(tracked: _Tracked) -> tuple[int, int] | None:
        if not (_HAS_IO_COUNTERS and tracked.io_readable):
            return None
        try:
            counters = tracked.proc.io_counters()
        except psutil.AccessDenied:
            tracked.io_readable = False
            return None
        except OSError:
            # /proc/<pid>/io is missing without task I/O accounting; NoSuchProcess is not
            # an OSError and reaches the caller.
            tracked.io_readable = False
            return None
        return counters.read_bytes, counters.write_bytes

    def _record(
        self,
        tracked: _Tracked,
        t_ns: int,
        cpu_pct: float | None = None,
        rss: int | None = None,
        read_s: float | None = None,
        write_s: float | None = None,
        threads: int | None = None,
    ) -> ProcSample:
        return ProcSample(
            host=self.host,
            t_ns=t_ns,
            pid=tracked.proc.pid,
            ppid=tracked.ppid,
            role=tracked.role,
            name=tracked.name,
            cpu_pct=cpu_pct,
            rss_bytes=rss,
            io_read_bytes_s=read_s,
            io_write_bytes_s=write_s,
            num_threads=threads,
        )

    def _refresh_tree(self) -> None:
        """Re-list the tree and re-read every member's parent, name, command line and role."""
        found: dict[int, psutil.Process] = {}
        if self._root is not None:
            try:
                children = self._root.children(recursive=True)
                found[self._root.pid] = self._root
            except psutil.NoSuchProcess:
                children = []
            for child in children:
                found[child.pid] = child
        for pid, tracked in list(self._tracked.items()):
            known = found.get(pid)
            if known is None and tracked.proc.is_running():
                found[pid] = tracked.proc  # orphaned descendant: still ours
            elif known is not None and known == tracked.proc:
                found[pid] = tracked.proc  # keep the object that holds psutil's caches
            else:
                del self._tracked[pid]  # exited, or its pid now belongs to a new process

        identities: dict[int, tuple[psutil.Process, int | None, str, list[str], bool]] = {}
        for pid, proc in found.items():
            unread = False
            try:
                with proc.oneshot():
                    if proc.status() == psutil.STATUS_ZOMBIE:
                        continue
                    ppid = proc.ppid()
                    name = proc.name()
                try:
                    cmdline = proc.cmdline()
                    if not cmdline:
                        cmdline, unread = _exe_only(proc), True
                except psutil.AccessDenied:
                    cmdline = []
            except psutil.NoSuchProcess:
                continue
            except psutil.AccessDenied:
                ppid, name, cmdline = None, "", []
            identities[pid] = (proc, ppid, name[:NAME_MAX_CHARS], cmdline, unread)
        self._cmdlines = {pid: identity[3] for pid, identity in identities.items()}

        root_identity = identities.get(self.root_pid)
        if root_identity is not None:
            # Remembered across refreshes: a launcher root that exits first still explains
            # its orphaned ranks.
            self._root_is_launcher = is_launcher(root_identity[3])

        for pid, (proc, ppid, name, cmdline, unread) in identities.items():
            tracked = self._tracked.get(pid)
            if tracked is None:
                try:
                    started = proc.create_time()  # cached by psutil: no system call
                except psutil.Error:
                    started = 0.0
                tracked = self._tracked[pid] = _Tracked(proc, ppid, name, "other",
                                                        start_s=started)  # fmt: skip
            else:
                tracked.ppid = ppid
            self._identify(pid, tracked, name, cmdline)
            tracked.unread = unread
        for pid in set(self._tracked) - set(identities):
            del self._tracked[pid]
        self._unread = any(tracked.unread for tracked in self._tracked.values())

    def _identify(self, pid: int, tracked: _Tracked, name: str, cmdline: list[str]) -> None:
        """Set ``tracked``'s name, role and infra flag from its command line and its parent's."""
        parent = self._cmdlines.get(tracked.ppid) if tracked.ppid is not None else None
        role = classify_role(cmdline, name, parent, pid == self.root_pid, self._root_is_launcher)
        tracked.name, tracked.role = name, role
        tracked.infra = role == "other" and _is_ray_infrastructure(cmdline, name, _parse(cmdline))

    def _read_unread(self) -> None:
        """Read again the processes that were between ``exec`` and their arguments: their role
        from the executable alone may not be the one their arguments give (``python -m vllm…``
        under a launcher), and their name may have been the parent's still (when the kernel
        renames the process during ``exec`` differs between versions)."""
        for pid, tracked in self._tracked.items():
            if not tracked.unread:
                continue
            try:
                cmdline = tracked.proc.cmdline()
                name = tracked.proc.name()[:NAME_MAX_CHARS]
            except psutil.Error:  # gone, or denied: the next tree refresh settles it
                tracked.unread = False
                continue
            if not cmdline:
                continue
            tracked.unread = False
            self._cmdlines[pid] = cmdline
            if pid == self.root_pid:
                self._root_is_launcher = is_launcher(cmdline)
            self._identify(pid, tracked, name, cmdline)
        self._unread = any(tracked.unread for tracked in self._tracked.values())
