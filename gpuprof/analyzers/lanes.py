"""A part of the diagnosis run in a forked child process while the parent runs another.

`diagnose` runs two groups of stall detectors that do not depend on each other
(`stalls.SIDE_BY_SIDE`) at once on two cores: the child inherits the analysis context as it
stands (samples aligned, GPU-time claimed) by ``fork``, runs its group, and sends back its
findings, notes and the figures it computed for the context (pickled through a pipe); the
parent runs the other group meanwhile, then takes them in the declared order, so the diagnosis
is the same, to the byte, as one process running every detector in turn.

Nothing is lost when the child fails (killed, out of memory, a result that does not pickle):
`Lane.result` says so and the parent runs the group itself. Only where ``fork`` exists (Linux,
macOS) and only when asked (``workers`` > 1): a process with threads of its own that may hold
locks (a watcher while it samples) must not fork, and calls `diagnose` with one worker.
"""

from __future__ import annotations

import gc
import os
import pickle
from collections.abc import Callable
from typing import Any

_FAILED = object()


class Lane:
    """A forked child computing one value; `result` waits for it."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid = pid
        self.fd = fd

    def result(self) -> Any:
        """The child's value, or `FAILED` when it did not send one (it died, or its value
        could not be pickled). Reaps the child either way."""
        try:
            with os.fdopen(self.fd, "rb") as pipe:
                data = pipe.read()
        except OSError:
            data = b""
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            status = -1
        gc.unfreeze()
        if status != 0 or not data:
            return _FAILED
        try:
            return pickle.loads(data)
        except Exception:
            return _FAILED


FAILED = _FAILED
"""What `Lane.result` gives when the child sent nothing usable."""


def start(compute: Callable[[], Any]) -> Lane | None:
    """``compute()`` in a forked child, its pickled value coming back through a pipe; None
    when this platform or this moment cannot fork (then the caller computes it itself)."""
    if not hasattr(os, "fork"):
        return None
    try:
        read_fd, write_fd = os.pipe()
    except OSError:
        return None
    # The objects that exist now are left out of the garbage collector's passes until the
    # child is done (`Lane.result`): a pass writes to every object it visits, and each page
    # written then has to be copied, in the child and in the parent.
    gc.freeze()
    try:
        pid = os.fork()
    except OSError:
        gc.unfreeze()
        os.close(read_fd)
        os.close(write_fd)
        return None
    if pid == 0:  # the child: compute, send, and leave without the parent's exit handlers
        code = 1
        try:
            gc.disable()  # a short life: what it leaves goes with the process
            os.close(read_fd)
            data = pickle.dumps(compute(), protocol=pickle.HIGHEST_PROTOCOL)
            with os.fdopen(write_fd, "wb") as pipe:
                pipe.write(data)
            code = 0
        except BaseException:  # whatever happens, the parent carries on (it sees code 1)
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    return Lane(pid, read_fd)
