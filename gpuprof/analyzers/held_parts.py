"""The parts one process holds, within a memory budget: those not in use spilled to disk.

A diagnosis made of parts (`parts.Parts`) calls every part some 80 times (``map``), each call
reading what earlier ones derived and claimed. `HeldParts` keeps the parts of one process
(the worker's nodes, `part_workers`): without a budget all of them in memory, as made; with
one, a part is made when first used (its nodes' rows read then, `load_cache.KeptSeries`),
and after each use the parts used longest ago are written out — everything their context
holds, its claims and figures as they are — until those left fit the budget. A part
written out is read back, as it was, when next used. Each call visits the parts in the
other direction than the last, so the parts it starts with are those the last one kept.

What a context holds is written as one pickle per spill, with each large frame, series,
index and array in it written once to the part's file of objects and named by a token:
a frame shared by two figures is one frame again when read back, and a spill after a call
writes only what that call made. Read back, a large array is a view of a private map of
the file, not a copy (`_Items`), and a long column of text is rebuilt from its distinct
texts: a part comes back for the cost of its frames' Python objects, and only the pages a
call touches are read. The diagnosis is the same to the byte whether its parts stay in
memory or go to disk after every call (tests/test_held_parts.py).

A detector must not write into an array or frame a part holds (it makes new ones, as
`AnalysisContext.claim` does): a frame with a column added or set anew is written again,
but a value changed in place is not seen, and a part read back would have the old one.

The files are this process's own, in a directory removed when the parts close; pickle is
safe here because nothing else writes them.
"""

from __future__ import annotations

import contextlib
import gc
import io
import mmap
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.analyzers.findings import AnalysisContext

__all__ = ["ENV_SPILL_DIR", "HeldParts", "SpillFailed", "context_bytes", "spill_root"]

ENV_SPILL_DIR = "GPUPROF_SPILL_DIR"
"""Where parts are written out (default: the run's directory when it can be written, else
the system's temporary directory, `spill_root`)."""

PREFIX = "gpuprof-spill-"
"""Start of the name of a process's directory of parts written out, followed by the process's
id, a dash and `tempfile.mkdtemp`'s random letters (`clear_stale` reads the id back)."""

NOT_SPILLED = ("_found", "_parts", "_per_frame_cache")
"""Context entries never written out: the run's findings (one list, shared by the process's
parts and set again when read back), the parts themselves, and figures kept per frame
object (the frames read back are other objects: computed again when asked)."""

ITEM_ARRAY_BYTES = 64 * 1024
"""Arrays from this size are written once as objects of their own; smaller ones are
written with what holds them, at each spill."""

SWEEP_BYTES = 64 * 2**20
"""Bytes of parts written out (or the budget, when larger) after which the collector runs."""

ALIGN = 64
"""Alignment in the file of an object's arrays read back into memory (those mapped start
at a page)."""

TEXT_ROWS = 1024
"""Arrays of text from this many rows are written as their distinct texts and codes."""

MAP_BYTES = 64 * 1024
"""Arrays from this size are read back as views of a map of the file (`_Items`)."""

ITEM_INDEX_ROWS = 4096
"""Indexes from this length are written once as objects of their own."""


class SpillFailed(BaseException):
    """A part could not be written out or read back (disk full, the directory removed): the
    diagnosis cannot go on within its budget. A `BaseException`, so that the detectors'
    guard (``except Exception``) lets it through."""


def spill_root(run_dir: str | os.PathLike | None = None) -> Path:
    """Where the parts of ``run_dir``'s diagnosis are written out: ``GPUPROF_SPILL_DIR``,
    else the run's directory (on the disk that holds the run, seldom a memory-backed
    ``/tmp``) when it can be written, else the system's temporary directory."""
    named = os.environ.get(ENV_SPILL_DIR, "").strip()
    if named:
        return Path(named)
    if run_dir is not None and os.access(run_dir, os.W_OK):
        return Path(run_dir)
    return Path(tempfile.gettempdir())


