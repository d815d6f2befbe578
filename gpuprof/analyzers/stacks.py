"""Which Python code ran while a finding's GPU-time was lost: the top stacks in its intervals.

The watcher samples the Python stacks of the watched processes with py-spy (`gpuprof.model.
StackSample`: wall seconds per window, thread and stack) and the scheduler times of their busy
threads (`ThreadSample`). Here, for a set of intervals (a finding's evidence), each sampled
thread-second is split into **busy** time (on a CPU, or ready to run and waiting for one) and
**blocked** time (sleeping, waiting on a lock, a queue, I/O or another process): a thread's
busy share of a window is its busy seconds there over the seconds it was sampled there
(capped at one). A run without per-thread times (recorded before they existed, or on a
system without ``/proc``) counts every sampled second as busy and says so
(``activity: "unknown"``).

Stacks are grouped by their **leaf-most user frame** — the innermost frame that is the
user's code rather than the standard library, an installed package (``site-packages``) or
gpuprof's own code — and the library function it was in when it was there ("62% of the
busy Python time in `my_reward.py:87 verify()` → `simplify (sympy/simplify/simplify.py:600)`");
a function's lines form one group, named by its commonest line. The top groups by busy
seconds explain where the CPU went; the main threads' top blocked stacks say what the driver
waited on (a queue fed by loader workers, a remote scorer). gpuprof's own threads
(``gpuprof-hooks``) are left out.

Pure: frames in, figures out; numpy over the sample rows, Python only over distinct stacks.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.analyzers.texts import as_texts
from gpuprof.intervals import union
from gpuprof.model import Run

STACK_KINDS: frozenset[str] = frozenset({"host_bound", "dataloader_starvation", "reward_bound",
                                         "reshard_idle", "periodic_stall",
                                         "idle_unattributed"})  # fmt: skip
"""Finding kinds about idle or host time: each carries its top stacks when the run has them."""
TOP = 5
"""Groups of stacks listed per finding (busy; blocked: `TOP_WAITING`)."""
TOP_WAITING = 3
CHAIN_USER_FRAMES = 4
"""User frames shown in a group's chain (the innermost ones), before the library call."""
MIN_SECONDS = 0.05
"""Less sampled thread-time than this inside the intervals is no evidence: no stacks."""
OWN_THREAD_PREFIX = "gpuprof-"
"""Threads gpuprof starts in the training process (the hooks' writer): not the user's."""
MAIN_BLOCKED_MIN_SHARE = 0.25
"""The main threads' blocked stacks are listed when they were blocked at least this share of
their sampled time in the intervals (less is the noise of a busy thread's pauses)."""
WAITING_THREADS = frozenset({"MainThread"})
WAITING_ROLES = frozenset({"main", "trainer"})
"""Whose blocked stacks are listed: the main thread of the driver and the trainers."""

_STDLIB = re.compile(r"[/\\]lib(64)?[/\\]python\d+(\.\d+)?t?[/\\]")
_PACKAGES = re.compile(r"[/\\](site|dist)-packages[/\\]")
_OWN = re.compile(r"[/\\]gpuprof[/\\]")


def is_user_file(path: str) -> bool:
    """Whether a frame's file is the user's code: not the standard library, not an installed
    package, not an interpreter-internal (``<frozen …>``) and not gpuprof's own (its hooks,
    its framework adapters: any file in a ``gpuprof/`` package directory); code run with
    ``python -c`` (``<string>``) is the user's."""
    if not path:
        return False
    if path.startswith("<"):
        return path in ("<string>", "<stdin>")
    return not (_PACKAGES.search(path) or _STDLIB.search(path) or _OWN.search(path))


def short_file(path: str, cwd: str | None = None) -> str:
    """A frame's file as people read it: relative to the run's working directory when under
    it, the part after ``site-packages/`` or ``pythonX.Y/`` for library code, else the
    file's name."""
    if not path or path.startswith("<"):
        return path
    if cwd and path.startswith(cwd.rstrip("/\\") + os.sep):
        return path[len(cwd.rstrip("/\\")) + 1 :]
    for pattern in (_PACKAGES, _STDLIB):
        m = pattern.search(path)
        if m:
            return path[m.end() :]
    return os.path.basename(path)


