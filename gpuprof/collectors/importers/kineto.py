"""PyTorch-profiler (Kineto) traces → GPU busy samples, phase spans and steps.

One file per rank, ``.json`` or ``.json.gz``, as ``torch.profiler`` (``export_chrome_trace``
or ``tensorboard_trace_handler``) writes it: a JSON object with ``traceEvents`` (Chrome
trace-event format, complete events ``ph: "X"``) and metadata keys (``schemaVersion``,
``deviceProperties``, ``distributedInfo``, ``displayTimeUnit``, ``baseTimeNanoseconds``).

What is read:

- **GPU activity**: kernels, memcpys and memsets, under today's categories (``kernel``,
  ``gpu_memcpy``, ``gpu_memset``) or the old ones (``Kernel``, ``Memcpy``, ``Memset``). Their
  union per device gives exact busy and idle time; the import turns it into `GpuSample` rows
  every bin (at most `BIN_NS`; ``util_gpu_pct`` = busy share of the bin, so it is the same "a
  kernel was running" measure NVML gives) and keeps the exact figures as one ``gpu_time``
  event per GPU (attrs in ns: window, busy, idle, compute, communication, memory; counts) and
  in the notes.
  A kernel whose name contains ``nccl`` is communication; memcpy/memset (and kernels named
  ``Memcpy…``/``Memset…``/``dma…``) are memory; everything else is compute. Where kinds
  overlap in time, compute wins over communication over memory.
- **GPU memory** (traces taken with ``profile_memory=True``): the ``[memory]`` records of CUDA
  or HIP devices give ``mem_used_bytes``, the caching allocator's peak reserved bytes in each
  sample's bin.
- **Phases**: ``user_annotation`` ranges (``record_function``) and DataLoader ``__next__``
  ops become spans, their names mapped to canonical phases (`gpuprof.phases`): ``## name ##``
  markers lose their hashes, ``Optimizer.step#SGD.step`` is ``optimizer.step`` (the update).
  PyTorch's own collective ranges (``nccl:all_reduce``…) and ``Optimizer.zero_grad`` are not
  phases and are skipped. Blocking CUDA runtime calls of 100 µs or more become ``cuda_alloc``
  (cudaMalloc / cudaFree…) and ``cuda_sync`` (cudaStreamSynchronize…) spans, so that GPU idle
  time while the host sits in them has a cause; a DataLoader whose ``__next__`` ops all name
  ``_SingleProcessDataLoaderIter`` ran with ``num_workers=0`` (recorded as that knob).
  ``ProfilerStep#N`` ranges give ``step`` spans and ``step`` events,
  and number the spans inside them.
- **Who**: the rank is ``distributedInfo.rank``, else a ``rank<N>`` in the file name; a GPU
  activity's device is its ``args.device`` (else its pid, which Kineto sets to the device);
  a trace without device ids puts rank r on GPU r. The host is the trace's ``host_name``, else
  the ``<host>_<pid>.<time>.pt.trace.json`` name ``tensorboard_trace_handler`` writes, else the
  file name without its rank part (so the ranks of one job land on one host).

Time: ``ts``/``dur`` are microseconds whatever ``displayTimeUnit`` says (that key is only a
display hint); nanosecond-resolution traces write fractional microseconds. Newer Kineto writes
``ts`` relative to ``baseTimeNanoseconds`` (a wall-clock base), older Kineto writes µs since the
Unix epoch; either way events land on the wall clock (``anchored``). A trace whose times are
neither (an unknown clock) is shifted to start at 0 and marked not anchored. Absolute µs
timestamps parsed as float64 keep about 0.25 µs of resolution.

The per-rank compute / communication / memory / idle split with HolisticTraceAnalysis's
definitions (to set beside its ``get_temporal_breakdown``) is `kineto_breakdown`.
"""

from __future__ import annotations

import gc
import gzip
import json
import operator
import re
import zlib
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.collectors.importers import Imported, ImportFormatError, _decode
from gpuprof.intervals import covered_ns, union
from gpuprof.model import Event, GpuSample, Span, columns, span_depths
from gpuprof.phases import canonical_phase

try:  # about 1.3-2x faster than the standard library on profiler traces
    import orjson
except ImportError:  # pragma: no cover - orjson is a dependency; the fallback keeps it optional
    orjson = None

FORMAT = "kineto"

BIN_NS = 100_000_000
"""Widest bin the exact busy intervals are turned into GPU samples over (100 ms); shorter
traces get narrower bins (`MIN_BINS` at least, down to `MIN_BIN_NS`) so that phases shorter
than 100 ms — a 60 ms data-loader wait in a 150 ms step — keep their own samples."""
MIN_BIN_NS = 1_000_000
MIN_BINS = 2_000
MAX_BINS = 100_000
"""Samples per GPU at most: a trace longer than 2.8 h (stray timestamps) gets wider bins."""