def clear_stale(root: str | os.PathLike) -> None:
    """Remove the directories of parts written out in ``root`` by processes that are gone
    (killed before they could remove their own)."""
    with contextlib.suppress(OSError):
        for entry in Path(root).glob(f"{PREFIX}*"):
            pid = entry.name[len(PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: alive
        return True
    return True


def context_bytes(ctx: AnalysisContext, known: dict[int, tuple[Any, int]] | None = None) -> int:
    """About how many bytes ``ctx`` holds: the data of every frame, series, index and array
    its entries reach (each counted once), which is most of a part. ``known``: the sizes of
    frames measured before (id → (frame, bytes)), filled in as frames are measured."""
    known = {} if known is None else known
    seen: set[int] = set()
    total = 0
    stack: list[Any] = [v for k, v in ctx.__dict__.items() if k not in ("_found", "_parts")]
    stack.append(ctx.run)
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, pd.DataFrame | pd.Series | pd.Index):
            hit = known.get(id(obj))
            if hit is None or hit[0] is not obj:
                hit = known[id(obj)] = (obj, _frame_bytes(obj))
            total += hit[1]
        elif isinstance(obj, np.ndarray):
            total += obj.nbytes if obj.base is None or id(obj.base) not in seen else 0
        elif isinstance(obj, dict):
            stack.extend(obj.values())
            stack.extend(k for k in obj if isinstance(k, tuple))
        elif isinstance(obj, list | tuple | set | frozenset):
            if len(obj) < 100_000:
                stack.extend(obj)
            else:  # a long list of plain values: its pointers and about as much again
                total += 16 * len(obj)
        elif hasattr(obj, "__dataclass_fields__"):
            stack.extend(getattr(obj, f) for f in obj.__dataclass_fields__)
    return total


def _frame_bytes(obj: pd.DataFrame | pd.Series | pd.Index) -> int:
    """The bytes of the arrays ``obj`` holds (its columns' and its index's; text held as
    Python objects counted as pointers)."""
    try:
        if isinstance(obj, pd.DataFrame):
            if not hasattr(obj, "_get_column_array"):  # pandas without it: slower, the same
                return int(obj.memory_usage(index=True, deep=False).sum())
            # each column's array as it is held (memory_usage makes a series per column)
            columns = (obj._get_column_array(i) for i in range(obj.shape[1]))
            return sum(int(a.nbytes) for a in columns) + _frame_bytes(obj.index)
        if isinstance(obj, pd.Series):
            return int(obj.array.nbytes) + _frame_bytes(obj.index)
        if isinstance(obj, pd.RangeIndex):
            return 0
        if isinstance(obj, pd.MultiIndex):
            return sum(int(c.nbytes) for c in obj.codes) + sum(
                _frame_bytes(level) for level in obj.levels
            )
        return int(obj.array.nbytes)
    except Exception:  # an exotic column: its length in pointers
        return 8 * len(obj)


class _Items:
    """One part's file of large objects: each written once, read back by its token.

    An object is written as its pickle (protocol 5) followed by its arrays' memory
    (``buffer_callback``: written from the arrays themselves, not copied into the pickle).
    Read back, an array of `MAP_BYTES` or more is a view of a private map of its own stretch
    of the file (`mmap.ACCESS_COPY`: writable, a page written is copied, the file never
    changed): nothing is copied to rebuild it, only the pages a call touches are read, and a
    view kept after its part is written out keeps its own array's pages, not the part's.
    Smaller ones are read into memory."""

    def __init__(self, path: Path):
        self.path = path
        # token → (offset, length of the pickle, [(offset, length)] of its arrays' memory)
        self._at: dict[int, tuple[int, int, list[tuple[int, int]]]] = {}
        self._by_id: dict[int, tuple[int, Any, tuple]] = {}  # id → (token, object, shape)
        self._next = 0

    def forget(self) -> None:
        """The objects written so far are no longer in memory (their ids may be reused)."""
        self._by_id.clear()

    def token(self, obj: Any) -> int:
        known = self._by_id.get(id(obj))
        shape = _shape(obj)
        if known is not None and known[1] is obj and _same_shape(known[2], shape):
            return known[0]
        buffers: list[pickle.PickleBuffer] = []
        out = io.BytesIO()
        _ItemPickler(out, buffer_callback=buffers.append).dump(obj)
        data = out.getbuffer()
        spans = []
        with open(self.path, "ab") as handle:
            at = handle.seek(0, io.SEEK_END)
            handle.write(data)
            end = at + len(data)
            for buffer in buffers:
                raw = buffer.raw()
                # a map starts at a page; an array read into memory, where numpy's would
                align = mmap.ALLOCATIONGRANULARITY if raw.nbytes >= MAP_BYTES else ALIGN
                start = -(-end // align) * align
                handle.write(bytes(start - end))
                handle.write(raw)
                spans.append((start, raw.nbytes))
                end = start + raw.nbytes
        token = self._next
        self._next += 1
        self._at[token] = (at, len(data), spans)
        self._by_id[id(obj)] = (token, obj, shape)
        return token

    def load(self, token: int, fd: int) -> Any:
        """The object of ``token``, read from ``fd``, a descriptor of the file."""
        at, length, spans = self._at[token]
        buffers = [_read(fd, start, n) for start, n in spans]
        obj = pickle.loads(os.pread(fd, length, at), buffers=buffers)
        self._by_id[id(obj)] = (token, obj, _shape(obj))
        return obj


class _ItemPickler(pickle.Pickler):
    """Pickles an object's arrays out of band, and its long arrays of text as the distinct
    texts and each row's number among them (`_texts`): rebuilt at each read back, that is a
    `take`, not a Python object unpickled a row."""

    def __init__(self, file: Any, buffer_callback: Callable[[Any], None]):
        super().__init__(file, protocol=5, buffer_callback=buffer_callback)

    def reducer_override(self, obj: Any) -> Any:
        if (
            type(obj) is np.ndarray
            and obj.dtype == object
            and obj.size >= TEXT_ROWS
            and obj.flags.c_contiguous
            and pd.api.types.infer_dtype(obj.ravel(), skipna=False) == "string"
        ):
            codes, uniques = pd.factorize(obj.ravel())
            small = np.min_scalar_type(-max(len(uniques), 1))  # a signed type that holds them
            return _texts, (list(uniques), codes.astype(small), obj.shape)
        return NotImplemented


def _texts(uniques: list[str], codes: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The array of text `_ItemPickler` wrote as ``uniques`` and ``codes``."""
    return np.array(uniques, dtype=object).take(codes).reshape(shape)


def _read(fd: int, at: int, n: int) -> memoryview:
    """``n`` bytes of ``fd`` from ``at``, writable: mapped when large (read into memory where
    the file system cannot map it)."""
    if n >= MAP_BYTES:
        # a file system without maps reads it into memory; a file cut short is said below
        with contextlib.suppress(OSError, ValueError):
            return memoryview(mmap.mmap(fd, n, offset=at, access=mmap.ACCESS_COPY))
    got = bytearray(n)
    if os.preadv(fd, [got], at) != n:
        raise OSError(f"the file of a part's objects is cut short at {at}")
    return memoryview(got)


def _shape(obj: Any) -> tuple:
    """What tells an object written out from the same object changed in place since: its
    shape and dtype; a frame's column labels (the labels' object, kept: labels changed are
    a new one) and its blocks (a column added or set anew is a new block)."""
    if isinstance(obj, pd.DataFrame):
        blocks = getattr(getattr(obj, "_mgr", None), "blocks", ())
        return (obj.shape, obj.columns, tuple(id(b) for b in blocks))
    return (getattr(obj, "shape", None), str(getattr(obj, "dtype", "")))


def _same_shape(was: tuple, now: tuple) -> bool:
    if isinstance(now[1], pd.Index):
        return was[0] == now[0] and was[1] is now[1] and was[2] == now[2]
    return was == now


def _is_item(obj: Any) -> bool:
    if isinstance(obj, pd.DataFrame | pd.Series):
        return True
    if isinstance(obj, pd.Index):
        return len(obj) >= ITEM_INDEX_ROWS
    return isinstance(obj, np.ndarray) and obj.nbytes >= ITEM_ARRAY_BYTES and obj.dtype != object


class _Writer(pickle.Pickler):
    def __init__(self, file: Any, items: _Items):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._items = items

    def persistent_id(self, obj: Any) -> int | None:
        return self._items.token(obj) if _is_item(obj) else None


class _Reader(pickle.Unpickler):
    def __init__(self, file: Any, items: _Items, fd: int):
        super().__init__(file)
        self._items = items
        self._fd = fd
        self._loaded: dict[int, Any] = {}

    def persistent_load(self, pid: Any) -> Any:
        token = int(pid)
        if token not in self._loaded:  # one object, however many entries hold it
            self._loaded[token] = self._items.load(token, self._fd)
        return self._loaded[token]


class HeldParts:
    """``count`` parts, part ``i`` made by ``make(i)`` when first used. ``budget``: bytes
    the parts may hold in memory together (`context_bytes`; at least the part in use
    stays), None for no limit (all kept as made). ``spill_dir``: where this process's
    directory of parts written out goes (a temporary directory by default). ``found``:
    the run's findings, set on every part (made or read back)."""

    def __init__(
        self,
        make: Callable[[int], AnalysisContext],
        count: int,
        *,
        budget: int | None = None,
        spill_dir: str | os.PathLike | None = None,
        found: list | None = None,
    ):
        self._make = make
        self.count = count
        self.budget = budget
        self._root = spill_dir
        self._dir: Path | None = None
        self._found = found if found is not None else []
        self._held: dict[int, AnalysisContext] = {}  # in order of last use
        self._sizes: dict[int, int] = {}
        self._measured: dict[int, dict[int, tuple[Any, int]]] = {}  # part → frames' sizes
        self._spilled: dict[int, tuple[Path, _Items]] = {}
        self._forward = True
        self._unswept = 0  # bytes of parts written out since the collector last ran
        self.spills = 0
        """Parts written out so far."""
        self.restores = 0
        """Parts read back so far."""

    def map(self, fn: Callable[..., Any], args: tuple = ()) -> list[Any]:
        """``fn(part, *args)`` of every part, in part order."""
        order = range(self.count) if self._forward else range(self.count - 1, -1, -1)
        self._forward = not self._forward
        out: list[Any] = [None] * self.count
        for i in order:
            ctx = self._get(i)
            try:
                out[i] = fn(ctx, *args)
            finally:
                if self.budget is not None:
                    self._sizes[i] = context_bytes(ctx, self._measured.setdefault(i, {}))
                    self._fit(keep=i)
        return out

    def contexts(self) -> list[AnalysisContext]:
        """Every part, made or read back, all in memory at once (without a budget: the
        parts made when the process starts, while the others make theirs)."""
        return [self._get(i) for i in range(self.count)]

    def _get(self, i: int) -> AnalysisContext:
        ctx = self._held.pop(i, None)
        if ctx is None:
            ctx = self._read_back(i) if i in self._spilled else self._make(i)
            ctx.__dict__["_found"] = self._found
        self._held[i] = ctx  # the last used, last
        return ctx

    def _fit(self, keep: int) -> None:
        while len(self._held) > 1 and sum(self._sizes.get(i, 0) for i in self._held) > self.budget:
            oldest = next(i for i in self._held if i != keep)
            self._unswept += self._sizes.get(oldest, 0)
            self._spill(oldest)
        if self._unswept > max(self.budget, SWEEP_BYTES):
            # a part's frames hold reference cycles: what it held is freed by the collector
            # only, whose oldest generation runs seldom (or never, in a worker) — without a
            # pass, parts written out stay in memory: 2 GB more on a cluster-day
            gc.collect()
            self._unswept = 0

    def _spill(self, i: int) -> None:
        ctx = self._held.pop(i)
        self._sizes.pop(i, None)
        self._measured.pop(i, None)
        try:
            if self._dir is None:
                root = self._root if self._root is not None else spill_root()
                self._dir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=root))
            entries, items = self._spilled.get(i) or (
                self._dir / f"part-{i}.pkl",
                _Items(self._dir / f"part-{i}.items"),
            )
            state = {k: v for k, v in ctx.__dict__.items() if k not in NOT_SPILLED}
            items.path.touch()
            tmp = entries.with_suffix(".tmp")
            with open(tmp, "wb") as handle:
                _Writer(handle, items).dump(state)
            os.replace(tmp, entries)
        except Exception as exc:  # a disk that is full or gone, a figure that won't pickle:
            # the part is no longer in memory, so nothing may go on without it
            raise SpillFailed(f"a part could not be written out: {exc}") from exc
        items.forget()
        self._spilled[i] = (entries, items)
        self.spills += 1

    def _read_back(self, i: int) -> AnalysisContext:
        entries, items = self._spilled[i]
        try:
            with open(items.path, "rb") as handle, open(entries, "rb") as source:
                state = _Reader(source, items, handle.fileno()).load()
        except Exception as exc:  # removed, cut short: the part is lost
            raise SpillFailed(f"a part written out does not read back: {exc}") from exc
        ctx = AnalysisContext.__new__(AnalysisContext)
        ctx.__dict__.update(state)
        self.restores += 1
        return ctx

    def close(self) -> None:
        """Remove what was written out (idempotent)."""
        self._held.clear()
        self._spilled.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> HeldParts:
        return self

    def __exit__(self, *exc: Any) -> None:
        with contextlib.suppress(Exception):
            self.close()