@dataclass
class StackGroup:
    """Stacks that share their leaf-most user function and the library function it was in."""

    share: float
    """Of the busy (or, in a ``blocked`` list, blocked) seconds in the intervals (0–1)."""
    seconds: float
    """Thread-seconds (busy, or blocked) in the intervals."""
    function: str
    file: str
    line: int | None
    """The line the function was at most (of the group's commonest stack)."""
    user_code: bool
    """False when no frame of the stacks is the user's (``function`` is then the leaf)."""
    calls: str | None
    """The library function the user function was in, as ``name (file:line)``; None when
    the user function was the innermost frame."""
    chain: list[str] = field(default_factory=list)
    """The innermost user frames, outermost first, then ``calls``: ``name (file:line)``."""
    processes: list[str] = field(default_factory=list)
    """``role pid`` of the processes whose threads it was seen in (most time first)."""
    threads: list[str] = field(default_factory=list)
    short_file: str = ""

    def where(self) -> str:
        """``my_reward.py:87 verify()``."""
        line = "" if self.line is None else f":{self.line}"
        return f"{self.short_file or self.file}{line} {self.function}()"

    def phrase(self) -> str:
        """``my_reward.py:87 verify() → simplify (sympy/simplify/simplify.py:600)``."""
        text = self.where()
        if self.calls:
            text += f" → {self.calls}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "share": round(self.share, 4),
            "seconds": round(self.seconds, 3),
            "function": self.function,
            "file": self.file,
            "line": self.line,
            "user_code": self.user_code,
            "calls": self.calls,
            "chain": list(self.chain),
            "processes": list(self.processes),
            "threads": list(self.threads),
        }


@dataclass
class StackSummary:
    """A finding's Python stacks: where the busy time went, and what the main threads were
    blocked in."""

    busy_s: float
    """Sampled thread-seconds in the intervals that threads were running or ready to run."""
    blocked_s: float
    """...and blocked (sleeping, waiting on a lock, a queue, I/O, another process)."""
    activity: str
    """``thread_cpu`` (busy from the threads' scheduler times) or ``unknown`` (no per-thread
    CPU recorded: every sampled second counted as busy)."""
    rate_hz: float | None
    processes: int
    threads: int
    main_blocked_share: float | None = None
    """Share (0–1) of the main threads' sampled time (the driver's and the trainers') they
    were blocked; None when no main thread was sampled."""
    top: list[StackGroup] = field(default_factory=list)
    blocked: list[StackGroup] = field(default_factory=list)
    """The main threads' blocked stacks, when they were blocked at least
    `MAIN_BLOCKED_MIN_SHARE` of their time."""

    def headline(self) -> str:
        """One line: the top group and its share, else what the main threads were blocked
        in."""
        if self.top:
            g = self.top[0]
            what = "busy" if self.activity == "thread_cpu" else "sampled"
            return f"{g.share:.0%} of the {what} Python time in {g.phrase()}"
        if self.blocked:
            g = self.blocked[0]
            return f"no Python thread busy; the main thread was blocked in {g.phrase()}"
        return "no Python thread was busy"

    def to_dict(self) -> dict[str, Any]:
        return {
            "headline": self.headline(),
            "busy_s": round(self.busy_s, 3),
            "blocked_s": round(self.blocked_s, 3),
            "activity": self.activity,
            "rate_hz": self.rate_hz,
            "processes": self.processes,
            "threads": self.threads,
            "main_blocked_share": None
            if self.main_blocked_share is None
            else round(self.main_blocked_share, 4),
            "top": [g.to_dict() for g in self.top],
            "blocked": [g.to_dict() for g in self.blocked],
        }