# Category (lower case) → kind code. Old Kineto used capitalised names for the same things.
KERNEL, MEMCPY, MEMSET, CPU_OP, ANNOTATION, RUNTIME, GPU_ANNOTATION, OTHER = range(8)
_CATEGORIES = {
    "kernel": KERNEL,
    "gpu_memcpy": MEMCPY,
    "memcpy": MEMCPY,
    "gpu_memset": MEMSET,
    "memset": MEMSET,
    "cpu_op": CPU_OP,
    "operator": CPU_OP,
    "user_annotation": ANNOTATION,
    "cuda_runtime": RUNTIME,
    "runtime": RUNTIME,
    "cuda_driver": RUNTIME,
    "gpu_user_annotation": GPU_ANNOTATION,
}
GPU_KINDS = (KERNEL, MEMCPY, MEMSET)

# GPU activity classes, in the priority order overlaps are resolved in.
COMPUTE, COMMUNICATION, MEMORY = 0, 1, 2

_KINETO_KEYS = re.compile(
    r'"(schemaVersion|deviceProperties|distributedInfo|baseTimeNanoseconds|traceName)"\s*:'
)
_KINETO_CATS = re.compile(
    r'"cat"\s*:\s*"(cpu_op|cuda_runtime|kernel|gpu_memcpy|gpu_memset|user_annotation|'
    r"gpu_user_annotation|python_function|Operator|Runtime|Kernel|Memcpy|Memset)\""
)
_STEP_NAME = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")
_STEP_LIKE = re.compile(r"^ProfilerStep\s*#\s*\d+$")
_DATALOADER = re.compile(r"^enumerate\(DataLoader\)#.*__next__$")
_SINGLE_PROCESS_LOADER = "_SingleProcessDataLoaderIter"
"""The iterator class a ``num_workers=0`` DataLoader names its ``__next__`` op after."""
RUNTIME_PHASES: dict[str, str] = {
    "cudaMalloc": "cuda_alloc",
    "cudaFree": "cuda_alloc",
    "cudaMallocHost": "cuda_alloc",
    "cudaFreeHost": "cuda_alloc",
    "cudaHostAlloc": "cuda_alloc",
    "cudaMallocAsync": "cuda_alloc",
    "cudaStreamSynchronize": "cuda_sync",
    "cudaDeviceSynchronize": "cuda_sync",
    "cudaEventSynchronize": "cuda_sync",
    "cudaMemcpy": "cuda_sync",
}
"""Blocking CUDA runtime calls kept as phase spans: while the host sits in the allocator
(``cuda_alloc``) or waits for the device (``cuda_sync``) it launches nothing."""
RUNTIME_MIN_NS = 100_000
"""Runtime calls shorter than this (100 µs) are launch overhead, not a blocking stall."""
_NOT_PHASES = re.compile(r"^(?:nccl|gloo|mpi|ucc|xccl|c10d)[:_]|^Optimizer\.zero_grad#", re.I)
_HASHES = re.compile(r"^#+\s*(.*?)\s*#+$")
_OPTIMIZER = re.compile(r"^Optimizer\.(\w+)#.*$")
_RANK_IN_NAME = re.compile(r"(?:^|[-_.])rank[-_]?(\d+)", re.I)
_HANDLER_NAME = re.compile(r"^(?P<host>.+)_(?P<pid>\d+)\.(?P<time>\d+)\.pt\.trace\.json(\.gz)?$")
_EPOCH_NS = (946_684_800 * 10**9, 4_102_444_800 * 10**9)
"""Wall-clock times a trace can plausibly have: 2000-01-01 to 2100-01-01, in ns."""
_MAX_US = 9.0e15
"""|ts| beyond this (µs) would overflow int64 nanoseconds."""


def sniff(head: str, path: Path) -> bool:
    """A Chrome trace (``traceEvents``) with Kineto's metadata keys or categories."""
    if '"traceEvents"' not in head:
        return False
    return bool(_KINETO_KEYS.search(head) or _KINETO_CATS.search(head))


