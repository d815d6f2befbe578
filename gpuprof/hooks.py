"""The in-process API: ``phase()``, ``step()``, ``mark()``, ``init()``.

Cost model: entering and leaving a phase reads the monotonic clock twice and appends one tuple
to a deque; a daemon thread turns the tuples into rows and commits them every quarter second. The
training thread never touches SQLite, never synchronises a GPU and never sees an exception from
here: an internal error prints one warning and turns the hooks into no-ops.

Under ``gpuprof watch`` the hooks find the run through ``GPUPROF_RUN_DIR`` (and write the
watcher's host file named in ``GPUPROF_DB`` when on the watcher's host); outside any run they do
nothing. A process without a watcher on its host (a Ray worker on another node) writes a file of
its own, ``<run>/<host>.<pid>.sqlite``, merged when the run is loaded.
"""

from __future__ import annotations

import atexit
import collections
import functools
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from gpuprof import nodes
from gpuprof.phases import canonical_phase

ENV_RUN_DIR = "GPUPROF_RUN_DIR"
ENV_DB = "GPUPROF_DB"
ENV_HOST = nodes.ENV_NODE
ENV_CUDA_EVENTS = "GPUPROF_CUDA_EVENTS"
ENV_MAX_QUEUED = "GPUPROF_MAX_QUEUED_SPANS"
ENV_PURE_PYTHON = "GPUPROF_PURE_PYTHON_HOOKS"
"""Set (not "0"): `phase` runs in pure Python even where its C part (`gpuprof._cphase`) is
built: to compare the two, or to rule the C part out."""
ENV_STATUS_DIR = "GPUPROF_STATUS_DIR"
"""Where a process whose recording failed leaves ``<pid>.json`` (steps seen and written) for
the watcher: a directory in memory (/dev/shm), so it still works when the run's disk is full,
read-only or gone."""
FLUSH_INTERVAL_S = 0.25
"""How often a process's hooks commit what they queued: at most this much (plus one commit) of
spans is lost when the process is killed (SIGKILL, the OOM killer); budget 0.5 s."""
MAX_QUEUED_SPANS = 1_000_000
"""Spans a process keeps queued for the writer at most (~210 MB of RSS when full, measured by
benchmarks/bench_queue_memory.py): minutes of a loop recording thousands of spans a second while
the writer is stalled (a slow disk). Beyond it the oldest
queued spans are dropped and counted; the run says how many."""

WRITE_CHUNK = 50_000
"""Spans turned into rows and committed at a time (bounds the writer's working memory)."""

F = TypeVar("F", bound=Callable[..., Any])

_STEP, _MARK = 1, 2
_mono = time.monotonic_ns
_get_ident = threading.get_ident
"""The hot path's thread id: ``pthread_self``, a few ns. The kernel's id
(``threading.get_native_id``) is a system call per span here (~0.25 µs); the writer maps one to
the other (`_native_ids`)."""
_RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
_LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
_WORLD_SIZE_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def _env_int(names: tuple[str, ...]) -> int | None:
    for name in names:
        value = os.environ.get(name)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                continue
    return None


