"""A run's parts held by worker processes, one core each: the diagnosis node by node at once.

`WorkerParts` is `parts.Parts` whose parts live in forked worker processes: each worker
inherits the loaded run (``fork``: nothing is copied until written), keeps the contexts of its
nodes (labels their samples, holds their claims), and answers the diagnosis's calls
(``map(fn, …)``: ``fn`` a module-level function of one part's context) with small partial
figures through a pipe. This process holds the first part itself, keeps the run's view
without samples or spans (`parts.whole_view`) and takes every decision on the combined
figures — so the detectors' per-sample work, most of a diagnosis, is divided between the
cores, and the diagnosis is `diagnose`'s, to the byte (tests/test_parts.py,
tests/test_part_workers.py). A run read without its sampled series and spans (its kept form,
`load_cache.KeptSeries`) is never whole in any process: each worker reads its own nodes'
(tests/test_kept_series.py).

A worker that dies (killed, out of memory) or sends what does not unpickle ends the parts:
the call raises `PartsLost`, which no detector catches, and the caller diagnoses the run in one
process instead. Only where ``fork`` exists, and only from a process without threads that may
hold locks (the same rule as `lanes`).
"""

from __future__ import annotations

import dataclasses
import gc
import multiprocessing
import pickle
from collections.abc import Callable
from typing import Any, TypeVar

from gpuprof.analyzers.findings import AnalysisContext
from gpuprof.analyzers.held_parts import HeldParts, SpillFailed
from gpuprof.analyzers.parts import (
    Parts,
    combined_facts,
    cut,
    deal,
    node_groups,
    partial_facts,
    whole_context,
)
from gpuprof.model import Run

__all__ = ["PartsLost", "WorkerParts"]

T = TypeVar("T")


class PartsLost(BaseException):
    """A worker holding parts of the run is gone: the diagnosis made of parts cannot go on.
    A `BaseException`, so that the detectors' guard (``except Exception``: one broken
    detector must not hide the others) lets it through to the caller."""


def _serve(
    conn: Any, run: Run, hosts: list[list[str]], options: Any, inherited: list[Any],
    series: Any = None, budget: int | None = None, spill_dir: str | None = None,
) -> None:  # fmt: skip
    """A worker: the parts of ``run`` that each group of ``hosts`` recorded (cut here, on the
    worker's core; their sampled series read here from ``series`` when ``run`` holds none),
    answering ``(fn, args, found)`` calls until told to stop (None). ``budget``: bytes its
    parts may hold in memory (`held_parts.HeldParts`; None: all, made at once).
    ``inherited``: the parent's ends of the pipes, closed here so that the parent closing
    its own is seen (a broken pipe, the end of the input)."""
    for end in inherited:
        end.close()
    gc.disable()  # the inherited run is never freed here: a pass would only copy its pages
    found: list = []
    held = _held(run, hosts, found, options, series, budget, spill_dir)
    try:
        if budget is None:
            held.contexts()  # made now, while the other processes make theirs
    except Exception:  # its series do not read: the parent sees the pipe close (PartsLost)
        return
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return
            if msg is None:
                return
            fn, args, new_found = msg
            found.extend(new_found)
            lost = False
            try:
                reply = ("ok", held.map(fn, args))
                data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:  # the caller raises it, as the call in one process would
                data = _error(exc)
            except (PartsLost, SpillFailed) as exc:  # no part can answer: said, then gone
                data, lost = pickle.dumps(("lost", str(exc))), True
            try:
                conn.send_bytes(data)
            except (EOFError, OSError):
                return
            if lost:
                return
    finally:  # a part that can't be made or spilled ends the worker: the parent sees it
        held.close()


def _held(
    run: Run, hosts: list[list[str]], found: list, options: Any, series: Any,
    budget: int | None, spill_dir: str | None,
) -> HeldParts:  # fmt: skip
    """The parts of ``run`` each group of ``hosts`` recorded, held within ``budget``."""

    def make(i: int) -> AnalysisContext:
        try:
            return _context(run, hosts[i], found, options, series)
        except Exception as exc:
            if budget is None:
                raise
            # mid-diagnosis a detector would take it for its own failure
            raise PartsLost(f"a part does not read ({type(exc).__name__}: {exc})") from exc

    return HeldParts(make, len(hosts), budget=budget, spill_dir=spill_dir, found=found)


def _context(run: Run, group: list[str], found: list, options: Any, series: Any) -> Any:
    part = cut(run, group)
    if series is not None:  # the run was read without its series: this part's, here
        part = dataclasses.replace(part, **series.read(group))
    ctx = AnalysisContext(part)
    ctx.__dict__["_found"] = found  # the run's findings, not the part's
    if options is not None:
        ctx.__dict__["_efficiency_options"] = options
    return ctx