@dataclass
class KinetoTrace:
    """The events of one trace as columns (one row per complete event with a valid time).

    ``start_ns``/``dur_ns`` are int64 nanoseconds on the trace's clock (wall clock when
    ``anchored``); ``kind`` is a code from `_CATEGORIES` (OTHER for the rest); ``pid``/``tid``
    are int64 (-1 when not a number); ``names`` are the event names. ``device``/``stream``/
    ``gpu_class`` hold GPU activities only (``gpu_rows`` are their row numbers), device -1
    when the trace does not say. ``args`` keeps each row's raw ``args`` for lazy lookups.
    """

    path: Path
    meta: dict[str, Any]
    rank: int | None
    host: str
    host_known: bool
    """Whether ``host`` is the machine's name (from the trace or the handler's file name)
    rather than a stand-in made from the file name."""
    anchored: bool
    start_ns: np.ndarray
    dur_ns: np.ndarray
    kind: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    names: np.ndarray
    args: list[Any]
    gpu_rows: np.ndarray
    device: np.ndarray
    stream: np.ndarray
    gpu_class: np.ndarray
    window_ns: tuple[int, int] | None
    """The profiled window: the profiler's own ``Trace`` span widened to every event."""
    mem_t_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """GPU memory records (``[memory]`` instants of ``profile_memory=True``): time, device,
    and the caching allocator's reserved bytes after the (de)allocation."""
    mem_device: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    mem_reserved_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    dropped: int = 0
    """Complete events dropped for a missing, non-numeric or negative time."""
    notes: list[str] = field(default_factory=list)

    @property
    def end_ns(self) -> np.ndarray:
        return self.start_ns + self.dur_ns


def load_trace(path: Path | str) -> KinetoTrace:
    """Decode one trace file into columns; raises `ImportFormatError` for malformed input."""
    path = Path(path)
    # a trace decodes into millions of small dicts: the cyclic collector would traverse them
    # all again and again while they are made (about 3x the decode time), and none of them
    # can form a cycle
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _load(path)
    finally:
        if collecting:
            gc.enable()


def _load(path: Path) -> KinetoTrace:
    data = _decode_json(path)
    if isinstance(data, dict):
        events = data.get("traceEvents")
        meta = {k: v for k, v in data.items() if k != "traceEvents"}
    elif isinstance(data, list):  # the bare-array form of the trace-event format
        events, meta = data, {}
    else:
        raise ImportFormatError(f"{path}: not a trace: the JSON is a {type(data).__name__}")
    if not isinstance(events, list):
        raise ImportFormatError(f"{path}: no traceEvents list")
    stray = 0
    if set(map(type, events)) - {dict}:
        kept = [e for e in events if type(e) is dict]
        stray, events = len(events) - len(kept), kept
    trace = _columns(path, meta, events)
    if stray:
        trace.notes.append(f"{stray} trace events that are not JSON objects were skipped")
    return trace


def _decode_json(path: Path) -> Any:
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise ImportFormatError(f"{path}: cannot read ({exc})") from None
    if orjson is not None:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # the standard library also takes NaN/Infinity, UTF-16 and huge integers
    try:
        return json.loads(_decode(raw))
    except json.JSONDecodeError as exc:
        # the decoder stops at the end of the text (or in a string left open) when cut short
        cut = exc.pos >= len(exc.doc.rstrip()) or exc.msg.startswith("Unterminated string")
        what = "truncated" if cut else "invalid"
        raise ImportFormatError(
            f"{path}:{exc.lineno}: {what} JSON ({exc.msg}, column {exc.colno})"
        ) from None
    except RecursionError:
        raise ImportFormatError(f"{path}: JSON nested too deeply") from None


def _get(events: list[dict], key: str) -> list[Any]:
    """One field of every event (None where absent), without a Python-level loop."""
    return list(map(dict.get, events, repeat(key)))


def _is_type(values: list[Any], kind: type) -> np.ndarray:
    """Which values are exactly of type ``kind`` (not a subclass: bool is no int here)."""
    same = map(operator.is_, map(type, values), repeat(kind))
    return np.fromiter(same, dtype=bool, count=len(values))


def _numbers(values: list[Any]) -> np.ndarray:
    """Values as float64; anything not a finite number (bools included) becomes NaN."""
    series = pd.Series(values, dtype=object)
    out = np.array(pd.to_numeric(series, errors="coerce"), dtype=np.float64)  # writable
    out[_is_type(values, bool) | ~np.isfinite(out)] = np.nan  # True is not a timestamp
    return out


def _ints(values: list[Any], default: int = -1) -> np.ndarray:
    """Integer ids (pid, tid, device, stream); digits inside strings ("stream 7") count too."""
    series = pd.Series(values, dtype=object)
    num = _numbers(values)
    bad = np.isnan(num)
    if bad.any():
        text = series[bad].map(lambda v: v if isinstance(v, str) else "")
        num[bad] = pd.to_numeric(text.str.extract(r"(\d+)", expand=False), errors="coerce")
    num[~np.isfinite(num) | (np.abs(num) > 2**62)] = default
    return num.astype(np.int64)


