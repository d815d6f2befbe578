"""Run ``python -m gpuprof ARGS`` for the tests without paying its imports every time.

The suite runs the CLI as a user would, in a process of its own, several hundred times; each of
those processes spent ~1.1 s of CPU importing pandas, pyarrow, rich, typer and gpuprof before
doing a tenth of that work (measured with a per-process CPU account of the whole suite). A
*zygote* is one process per test worker that imports them once and then forks, for each
command, a child that runs ``gpuprof``'s ``__main__`` exactly as ``python -m gpuprof`` does:
the request's argv, environment, working directory and standard streams, the default signal
dispositions, and the interpreter's exit sequence (non-daemon threads joined, ``atexit``
handlers, streams flushed). What is shared is only what importing left in memory.

A request the zygote cannot reproduce faithfully (an environment that changes how Python or
the imports behave, ``stdin`` given as data) runs as a plain subprocess, and
``GPUPROF_TEST_FRESH_PROCESSES=1`` runs every command that way. The tests that send signals to
the watcher, or time its start, start ``python -m gpuprof`` themselves and never come here.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading

PRELOAD = (
    "numpy",
    "pandas",
    "pyarrow",
    "pyarrow.parquet",
    "pyarrow.compute",
    "psutil",
    "rich.console",
    "rich.table",
    "typer",
    # what typer and rich load lazily when a command's options are parsed or its help shown
    "typer._adapters",
    "typer.rich_utils",
    "pydantic",
    "rich.markdown",
    "rich.traceback",
    "rich.syntax",
    "pandas.core.methods.to_dict",
    "pandas.core.reshape.reshape",
)
"""Third-party modules imported once by the zygote: what ``python -m gpuprof`` spends most of
its start on. gpuprof's own modules follow (`_preload_gpuprof`); none reads the environment or
the working directory when imported (``tests/test_zygote.py`` holds them to that)."""

_SAME_AS_ZYGOTE = (
    "PYTHON", "LC_", "LANG", "OMP_", "OPENBLAS_", "MKL_", "ARROW_", "PANDAS_", "LD_",
)  # fmt: skip
"""Environment variables read when the interpreter, the dynamic loader or a preloaded module
starts: a request whose values differ from the zygote's runs as a fresh process instead.
``LD_LIBRARY_PATH`` is one: the loader reads it once, so a forked child given the simulated
NVML library's directory would still not find the library."""

_FRESH_ONLY = ("PYTHONIOENCODING", "PYTHONWARNINGS", "PYTHONDEVMODE")
"""Settings of the standard streams and warnings a child would have to rebuild: a request
with any of them runs as a fresh process."""

_LEN = struct.Struct("!I")


def _interesting(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_SAME_AS_ZYGOTE)}