def _error(exc: Exception) -> bytes:
    try:
        return pickle.dumps(("err", exc), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # an exception that does not pickle: its type's name and message
        return pickle.dumps(("err", RuntimeError(f"{type(exc).__name__}: {exc}")))


class WorkerParts(Parts):
    """The parts of ``run`` (`parts.by_node` into ``workers`` parts of consecutive nodes):
    the first held by this process, each other by a forked worker. ``options``: the
    efficiency options (`settings.attach_options`) every part and the whole run's view
    carry. ``series``: where the sampled series of a ``run`` read without them are
    (`load_cache.KeptSeries`): each part's are read by the process that holds it.
    ``budget``: bytes the parts may hold in memory, all processes together — the run is
    then cut into one part per node, ``workers`` processes (this one among them; one: no
    worker) each holding consecutive nodes, made when first used and written out when their
    share of the budget is full (`held_parts.HeldParts`); None: no limit. Use as a context
    manager, or call `close`. Raises ValueError for a run that is not cut
    (`parts.node_groups`), `PartsLost` when a part's series do not read."""

    def __init__(
        self, run: Run, workers: int, *, options: Any = None, series: Any = None,
        budget: int | None = None, spill_dir: str | None = None,
    ):  # fmt: skip
        if budget is None:
            groups = node_groups(run, workers, series=series)
            if groups is None or len(groups) < 2:
                raise ValueError("a run of one part is diagnosed in one process")
            held_by = [[g] for g in groups]
        else:
            groups = node_groups(run, None, series=series)
            if groups is None:
                raise ValueError("a run of one part is diagnosed in one process")
            held_by = _dealt(run, groups, workers, series)
        self._n = len(groups)
        share = None if budget is None else max(0, int(budget)) // len(held_by)
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._sent = 0  # findings the workers have
        self._closed = False
        self._held: HeldParts | None = None
        mp = multiprocessing.get_context("fork")
        gc.freeze()  # what exists now stays out of the collector's passes: no page is copied
        try:
            for mine_ in held_by[1:]:
                mine, theirs = mp.Pipe()
                ends = [mine, *self._conns]
                proc = mp.Process(
                    target=_serve,
                    args=(theirs, run, mine_, options, ends, series, share, spill_dir),
                    daemon=True,
                )  # fmt: skip
                proc.start()
                theirs.close()
                self._procs.append(proc)
                self._conns.append(mine)
        except BaseException:
            self.close()
            raise
        found: list = []
        self.whole = whole_context(run, self, found, options)
        self._held = _held(run, held_by[0], found, options, series, share, spill_dir)
        try:
            if share is None:  # made now, while the workers cut theirs
                self.contexts = self._held.contexts()
        except Exception as exc:  # its series do not read (kept again meanwhile)
            self.close()
            raise PartsLost(f"this process's part does not read ({type(exc).__name__})") from exc
        try:
            self.facts = combined_facts(run.meta, self.map(partial_facts))
            self.whole.__dict__["_facts"] = self.facts
            self.each(_set, {"_facts": self.facts})
        except BaseException:
            self.close()
            raise

    @property
    def spilled(self) -> tuple[int, int]:
        """``(parts written out, parts read back)`` by this process so far."""
        held = self._held
        return (held.spills, held.restores) if held is not None else (0, 0)

    @property
    def count(self) -> int:
        return self._n

    def map(self, fn: Callable[..., T], *args: Any) -> list[T]:
        """``fn(ctx, *args)`` on every part, in part order: this process's part while the
        workers compute theirs."""
        if self._closed:
            raise PartsLost("the parts' workers were closed")
        found = self.found
        new, self._sent = found[self._sent :], len(found)
        try:
            for conn in self._conns:
                conn.send((fn, args, new))
        except (OSError, ValueError, pickle.PicklingError) as exc:
            self.close()
            raise PartsLost(f"a worker holding parts is gone ({type(exc).__name__})") from exc
        error: Exception | None = None
        try:
            out: list[T] = self._held.map(fn, args)
        except Exception as exc:  # raised once the workers have answered (they stay in step)
            out, error = [], exc
        for conn in self._conns:
            try:
                status, value = pickle.loads(conn.recv_bytes())
            except Exception as exc:  # it died, or sent what does not load
                self.close()
                raise PartsLost(f"a worker holding parts is gone ({type(exc).__name__})") from exc
            if status == "ok":
                out.extend(value)
            elif status == "lost":  # its parts can no longer be made or read back
                self.close()
                raise PartsLost(value)
            elif error is None:
                error = value
        if error is not None:
            raise error
        return out

    def each(self, fn: Callable[..., Any], *args: Any) -> None:
        """``fn(ctx, *args)`` on every part, where it is held, for its effect (a claim)."""
        self.map(_for_effect, fn, args)

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for conn in self._conns:
            try:
                conn.send(None)
            except (OSError, ValueError):  # already gone: nothing to tell it
                pass
            # closed before waiting: a worker still sending a reply no one reads gets a
            # broken pipe and ends, instead of blocking until it is killed
            conn.close()
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        if self._held is not None:
            self._held.close()
        gc.unfreeze()

    def __enter__(self) -> WorkerParts:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _dealt(run: Run, groups: list[list[str]], workers: int, series: Any) -> list[list[list[str]]]:
    """The parts of one node each (``groups``) dealt to at most ``workers`` processes, each
    of consecutive nodes holding about as many GPU samples as the others (`parts.deal`)."""
    if series is not None:
        counts = series.census()[1]
    else:
        counts = run.gpu["host"].astype(object).value_counts() if len(run.gpu) else {}
    weights = [int(counts.get(g[0], 0)) for g in groups]
    return [[groups[i] for i in dealt] for dealt in deal(weights, max(1, int(workers)))]


def _set(ctx: AnalysisContext, values: dict[str, Any]) -> None:
    ctx.__dict__.update(values)


def _for_effect(ctx: AnalysisContext, fn: Callable[..., Any], args: tuple) -> None:
    fn(ctx, *args)