def _columns(path: Path, meta: dict[str, Any], events: list[dict]) -> KinetoTrace:
    notes: list[str] = []
    ts = _numbers(_get(events, "ts"))
    dur = _numbers(_get(events, "dur"))
    ph = pd.Series(_get(events, "ph"), dtype=object)
    complete = ph.isin(["X", None]).to_numpy() & ~np.isnan(ts)
    has_time = complete & ~np.isnan(dur)
    valid = has_time & (dur >= 0) & (np.abs(ts) < _MAX_US) & (dur < _MAX_US)
    dropped = int((complete & ph.notna().to_numpy() & ~valid).sum())
    rows = np.flatnonzero(valid)
    mem_rows, mem_device, mem_reserved = _memory_records(events, ph, ts)
    mem_ts, ts, dur = ts[mem_rows], ts[rows], dur[rows]

    base = meta.get("baseTimeNanoseconds")
    base = int(base) if isinstance(base, int | float) and not isinstance(base, bool) else None
    if base is not None and not (np.isfinite(base) and abs(base) < 2**62):
        base = None
    start, mem_t_ns = _to_ns(ts, base), _to_ns(mem_ts, base)
    dur_ns = np.rint(dur * 1000).astype(np.int64)
    anchored = True
    if len(start) and not (
        _EPOCH_NS[0] <= int(start.min()) and int((start + dur_ns).max()) < _EPOCH_NS[1]
    ):
        anchored = False
        origin = int(start.min())
        start, mem_t_ns = start - origin, mem_t_ns - origin
        notes.append("times are not on the wall clock: the trace is placed at time 0")

    picked = [events[i] for i in rows] if len(rows) != len(events) else events
    raw_cats = _get(picked, "cat")
    cats = pd.Series(raw_cats, dtype=object).where(_is_type(raw_cats, str), None)
    kind = cats.str.lower().map(_CATEGORIES).fillna(OTHER).to_numpy(np.int64)
    raw_names = _get(picked, "name")
    names = pd.Series(raw_names, dtype=object).where(_is_type(raw_names, str), "")
    names = names.to_numpy(object)
    pid = _ints(_get(picked, "pid"))
    tid = _ints(_get(picked, "tid"))
    args = _get(picked, "args")

    rank = _rank(path, meta)
    host, host_known = _host(path, meta)
    gpu_rows = np.flatnonzero(np.isin(kind, GPU_KINDS))
    gpu_args = [a if type(a) is dict else {} for a in (args[i] for i in gpu_rows)]
    device = _ints(_get(gpu_args, "device"))
    fallback = np.where(pid[gpu_rows] >= 0, pid[gpu_rows], rank if rank is not None else 0)
    device = np.where(device >= 0, device, fallback)
    stream = _ints(_get(gpu_args, "stream"))
    stream = np.where(stream >= 0, stream, tid[gpu_rows])
    gpu_class = _classify(names[gpu_rows], kind[gpu_rows])

    window = _window(names, kind, start, dur_ns, cats)
    if dropped:
        notes.append(f"{dropped} events without a usable time were skipped")
    return KinetoTrace(
        path=path,
        meta=meta,
        rank=rank,
        host=host,
        host_known=host_known,
        anchored=anchored,
        start_ns=start,
        dur_ns=dur_ns,
        kind=kind,
        pid=pid,
        tid=tid,
        names=names,
        args=args,
        gpu_rows=gpu_rows,
        device=device,
        stream=stream,
        gpu_class=gpu_class,
        window_ns=window,
        mem_t_ns=mem_t_ns,
        mem_device=mem_device,
        mem_reserved_bytes=mem_reserved,
        dropped=dropped,
        notes=notes,
    )


def _to_ns(ts_us: np.ndarray, base: int | None) -> np.ndarray:
    """µs (float) → int64 ns, whole and fractional parts apart so no precision is lost
    beyond what the float already lost; plus the trace's base time when it has one."""
    whole = np.floor(ts_us)
    ns = whole.astype(np.int64) * 1000 + np.rint((ts_us - whole) * 1000).astype(np.int64)
    return ns + base if base is not None else ns


_GPU_DEVICE_TYPES = (1, 6)
"""c10::DeviceType of CUDA and HIP in ``[memory]`` records (CPU is 0)."""


def _memory_records(events: list[dict], ph: pd.Series, ts: np.ndarray):
    """Rows, device and reserved bytes of the GPU ``[memory]`` instants with a usable time."""
    instant = np.flatnonzero(ph.eq("i").to_numpy() & ~np.isnan(ts) & (np.abs(ts) < _MAX_US))
    names = _get([events[i] for i in instant], "name")
    is_memory = map(operator.eq, names, repeat("[memory]"))
    instant = instant[np.fromiter(is_memory, dtype=bool, count=len(names))]
    args = [a if type(a) is dict else {} for a in _get([events[i] for i in instant], "args")]
    device_type = _ints(_get(args, "Device Type"))
    device = _ints(_get(args, "Device Id"))
    reserved = _numbers(_get(args, "Total Reserved"))
    allocated = _numbers(_get(args, "Total Allocated"))
    reserved = np.where(np.isnan(reserved), allocated, reserved)
    ok = np.isin(device_type, _GPU_DEVICE_TYPES) & (device >= 0) & ~np.isnan(reserved)
    return instant[ok], device[ok], reserved[ok]


