"""Pass the watched command's output through, in a process that outlives the watcher.

Run as a script (``python -I tee.py IN OUT COPY [IN OUT COPY …]``, file descriptors), never
imported by the training process. For each stream it copies every byte read from IN to OUT
(the terminal or file the user gave the watcher) and, best effort, to COPY (a pipe to the
watcher, which stores the lines). It ignores terminal signals and runs in its own session, so
a Ctrl-C, SIGTERM or SIGKILL aimed at the watcher never closes the command's stdout or stderr:
the command keeps writing as if it had no watcher. It exits when every IN reaches end of file.

COPY is non-blocking: if the watcher stalls, chunks it cannot take are dropped (and counted)
rather than stalling the command; if the watcher is gone, copying stops.
"""

from __future__ import annotations

import errno
import os
import selectors
import signal
import sys


def _write_all(fd: int, data: bytes) -> bool:
    """Write everything to ``fd`` (blocking); False once it cannot take more."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except InterruptedError:
            continue
        except OSError:
            return False
    return True


def run(streams: list[tuple[int, int, int]]) -> int:
    """Copy until every input closes; returns how many chunks the watcher could not take."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    selector = selectors.DefaultSelector()
    state = {}
    for in_fd, out_fd, copy_fd in streams:
        os.set_blocking(copy_fd, False)
        selector.register(in_fd, selectors.EVENT_READ)
        state[in_fd] = [out_fd, copy_fd]
    dropped = 0
    while state:
        for key, _ in selector.select():
            in_fd = key.fd
            out_fd, copy_fd = state[in_fd]
            try:
                data = os.read(in_fd, 65536)
            except OSError:
                data = b""
            if not data:
                selector.unregister(in_fd)
                os.close(in_fd)
                if copy_fd >= 0:
                    os.close(copy_fd)
                del state[in_fd]
                continue
            if out_fd >= 0 and not _write_all(out_fd, data):
                state[in_fd][0] = -1  # the terminal went away: keep draining the command
            if copy_fd >= 0:
                try:
                    if os.write(copy_fd, data) < len(data):
                        dropped += 1  # a partial write: the stored copy loses the rest
                except BlockingIOError:
                    dropped += 1
                except OSError as exc:
                    if exc.errno in (errno.EPIPE, errno.EBADF):
                        os.close(copy_fd)
                        state[in_fd][1] = -1  # the watcher is gone
    return dropped


def main(argv: list[str]) -> int:
    fds = [int(a) for a in argv]
    if not fds or len(fds) % 3:
        print("usage: tee.py IN OUT COPY [IN OUT COPY ...]", file=sys.stderr)
        return 2
    run([tuple(fds[i : i + 3]) for i in range(0, len(fds), 3)])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