class _Recorder:
    """Per-process state of an active run: the queues, the clock offset and the writer thread."""

    def __init__(self, db_path: Path, *, cuda_events: bool = False) -> None:
        # The run-file writer (SQLite, no pandas or Arrow) loads here, in the thread that
        # starts recording, not at `import gpuprof` (a process outside any run never loads
        # it) and not first in the writer thread (whose import would then race the
        # training's own imports).
        from gpuprof import runfile  # noqa: F401

        self.db_path = db_path
        self.host = nodes.node_name()
        self.pid = os.getpid()
        # Spans are timed on the monotonic clock (immune to NTP steps) and shifted onto the
        # epoch once, so every process on the host agrees within microseconds.
        self.offset_ns = nodes.now_ns() - time.monotonic_ns()
        bound = _env_int((ENV_MAX_QUEUED,))  # junk or non-positive: the default bound
        self.max_queued = bound if bound is not None and bound > 0 else MAX_QUEUED_SPANS
        self.spans: collections.deque = collections.deque(maxlen=self.max_queued)
        """(name, attrs, start, end, thread ident, step[, cuda event pair]) — monotonic ns,
        `threading.get_ident` (stored as the kernel's thread id). Bounded:
        when the writer falls behind, the oldest spans go (counted in `dropped`)."""
        self._queued = itertools.count()
        self.tick = self._queued.__next__
        """Called once per queued span, before the append (one C call)."""
        self.taken = 0
        self.dropped = 0
        self.other: collections.deque = collections.deque()
        """Step boundaries and marks, tagged with ``_STEP`` / ``_MARK``."""
        self.step = 0
        self.step_start = time.monotonic_ns()
        self.steps_seen = 0
        self.steps_written = 0
        self.failed_at_ns: int | None = None
        self.failure = ""
        self.cuda = _CudaTimer() if cuda_events else None
        self.pending_gpu: list[tuple] = []
        self.conn = None
        self.native_ids: dict[int, int] = {}
        """`threading.get_ident` → kernel thread id, of every thread seen alive at a flush."""
        self.failed = False
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.announced = False
        self.thread = threading.Thread(target=self._loop, name="gpuprof-hooks", daemon=True)
        self.thread.start()
        mp_util = sys.modules.get("multiprocessing.util")
        if mp_util is not None:
            # multiprocessing children (DataLoader workers) leave through os._exit, skipping
            # atexit; their finalizers still run
            try:
                mp_util.Finalize(None, shutdown, exitpriority=100)
            except Exception:
                pass

    def _loop(self) -> None:
        while not self.stop.wait(FLUSH_INTERVAL_S):
            self.flush()

    def flush(self, final: bool = False) -> None:
        """Commit everything queued (CUDA-timed spans wait until their events completed)."""
        with self.lock:
            if self.failed:
                self.spans.clear()
                self.other.clear()
                return
            # in chunks: a full queue turned into rows at once would double its memory; no
            # more chunks than the queue held when the flush began (producers keep adding)
            chunks = 1 + len(self.spans) // WRITE_CHUNK
            try:
                for _ in range(chunks):
                    spans = _drain(self.spans, WRITE_CHUNK)
                    other = _drain(self.other)
                    self._count_dropped(other, len(spans))
                    if not spans and not other and not self.pending_gpu:
                        return
                    if self.conn is not None and not self.db_path.exists():
                        # SQLite would keep writing into the unlinked file: nothing kept
                        raise OSError(f"the run directory {self.db_path.parent} was removed")
                    self._write(spans, other, final)
                    del spans, other
            except Exception as exc:  # a full disk or a removed run dir must not hurt training
                self.failed = True
                self.failed_at_ns = time.time_ns()
                from gpuprof import runfile

                self.failure = runfile.failure_reason(exc, self.db_path)
                when = time.strftime("%H:%M:%S", time.localtime(self.failed_at_ns / 1e9))
                _warn_once(
                    f"gpuprof: recording stopped at {when}: {self.failure} "
                    f"({self.db_path.name}); the training goes on unrecorded"
                )

    def _count_dropped(self, other: list[tuple], taken: int) -> None:
        """Spans the bounded queue let go since the last flush: queued (ticks) minus taken
        minus still queued. A span ticked but not yet appended reads as dropped for a moment,
        so the total only ever grows to the true figure; it is recorded as a ``dropped``
        event whenever it grows."""
        self.taken += taken
        ticked = int(repr(self._queued)[6:-1])  # count(N): N spans ticked so far
        dropped = max(self.dropped, ticked - self.taken - len(self.spans))
        if dropped > self.dropped:
            self.dropped = dropped
            other.append((_MARK, "spans", {"spans": dropped}, time.monotonic_ns(), "dropped"))
            _warn_once(
                f"gpuprof: the writer fell behind and spans were dropped (more than "
                f"{self.max_queued} queued; {ENV_MAX_QUEUED} sets the bound)"
            )

    def _write(self, items: list[tuple], other: list[tuple], final: bool) -> None:
        host, pid, offset = self.host, self.pid, self.offset_ns
        rank = _env_int(_RANK_VARS)
        local_rank = _env_int(_LOCAL_RANK_VARS)
        events = []
        if not self.announced:
            events.append(self._process_event(rank, local_rank))
            self.announced = True
        if self.cuda is not None:
            items, self.pending_gpu = self._with_gpu_times(self.pending_gpu + items, final)
        canonical, encode = _canonical, _encode_attrs
        native = _native_ids(self.native_ids).get
        if self.cuda is None:
            spans = [
                (host, pid, native(tid, tid), rank, local_rank, canonical(name), _text(name),
                 step, 0, start + offset, end + offset, None, None, encode(attrs))
                for name, attrs, start, end, tid, step in items
            ]  # fmt: skip
        else:
            spans = [
                (host, pid, native(item[4], item[4]), rank, local_rank, canonical(item[0]),
                 _text(item[0]),
                 item[5], 0, item[2] + offset, item[3] + offset,
                 item[6] if len(item) > 6 else None, item[7] if len(item) > 7 else None,
                 encode(item[1]))
                for item in items
            ]  # fmt: skip
        for item in other:
            if item[0] == _STEP:
                _, n, attrs, start, end, tid = item
                encoded = _encode_attrs(attrs)
                spans.append(
                    (host, pid, native(tid, tid), rank, local_rank, "step", "step", n, 0,
                     start + offset, end + offset, None, None, encoded)
                )  # fmt: skip
                events.append((host, pid, rank, end + offset, "step", str(n), encoded))
            else:
                kind = item[4] if len(item) > 4 else "mark"  # "knobs" from `record_knobs`
                _, name, attrs, t = item[:4]
                events.append(
                    (host, pid, rank, t + offset, kind, _text(name), _encode_attrs(attrs))
                )
        # the run-file writer (SQLite) loads only in a process that records
        from gpuprof import runfile

        if self.conn is None:
            if str(self.db_path) == os.environ.get(ENV_DB):
                # the watcher's file: its directory exists from before the command started,
                # so a missing one was removed, and is not made again for one process's spans
                if not self.db_path.parent.is_dir():
                    raise OSError(f"the run directory {self.db_path.parent} was removed")
            else:
                self.db_path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = runfile.connect(self.db_path)
        runfile.insert_encoded(self.conn, {"spans": spans, "events": events})
        self.steps_written += sum(1 for item in other if item[0] == _STEP)

    def _process_event(self, rank: int | None, local_rank: int | None) -> tuple:
        attrs = {
            "ppid": os.getppid(),
            "local_rank": local_rank,
            "world_size": _env_int(_WORLD_SIZE_VARS),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "executable": os.path.basename(sys.executable),
        }
        return (self.host, self.pid, rank, nodes.now_ns(), "process", "start", _encode_attrs(attrs))

    def _with_gpu_times(self, items: list[tuple], final: bool) -> tuple[list[tuple], list[tuple]]:
        """Attach GPU times to spans whose CUDA events completed; keep the rest for later."""
        ready, waiting = [], []
        for item in items:
            if len(item) < 7:
                ready.append(item)
                continue
            gpu_start, gpu_end = self.cuda.resolve(item[6], self.offset_ns)
            if gpu_start is None and not final and len(waiting) < 10_000:
                waiting.append(item)
            else:
                ready.append((*item[:6], gpu_start, gpu_end))
        return ready, waiting

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=5.0)
        self.flush(final=True)
        with self.lock:
            if self.conn is not None:
                try:
                    self.conn.close()
                except Exception:
                    pass
                self.conn = None
        if self.failed:
            self._leave_status()

    def _leave_status(self) -> None:
        """Tell the watcher how much of this process's record was lost (best effort)."""
        status_dir = os.environ.get(ENV_STATUS_DIR)
        if not status_dir:
            return
        status = {
            "pid": self.pid,
            "host": self.host,
            "steps_seen": self.steps_seen,
            "steps_written": self.steps_written,
            "failed_at_ns": self.failed_at_ns,
            "reason": self.failure,
        }
        path = Path(status_dir) / f"{self.pid}.json"
        try:
            tmp = path.with_name(path.name + ".tmp")
            import json

            tmp.write_text(json.dumps(status))
            os.replace(tmp, path)
        except Exception:
            pass


