"""What a node is called in a run, and which machine a process is on.

A node's name is its host name unless ``GPUPROF_HOST`` says otherwise: several simulated nodes
on one machine (tests, benchmarks) or hosts whose names collide (containers) stay apart. The
machine, by contrast, is always the real host name: it decides whether a process can share the
watcher's SQLite file (WAL needs every writer of a file on one machine).
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

ENV_NODE = "GPUPROF_HOST"
"""The node's name in the run (default: the host name)."""
ENV_WATCHER_MACHINE = "GPUPROF_WATCHER_MACHINE"
"""Set by the watcher for its command: the real host name of the watcher's machine."""
ENV_NODE_IP = "GPUPROF_NODE_IP"
"""The node's IP address as Ray names it (``ray start --node-ip-address``), when this machine
has several and the one found by `node_ip` is not it."""


def node_name() -> str:
    """This process's node name: ``GPUPROF_HOST`` when set, else the host name."""
    return os.environ.get(ENV_NODE) or machine()


def node_ip() -> str:
    """This machine's primary IP address, the one Ray labels its node metrics with (``ip``):
    ``GPUPROF_NODE_IP`` when set, else the source address of the route to a public address
    (found by connecting a UDP socket, which sends nothing), else the address the host name
    resolves to when there is no such route (an isolated cluster), as Ray picks a node's IP;
    ``""`` when none is found. The last step may wait on name resolution: call it off the
    watcher's main thread."""
    given = os.environ.get(ENV_NODE_IP)
    if given:
        return given
    import socket  # here, not at the top: the hooks import this module in every process

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(("8.8.8.8", 53))
            return str(sock.getsockname()[0])
    except OSError:
        pass
    try:
        return socket.gethostbyname(socket.getfqdn(socket.gethostname()))
    except OSError:
        return ""


def machine() -> str:
    """The real host name of this machine (never overridden).

    ``uname``'s node name, which is what ``socket.gethostname()`` returns on Linux and macOS,
    without importing `socket` into every process that imports the hooks."""
    return os.uname().nodename


def on_watcher_machine() -> bool:
    """True in a process started (directly or not) by a watcher on this same machine."""
    return os.environ.get(ENV_WATCHER_MACHINE) == machine()


ENV_SIM_SKEW = "GPUPROF_SIM_CLOCK_SKEW_NS"
"""Simulation only: shift this process's wall clock by this many ns, so that several simulated
nodes on one machine disagree about the time as real nodes do (tests of clock alignment)."""


def _skew_ns() -> int:
    try:
        return int(os.environ.get(ENV_SIM_SKEW) or 0)
    except ValueError:
        return 0


_SKEW_NS = _skew_ns()


def now_ns() -> int:
    """Wall-clock time in ns since the epoch, as this node's clock reads it."""
    return time.time_ns() + _SKEW_NS


def natural_key(name: str) -> tuple[list[Any], str]:
    """Sort key that puts ``node2`` before ``node10`` (hostnames number their nodes)."""
    parts = re.split(r"(\d+)", name)
    # split() alternates text and digits, so equal positions always compare like with like
    return [int(p) if i % 2 else p.lower() for i, p in enumerate(parts)], name