def _classify(names: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """COMPUTE / COMMUNICATION / MEMORY for each GPU activity (see the module docstring)."""
    if len(names) == 0:
        return np.zeros(0, dtype=np.int8)
    # few distinct names in a real trace: classify each once
    codes, uniques = pd.factorize(pd.Series(names, dtype=object))
    text = pd.Series(uniques, dtype=object).astype(str)
    comm = text.str.contains("nccl", case=False, regex=False).to_numpy()
    mem = text.str.match(r"(Memcpy|Memset|dma)").to_numpy()
    per_name = np.where(comm, COMMUNICATION, np.where(mem, MEMORY, COMPUTE)).astype(np.int8)
    out = per_name[codes]
    out[(kind == MEMCPY) | (kind == MEMSET)] = MEMORY
    return out


def _window(names, kind, start, dur, cats) -> tuple[int, int] | None:
    if len(start) == 0:
        return None
    lo, hi = int(start.min()), int((start + dur).max())
    profiler = np.flatnonzero((cats.to_numpy() == "Trace") & (kind == OTHER))
    if len(profiler):
        lo = min(lo, int(start[profiler].min()))
        hi = max(hi, int((start[profiler] + dur[profiler]).max()))
    return lo, hi


def _rank(path: Path, meta: dict[str, Any]) -> int | None:
    info = meta.get("distributedInfo")
    if isinstance(info, dict):
        rank = info.get("rank")
        if isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < 2**31:
            return rank
    found = _RANK_IN_NAME.search(path.name)
    return int(found.group(1)) if found else None


def _host(path: Path, meta: dict[str, Any]) -> tuple[str, bool]:
    """The host's name and whether it is known (else a stand-in from the file name)."""
    for key in ("host_name", "hostname", "hostName"):
        value = meta.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip(), True
    handler = _HANDLER_NAME.match(path.name)
    if handler:
        return handler.group("host"), True
    stem = path.name.split(".")[0]
    stem = _RANK_IN_NAME.sub("", stem)
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).strip("_-.")
    return stem or "imported", False


# --------------------------------------------------------------------------------------------
# Intervals


def busy_before(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """For disjoint sorted intervals, the busy time before each instant of ``t``."""
    if len(starts) == 0:
        return np.zeros(len(t), dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(ends - starts)])
    k = np.searchsorted(starts, t, side="right")
    inside = np.where(k > 0, np.maximum(ends[np.maximum(k - 1, 0)] - t, 0), 0)
    return cum[k] - inside


def class_times(starts: np.ndarray, ends: np.ndarray, classes: np.ndarray) -> dict[str, int]:
    """Busy, compute, communication and memory ns of a set of activities (compute wins over
    communication over memory where they overlap): ``communication_ns`` is the exposed
    communication (NCCL kernels while no compute kernel runs), ``communication_all_ns`` every
    NCCL kernel's time, overlapped with compute or not."""
    compute = classes == COMPUTE
    comm = classes == COMMUNICATION
    upto_comm = classes <= COMMUNICATION
    busy = covered_ns(starts, ends)
    compute_ns = covered_ns(starts[compute], ends[compute])
    comm_or_compute = covered_ns(starts[upto_comm], ends[upto_comm])
    return {
        "busy_ns": busy,
        "compute_ns": compute_ns,
        "communication_ns": comm_or_compute - compute_ns,
        "communication_all_ns": covered_ns(starts[comm], ends[comm]),
        "memory_ns": busy - comm_or_compute,
    }


# --------------------------------------------------------------------------------------------
# The import


def parse(path: Path) -> Imported:
    """Import one trace file (see the module docstring); `ImportFormatError` when malformed."""
    try:
        trace = load_trace(path)
        return _imported(trace)
    except ImportFormatError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, OverflowError) as exc:
        # a structure no check above foresaw: still one line naming the file, never a traceback
        raise ImportFormatError(f"{path}: unreadable Kineto trace ({exc})") from None