def _native_ids(known: dict[int, int]) -> dict[int, int]:
    """``known`` updated with the threads alive now: `threading.get_ident` → kernel thread id.

    Threads that ended keep their last mapping (their spans may still be queued); an ident
    reused by a new thread takes the new thread's id. A thread Python's `threading` does not
    know (started from C and never asked for `threading.current_thread()`) keeps its ident.
    """
    for thread in threading.enumerate():
        if thread.ident is not None and thread.native_id is not None:
            known[thread.ident] = thread.native_id
    return known


def _drain(queue: collections.deque, limit: int | None = None) -> list:
    # popleft is atomic, so hooks may keep appending while we drain
    n = len(queue) if limit is None else min(limit, len(queue))
    return [queue.popleft() for _ in range(n)]


@functools.lru_cache(maxsize=4096)
def _canonical(name: Any) -> str:
    if type(name) is tuple:  # (framework name, canonical phase) from `framework_phase`
        return name[1]
    return canonical_phase(_text(name))


def _text(name: Any) -> str:
    # a phase named with a number or an enum must not stop the recording
    if type(name) is str:
        return name
    return str(name[0]) if type(name) is tuple else str(name)


@functools.cache
def _json() -> tuple[Callable[[Any], str], Callable[[str], str]]:
    """The full JSON encoder and the C-accelerated string escaper, loaded by the writer (not
    at `import gpuprof`)."""
    import json

    encoder = json.JSONEncoder(separators=(",", ":"), default=str)
    return encoder.encode, json.encoder.encode_basestring


