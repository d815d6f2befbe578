"""Per-thread CPU of the watched processes: which threads are Python's, which spin.

A trainer process reads 100% of a core or more from threads that are not its Python code:
the CUDA driver's event handler, NCCL's proxy and watchdog threads, the autograd engine's
device threads, OpenMP workers spinning between parallel regions. Whether the Python side
is the bottleneck is a question about the **busiest Python thread**: the threads py-spy
sampled Python stacks in (`StackSample.tid`), or, without stacks, the process's main
thread (its id is the process id). Other busy threads are named by their ``comm`` when it
says what they are (`thread_kind`).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from gpuprof.analyzers.grouping import appearance_codes, first_rows, isin_rows
from gpuprof.analyzers.texts import as_texts
from gpuprof.model import Run

THREAD_KINDS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^cuda-EvtHandlr|^cuda\d|^cuda-"), "CUDA driver"),
    (re.compile(r"^NCCL|nccl", re.IGNORECASE), "NCCL"),
    (re.compile(r"^pt_autograd|^autograd"), "PyTorch autograd engine"),
    (re.compile(r"^pt_nccl|^pt_gloo|^gloo"), "PyTorch collectives"),
    (re.compile(r"^pt_"), "PyTorch"),
    (re.compile(r"^omp_|^openmp|^gomp|^OMP"), "OpenMP"),
    (re.compile(r"^ZMQbg"), "ZeroMQ I/O"),
    (re.compile(r"^tokio-runtime|^rayon"), "Rust thread pool (tokenizers…)"),
    (re.compile(r"^grpc|^ray_|^client\.poll|^signal_handler"), "Ray / gRPC"),
)
"""``comm`` patterns of threads that are not the user's Python code, and what they are."""


def thread_kind(name: str) -> str | None:
    """What a thread is, from its ``comm``; None when the name does not say."""
    for pattern, kind in THREAD_KINDS:
        if pattern.search(name or ""):
            return kind
    return None


def python_tids(run: Run) -> dict[tuple[str, int], set[int]]:
    """Per (host, pid), the OS ids of its Python threads: those py-spy sampled stacks in,
    and the main thread (id = pid) always."""
    out: dict[tuple[str, int], set[int]] = {}
    samples = run.stack_samples
    if samples is not None and len(samples):
        tid = pd.to_numeric(samples["tid"], errors="coerce")
        ok = tid.notna().to_numpy()
        host = as_texts(samples["host"])[ok]
        pid = samples["pid"].to_numpy()[ok].astype(np.int64)
        tid = tid.to_numpy()[ok].astype(np.int64)
        # each (host, pid, tid) once, in order of first appearance (``drop_duplicates``)
        first = first_rows(appearance_codes([host, pid, tid], missing_is_value=True))
        for h, p, t in zip(host[first], pid[first].tolist(), tid[first].tolist()):
            out.setdefault((h, int(p)), set()).add(int(t))
    threads = run.threads
    if threads is not None and len(threads):
        host, pid = threads["host"].to_numpy(object), threads["pid"].to_numpy()
        first = first_rows(appearance_codes([host, pid], missing_is_value=True))
        for h, p in zip(host[first], pid[first].tolist()):
            out.setdefault((str(h), int(p)), set()).add(int(p))
    return out


def thread_table(run: Run) -> pd.DataFrame | None:
    """The run's thread readings with ``python`` (a Python thread of its process) and
    ``kind`` (`thread_kind`) per row; None when there are none."""
    threads = run.threads
    if threads is None or threads.empty:
        return None
    py = python_tids(run)
    host = as_texts(threads["host"])
    pid = threads["pid"].to_numpy().astype(np.int64)
    tid = threads["tid"].to_numpy().astype(np.int64)
    known = [(h, p, t) for (h, p), ts in py.items() for t in ts]
    is_py = isin_rows(
        [host, pid, tid],
        [np.array([k[0] for k in known], dtype=object),
         np.array([k[1] for k in known], dtype=np.int64),
         np.array([k[2] for k in known], dtype=np.int64)],
    )  # fmt: skip
    names = as_texts(threads["name"])
    kinds = {n: thread_kind(n) for n in pd.unique(names)}
    return pd.DataFrame({
        "host": host, "pid": pid, "tid": tid, "t_ns": threads["t_ns"].to_numpy(np.int64),
        "name": names,
        "cpu": pd.to_numeric(threads["cpu_pct"], errors="coerce").to_numpy(np.float64),
        "python": is_py, "kind": [kinds[n] for n in names],
    })  # fmt: skip