class StackIndex:
    """A run's stack samples made ready for interval queries (built once per run)."""

    def __init__(self, run: Run) -> None:
        self.cwd = run.meta.cwd
        frames, stacks, samples = run.stack_frames, run.stacks, run.stack_samples
        keep = ~samples["thread"].astype(str).str.startswith(OWN_THREAD_PREFIX).to_numpy()
        samples = samples[keep]
        fid = frames["frame_id"].to_numpy(np.int64)
        self.names = as_texts(frames["name"])
        self.files = frames["file"].fillna("").astype(str).to_numpy(object)
        lines = pd.to_numeric(frames["line"], errors="coerce").to_numpy(np.float64)
        self.lines = [None if not np.isfinite(v) else int(v) for v in lines]
        self.user = np.array([is_user_file(f) for f in self.files], dtype=bool)
        # a function is its name in its file: the frames of its lines share it
        self.func = pd.MultiIndex.from_arrays([self.names, self.files]).factorize()[0]
        frame_at = {int(f): i for i, f in enumerate(fid)}
        # each distinct stack as frame indices, outermost first (unknown frames dropped)
        self.paths: list[tuple[int, ...]] = []
        stack_at: dict[int, int] = {}
        for sid, text in zip(stacks["stack_id"].to_numpy(np.int64), stacks["frames"].astype(str)):
            ids = [frame_at.get(int(x), -1) for x in text.split()]
            stack_at[int(sid)] = len(self.paths)
            self.paths.append(tuple(i for i in ids if i >= 0))
        known = pd.Index(np.array(list(stack_at), dtype=np.int64))
        at = np.array(list(stack_at.values()), dtype=np.int64)
        pos = known.get_indexer(samples["stack_id"].to_numpy(np.int64))
        samples = samples[pos >= 0]
        if not samples["t_ns"].is_monotonic_increasing:  # loaded runs are; built ones may not be
            samples = samples.sort_values("t_ns", kind="stable")
            pos = known.get_indexer(samples["stack_id"].to_numpy(np.int64))
        self.stack = at[pos[pos >= 0]]
        self.t0 = samples["t_ns"].to_numpy(np.int64)
        self.seconds = _floats(samples["seconds"], 0.0)
        span = _floats(samples["span_s"], np.nan)
        self.span_ns = np.where(np.isfinite(span) & (span > 0), span, self.seconds) * 1e9
        self.span_ns = np.maximum(self.span_ns.astype(np.int64), 1)
        window = _floats(samples["window_s"], np.nan)
        self.window_ns = int(np.median(window[np.isfinite(window)]) * 1e9) if (
            np.isfinite(window).any()) else 1_000_000_000  # fmt: skip
        self.pid = _floats(samples["pid"], np.nan)
        self.role = as_texts(samples["role"])
        self.thread = as_texts(samples["thread"])
        role_code, roles = pd.factorize(self.role)
        pid = np.where(np.isfinite(self.pid), self.pid, -1).astype(np.int64)
        self.proc_code, keys = pd.factorize((role_code.astype(np.int64) << 32) | (pid & 0xFFFFFFFF))
        self.proc_names = [f"{roles[k >> 32]} {k & 0xFFFFFFFF}" if k & 0xFFFFFFFF != 0xFFFFFFFF
                           else str(roles[k >> 32]) for k in keys]  # fmt: skip
        self.thread_code, self.thread_names = pd.factorize(self.thread)
        self.max_span_ns = int(self.span_ns.max()) if len(self.span_ns) else 0
        self.rate = _floats(samples["rate_hz"], np.nan)
        self.busy, self.activity = busy_fraction(samples, run.threads, self.window_ns)
        self.main = np.isin(self.thread, list(WAITING_THREADS)) & np.isin(
            self.role, list(WAITING_ROLES))  # fmt: skip
        self._group_of_stack = self._group_stacks()

    def __len__(self) -> int:
        return len(self.stack)

    # -- grouping --------------------------------------------------------------------------

    def _group_stacks(self) -> np.ndarray:
        """Per distinct stack, its group: (leaf-most user function, the function below it)."""
        keys: dict[tuple[int, int], int] = {}
        self.group_user: list[bool] = []
        out = np.zeros(len(self.paths), dtype=np.int64)
        for k, path in enumerate(self.paths):
            user_at = [j for j, f in enumerate(path) if self.user[f]]
            if user_at:
                j = user_at[-1]
                key = (int(self.func[path[j]]), int(self.func[path[j + 1]]) if j + 1 < len(path)
                       else -1)  # fmt: skip
            else:
                key = (int(self.func[path[-1]]) if path else -1, -1)
            if key not in keys:
                keys[key] = len(self.group_user)
                self.group_user.append(bool(user_at))
            out[k] = keys[key]
        return out

    def _label(self, f: int) -> str:
        line = self.lines[f]
        where = short_file(self.files[f], self.cwd) + ("" if line is None else f":{line}")
        return f"{self.names[f]} ({where})"

    # -- queries -----------------------------------------------------------------------------

    def overlap(self, intervals: Sequence[Sequence[int]] | None) -> np.ndarray:
        """Per sample row, the share (0–1) of its span inside the union of ``intervals``
        (None: the whole run, all ones)."""
        if intervals is None:
            return np.ones(len(self.t0))
        pairs = [(int(a), int(b)) for a, b in intervals if b > a]
        out = np.zeros(len(self.t0))
        if not pairs or not len(self.t0):
            return out
        s, e = union(np.array([p[0] for p in pairs], np.int64),
                     np.array([p[1] for p in pairs], np.int64))  # fmt: skip
        # rows are in time order: only those starting from a span before the first interval
        # up to the end of the last can overlap
        lo = int(np.searchsorted(self.t0, s[0] - self.max_span_ns, side="left"))
        hi = int(np.searchsorted(self.t0, e[-1], side="left"))
        t0, span = self.t0[lo:hi], self.span_ns[lo:hi]
        lengths = (e - s).astype(np.float64)
        before = np.concatenate([[0.0], np.cumsum(lengths)])

        def covered(x: np.ndarray) -> np.ndarray:  # length of the union before x
            k = np.searchsorted(s, x, side="right") - 1
            at = np.maximum(k, 0)
            inside = np.clip((x - s[at]).astype(np.float64), 0, lengths[at])
            return np.where(k >= 0, before[at] + inside, 0.0)

        out[lo:hi] = (covered(t0 + span) - covered(t0)) / span
        return out

    def weights(self, intervals: Sequence[Sequence[int]] | None) -> tuple[np.ndarray, np.ndarray]:
        """Per sample row, its busy and blocked thread-seconds inside ``intervals``."""
        inside = self.seconds * self.overlap(intervals)
        busy = inside * self.busy
        return busy, inside - busy

    def summary(self, intervals: Sequence[Sequence[int]]) -> StackSummary | None:
        """The top stacks in ``intervals``; None when too little was sampled there."""
        busy, blocked = self.weights(intervals)
        if busy.sum() + blocked.sum() < MIN_SECONDS:
            return None
        seen = (busy + blocked) > 0
        rates = self.rate[seen & np.isfinite(self.rate)]
        threads = set(zip(self.pid[seen].tolist(), self.thread[seen].tolist()))
        main_total = float((busy + blocked)[self.main].sum())
        main_blocked = float(blocked[self.main].sum())
        share = main_blocked / main_total if main_total >= MIN_SECONDS else None
        listed = share is not None and share >= MAIN_BLOCKED_MIN_SHARE
        return StackSummary(
            busy_s=float(busy.sum()),
            blocked_s=float(blocked.sum()),
            activity=self.activity,
            rate_hz=float(np.median(rates)) if len(rates) else None,
            processes=len({p for p, _ in threads}),
            threads=len(threads),
            main_blocked_share=share,
            top=self._top(busy, TOP),
            blocked=self._top(np.where(self.main, blocked, 0.0), TOP_WAITING) if listed else [],
        )

    def _top(self, weight: np.ndarray, n: int) -> list[StackGroup]:
        total = float(weight.sum())
        if total < MIN_SECONDS:
            return []
        group = self._group_of_stack[self.stack]
        per_group = np.bincount(group, weights=weight, minlength=len(self.group_user))
        out = []
        for g in np.argsort(-per_group, kind="stable")[:n]:
            seconds = float(per_group[g])
            if seconds < 0.01 * total:
                break
            rows = np.flatnonzero((group == g) & (weight > 0))
            out.append(self._group(int(g), rows, weight, seconds, total))
        return out

    def _group(self, g: int, rows: np.ndarray, weight: np.ndarray, seconds: float,
               total: float) -> StackGroup:  # fmt: skip
        # named after the group's commonest stack: its user frame's line, its chain
        per_stack = np.bincount(self.stack[rows], weights=weight[rows])

        path = self.paths[int(np.argmax(per_stack))]
        if self.group_user[g]:
            j = max(i for i, f in enumerate(path) if self.user[f])
            users = [f for f in path[: j + 1] if self.user[f]]
        else:
            j, users = len(path) - 1, path[-1:]
        key = path[j]
        chain = [self._label(f) for f in users[-CHAIN_USER_FRAMES:]]
        calls = self._label(path[j + 1]) if self.group_user[g] and j + 1 < len(path) else None
        if calls:
            chain.append(calls)
        procs = np.bincount(self.proc_code[rows], weights=weight[rows])
        threads = np.bincount(self.thread_code[rows], weights=weight[rows])
        procs = [self.proc_names[k] for k in np.argsort(-procs, kind="stable")[:3] if procs[k] > 0]
        threads = [str(self.thread_names[k]) for k in np.argsort(-threads, kind="stable")[:3]
                   if threads[k] > 0]  # fmt: skip
        return StackGroup(
            share=seconds / total,
            seconds=seconds,
            function=str(self.names[key]),
            file=str(self.files[key]),
            line=self.lines[key],
            user_code=bool(self.group_user[g]),
            calls=calls,
            chain=chain,
            processes=procs,
            threads=threads,
            short_file=short_file(str(self.files[key]), self.cwd),
        )

    def tree(self, intervals: Sequence[Sequence[int]] | None, *, blocked: bool = False,
             min_share: float = 0.005, max_nodes: int = 400) -> dict[str, Any] | None:  # fmt: skip
        """A flame graph of the busy (or the main threads' blocked) time in ``intervals``
        (None: the whole run): nested ``{"n": name, "f": "file:line", "v": seconds, "u": user
        code, "c": [children]}`` from the root ``all``; frames under ``min_share`` of the
        total are left out (their time stays in their parent), at most about ``max_nodes``
        nodes. None when nothing was sampled."""
        busy, idle = self.weights(intervals)
        weight = np.where(self.main, idle, 0.0) if blocked else busy
        total = float(weight.sum())
        if total < MIN_SECONDS:
            return None
        per_stack = np.bincount(self.stack, weights=weight, minlength=len(self.paths))
        root: dict[str, Any] = {"n": "all", "f": "", "v": total, "u": False, "c": {}}
        for k in np.flatnonzero(per_stack > 0):
            v, node = float(per_stack[k]), root
            for f in self.paths[k]:
                child = node["c"].get(f)
                if child is None:
                    line = self.lines[f]
                    where = short_file(self.files[f], self.cwd) + (
                        "" if line is None else f":{line}")  # fmt: skip
                    child = {"n": str(self.names[f]), "f": where, "v": 0.0,
                             "u": bool(self.user[f]), "c": {}}  # fmt: skip
                    node["c"][f] = child
                child["v"] += v
                node = child
        floor, count = total * min_share, [0]

        def prune(node: dict[str, Any]) -> dict[str, Any]:
            count[0] += 1
            out = {"n": node["n"], "f": node["f"], "v": round(node["v"], 4), "u": node["u"]}
            kids = sorted((c for c in node["c"].values() if c["v"] >= floor),
                          key=lambda c: -c["v"])  # fmt: skip
            out["c"] = [prune(c) for c in kids if count[0] < max_nodes]
            return out

        return prune(root)