def _encode_attrs(attrs: dict[str, Any] | None) -> str:
    """JSON text of span attributes; flat dicts of str/int/bool (the usual case) take a fast
    path that is several times quicker than ``json.dumps``."""
    if not attrs:
        return "{}"
    _json_encode, _json_str = _json()
    parts = []
    for key, value in attrs.items():
        kind = type(value)
        if kind is int:
            text = str(value)
        elif kind is str:
            text = _json_str(value)
        elif kind is bool:
            text = "true" if value else "false"
        elif value is None:
            text = "null"
        else:  # floats (NaN/inf spelling), nested values, objects: the full encoder
            return _json_encode(attrs)
        if type(key) is not str:
            return _json_encode(attrs)
        parts.append(f"{_json_str(key)}:{text}")
    return "{" + ",".join(parts) + "}"


class _CudaTimer:
    """GPU-side span timing with CUDA events: record on enter/exit, read later, never wait.

    Event pairs are resolved by the writer thread once ``query()`` says they completed; their
    times are placed on the host clock relative to a reference event recorded at start-up.
    """

    def __init__(self) -> None:
        import torch  # only imported when the user asked for CUDA timing

        self.torch = torch
        self.ref = torch.cuda.Event(enable_timing=True)
        self.ref.record()
        self.ref_mono_ns = time.monotonic_ns()

    def start(self) -> Any:
        if not self.torch.cuda.is_initialized():
            return None
        begin = self.torch.cuda.Event(enable_timing=True)
        begin.record()
        return [begin, None]

    def stop(self) -> Any:
        end = self.torch.cuda.Event(enable_timing=True)
        end.record()
        return end

    def resolve(self, pair: list, offset_ns: int) -> tuple[int | None, int | None]:
        begin, end = pair
        if end is None or not (self.ref.query() and begin.query() and end.query()):
            return None, None
        base = self.ref_mono_ns + offset_ns
        return (
            base + int(self.ref.elapsed_time(begin) * 1e6),
            base + int(self.ref.elapsed_time(end) * 1e6),
        )


# -- process-wide state ------------------------------------------------------------------------
_recorder: _Recorder | None = None
_checked = False
_fast: _Recorder | None = None
"""`_recorder` while it times phases on the host only (no CUDA events): what the hot path of
`phase` checks first."""
_fast_tick: Callable[[], int] = int
_fast_append: Callable[[tuple], None] = len
"""`_fast`'s span counter and queue append, as globals: a global is read with fewer
instructions than an attribute of the recorder (set before `_fast`, never read without it)."""
_cphase: Any = None
"""The C part of `phase` (`gpuprof._cphase`) when it is in use: `_set_recorder` keeps its
state in step with `_fast`."""
_inherited_step = 0
_init_lock = threading.Lock()
_warned: set[str] = set()