class Zygote:
    """A preloaded process of this test worker that forks one child per gpuprof command."""

    def __init__(self, env: dict[str, str]) -> None:
        self._dir = tempfile.mkdtemp(prefix="gpuprof-zygote-")
        self.path = os.path.join(self._dir, "socket")
        self.env = dict(env)
        self._process = subprocess.Popen(
            [sys.executable, __file__, self.path],
            env=self.env,
            stdin=subprocess.PIPE,  # its end of file tells the zygote this worker is gone
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._ready = False

    def serves(self, env: dict[str, str]) -> bool:
        return (
            self._process.poll() is None
            and _interesting(env) == _interesting(self.env)
            and not any(name in env for name in _FRESH_ONLY)
        )

    def _connect(self) -> socket.socket:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        deadline = 60.0  # the zygote's own imports, on a busy machine
        while True:
            try:
                conn.connect(self.path)
                self._ready = True
                return conn
            except (FileNotFoundError, ConnectionRefusedError):
                if self._ready or self._process.poll() is not None or deadline <= 0:
                    conn.close()
                    raise
                threading.Event().wait(0.05)
                deadline -= 0.05

    def run(
        self,
        args: list[str],
        env: dict[str, str],
        cwd: str | os.PathLike | None,
        timeout: float | None,
        text: bool,
    ) -> subprocess.CompletedProcess:
        """``subprocess.run(python -m gpuprof ARGS, capture_output=True, ...)``, forked."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        stdin = os.open(os.devnull, os.O_RDONLY)
        conn = self._connect()
        try:
            request = json.dumps(
                {"argv": args, "env": env, "cwd": os.fspath(cwd or os.getcwd())}
            ).encode()
            socket.send_fds(conn, [_LEN.pack(len(request)) + request], [stdin, out_w, err_w])
        finally:
            for fd in (stdin, out_w, err_w):
                os.close(fd)
        pid = _LEN.unpack(_recv_exactly(conn, _LEN.size))[0]
        streams = _Drain(out_r, err_r)
        try:
            conn.settimeout(timeout)
            status = struct.unpack("!i", _recv_exactly(conn, 4))[0]
        except TimeoutError:
            _kill(pid)
            streams.finish()
            raise subprocess.TimeoutExpired(
                [sys.executable, "-m", "gpuprof", *args], timeout, *streams.result(text)
            ) from None
        finally:
            conn.close()
        streams.finish()
        stdout, stderr = streams.result(text)
        return subprocess.CompletedProcess(
            [sys.executable, "-m", "gpuprof", *args], status, stdout, stderr
        )

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.stdin.close()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        for name in (self.path,):
            try:
                os.unlink(name)
            except FileNotFoundError:
                pass
        os.rmdir(self._dir)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the gpuprof zygote closed the connection")
        data += chunk
    return data


class _Drain:
    """Reads a child's stdout and stderr to their ends in threads, as ``communicate`` does,
    so that a child writing more than a pipe holds never blocks."""

    def __init__(self, *fds: int) -> None:
        self._chunks: list[list[bytes]] = [[] for _ in fds]
        self._threads = [
            threading.Thread(target=self._read, args=(fd, chunks), daemon=True)
            for fd, chunks in zip(fds, self._chunks)
        ]
        for thread in self._threads:
            thread.start()

    @staticmethod
    def _read(fd: int, chunks: list[bytes]) -> None:
        with os.fdopen(fd, "rb", buffering=0) as stream:
            while chunk := stream.read(65536):
                chunks.append(chunk)

    def finish(self) -> None:
        # a grandchild holding the pipes open (a watched command left running) must not hang
        # the test: the child's own output has all arrived once it has exited
        for thread in self._threads:
            thread.join(timeout=10)

    def result(self, text: bool) -> tuple:
        raw = [b"".join(chunks) for chunks in self._chunks]
        if not text:
            return tuple(raw)
        # what subprocess.run(text=True) does: the locale's encoding, universal newlines
        return tuple(
            data.decode(_encoding(), errors="strict").replace("\r\n", "\n").replace("\r", "\n")
            for data in raw
        )


def _encoding() -> str:
    import locale

    return locale.getpreferredencoding(False)


# ---------------------------------------------------------------- the zygote process itself


def _preload_gpuprof() -> None:
    """gpuprof's modules but the integrations (those load inside training processes, with
    their frameworks)."""
    import importlib
    import pkgutil

    import gpuprof

    for info in pkgutil.walk_packages(gpuprof.__path__, "gpuprof."):
        if ".integrations" not in info.name and not info.name.endswith("__main__"):
            importlib.import_module(info.name)


def _serve(path: str) -> None:
    for name in PRELOAD:
        __import__(name)
    _preload_gpuprof()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    # a child's end wakes the loop below through this pipe
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    running: dict[int, socket.socket] = {}  # child pid → the connection waiting for its end
    while True:
        ready, _, _ = select.select([listener, sys.stdin, wake_r], [], [])
        if sys.stdin in ready:  # the test worker closed our stdin or died: stop
            return
        if wake_r in ready:
            os.read(wake_r, 512)
            _report_ended(running)
        if listener in ready:
            conn, _ = listener.accept()
            header, fds, _, _ = socket.recv_fds(conn, _LEN.size, 3)
            request = json.loads(_recv_exactly(conn, _LEN.unpack(header)[0]))
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for fd in (listener.fileno(), wake_r, wake_w, conn.fileno()):
                    os.close(fd)
                for other in running.values():
                    other.close()
                _become_gpuprof(request, fds)  # never returns
            for fd in fds:
                os.close(fd)
            conn.sendall(_LEN.pack(pid))
            running[pid] = conn
            _report_ended(running)  # one may have ended before it was registered


def _report_ended(running: dict[int, socket.socket]) -> None:
    while running:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = running.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(struct.pack("!i", os.waitstatus_to_exitcode(status)))
            conn.close()


def _become_gpuprof(request: dict, fds: list[int]) -> None:
    import runpy

    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdin.close()
        sys.stdout.close()
        sys.stderr.close()
        unbuffered = bool(request["env"].get("PYTHONUNBUFFERED"))  # as `python -u`
        sys.stdin = _text(0, "r")
        sys.stdout = _text(1, "w", unbuffered=unbuffered)
        sys.stderr = _text(2, "w", unbuffered=unbuffered, errors="backslashreplace")
        # the zygote's dispositions are the interpreter's own at start (SIGPIPE and SIGXFSZ
        # ignored, SIGINT raising KeyboardInterrupt) but for SIGCHLD, reset by our parent
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.path[0] = os.getcwd()  # `python -m` puts the working directory first
        sys.argv = ["-m", *request["argv"]]
        try:
            runpy.run_module("gpuprof", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as stop:
            code = _exit_code(stop.code)
        except KeyboardInterrupt:  # the interpreter would end by the signal itself
            sys.excepthook(*sys.exc_info())
            code = -int(signal.SIGINT)
        except BaseException:
            code = 1
            sys.excepthook(*sys.exc_info())
        threading._shutdown()  # the interpreter's own end: join non-daemon threads
        atexit._run_exitfuncs()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            if code < 0:
                signal.signal(-code, signal.SIG_DFL)
                os.kill(os.getpid(), -code)
            os._exit(code)


def _exit_code(value) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _text(fd: int, mode: str, unbuffered: bool = False, errors: str = "strict"):
    """A standard stream as the interpreter makes it at start on a pipe: stderr line-buffered,
    ``-u``/PYTHONUNBUFFERED writing through."""
    import io

    raw = io.FileIO(fd, mode, closefd=False)
    if "r" in mode:
        return io.TextIOWrapper(io.BufferedReader(raw))
    if unbuffered:
        return io.TextIOWrapper(raw, errors=errors, write_through=True)
    return io.TextIOWrapper(io.BufferedWriter(raw), errors=errors, line_buffering=fd == 2)


if __name__ == "__main__":
    _serve(sys.argv[1])
