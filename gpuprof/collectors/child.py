"""Run the watched command: own process group, output passed through and kept, signals forwarded.

The command's stdout and stderr are pipes read by a small tee process (``tee.py``) that copies
every byte to the watcher's own stdout and stderr as it arrives (so progress bars and colours
pass untouched) and sends a copy to the watcher, which stores it split into lines with the time
they arrived. The tee runs in its own session and ignores terminal signals, so the command's
output keeps flowing even if the watcher is killed. Signals the watcher receives (SIGINT,
SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2) go to the command's whole process group, as they
would without the watcher. When the watcher owns the terminal, the command's group is made the
terminal's foreground group so it can read stdin and receives Ctrl-C directly.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gpuprof.nodes import now_ns

FORWARDED_SIGNALS = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
MAX_LINE_CHARS = 4096
"""Longer output lines are cut when stored (they still pass through whole)."""
_MAX_PARTIAL_BYTES = 1 << 16

LineCallback = Callable[[int, str, str], None]
"""Called with (t_ns, stream name, line without its newline)."""


class CommandNotFound(Exception):
    """The command could not be started (not found or not executable)."""


def exit_code_of(returncode: int) -> int:
    """A shell-style exit code: the child's, or 128+N when signal N killed it."""
    return 128 - returncode if returncode < 0 else returncode


class LineSplitter:
    """Turns a byte stream into lines as a terminal would show them.

    A carriage return without a newline (progress bars) overwrites the line: only the text
    after the last ``\\r`` of a line is kept. Bytes are decoded as UTF-8 with replacement.
    """

    def __init__(self, stream: str, on_line: LineCallback) -> None:
        self.stream = stream
        self.on_line = on_line
        self.partial = b""

    def feed(self, data: bytes, t_ns: int) -> None:
        buf = self.partial + data
        *lines, self.partial = buf.split(b"\n")
        for raw in lines:
            self._emit(raw, t_ns)
        if len(self.partial) > _MAX_PARTIAL_BYTES:
            # a progress bar that never ends its line: keep only what it shows now
            self.partial = self.partial[self.partial.rfind(b"\r") + 1 :][-_MAX_PARTIAL_BYTES:]

    def close(self, t_ns: int) -> None:
        if self.partial:
            self._emit(self.partial, t_ns)
            self.partial = b""

    def _emit(self, raw: bytes, t_ns: int) -> None:
        raw = raw.rstrip(b"\r")
        if b"\r" in raw:
            raw = raw[raw.rfind(b"\r") + 1 :]
        if raw:
            self.on_line(t_ns, self.stream, raw.decode("utf-8", "replace")[:MAX_LINE_CHARS])