def _warn_once(message: str) -> None:
    """One plain line on stderr, once per message: a Python warning would print a source
    path and a code line into the training's output, and may be turned into an error by
    the training's own warning filters."""
    if message in _warned:
        return
    _warned.add(message)
    try:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
    except Exception:
        pass


def _set_recorder(recorder: _Recorder | None, checked: bool = True) -> None:
    """Make ``recorder`` the process's (None: record nothing); the one place that sets the
    hot path's `_fast` beside it."""
    global _recorder, _checked, _fast, _fast_tick, _fast_append
    _fast = None  # first: a phase exiting meanwhile takes the slow path, which re-reads
    if _cphase is not None:
        _cphase.set_fast(None, None, None, False)
    _recorder, _checked = recorder, checked
    if recorder is not None and recorder.cuda is None:
        _fast_tick, _fast_append = recorder.tick, recorder.spans.append
        _fast = recorder
    if _cphase is not None:
        _cphase.set_fast(_fast, _fast_tick, _fast_append, checked and recorder is None)


def _disable(exc: BaseException) -> None:
    _warn_once(f"gpuprof: hooks disabled after an internal error: {exc!r}")
    _set_recorder(None)


def _resolve_db(run_dir: Path) -> Path:
    """The file this process writes: the watcher's host file when it runs on this host."""
    db = os.environ.get(ENV_DB)
    if db and nodes.on_watcher_machine():
        return Path(db)
    from gpuprof import runfile

    return runfile.host_file(run_dir, nodes.node_name(), os.getpid())


def _from_env() -> _Recorder | None:
    with _init_lock:
        if _checked:
            return _recorder
        run_dir = os.environ.get(ENV_RUN_DIR)
        recorder = None
        if run_dir:
            try:
                cuda = os.environ.get(ENV_CUDA_EVENTS, "") not in ("", "0")
                recorder = _Recorder(_resolve_db(Path(run_dir)), cuda_events=cuda)
                recorder.step = _inherited_step
            except Exception as exc:
                _disable(exc)
        # only now: threads arriving while the recorder is built must wait on the lock, not
        # read "checked, no recorder" and skip their spans
        _set_recorder(recorder)
        return recorder


def _active() -> _Recorder | None:
    recorder = _recorder
    if recorder is None and not _checked:
        recorder = _from_env()
    return recorder


def init(run_dir: str | os.PathLike | None = None, *, cuda_events: bool = False) -> bool:
    """Start recording into ``run_dir`` (default: the run of the enclosing ``gpuprof watch``).

    Returns True when hooks record from now on. Never raises: a failure warns once and
    leaves the hooks as no-ops.
    """
    try:
        with _init_lock:
            if _recorder is not None:
                _recorder.close()
            _set_recorder(None)
            target = run_dir or os.environ.get(ENV_RUN_DIR)
            if not target:
                return False
            path = Path(target)
            if run_dir is not None:
                os.environ[ENV_RUN_DIR] = str(path.resolve())
                path.mkdir(parents=True, exist_ok=True)
            _set_recorder(_Recorder(_resolve_db(path), cuda_events=cuda_events))
            return True
    except Exception as exc:
        _disable(exc)
        return False


def shutdown() -> None:
    """Commit what is queued and stop recording (also runs at interpreter exit)."""
    recorder = _recorder
    _set_recorder(None)
    if recorder is not None:
        try:
            recorder.close()
        except Exception as exc:
            _warn_once(f"gpuprof: final flush failed: {exc!r}")


def flush() -> None:
    """Commit what is queued now (normally the writer thread does this four times a second)."""
    recorder = _recorder
    if recorder is not None:
        recorder.flush()


def enabled() -> bool:
    """True when hooks are recording into a run."""
    return _active() is not None


