"""``gpuprof watch --live``: a status area at the bottom of the terminal while the command runs.

Mode: the watched command's output keeps flowing straight to the terminal (through the tee
process, untouched), so the view cannot print "above" it the way a rich ``Live`` would. Instead
it reserves the bottom rows of the terminal with a scrolling region (DECSTBM, as apt's progress
bar does): the command's lines scroll in the rows above, and the status is redrawn in the rows
below, each redraw one ``write`` wrapped in save/restore-cursor, so it never lands inside a line
the command is writing and the command's cursor, colours and partial lines are left as they
were. It draws on stderr, only when stderr is a terminal, at most `REFRESH_HZ` times a second;
the bottom rows are cleared and the region released when the command ends. (A watcher killed
with SIGKILL cannot release it: the terminal then keeps its shorter scrolling area until
``reset``.) A command that takes over the whole screen itself (``top``, a curses UI) and the
status will draw over each other: leave ``--live`` off for those.

What it shows:

- per GPU: utilization and memory bars from the sampler's newest readings;
- per rank: the last phase it finished (hooks record a span when it ends, so this is the most
  recent finished phase, a second or so behind) and how long ago;
- the step count and seconds per step from the ranks' step events;
- the "latest finding": the phase in which the most GPU-time has gone idle so far, a cheap
  running estimate (each reading's idle GPUs are charged to the innermost span that covers it),
  not the full diagnosis.

The node's run files are read incrementally (rows after the last rowid seen) at most once a
second, from the watcher's process: the training processes never wait on the view. Besides the
watcher's own file that is every file the node's other processes write
(`gpuprof.run_tail`): the Ray workers of a cluster started before the watch write
their own.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from rich.console import Console
from rich.text import Text

from gpuprof.analyzers.findings import Thresholds
from gpuprof.reports import fmt
from gpuprof.run_tail import NodeRows, RunTail

REFRESH_HZ = 4.0
"""Redraws per second, at most."""
STORE_POLL_S = 1.0
"""How often the run file is read for new spans and steps."""
HISTORY_READINGS = 3600
"""Readings kept for charging idle time to spans that have not ended yet (15 min at 4 Hz)."""
MAX_GPU_ROWS = 8
"""GPU lines shown (two GPUs a line when the width allows); more GPUs are summarised."""
MAX_GAP_S = 5.0
"""A reading stands for the time since the previous one, at most this long (a gap longer than
that is a pause in sampling, not idle time)."""
BIN_NS = 250_000_000
"""Samples read from a node's file are charged in bins this long (the 4 Hz of the readings)."""

Readings = tuple[int, Sequence[Any], Any]
"""``(t_ns, GpuSample per GPU, HostSample or None)``, as the sampler's ``latest()`` gives."""


def _ns(values: Sequence[int | None]) -> np.ndarray:
    """Times in ns as an array, -1 for a missing one."""
    return np.array([-1 if v is None else v for v in values], dtype=np.int64)


def live_supported(stream: TextIO) -> bool:
    """True when ``stream`` is a terminal the view can draw on."""
    try:
        return os.isatty(stream.fileno()) and os.environ.get("TERM", "") not in ("", "dumb")
    except (AttributeError, OSError, ValueError):
        return False


@dataclass
class _Rank:
    rank: int | None
    pid: int
    phase: str = "–"
    end_ns: int = 0
    steps: deque = field(default_factory=lambda: deque(maxlen=20))
    """End times (ns) of the last steps."""
    step_count: int = 0