def _imported(trace: KinetoTrace) -> Imported:
    notes = list(trace.notes)
    if trace.rank is None:
        notes.append("the trace names no rank: taken as rank 0")
    rank = trace.rank if trace.rank is not None else 0
    main_pid = _main_pid(trace)
    steps = _steps(trace)
    spans = _phase_spans(trace, rank, steps)
    step_spans, step_events = _step_records(trace, rank, steps)
    gpu, gpu_events, gpus = _gpu_samples(trace, rank, main_pid, notes)
    frames: dict[str, pd.DataFrame] = {}
    all_spans = pd.concat([f for f in (step_spans, spans) if len(f)] or [spans])
    if len(all_spans):
        all_spans = all_spans.sort_values("start_ns", kind="stable", ignore_index=True)
        all_spans["depth"] = span_depths(all_spans)
        frames["spans"] = all_spans
    events = pd.concat([f for f in (step_events, gpu_events) if len(f)] or [step_events])
    if len(events):
        frames["events"] = events.reset_index(drop=True)
    if len(gpu):
        frames["gpu"] = gpu
    if not len(gpu):
        notes.append("no GPU activity in the trace: phases only")
    meta: dict[str, Any] = {"gpus": gpus}
    loader_names = pd.Series(trace.names, dtype=object).astype(str)
    loader_names = loader_names[loader_names.str.match(_DATALOADER)]
    if len(loader_names):
        # the loader's own op names say how many workers it had: none, or some
        single = loader_names.str.contains(_SINGLE_PROCESS_LOADER, regex=False).all()
        if single:
            meta["knobs"] = {"num_workers": 0}
            notes.append("the DataLoader ran in the main process (num_workers=0)")
    if trace.host_known:
        meta["hosts"] = [trace.host]
    if trace.window_ns is not None:
        meta["start_ns"], meta["end_ns"] = trace.window_ns
    if len(gpu):
        meta["interval_s"] = _bin_ns(trace.window_ns) / 1e9
    info = trace.meta.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("world_size"), int):
        notes.append(f"rank {rank} of {info['world_size']}")
    return Imported(
        source=trace.path,
        format=FORMAT,
        frames=frames,
        meta=meta,
        anchored=trace.anchored,
        notes=notes,
    )


def _main_pid(trace: KinetoTrace) -> int:
    cpu = np.isin(trace.kind, (CPU_OP, ANNOTATION, RUNTIME)) & (trace.pid >= 0)
    if not cpu.any():
        return 0
    values, counts = np.unique(trace.pid[cpu], return_counts=True)
    return int(values[np.argmax(counts)])


@dataclass
class _Steps:
    rows: np.ndarray
    numbers: np.ndarray
    starts: np.ndarray
    ends: np.ndarray


def _steps(trace: KinetoTrace) -> _Steps:
    """``ProfilerStep#N`` ranges on the CPU side, sorted by start, one per step number."""
    cpu = np.flatnonzero(np.isin(trace.kind, (CPU_OP, ANNOTATION)))
    names = pd.Series(trace.names[cpu], dtype=object).astype(str)
    number = pd.to_numeric(names.str.extract(_STEP_NAME, expand=False), errors="coerce")
    ok = number.notna().to_numpy() & (number.to_numpy(np.float64, na_value=np.nan) < 2**62)
    rows = cpu[ok]
    numbers = number.to_numpy(np.float64, na_value=np.nan)[ok].astype(np.int64)
    order = np.lexsort((trace.start_ns[rows], numbers))
    rows, numbers = rows[order], numbers[order]
    first = np.ones(len(rows), dtype=bool)
    first[1:] = numbers[1:] != numbers[:-1]  # a step recorded twice: keep its first range
    rows, numbers = rows[first], numbers[first]
    order = np.argsort(trace.start_ns[rows], kind="stable")
    rows, numbers = rows[order], numbers[order]
    return _Steps(rows, numbers, trace.start_ns[rows], trace.end_ns[rows])


def _step_of(steps: _Steps, t: np.ndarray) -> np.ndarray:
    """The ProfilerStep number covering each instant (NaN outside every step)."""
    out = np.full(len(t), np.nan)
    if len(steps.rows) == 0:
        return out
    k = np.searchsorted(steps.starts, t, side="right") - 1
    k0 = np.maximum(k, 0)
    hit = (k >= 0) & (t < steps.ends[k0])
    out[hit] = steps.numbers[k0[hit]]
    return out


def phase_name(name: str) -> str:
    """The name a profiler range goes by as a phase: ``## forward ##`` → ``forward``,
    ``Optimizer.step#AdamW.step`` → ``optimizer.step``."""
    hashed = _HASHES.match(name)
    if hashed:
        name = hashed.group(1)
    optimizer = _OPTIMIZER.match(name)
    if optimizer:
        name = f"optimizer.{optimizer.group(1)}"
    return name


