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

The run's SQLite file is read incrementally (rows after the last rowid seen) at most once a
second, from the watcher's process: the training processes never wait on the view.
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

from gpuprof import store
from gpuprof.analyzers.findings import Thresholds
from gpuprof.reports import fmt

REFRESH_HZ = 4.0
"""Redraws per second, at most."""
STORE_POLL_S = 1.0
"""How often the run file is read for new spans and steps."""
HISTORY_READINGS = 3600
"""Readings kept for charging idle time to spans that have not ended yet (15 min at 4 Hz)."""
MAX_GPU_ROWS = 8
"""GPU lines shown (two GPUs a line when the width allows); more GPUs are summarised."""

Readings = tuple[int, Sequence[Any], Any]
"""``(t_ns, GpuSample per GPU, HostSample or None)``, as the sampler's ``latest()`` gives."""


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
        dt = 0.0 if self._last_t is None else min(5.0, (t_ns - self._last_t) / 1e9)
        self._last_t = t_ns
        utils = [g.util_gpu_pct for g in gpus if g.util_gpu_pct is not None]
        idle = sum(1 for u in utils if u < self.idle_util_pct)
        self.gpu_s += dt * len(utils)
        self._t.append(t_ns)
        self._idle_gpu_s.append(dt * idle)
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
        times = np.fromiter(self._t, dtype=np.int64, count=len(self._t))
        labels, lengths = list(self._label), list(self._label_len)
        for pid, rank, phase, start, end in rows:
            if phase == "step" or start is None or end is None:
                continue
            info = self.ranks.setdefault(pid, _Rank(rank, pid))
            if end >= info.end_ns:
                info.phase, info.end_ns = str(phase), int(end)
            if len(times):
                inside = np.flatnonzero((times >= start) & (times < end))
                length = int(end - start)
                for i in inside.tolist():
                    if labels[i] is None or length < lengths[i]:  # innermost span wins
                        labels[i], lengths[i] = str(phase), length
        self._label, self._label_len = deque(labels), deque(lengths)

    def add_steps(self, rows: Sequence[tuple]) -> None:
        """New step events ``(pid, rank, t_ns)`` from the run file."""
        for pid, rank, t_ns in rows:
            info = self.ranks.setdefault(pid, _Rank(rank, pid))
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


class StoreTail:
    """Reads the rows added to a run file since the last call (by rowid; cheap, no index)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn = None
        self.span_rowid = 0
        self.event_rowid = 0
        self.steps_total = 0

    def poll(self) -> tuple[list[tuple], list[tuple]]:
        """New spans ``(pid, rank, phase, start_ns, end_ns)`` and step events
        ``(pid, rank, t_ns)``; empty lists while the file cannot be read."""
        try:
            if self.conn is None:
                self.conn = store.connect(self.path, create=False)
            spans = self.conn.execute(
                "SELECT rowid, pid, rank, phase, start_ns, end_ns FROM spans WHERE rowid > ? "
                "ORDER BY rowid LIMIT 100000",
                (self.span_rowid,),
            ).fetchall()
            steps = self.conn.execute(
                "SELECT rowid, pid, rank, t_ns FROM events WHERE rowid > ? AND kind = 'step' "
                "ORDER BY rowid LIMIT 100000",
                (self.event_rowid,),
            ).fetchall()
        except Exception:  # a locked or half-created file: try again at the next poll
            return [], []
        if spans:
            self.span_rowid = spans[-1][0]
        if steps:
            self.event_rowid = steps[-1][0]
        return [r[1:] for r in spans], [r[1:] for r in steps]

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
            self.conn = None


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
    reads ``db_path`` for spans and steps at most once a second."""

    def __init__(
        self,
        readings: Callable[[], Readings | None],
        db_path: Path,
        stream: TextIO,
        *,
        refresh_hz: float = REFRESH_HZ,
    ) -> None:
        self.readings = readings
        self.state = LiveState()
        self.tail = StoreTail(Path(db_path))
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
                    spans, steps = self.tail.poll()
                    self.state.add_spans(spans)
                    self.state.add_steps(steps)
                    next_poll = started + STORE_POLL_S
                # one column spare: writing the last column would leave a pending wrap
                self.region.draw(self._render(max(20, self.region.width() - 1)))
                self.draws += 1
            except Exception as exc:  # the view is a convenience: never let it disturb the watch
                if len(self.errors) < 5:
                    self.errors.append(f"live view: {exc!r}")
            self._stop.wait(max(0.0, self.period_s - (time.monotonic() - started)))