class LiveState:
    """Everything the status shows, updated from readings and from new store rows."""

    def __init__(self, idle_util_pct: float | None = None) -> None:
        self.idle_util_pct = Thresholds().idle_util_pct if idle_util_pct is None else idle_util_pct
        self.readings: Readings | None = None
        self.gpus_seen: set[tuple[str, int]] = set()
        """Every (host, GPU) read so far: one that stops reporting keeps its line."""
        self.ranks: dict[int, _Rank] = {}
        # idle accounting: one entry per reading, charged to the innermost span covering it
        self._t: deque[int] = deque()
        self._idle_gpu_s: deque[float] = deque()
        self._label: deque[str | None] = deque()
        self._label_len: deque[int] = deque()
        self._settled: dict[str | None, float] = {}
        self.gpu_s = 0.0
        self._last_t: int | None = None
        self._gpu_last_t: dict[int, int] = {}
        self.read_gpu_s: dict[int, float] = {}
        """Per GPU index: the seconds its utilization readings have covered so far."""
        self.busy_gpu_s: dict[int, float] = {}
        """Per GPU index: those seconds weighted by NVML utilization (0–1): over
        `read_gpu_s`, its mean utilization (differences between two moments: over that time)."""

    # ----- inputs
    def add_readings(self, readings: Readings | None) -> None:
        """Take the sampler's newest readings (ignored when they are not new)."""
        if readings is None:
            return
        self.readings = readings
        t_ns, gpus, _ = readings
        self.gpus_seen.update((g.host, g.gpu) for g in gpus)
        if self._last_t is not None and t_ns <= self._last_t:
            return
        dt = 0.0 if self._last_t is None else min(MAX_GAP_S, (t_ns - self._last_t) / 1e9)
        self._last_t = t_ns
        utils = [g.util_gpu_pct for g in gpus if g.util_gpu_pct is not None]
        idle = sum(1 for u in utils if u < self.idle_util_pct)
        self.gpu_s += dt * len(utils)
        if dt > 0:
            for g in gpus:
                if g.util_gpu_pct is not None:
                    self.read_gpu_s[g.gpu] = self.read_gpu_s.get(g.gpu, 0.0) + dt
                    busy = dt * g.util_gpu_pct / 100.0
                    self.busy_gpu_s[g.gpu] = self.busy_gpu_s.get(g.gpu, 0.0) + busy
        self._append(t_ns, dt * idle)

    def add_gpu_samples(self, t_ns: np.ndarray, gpu: np.ndarray, util_pct: np.ndarray) -> None:
        """GPU samples read from a node's file rather than the sampler's newest readings (the
        rows a Ray driver stores for another node): each sample stands for the time since the
        previous sample of its GPU (at most `MAX_GAP_S`); a NaN utilisation counts for
        nothing. The idle GPU-time is charged per `BIN_NS` of the node's clock, so that a
        node's 10 Hz samples cost the history no more than the 4 Hz readings do."""
        if not len(t_ns):
            return
        order = np.lexsort((t_ns, gpu))
        t = np.asarray(t_ns, dtype=np.int64)[order]
        g = np.asarray(gpu, dtype=np.int64)[order]
        util = np.asarray(util_pct, dtype=np.float64)[order]
        starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
        ends = np.r_[starts[1:], len(g)] - 1
        prev = np.empty_like(t)
        prev[1:] = t[:-1]
        for i, j in zip(starts.tolist(), ends.tolist()):
            key = int(g[i])
            prev[i] = self._gpu_last_t.get(key, t[i])
            self._gpu_last_t[key] = max(int(t[j]), self._gpu_last_t.get(key, int(t[j])))
        dt = np.clip((t - prev) / 1e9, 0.0, MAX_GAP_S)
        valid = ~np.isnan(util)
        idle = valid & (util < self.idle_util_pct)
        bins, where = np.unique(t // BIN_NS, return_inverse=True)
        self.gpu_s += float((dt * valid).sum())
        ids, which = np.unique(g, return_inverse=True)
        read = np.bincount(which, weights=np.where(valid, dt, 0.0), minlength=len(ids))
        busy = np.bincount(which, weights=np.where(valid, dt * util / 100.0, 0.0),
                           minlength=len(ids))  # fmt: skip
        for key, r, b in zip(ids.tolist(), read.tolist(), busy.tolist()):
            self.read_gpu_s[key] = self.read_gpu_s.get(key, 0.0) + r
            self.busy_gpu_s[key] = self.busy_gpu_s.get(key, 0.0) + b
        idle_s = np.bincount(where, weights=dt * idle, minlength=len(bins))
        for b, seconds in zip(bins.tolist(), idle_s.tolist()):
            self._append(b * BIN_NS, seconds)

    def _append(self, t_ns: int, idle_gpu_s: float) -> None:
        """One entry of the idle accounting, charged to no phase until a span covers it."""
        self._t.append(t_ns)
        self._idle_gpu_s.append(idle_gpu_s)
        self._label.append(None)
        self._label_len.append(0)
        while len(self._t) > HISTORY_READINGS:
            self._t.popleft()
            label = self._label.popleft()
            self._label_len.popleft()
            self._settled[label] = self._settled.get(label, 0.0) + self._idle_gpu_s.popleft()

    def add_spans(self, rows: Sequence[tuple]) -> None:
        """New span rows ``(pid, rank, phase, start_ns, end_ns)`` from the run file."""
        if not rows:
            return
        pid, rank, phase, start, end = zip(*rows)
        self.add_span_columns(np.array(pid, dtype=np.int64), list(rank),
                              np.array(phase, dtype=object), _ns(start), _ns(end))  # fmt: skip

    def add_span_columns(
        self,
        pid: np.ndarray,
        rank: Sequence[int | None],
        phase: np.ndarray,
        start_ns: np.ndarray,
        end_ns: np.ndarray,
    ) -> None:
        """New spans as columns (the Arrow chunks of another node come so, hundreds a pull):
        pids, ranks (None where unknown), phase names, start and end times in ns (-1 where
        missing: such a span is left out)."""
        keep = np.flatnonzero((phase != "step") & (start_ns >= 0) & (end_ns >= 0))
        if not len(keep):
            return
        # each process's last phase: its span that ended last
        by_end = keep[np.argsort(end_ns[keep], kind="stable")]
        _, from_end = np.unique(pid[by_end][::-1], return_index=True)
        for i in by_end[len(by_end) - 1 - from_end].tolist():
            info = self.ranks.get(int(pid[i]))
            if info is None:
                info = self.ranks[int(pid[i])] = _Rank(rank[i], int(pid[i]))
            if end_ns[i] >= info.end_ns:
                info.phase, info.end_ns = str(phase[i]), int(end_ns[i])
        times = np.fromiter(self._t, dtype=np.int64, count=len(self._t))
        if not len(times):
            return
        starts, ends = start_ns[keep], end_ns[keep]
        if bool(np.all(times[1:] >= times[:-1])):
            # entries are appended in time order (readings, then each pull's bins): bisect
            first, stop = np.searchsorted(times, starts), np.searchsorted(times, ends)
            covering = np.flatnonzero(stop > first).tolist()
            entries = {k: range(int(first[k]), int(stop[k])) for k in covering}
        else:
            entries = {k: np.flatnonzero((times >= starts[k]) & (times < ends[k])).tolist()
                       for k in range(len(keep))}  # fmt: skip
        # in place: the entries spans cover are mostly the newest, which a deque reaches fast
        labels, lengths = self._label, self._label_len
        for k, inside in entries.items():
            name, length = str(phase[keep[k]]), int(ends[k] - starts[k])
            for i in inside:
                if labels[i] is None or length < lengths[i]:  # innermost span wins
                    labels[i], lengths[i] = name, length

    def add_rows(self, rows: NodeRows) -> None:
        """The spans and steps a node's files gained (`gpuprof.run_tail`)."""
        self.add_spans(rows.spans)
        data = rows.span_table
        if data is not None and data.num_rows:
            self.add_span_columns(
                data.column("pid").to_numpy(zero_copy_only=False).astype(np.int64),
                data.column("rank").to_pylist(),
                data.column("phase").to_numpy(zero_copy_only=False),
                data.column("start_ns").fill_null(-1).to_numpy().astype(np.int64),
                data.column("end_ns").fill_null(-1).to_numpy().astype(np.int64),
            )
        self.add_steps(rows.steps)

    def add_steps(self, rows: Sequence[tuple]) -> None:
        """New step events ``(pid, rank, t_ns)`` from the run file."""
        for pid, rank, t_ns in rows:
            info = self.ranks.get(pid)
            if info is None:
                info = self.ranks[pid] = _Rank(rank, pid)
            info.steps.append(int(t_ns))
            info.step_count += 1

    # ----- figures
    def idle_by_phase(self) -> dict[str | None, float]:
        """Idle GPU-seconds charged to each phase so far (None: outside every span)."""
        out = dict(self._settled)
        for label, idle in zip(self._label, self._idle_gpu_s):
            out[label] = out.get(label, 0.0) + idle
        return out

    def lead(self) -> _Rank | None:
        """The process whose steps set the pace: the lowest rank that has stepped."""
        stepped = [r for r in self.ranks.values() if r.steps]
        if not stepped:
            return None
        return min(stepped, key=lambda r: (r.rank is None, r.rank or 0, r.pid))

    def step_time_s(self, rank: _Rank | None = None) -> float | None:
        """Mean seconds per step over the last steps of ``rank`` (default: the lead rank)."""
        info = self.lead() if rank is None else rank
        if info is None or len(info.steps) < 2:
            return None
        return (info.steps[-1] - info.steps[0]) / 1e9 / (len(info.steps) - 1)

    def top_idle_phase(self) -> tuple[str, float, float] | None:
        """``(phase, idle GPU-s, share of the GPU-time read)`` of the phase in which the most
        GPU-time has gone idle so far; None while no phase reaches `Thresholds.min_share`."""
        named = {k: v for k, v in self.idle_by_phase().items() if k is not None}
        if not named or self.gpu_s <= 0:
            return None
        phase, lost = max(named.items(), key=lambda kv: kv[1])
        share = lost / self.gpu_s
        return (phase, lost, share) if share >= Thresholds().min_share else None


def _bar(fraction: float | None, width: int, ascii_only: bool) -> Text:
    full, empty = ("#", ".") if ascii_only else ("█", "░")
    if fraction is None or fraction != fraction:
        return Text(" " * width)
    n = round(max(0.0, min(1.0, fraction)) * width)
    style = "red" if fraction < 0.1 else "yellow" if fraction < 0.5 else "green"
    return Text.assemble((full * n, style), (empty * (width - n), "dim"))


def _gpu_cell(label: str, g: Any | None, ascii_only: bool) -> Text:
    """``GPU3  ████░░░░  52% mem ██░░░  41.2G`` (36 cells); a GPU without a reading says so."""
    cell = Text(f"{label:<5} ")
    if g is None:
        return cell.append("no reading (lost?)".ljust(30), style="red")
    util = g.util_gpu_pct
    used, total = g.mem_used_bytes, g.mem_total_bytes
    mem = used / total if used is not None and total else None
    cell.append_text(_bar(None if util is None else util / 100, 8, ascii_only))
    cell.append(f" {fmt.percent(util):>4} mem ")
    cell.append_text(_bar(mem, 5, ascii_only))
    cell.append(f" {fmt.gib(used):>5}G" if used is not None else "   n/a")
    return cell


def status_lines(state: LiveState, width: int, now_ns: int, *, ascii_only: bool = False) -> list:
    """The status as rich `Text` lines, none wider than ``width`` cells."""
    lines: list[Text] = []
    head = Text("gpuprof live", style="bold")
    lead = state.lead()
    if lead is not None:
        head.append(f"  step {lead.step_count}")
        step_s = state.step_time_s()
        if step_s:
            head.append(f"  {fmt.seconds(step_s)}/step")
    readings = state.readings
    host = readings[2] if readings else None
    if host is not None and getattr(host, "cpu_pct", None) is not None:
        head.append(f"  host CPU {fmt.percent(host.cpu_pct)}")
    lines.append(head)

    latest = {(g.host, g.gpu): g for g in readings[1]} if readings else {}
    keys = sorted(state.gpus_seen)
    if not keys:
        lines.append(Text("no GPU readings (host only)", style="dim"))
    else:
        hosts = {h for h, _ in keys}
        labels = [f"{h}:{i}" if len(hosts) > 1 else f"GPU{i}" for h, i in keys]
        cells = [_gpu_cell(lab, latest.get(k), ascii_only) for lab, k in zip(labels, keys)]
        per_line = 2 if width >= 2 * max(c.cell_len for c in cells) + 3 else 1
        shown = cells[: MAX_GPU_ROWS * per_line]
        joiner = Text(" | " if ascii_only else " │ ", style="dim")
        for i in range(0, len(shown), per_line):
            lines.append(joiner.join(shown[i : i + per_line]))
        rest = [latest.get(k) for k in keys[len(shown) :]]
        if rest:
            utils = [g.util_gpu_pct for g in rest if g is not None and g.util_gpu_pct is not None]
            mean = sum(utils) / len(utils) if utils else None
            lines.append(Text(f"+{len(rest)} more GPUs, mean util {fmt.percent(mean)}"))

    ranks = sorted(state.ranks.values(), key=lambda r: (r.rank is None, r.rank or 0, r.pid))
    ranks = [r for r in ranks if r.end_ns]
    line = Text("last phase: ")
    if not ranks:
        line.append("none finished yet", style="dim")
    else:
        for r in ranks:
            who = f"r{r.rank}" if r.rank is not None else f"pid {r.pid}"
            ago = max(0.0, (now_ns - r.end_ns) / 1e9)
            part = f"{who} {r.phase} ({ago:.0f}s ago)  "
            if line.cell_len + len(part) > width - 8:
                line.append(f"+{len(ranks) - ranks.index(r)} more")
                break
            line.append(part)
    lines.append(line)

    finding = Text("most idle: ", style="bold")
    top = state.top_idle_phase()
    if top is not None:
        phase, lost, share = top
        finding.append(phase, style="bold yellow")
        finding.append(f"  {fmt.gpu_seconds(lost)} idle, {100 * share:.0f}% of GPU-time so far")
    else:
        finding.append("no phase stands out yet", style="dim")
    lines.append(finding)
    for line in lines:
        line.truncate(width, overflow="ellipsis")
    return lines


class ScrollRegion:
    """The bottom rows of a terminal kept for a status, the rows above scrolling as usual."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.rows = 0
        self.height = 0

    def _size(self) -> tuple[int, int]:
        size = os.get_terminal_size(self.fd)
        return size.lines, size.columns

    def width(self) -> int:
        return self._size()[1]

    def draw(self, lines: list[str]) -> None:
        """Draw ``lines`` (already rendered, each narrower than the terminal) at the bottom."""
        rows, _ = self._size()
        height = max(0, min(len(lines), rows // 3))
        out = []
        if (rows, height) != (self.rows, self.height):
            out.append(self._release_codes())
            if height:
                # make room below the cursor, then keep the rows above for scrolling output
                out.append("\n" * height + f"\x1b[{height}A")
                out.append(f"\x1b7\x1b[1;{rows - height}r\x1b8")
            self.rows, self.height = rows, height
        if height:
            out.append("\x1b7")
            for i, line in enumerate(lines[:height]):
                out.append(f"\x1b[{rows - height + 1 + i};1H\x1b[2K{line}")
            out.append("\x1b8")
        self._write("".join(out))

    def _release_codes(self) -> str:
        if not self.height:
            return ""
        # clear the old status rows, then give the whole screen back to scrolling
        top = self.rows - self.height + 1
        return f"\x1b7\x1b[{top};1H\x1b[J\x1b[r\x1b8"

    def release(self) -> None:
        self._write(self._release_codes())
        self.height = 0

    def _write(self, text: str) -> None:
        if not text:
            return
        data = text.encode("utf-8", "replace")
        # one write: the terminal takes it whole, between the command's own writes
        with contextlib.suppress(OSError):
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view) :]


class LiveView:
    """The status area's thread: redraws from ``readings()`` at most `REFRESH_HZ` a second and
    reads ``db_path`` (and the other files of ``node`` in ``run_dir``) for spans and steps at
    most once a second."""

    def __init__(
        self,
        readings: Callable[[], Readings | None],
        db_path: Path,
        stream: TextIO,
        *,
        node: str = "",
        run_dir: Path | None = None,
        refresh_hz: float = REFRESH_HZ,
    ) -> None:
        self.readings = readings
        self.state = LiveState()
        # the node's other files too (Ray workers of a cluster started before the watch)
        self.tail = RunTail(Path(db_path), node, run_dir=run_dir, other_nodes=False)
        self.region = ScrollRegion(stream.fileno())
        self.period_s = 1.0 / min(refresh_hz, REFRESH_HZ)
        self.draws = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuprof-live", daemon=True)
        probe = Console(file=stream, force_terminal=True)
        self._color_system = probe.color_system
        self._ascii = not (probe.encoding or "").lower().startswith("utf")
        self._old_ttou: Any = None

    def start(self) -> None:
        # a background process group writing to a terminal with `stty tostop` is stopped by
        # SIGTTOU; the watcher's group is background once the command owns the terminal
        if threading.current_thread() is threading.main_thread():
            with contextlib.suppress(OSError, ValueError):
                self._old_ttou = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        self._thread.start()

    def stop(self) -> None:
        """Stop redrawing, clear the status rows and give the terminal back."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        self.region.release()
        self.tail.close()
        if self._old_ttou is not None:
            with contextlib.suppress(OSError, ValueError):
                signal.signal(signal.SIGTTOU, self._old_ttou)

    def _render(self, width: int) -> list[str]:
        lines = status_lines(self.state, width, time.time_ns(), ascii_only=self._ascii)
        buffer = io.StringIO()
        console = Console(file=buffer, force_terminal=True, width=width,
                          color_system=self._color_system, legacy_windows=False)  # fmt: skip
        out = []
        for line in lines:
            buffer.seek(0)
            buffer.truncate()
            console.print(line, end="", no_wrap=True, overflow="ellipsis", crop=True)
            out.append(buffer.getvalue())
        return out

    def _run(self) -> None:
        next_poll = 0.0
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.state.add_readings(self.readings())
                if started >= next_poll:
                    for rows in self.tail.poll().values():
                        self.state.add_rows(rows)
                    next_poll = started + STORE_POLL_S
                # one column spare: writing the last column would leave a pending wrap
                self.region.draw(self._render(max(20, self.region.width() - 1)))
                self.draws += 1
            except Exception as exc:  # the view is a convenience: never let it disturb the watch
                if len(self.errors) < 5:
                    self.errors.append(f"live view: {exc!r}")
            self._stop.wait(max(0.0, self.period_s - (time.monotonic() - started)))