class _PhaseMethods:
    """What both implementations of `phase` share: the slow paths, async use, decorating."""

    __slots__ = ()
    name: Any
    attrs: dict[str, Any] | None
    _start: int | None
    _gpu: Any

    def _enter_slow(self) -> phase:
        """Outside a run (the first phase of a process looks for one), or timed with CUDA."""
        self._start = self._gpu = None
        recorder = _recorder
        if recorder is None and (_checked or (recorder := _from_env()) is None):
            return self  # type: ignore[return-value]
        if recorder.cuda is not None:
            try:
                self._gpu = recorder.cuda.start()
            except Exception as exc:
                _disable(exc)
                return self  # type: ignore[return-value]
        self._start = _mono()
        return self  # type: ignore[return-value]

    def _exit_slow(self, exc_type: Any, end: int) -> None:
        start, recorder = self._start, _recorder
        if start is None or recorder is None:
            return
        attrs = self.attrs
        if exc_type is not None:
            attrs = {**(attrs or {}), "error": exc_type.__name__}
        item = (self.name, attrs, start, end, _get_ident(), recorder.step)
        gpu = getattr(self, "_gpu", None)  # not set when entered on the fast path
        if gpu is not None and recorder.cuda is not None:
            gpu[1] = recorder.cuda.stop()
            item = (*item, gpu)
            self._gpu = None
        recorder.tick()
        recorder.spans.append(item)

    async def __aenter__(self) -> phase:
        return self.__enter__()  # type: ignore[attr-defined]

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        return self.__exit__(exc_type, exc, tb)  # type: ignore[attr-defined]

    def __call__(self, fn: F) -> F:
        """Use as a decorator; each call of ``fn`` is one span (sync or async)."""
        name, attrs = self.name, self.attrs
        import inspect  # only for decorated functions: not on `import gpuprof`

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                async with phase(name, **(attrs or {})):
                    return await fn(*args, **kwargs)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with phase(name, **(attrs or {})):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


class _PyPhase(_PhaseMethods):
    """Time a phase: ``with phase("rollout"):``, ``async with``, or ``@phase("reward")``.

    ``name`` may be a framework's own name; it is stored as given and mapped to a canonical
    phase (``rollout``, ``reward``, ``reshard``…). ``attrs`` (tokens, bytes…) are stored with
    the span. Phases nest. Outside a run this costs one object and a check.

    The hot path is in C (`gpuprof._cphase`, compiled by the install); this class is its
    pure-Python twin, used where the C part did not build or with
    ``GPUPROF_PURE_PYTHON_HOOKS=1``: the same behaviour at ~0.25 µs more per span.
    """

    __slots__ = ("_gpu", "_start", "attrs", "name")

    def __init__(self, name: str, **attrs: Any) -> None:
        self.name = name
        # no empty dict per span: a million queued spans would carry 64 MB of them
        self.attrs = attrs or None

    def __enter__(self) -> phase:
        if _fast is not None:
            self._start = _mono()
            return self  # type: ignore[return-value]
        if _checked and _recorder is None:  # outside any run
            self._start = None
            return self  # type: ignore[return-value]
        return self._enter_slow()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        recorder = _fast
        if recorder is not None and exc_type is None and (start := self._start) is not None:
            end = _mono()
            # The whole hot path: a tick and one tuple into a bounded deque; depth is worked
            # out on load, the thread's kernel id by the writer.
            try:
                # the span is made first: a failure to make it is not a span let go
                item = (self.name, self.attrs, start, end, _get_ident(), recorder.step)
                _fast_tick()
                _fast_append(item)
            except Exception as err:
                _disable(err)
            return False
        if self._start is None:  # entered outside a run
            return False
        try:
            self._exit_slow(exc_type, _mono())
        except Exception as err:
            _disable(err)
        return False


def _c_phase() -> type | None:
    """`phase` on the C hot path of `gpuprof._cphase`, or None where it is not built (the
    extension is optional: a platform without a compiler installs without it)."""
    if os.environ.get(ENV_PURE_PYTHON, "") not in ("", "0"):
        return None
    global _cphase
    try:
        from gpuprof import _cphase as module
    except ImportError:
        return None

    class phase(module.PhaseBase, _PhaseMethods):
        __slots__ = ()
        __doc__ = _PyPhase.__doc__

    phase.__qualname__ = "phase"  # `gpuprof.hooks.phase`, not a local class
    module.set_disable(_disable)
    _cphase = module
    _set_recorder(_recorder, _checked)
    return phase


