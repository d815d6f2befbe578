"""The data model: the records collectors produce and the `Run` analyzers and renderers read.

Time is integer nanoseconds since the Unix epoch (``t_ns``); units live in field names
(``mem_used_bytes``, ``pcie_rx_bytes_s``, ``power_w``, ``util_gpu_pct``). A metric that is missing
or unsupported is ``None`` in a record and NaN in a frame, never 0.

Each record class doubles as the schema of one store table: the table's columns are the record's
fields, in order, so the collectors, the store and the loaded frames cannot disagree.
No I/O happens here.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas and numpy are imported where frames are made: the record
    # classes are what a Ray node's sampler needs, and it starts faster without them
    import numpy as np
    import pandas as pd

SCHEMA_VERSION = 2
"""Version of the on-disk layout; bumped whenever a table or column changes meaning."""


@dataclass(slots=True)
class GpuSample:
    """One reading of one GPU.

    ``util_gpu_pct`` is NVML's "a kernel was running" share of the last sample period, not
    how busy the SMs were; ``sm_active_pct`` (GPM, Hopper and newer) is the real SM activity.
    PCIe and NVLink figures are the difference of NVML's cumulative byte counters over the
    sampling interval; on drivers without the PCIe counters, PCIe is NVML's 20 ms throughput
    window, read for one GPU per tick (None on the others).
    """

    host: str
    gpu: int
    uuid: str | None
    t_ns: int
    util_gpu_pct: float | None = None
    util_mem_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    pcie_tx_bytes_s: float | None = None
    pcie_rx_bytes_s: float | None = None
    nvlink_tx_bytes_s: float | None = None
    nvlink_rx_bytes_s: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    temp_c: float | None = None
    clock_event_reasons: int | None = None
    """Bit mask of ``nvmlClocksEventReason*`` flags (power cap, thermal slowdown, …)."""
    sm_active_pct: float | None = None
    sm_occupancy_pct: float | None = None
    tensor_active_pct: float | None = None
    dram_active_pct: float | None = None


@dataclass(slots=True)
class HostSample:
    """System-wide host reading: CPU busy share over all cores (0–100) and memory in use."""

    host: str
    t_ns: int
    cpu_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    n_cpus: int | None = None


@dataclass(slots=True)
class ProcSample:
    """One watched process at one instant.

    ``cpu_pct`` is percent of one core (a process using two full cores reads 200).
    ``role`` is one of ``main``, ``trainer``, ``dataloader``, ``inference``, ``other``.
    """

    host: str
    t_ns: int
    pid: int
    ppid: int | None
    role: str
    name: str
    cpu_pct: float | None = None
    rss_bytes: int | None = None
    io_read_bytes_s: float | None = None
    io_write_bytes_s: float | None = None
    num_threads: int | None = None


@dataclass(slots=True)
class GpuProcSample:
    """A process seen on a GPU by NVML: its device memory and, where NVML gives it, SM share."""

    host: str
    t_ns: int
    gpu: int
    pid: int
    gpu_mem_bytes: int | None = None
    sm_util_pct: float | None = None
    watched: bool = False
    """True when the pid belongs to the watched process tree."""


@dataclass(slots=True)
class Span:
    """A timed phase of one process: ``[start_ns, end_ns)``.

    ``phase`` is the canonical name (see ``gpuprof.phases``), ``name`` the name as given.
    ``gpu_start_ns``/``gpu_end_ns`` come from CUDA events when enabled (estimates on the
    host clock, no synchronisation). ``attrs`` holds tokens, bytes, framework name…
    """

    host: str
    pid: int
    tid: int
    rank: int | None
    local_rank: int | None
    phase: str
    name: str
    step: int | None
    depth: int
    start_ns: int
    end_ns: int
    gpu_start_ns: int | None = None
    gpu_end_ns: int | None = None
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Event:
    """A point event: ``kind`` is ``step``, ``mark``, ``exit``, ``nvml_fault``, ``notice``…"""

    host: str
    pid: int
    rank: int | None
    t_ns: int
    kind: str
    name: str
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class LogLine:
    """One line the watched command wrote, stamped when the watcher read it."""

    host: str
    t_ns: int
    stream: str
    """``stdout`` or ``stderr``."""
    line: str


@dataclass(slots=True)
class ThreadSample:
    """One busy thread of a watched process over the last host interval.

    ``cpu_pct`` is the percent of the ``interval_s`` seconds before ``t_ns`` the thread ran on
    a CPU (0–100: a thread uses at most one core), ``runq_pct`` the percent it was ready to
    run but waited for a CPU (the kernel's run queue; None where the kernel does not keep
    scheduler statistics). ``name`` is the thread's ``comm`` (15 characters:
    ``cuda-EvtHandlr``, ``pt_autograd_0``, a Python thread's name on Python 3.14+, else the
    process's). Only threads that used at least 1% of a core are recorded, and only of
    processes using at least a few percent of one
    (`gpuprof.collectors.host.THREAD_MIN_PROCESS_CPU_PCT`): a thread of a recorded process
    with no row in an interval was idle.
    """

    host: str
    t_ns: int
    pid: int
    tid: int
    name: str
    cpu_pct: float | None = None
    runq_pct: float | None = None
    interval_s: float | None = None


@dataclass(slots=True)
class StackFrame:
    """One Python function at one line, interned: ``frame_id`` is a hash of (name, file,
    line), the same on every host and in every run (`gpuprof.collectors.stacks.frame_id`)."""

    frame_id: int
    name: str
    file: str
    line: int | None = None


@dataclass(slots=True)
class Stack:
    """A call stack, interned: ``frames`` is its frame ids from the outermost call to the
    innermost, space-separated; ``stack_id`` a hash of them."""

    stack_id: int
    frames: str


@dataclass(slots=True)
class StackSample:
    """Wall seconds one Python thread was seen in one stack within one time window.

    Sampled by py-spy from the watcher (`gpuprof.collectors.stacks`) at ``rate_hz`` samples a
    second; ``seconds`` × ``rate_hz`` is about the number of samples. Rows are summed per
    window of ``window_s`` seconds (aligned on the epoch): ``t_ns`` is when the stack was
    first seen in its window and ``span_s`` how far from there its last stretch in the window
    ended (``seconds`` ≤ ``span_s``; equal when it was one stretch), so a row places its time
    more finely than its window. ``tid`` is the OS thread id (None when py-spy could not tell
    it), ``thread`` the Python thread's name, ``role`` the process's role as the host
    collector classifies it. Whether the thread was busy (running or ready to run) or blocked
    comes from its `ThreadSample` rows in that window.
    """

    host: str
    t_ns: int
    span_s: float
    window_s: float
    pid: int
    tid: int | None
    thread: str
    role: str
    stack_id: int
    seconds: float
    rate_hz: float


RECORD_TYPES: dict[str, type] = {
    "gpu": GpuSample,
    "host": HostSample,
    "procs": ProcSample,
    "gpu_procs": GpuProcSample,
    "spans": Span,
    "events": Event,
    "logs": LogLine,
    "threads": ThreadSample,
    "stack_frames": StackFrame,
    "stacks": Stack,
    "stack_samples": StackSample,
}
"""Table / frame name → record class. The store and `Run` both follow this order.