class ChildProcess:
    """The watched command and the threads that copy its output."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        on_line: LineCallback | None = None,
        stdout: int | None = None,
        stderr: int | None = None,
        kill_after_s: float | None = 30.0,
    ) -> None:
        self.argv = list(argv)
        self.kill_after_s = kill_after_s
        """After a forwarded SIGTERM/SIGINT/SIGHUP/SIGQUIT, SIGKILL the group when it is still
        running this many seconds later, or at once on a second such signal (``timeout -k``);
        None: never."""
        self._stop_at: float | None = None
        self.killed = False
        """True when the group was escalated to SIGKILL."""
        self.leftover: list[int] = []
        """Pids of the command's process group still running when the command exited."""
        self.env = dict(env)
        self.on_line = on_line
        self.out_fd = sys.stdout.fileno() if stdout is None else stdout
        self.err_fd = sys.stderr.fileno() if stderr is None else stderr
        self.proc: subprocess.Popen | None = None
        self.pgid: int | None = None
        self.signals_received: list[int] = []
        self._pumps: list[threading.Thread] = []
        self._old_handlers: dict[int, object] = {}
        self._pending: list[int] = []
        """Signals received before the command's process group existed, to pass on."""
        self._tty_fd: int | None = None
        self.tee: subprocess.Popen | None = None

    def start(self) -> int:
        """Start the command in its own process group; return its pid."""
        # its own process group, so a forwarded signal reaches torchrun's workers too
        group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        # before the command exists: a signal that comes while it starts is kept and passed
        # on once it runs, where it would otherwise take the watcher down with its default
        # action and leave the command running (a loaded machine can run the new command
        # for a while before the watcher is scheduled again)
        self._install_signal_forwarding()
        try:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=None,
                stdout=out_w,
                stderr=err_w,
                close_fds=True,
                **group,
            )
        except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            self._restore_signal_handlers()
            raise CommandNotFound(f"cannot run {self.argv[0]!r}: {exc.strerror}") from None
        finally:
            if self.proc is not None:
                os.close(out_w)
                os.close(err_w)
        self.pgid = self.proc.pid
        self._give_terminal()
        for signum in self._pending:  # received while the command was starting
            self._forward(signum, None, replay=True)
        self._pending.clear()
        streams = [(out_r, self.out_fd, "stdout"), (err_r, self.err_fd, "stderr")]
        copies = self._start_tee(streams)
        if copies is None:  # no tee process: pass the output through from here
            pumps = [(fd, out_fd, name, True) for fd, out_fd, name in streams]
        else:
            pumps = [(fd, -1, name, False) for fd, (_, _, name) in zip(copies, streams)]
        for fd, out_fd, name, passthrough in pumps:
            thread = threading.Thread(
                target=self._pump,
                args=(fd, out_fd, name, passthrough),
                name=f"gpuprof-{name}",
                daemon=True,
            )
            thread.start()
            self._pumps.append(thread)
        return self.proc.pid

    def _start_tee(self, streams: list[tuple[int, int, str]]) -> list[int] | None:
        """Hand the command's pipes to a tee process that outlives the watcher.

        Returns the read ends of the copies the tee sends back, or None when it could not be
        started (the watcher then passes the output through itself).
        """
        copies = [os.pipe() for _ in streams]
        args, keep = [], []
        for (in_fd, out_fd, _), (_, copy_w) in zip(streams, copies):
            args += [str(in_fd), str(out_fd), str(copy_w)]
            keep += [in_fd, out_fd, copy_w]
        try:
            self.tee = subprocess.Popen(
                [sys.executable, "-I", str(Path(__file__).with_name("tee.py")), *args],
                stdin=subprocess.DEVNULL,
                pass_fds=keep,
                start_new_session=True,  # terminal signals and the watcher's death spare it
            )
        except OSError:
            for read_end, write_end in copies:
                os.close(read_end)
                os.close(write_end)
            return None
        for in_fd, _, _ in streams:
            os.close(in_fd)  # the tee owns the command's pipes now
        for _, write_end in copies:
            os.close(write_end)
        return [read_end for read_end, _ in copies]

    def _pump(self, fd: int, out_fd: int, name: str, passthrough: bool) -> None:
        splitter = LineSplitter(name, self.on_line) if self.on_line else None
        writable = passthrough
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:
                break
            if not data:
                break
            if writable:
                writable = _write_all(out_fd, data)
            if splitter is not None:
                try:
                    splitter.feed(data, now_ns())
                except Exception:
                    splitter = None  # storing lines is best effort; passing them through is not
        if splitter is not None:
            with contextlib.suppress(Exception):
                splitter.close(now_ns())
        os.close(fd)

    def _install_signal_forwarding(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in FORWARDED_SIGNALS:
            with contextlib.suppress(OSError, ValueError):
                self._old_handlers[sig] = signal.signal(sig, self._forward)

    def _forward(self, signum: int, frame: object, replay: bool = False) -> None:
        if not replay:
            self.signals_received.append(signum)
        if self.pgid is None:
            self._pending.append(signum)
            return
        if signum in _STOPPING and self._stop_at is not None and self.kill_after_s is not None:
            self._kill()  # a second stop request: the user means it
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signum)
        if signum in _STOPPING and self._stop_at is None:
            self._stop_at = time.monotonic()

    def _kill(self) -> None:
        if self.pgid is None:
            return
        self.killed = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signal.SIGKILL)

    def _give_terminal(self) -> None:
        """Make the child's group the terminal's foreground group when we hold the terminal."""
        try:
            fd = sys.stdin.fileno()
            if not os.isatty(fd) or os.tcgetpgrp(fd) != os.getpgrp():
                return
            with _ignoring(signal.SIGTTOU):
                os.tcsetpgrp(fd, self.pgid)
            self._tty_fd = fd
        except (OSError, ValueError, AttributeError):
            self._tty_fd = None

    def _take_terminal_back(self) -> None:
        if self._tty_fd is None:
            return
        with contextlib.suppress(OSError), _ignoring(signal.SIGTTOU):
            os.tcsetpgrp(self._tty_fd, os.getpgrp())
        self._tty_fd = None

    def wait(self) -> int:
        """Wait for the command and its output; return its exit code (128+N for signal N)."""
        assert self.proc is not None
        while True:
            try:
                returncode = self.proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                stop_at, grace = self._stop_at, self.kill_after_s
                expired = stop_at is not None and grace is not None
                if expired and not self.killed and time.monotonic() - stop_at >= grace:
                    self._kill()  # it ignored the stop request: escalate
            except KeyboardInterrupt:  # only if a handler could not be installed
                continue
        self.leftover = _group_members(self.pgid)
        for thread in self._pumps:
            # a grandchild may hold the pipes open after the child exits: don't wait forever
            thread.join(timeout=2.0)
        if (
            self.tee is not None
            and self.tee.poll() is None
            and not any(t.is_alive() for t in self._pumps)
        ):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.tee.wait(timeout=1.0)
        self._take_terminal_back()
        self._restore_signal_handlers()
        return exit_code_of(returncode)

    def _restore_signal_handlers(self) -> None:
        for sig, handler in self._old_handlers.items():
            with contextlib.suppress(OSError, ValueError, TypeError):
                signal.signal(sig, handler)
        self._old_handlers.clear()

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode


_STOPPING = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT})
"""Forwarded signals that ask the command to stop (the ones ``--kill-after`` escalates)."""


def _group_members(pgid: int | None) -> list[int]:
    """Pids of live processes in process group ``pgid`` (grandchildren left behind)."""
    if pgid is None:
        return []
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return []
    import psutil

    out = []
    for proc in psutil.process_iter(["pid", "status"]):
        with contextlib.suppress(psutil.Error, OSError):
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.info["pid"]) == pgid:
                out.append(proc.info["pid"])
    return sorted(out)


def _write_all(fd: int, data: bytes) -> bool:
    """Write everything to ``fd``; False once it is closed (e.g. piped into ``head``)."""
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError as exc:
            if exc.errno == errno.EAGAIN:
                time.sleep(0.001)
                continue
            return False
        view = view[written:]
    return True


@contextlib.contextmanager
def _ignoring(sig: int):
    old = signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(sig, old)