phase: type[_PyPhase] = _c_phase() or _PyPhase  # type: ignore[assignment]


def step(n: int | None = None, tokens: int | None = None, **attrs: Any) -> None:
    """Mark the end of training step ``n`` (default: the current step number, from 0).

    Records a ``step`` span from the previous step boundary (or the first hook) to now and a
    ``step`` event; ``tokens`` is the number of tokens the step processed or generated, used
    for tokens/s. Later spans belong to step ``n + 1``.
    """
    recorder = _active()
    if recorder is None:
        return
    try:
        now = time.monotonic_ns()
        number = recorder.step if n is None else int(n)
        if tokens is not None:
            attrs["tokens"] = tokens
        recorder.other.append((_STEP, number, attrs, recorder.step_start, now, _get_ident()))
        recorder.step = number + 1
        recorder.step_start = now
        recorder.steps_seen += 1
    except Exception as exc:
        _disable(exc)


def framework_phase(name: str, canonical: str | None, **attrs: Any) -> phase:
    """A phase stored under a framework's own ``name`` with the canonical phase an adapter
    chose for it (``None``: the usual mapping of ``name``). For adapters whose names only
    have a meaning in context (TRL's ``_get_per_token_logps_and_entropies`` is the old-,
    the reference- or the update's log-prob pass depending on the caller)."""
    return phase((name, canonical) if canonical else name, **attrs)  # type: ignore[arg-type]


def begin_step() -> None:
    """Mark the start of the current step: the next `step` span starts here rather than at
    the previous step's end (time between steps is then outside every step)."""
    recorder = _active()
    if recorder is not None:
        recorder.step_start = time.monotonic_ns()


def record_knobs(framework: str | None, knobs: dict[str, Any], version: str | None = None) -> None:
    """Record the framework settings a process read from its own configuration.

    Stored as one ``knobs`` event (name: the framework, attrs: ``{"version", "knobs"}``);
    ``gpuprof watch`` copies them into the run's ``RunMeta.knobs`` / ``framework`` when the
    run ends, where the recommender reads current values. Values should be JSON scalars.
    """
    recorder = _active()
    if recorder is None:
        return
    try:
        # secret settings (a W&B key in a config) never reach the run directory; imported
        # here, once, so that importing the hooks compiles no regular expression
        from gpuprof.redact import redact_knobs

        attrs = {"version": version, "knobs": redact_knobs(knobs)}
        recorder.other.append((_MARK, framework or "", attrs, time.monotonic_ns(), "knobs"))
    except Exception as exc:
        _disable(exc)


def enable_cuda_events() -> bool:
    """Time later phases on the GPU with CUDA events too (as ``GPUPROF_CUDA_EVENTS=1``).

    For adapters that find out only at run time that work goes to a GPU (a collective on a
    CUDA tensor). Returns True when CUDA event timing is on.
    """
    recorder = _active()
    if recorder is None:
        return False
    if recorder.cuda is None:
        try:
            recorder.cuda = _CudaTimer()
            if recorder is _recorder:
                _set_recorder(recorder)  # CUDA-timed phases take the slow path from now on
        except Exception as exc:
            _warn_once(f"gpuprof: CUDA event timing unavailable: {exc!r}")
            return False
    return True


def mark(name: str, **attrs: Any) -> None:
    """Record a point event (a checkpoint written, a config change…)."""
    recorder = _active()
    if recorder is None:
        return
    try:
        recorder.other.append((_MARK, name, attrs, time.monotonic_ns()))
    except Exception as exc:
        _disable(exc)


def _after_fork_in_child() -> None:
    """A forked child (e.g. a DataLoader worker) starts with no recorder and no queued rows.

    The parent's queued rows were copied into the child's memory: they are dropped here (the
    parent writes its own). The child opens its own recorder on its first hook, and keeps the
    parent's step number so worker spans line up.
    """
    global _init_lock, _inherited_step
    parent = _recorder
    _init_lock = threading.Lock()
    _set_recorder(None, checked=False)
    _inherited_step = parent.step if parent is not None else 0


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(shutdown)