def _span_frame(trace, rows, rank, phases, names, steps_of, attrs) -> pd.DataFrame:
    frame = pd.DataFrame(
        {
            "host": trace.host,
            "pid": np.maximum(trace.pid[rows], 0),
            "tid": np.maximum(trace.tid[rows], 0),
            "rank": pd.array(np.full(len(rows), rank), dtype="Int64"),
            "local_rank": pd.array([None] * len(rows), dtype="Int64"),
            "phase": phases,
            "name": names,
            "step": pd.array([None if np.isnan(s) else int(s) for s in steps_of], dtype="Int64"),
            "depth": np.zeros(len(rows), dtype=np.int64),
            "start_ns": trace.start_ns[rows],
            "end_ns": trace.end_ns[rows],
            "gpu_start_ns": pd.array([None] * len(rows), dtype="Int64"),
            "gpu_end_ns": pd.array([None] * len(rows), dtype="Int64"),
            "attrs": attrs,
        }
    )
    return frame[columns(Span)]


def _phase_spans(trace: KinetoTrace, rank: int, steps: _Steps) -> pd.DataFrame:
    """User annotations and DataLoader ``__next__`` ops as phase spans."""
    kind, names = trace.kind, trace.names
    annotation = np.flatnonzero(kind == ANNOTATION)
    ann_names = pd.Series(names[annotation], dtype=object).astype(str)
    keep = ~(ann_names.str.match(_STEP_LIKE) | ann_names.str.contains(_NOT_PHASES))
    keep &= ann_names.str.len() > 0
    annotation = annotation[keep.to_numpy()]
    cpu = np.flatnonzero(np.isin(kind, (CPU_OP, ANNOTATION)))
    loader = cpu[pd.Series(names[cpu], dtype=object).astype(str).str.match(_DATALOADER).to_numpy()]
    runtime = np.flatnonzero(kind == RUNTIME)
    rt_names = pd.Series(names[runtime], dtype=object).astype(str)
    long_enough = (trace.end_ns[runtime] - trace.start_ns[runtime]) >= RUNTIME_MIN_NS
    blocking = rt_names.isin(list(RUNTIME_PHASES)).to_numpy() & long_enough
    runtime = runtime[blocking]
    rows = np.union1d(np.union1d(annotation, loader), runtime)
    if len(rows) == 0:
        return _span_frame(trace, rows, rank, [], [], np.zeros(0), [])
    raw = pd.Series(names[rows], dtype=object).astype(str)
    is_loader = np.isin(rows, loader)
    is_runtime = np.isin(rows, runtime)
    # map each distinct name once: a trace repeats the same few ranges every step
    codes, uniques = pd.factorize(raw)
    mapped = np.array([canonical_phase(phase_name(u)) for u in uniques], dtype=object)
    phases = mapped[codes]
    phases[is_loader] = "dataload"
    phases[is_runtime] = raw[is_runtime].map(RUNTIME_PHASES).to_numpy(object)
    steps_of = _step_of(steps, trace.start_ns[rows])
    attrs = [{"source": "kineto"}] * len(rows)
    return _span_frame(trace, rows, rank, phases, raw.to_numpy(object), steps_of, attrs)


def _step_records(trace: KinetoTrace, rank: int, steps: _Steps):
    rows = steps.rows
    spans = _span_frame(
        trace,
        rows,
        rank,
        np.full(len(rows), "step", dtype=object),
        trace.names[rows],
        steps.numbers.astype(np.float64),
        [{"source": "kineto"}] * len(rows),
    )
    events = pd.DataFrame(
        {
            "host": trace.host,
            "pid": np.maximum(trace.pid[rows], 0),
            "rank": pd.array(np.full(len(rows), rank), dtype="Int64"),
            "t_ns": trace.end_ns[rows],
            "kind": "step",
            "name": [str(n) for n in steps.numbers],
            "attrs": [{"source": "kineto"}] * len(rows),
        }
    )
    return spans, events[columns(Event)]