The last four (per-thread CPU and Python stacks) came after schema 2's first files: a file
without their tables reads as having no rows in them (see docs/STORE.md)."""

STACK_TABLES: tuple[str, ...] = ("threads", "stack_frames", "stacks", "stack_samples")
"""Tables a run file may lack (written before they existed): read as empty."""
SAMPLED_TABLES: tuple[str, ...] = ("gpu", "procs", "gpu_procs", "host")
"""The run's sampled series: what grows with the run's length and GPUs, read node by node
where a run is analysed in parts (`load_cache.KeptSeries`, `analyzers.parts`)."""
NODE_READ_TABLES: tuple[str, ...] = (*SAMPLED_TABLES, "spans", "events")
"""What a run analysed in parts leaves to the processes that hold its nodes
(`load_cache.KeptSeries`): its sampled series, and its spans and step events, which grow
with ranks × steps (18 M spans and 1.8 M step events for 1 024 GPUs over a day; the events
of other kinds are read by the whole run's view too). The whole run's figures of them come
from the parts (`parts.Facts`, `Parts.map`)."""
INTERNED_TABLES: dict[str, str] = {"stack_frames": "frame_id", "stacks": "stack_id"}
"""Tables keyed by a content hash rather than time: rows repeat across files and are kept
once when a run is loaded."""


def columns(record_type: type) -> list[str]:
    """Column names of a record type's table, in declaration order."""
    return [f.name for f in dataclasses.fields(record_type)]


def column_kinds(record_type: type) -> dict[str, str]:
    """Map each column to ``int``, ``float``, ``str``, ``bool`` or ``json`` from its annotation."""
    hints = typing.get_type_hints(record_type)
    kinds = {}
    for name, hint in hints.items():
        text = str(hint)
        if "dict" in text:
            kinds[name] = "json"
        elif "bool" in text:
            kinds[name] = "bool"
        elif "float" in text:
            kinds[name] = "float"
        elif "int" in text:
            kinds[name] = "int"
        else:
            kinds[name] = "str"
    return kinds


def empty_frame(record_type: type) -> pd.DataFrame:
    """A frame with the record's columns and no rows, with dtypes that keep NaN for missing."""
    import pandas as pd

    kinds = column_kinds(record_type)
    data = {}
    for name in columns(record_type):
        kind = kinds[name]
        data[name] = pd.Series(
            [],
            dtype={"int": "Int64", "float": "float64", "bool": "boolean"}.get(kind, "object"),
        )
    return pd.DataFrame(data)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_list_of(kind: type) -> Any:
    return lambda v: isinstance(v, list) and all(isinstance(x, kind) for x in v)


_META_TYPES: dict[str, Any] = {
    "run_id": lambda v: isinstance(v, str),
    "command": _is_list_of(str),
    "cwd": lambda v: isinstance(v, str),
    "hosts": _is_list_of(str),
    "gpus": _is_list_of(dict),
    "driver_version": lambda v: isinstance(v, str),
    "nvml_version": lambda v: isinstance(v, str),
    "cuda_driver_version": _is_int,
    "framework": lambda v: isinstance(v, str),
    "knobs": lambda v: isinstance(v, dict),
    "start_ns": _is_int,
    "end_ns": _is_int,
    "exit_code": _is_int,
    "exit_signal": _is_int,
    "interval_s": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "gpuprof_version": lambda v: isinstance(v, str),
    "schema_version": _is_int,
    "notices": _is_list_of(str),
    "stopped": lambda v: isinstance(v, str),
    "node_rank": _is_int,
    "nnodes": _is_int,
    "reference_node": lambda v: isinstance(v, str),
    "clocks": lambda v: isinstance(v, dict),
    "nodes": lambda v: isinstance(v, dict) and all(isinstance(x, dict) for x in v.values()),
    "stacks": lambda v: isinstance(v, dict),
    "steps": lambda v: isinstance(v, dict),
}
"""The type each stored metadata field must have (None is allowed except where required)."""
_META_REQUIRED = frozenset({"run_id", "command", "hosts", "gpus", "knobs", "notices",
                            "schema_version"})  # fmt: skip


@dataclass
class RunMeta:
    """What a run is: its command (secrets redacted), hosts, GPUs, versions and outcome.

    ``gpus`` lists one dict per GPU (host, index, uuid, name, mem_total_bytes…).
    ``knobs`` holds framework settings parsed from the command line or config.
    ``exit_code`` is the watched command's (128+N when signal N killed it), None while running.
    """

    run_id: str
    command: list[str] = field(default_factory=list)
    cwd: str | None = None
    hosts: list[str] = field(default_factory=list)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    driver_version: str | None = None
    nvml_version: str | None = None
    cuda_driver_version: int | None = None
    framework: str | None = None
    knobs: dict[str, Any] = field(default_factory=dict)
    start_ns: int | None = None
    end_ns: int | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    interval_s: float | None = None
    gpuprof_version: str | None = None
    schema_version: int = SCHEMA_VERSION
    notices: list[str] = field(default_factory=list)
    """Human-readable facts about collection: "NVML not available: …", "GPU 1 lost at …"."""
    node_rank: int | None = None
    """This watcher's node rank in a multi-node launch (torchrun / Slurm / MPI), else None."""
    nnodes: int | None = None
    """Nodes the launch spans (one watcher each), else None."""
    reference_node: str | None = None
    """The node whose clock the run's time axis follows (node rank 0; the first host)."""
    clocks: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per node, the clock offset applied when the run was read (see `gpuprof.clocks`)."""
    stopped: str | None = None
    """Set when recording stopped before the command ended: when, why and what is missing
    ("recording stopped at 00:12:31: disk full; 15 of 30 steps recorded; …")."""
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per node a Ray driver recorded or tried to (not the watcher's own), how: ``state``
    (``recorded``, ``lost`` or ``never_recorded``), ``asked_ns`` (its sampler asked for),
    ``from_ns`` (its first sample), ``lost_ns``, ``why``, ``notice`` (the run's notice
    saying it) and ``address`` (the node's IP in Ray's node table), times on the run's clock."""
    steps: dict[str, Any] | None = None
    """The stretch of steps the run was cut to when read (``analyze --steps``,
    `gpuprof.step_window`): ``first``, ``last``, ``steps``, ``run_steps``, ``run_first``,
    ``run_last``; None: the whole run."""
    stacks: dict[str, Any] | None = None
    """How the watcher samples Python stacks (``rate_hz`` while the GPUs work,
    ``idle_rate_hz`` while they idle; samples per second per process), which a Ray driver
    hands to the samplers of the cluster's other nodes; None: not sampled (``--no-stacks``)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> RunMeta:
        """A `RunMeta` from stored metadata; ``ValueError`` naming the first field of the
        wrong type (a run file edited by hand, or from another tool)."""
        if not isinstance(data, dict):
            raise ValueError(f"metadata is a {type(data).__name__}, not an object")
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for name, value in values.items():
            if value is None and name not in _META_REQUIRED:
                continue
            check = _META_TYPES.get(name)
            if check is not None and not check(value):
                raise ValueError(f"{name} = {value!r:.60} has the wrong type")
        if "run_id" not in values:
            raise ValueError("run_id is missing")
        return cls(**values)


@dataclass
class Run:
    """A recorded run: metadata plus one pandas frame per record type.

    Frames: ``gpu``, ``host``, ``procs``, ``gpu_procs``, ``spans``, ``events``, ``logs``,
    and the per-thread CPU and Python stacks (``threads``, ``stack_frames``, ``stacks``,
    ``stack_samples``; empty unless py-spy sampled the run); their columns are the fields of
    the matching record class. Analyzers and renderers see only this.
    """

    meta: RunMeta
    gpu: pd.DataFrame = field(default_factory=lambda: empty_frame(GpuSample))
    host: pd.DataFrame = field(default_factory=lambda: empty_frame(HostSample))
    procs: pd.DataFrame = field(default_factory=lambda: empty_frame(ProcSample))
    gpu_procs: pd.DataFrame = field(default_factory=lambda: empty_frame(GpuProcSample))
    spans: pd.DataFrame = field(default_factory=lambda: empty_frame(Span))
    events: pd.DataFrame = field(default_factory=lambda: empty_frame(Event))
    logs: pd.DataFrame = field(default_factory=lambda: empty_frame(LogLine))
    threads: pd.DataFrame = field(default_factory=lambda: empty_frame(ThreadSample))
    stack_frames: pd.DataFrame = field(default_factory=lambda: empty_frame(StackFrame))
    stacks: pd.DataFrame = field(default_factory=lambda: empty_frame(Stack))
    stack_samples: pd.DataFrame = field(default_factory=lambda: empty_frame(StackSample))

    @property
    def duration_s(self) -> float | None:
        """Wall time from the first to the last thing recorded, in seconds."""
        start, end = self.meta.start_ns, self.meta.end_ns
        if start is None or end is None:
            first, last = self.extent_ns()
            start = start if start is not None else first
            end = end if end is not None else last
        if start is None or end is None:
            return None
        return max(0.0, (int(end) - int(start)) / 1e9)

    def extent_ns(self) -> tuple[int | None, int | None]:
        """The first and last instant (epoch ns) of the GPU and host samples and the spans,
        what `duration_s` reads where the metadata has no start or end (None: nothing)."""
        starts = [int(f["t_ns"].min()) for f in (self.gpu, self.host) if len(f)]
        ends = [int(f["t_ns"].max()) for f in (self.gpu, self.host) if len(f)]
        if len(self.spans):
            starts.append(int(self.spans["start_ns"].min()))
            ends.append(int(self.spans["end_ns"].max()))
        return (min(starts) if starts else None, max(ends) if ends else None)


def span_depths(spans: pd.DataFrame) -> np.ndarray:
    """Nesting depth of each span within its thread (0 = outermost).

    Hooks don't track nesting (it would cost the training thread); for properly nested spans
    the depth of span i is the number of spans of its thread that started before it (ties:
    the longer one first) minus the number that had already ended when it started.
    """
    import numpy as np

    depth = np.zeros(len(spans), dtype=np.int64)
    starts_all = spans["start_ns"].to_numpy(np.int64)
    ends_all = spans["end_ns"].to_numpy(np.int64)
    # a span without a thread id (an imported log's) nests among its process's others of none
    groups = spans.groupby(["host", "pid", "tid"], sort=False, dropna=False).indices
    for index in groups.values():
        starts, ends = starts_all[index], ends_all[index]
        order = np.lexsort((-ends, starts))
        opened_before = np.empty(len(index), dtype=np.int64)
        opened_before[order] = np.arange(len(index))
        closed_before = np.searchsorted(np.sort(ends), starts, side="right")
        depth[index] = np.maximum(opened_before - closed_before, 0)
    return depth