def _floats(column: pd.Series, fill: float) -> np.ndarray:
    return pd.to_numeric(column, errors="coerce").fillna(fill).to_numpy(np.float64)


def busy_fraction(samples: pd.DataFrame, threads: pd.DataFrame,
                  window_ns: int) -> tuple[np.ndarray, str]:  # fmt: skip
    """Per sample row, the share of its thread's sampled time in that window it was busy (on
    a CPU or ready to run: its scheduler times there over its sampled seconds there, at most
    1), and ``thread_cpu``; all ones and ``unknown`` when the run has no per-thread CPU. Rows
    of a host without thread readings, or of a thread py-spy gave no OS id, count as busy."""
    n = len(samples)
    if threads is None or threads.empty or n == 0:
        return np.ones(n), "unknown"
    t = _floats(threads["t_ns"], np.nan)
    iv = _floats(threads["interval_s"], np.nan)
    pct = _floats(threads["cpu_pct"], np.nan) + _floats(threads["runq_pct"], 0.0)
    ok = np.isfinite(t) & np.isfinite(iv) & (iv > 0) & np.isfinite(pct)
    t, iv_ns = t[ok].astype(np.int64), (iv[ok] * 1e9).astype(np.int64)
    busy_s = np.minimum(pct[ok], 100.0) / 100.0 * iv[ok]
    reading_hosts = as_texts(threads["host"])[ok]
    sample_hosts = as_texts(samples["host"])
    codes, _ = pd.factorize(np.concatenate([reading_hosts, sample_hosts]))
    host, sample_host = codes[: len(reading_hosts)], codes[len(reading_hosts) :]
    pid = _ints(threads["pid"])[ok]
    tid = _ints(threads["tid"])[ok]
    # spread each reading's busy seconds over the windows its interval covers
    start = t - iv_ns
    w0, w1 = start // window_ns, (t - 1) // window_ns
    reps = np.clip(w1 - w0 + 1, 1, 3600)
    row = np.repeat(np.arange(len(t)), reps)
    w = w0[row] + (np.arange(len(row)) - np.repeat(np.cumsum(reps) - reps, reps))
    lo = np.maximum(start[row], w * window_ns)
    hi = np.minimum(t[row], (w + 1) * window_ns)
    piece = busy_s[row] * np.clip(hi - lo, 0, None) / iv_ns[row]
    keys = ["host", "pid", "tid", "w"]
    cpu = pd.DataFrame({"host": host[row], "pid": pid[row], "tid": tid[row], "w": w,
                        "busy": piece})  # fmt: skip
    cpu = cpu.groupby(keys, sort=False, as_index=False)["busy"].sum()
    rows = pd.DataFrame({"host": sample_host, "pid": _ints(samples["pid"]),
                         "tid": _ints(samples["tid"]),
                         "w": samples["t_ns"].to_numpy(np.int64) // window_ns,
                         "seconds": _floats(samples["seconds"], 0.0)})  # fmt: skip
    seen = rows.groupby(keys, sort=False)["seconds"].transform("sum").to_numpy()
    got = rows[keys].merge(cpu, how="left", on=keys)["busy"].to_numpy(np.float64)
    frac = np.nan_to_num(got, nan=0.0) / np.maximum(seen, 1e-9)
    unknown = ~np.isin(sample_host, np.unique(host)) | (rows["tid"].to_numpy() < 0)
    return np.where(unknown, 1.0, np.clip(frac, 0.0, 1.0)), "thread_cpu"


def _ints(column: pd.Series) -> np.ndarray:
    """Integer ids, -1 for missing."""
    return pd.to_numeric(column, errors="coerce").fillna(-1).to_numpy(np.int64)


def stack_index(ctx: Any) -> StackIndex | None:
    """The run's `StackIndex` (cached on an `AnalysisContext`); None without stack samples."""
    run = ctx.run
    if run.stack_samples is None or run.stack_samples.empty:
        return None
    cache = ctx.__dict__
    if "_stack_index" not in cache:
        cache["_stack_index"] = StackIndex(run)
    index = cache["_stack_index"]
    return index if len(index) else None


def attach_stacks(ctx: Any, findings: list[Any]) -> None:
    """Give every finding about idle or host time (`STACK_KINDS`) its top stacks in its
    intervals (in place: ``finding.stacks``)."""
    if not any(f.kind in STACK_KINDS for f in findings):
        return
    index = stack_index(ctx)
    if index is None:
        return
    for f in findings:
        if f.kind in STACK_KINDS:
            intervals = (f.evidence or {}).get("intervals") or []
            f.stacks = index.summary(intervals) if intervals else None