def _gpu_samples(trace: KinetoTrace, rank: int, main_pid: int, notes: list[str]):
    """GPU samples per bin (`_bin_ns`), one exact-figures event per GPU, and the GPU inventory.

    ``util_gpu_pct`` is the busy share of each bin when the trace recorded GPU activity (NaN
    when it recorded memory only); ``mem_used_bytes`` the most the caching allocator had
    reserved during the bin (``profile_memory=True`` traces; without the CUDA context's few
    hundred MB that NVML also counts).
    """
    props = _device_properties(trace.meta)
    rows = trace.gpu_rows
    samples, events, gpus = [], [], []
    devices = np.union1d(trace.device, trace.mem_device)
    if len(devices) == 0 or trace.window_ns is None:
        empty_events = pd.DataFrame({c: [] for c in columns(Event)})
        return pd.DataFrame(), empty_events, gpus
    lo, hi = trace.window_ns
    bin_ns = _bin_ns(trace.window_ns)
    if bin_ns > BIN_NS:
        notes.append(
            f"the trace spans {(hi - lo) / 3.6e12:.3g} h: GPU samples every {bin_ns / 1e9:.3g} s"
        )
    edges = np.arange(lo, max(hi, lo + 1), bin_ns, dtype=np.int64)
    bin_ends = np.minimum(np.append(edges[1:], hi), hi)
    width = np.maximum(bin_ends - edges, 1)
    starts, ends = trace.start_ns[rows], trace.end_ns[rows]
    window = hi - lo
    for device in devices:
        mine = trace.device == device
        prop = props.get(int(device), {})
        total = prop.get("totalGlobalMem")
        total = total if isinstance(total, int) and not isinstance(total, bool) else None
        util = np.full(len(edges), np.nan)
        if len(rows):
            s, e, cls = starts[mine], ends[mine], trace.gpu_class[mine]
            times = class_times(s, e, cls)
            merged = union(s, e)
            util = 100.0 * (busy_before(*merged, bin_ends) - busy_before(*merged, edges)) / width
            kinds = trace.kind[rows][mine]
            figures = {
                "gpu": int(device),
                "window_ns": window,
                "active_ns": int(e.max() - s.min()) if len(s) else 0,
                "idle_ns": window - times["busy_ns"],
                **times,
                "kernels": int((kinds == KERNEL).sum()),
                "memcpys": int((kinds == MEMCPY).sum()),
                "memsets": int((kinds == MEMSET).sum()),
                "streams": len(np.unique(trace.stream[mine])),
            }
            events.append((trace.host, main_pid, rank, hi, "gpu_time", "kineto", figures))
            notes.append(
                f"GPU {int(device)}: busy {times['busy_ns'] / 1e9:.6g} s of "
                f"{window / 1e9:.6g} s ({100 * times['busy_ns'] / max(window, 1):.1f}%): "
                f"compute {times['compute_ns'] / 1e9:.6g} s, communication "
                f"{times['communication_ns'] / 1e9:.6g} s, memory "
                f"{times['memory_ns'] / 1e9:.6g} s; {figures['kernels']} kernels"
            )
        at = trace.mem_device == device
        samples.append(
            pd.DataFrame(
                {
                    "host": trace.host,
                    "gpu": np.full(len(edges), int(device), dtype=np.int64),
                    "uuid": None,
                    # a sample stands for [t_ns, next sample): stamped at its bin's start
                    "t_ns": edges,
                    "util_gpu_pct": util,
                    "mem_used_bytes": _peak_per_bin(
                        trace.mem_t_ns[at], trace.mem_reserved_bytes[at], edges
                    ),
                    "mem_total_bytes": float(total) if total is not None else np.nan,
                }
            )
        )
        entry: dict[str, Any] = {"host": trace.host, "index": int(device)}
        if isinstance(prop.get("name"), str):
            entry["name"] = prop["name"]
        if total is not None:
            entry["mem_total_bytes"] = total
        gpus.append(entry)
    if not len(rows):
        notes.append("GPU memory recorded but no GPU activity: utilisation unknown")
    gpu = pd.concat(samples, ignore_index=True)
    for col in columns(GpuSample):
        if col not in gpu:
            gpu[col] = np.nan
    event_frame = pd.DataFrame(events, columns=columns(Event))
    return gpu[columns(GpuSample)], event_frame, gpus


def _peak_per_bin(t: np.ndarray, level: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The highest value a step function (``level`` from each time ``t`` on) takes in each
    bin starting at ``edges``; NaN before its first change."""
    out = np.full(len(edges), np.nan)
    if len(t) == 0:
        return out
    order = np.argsort(t, kind="stable")
    t, level = t[order], level[order]
    carried = np.searchsorted(t, edges, side="right") - 1  # the level as each bin opens
    known = carried >= 0
    out[known] = level[carried[known]]
    inside = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, len(edges) - 1)
    np.fmax.at(out, inside, level)  # and every level reached inside the bin
    return out


def _bin_ns(window: tuple[int, int] | None) -> int:
    """The sample period: ``window / MIN_BINS`` between `MIN_BIN_NS` and `BIN_NS`, widened so
    a window gives at most `MAX_BINS` samples."""
    if window is None:
        return BIN_NS
    span = window[1] - window[0]
    return max(min(BIN_NS, max(MIN_BIN_NS, span // MIN_BINS)), -(-span // MAX_BINS))


def _device_properties(meta: dict[str, Any]) -> dict[int, dict[str, Any]]:
    props = meta.get("deviceProperties")
    out: dict[int, dict[str, Any]] = {}
    if isinstance(props, list):
        for entry in props:
            if isinstance(entry, dict) and isinstance(entry.get("id"), int):
                out[entry["id"]] = entry
    return out
