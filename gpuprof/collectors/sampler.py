"""The watcher's sampling thread: NVML and host readings at fixed rates into the run file.

It runs in the watcher process, never in the training process, so it never holds the
training interpreter's GIL. GPU metrics are read every ``interval_s``; the host and the process
tree every ``host_interval_s`` (default 0.5 s: a process's CPU share is counted in 10 ms clock
ticks, so finer readings are mostly noise, and walking the tree costs as much as reading eight
GPUs); the processes on each GPU every ``process_interval_s``. Ticks are scheduled on absolute
times (no drift); a slow tick skips the ticks it overran rather than bunching them.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from gpuprof.nodes import now_ns

if TYPE_CHECKING:  # the store (pandas, pyarrow) is not needed to sample: a Ray node's
    # sampler hands its rows to a buffer and starts faster without it
    from gpuprof.store import BufferedWriter

PROCESS_INTERVAL_S = 1.0
"""How often the processes on each GPU are listed (heavier NVML calls than metrics)."""
HOST_INTERVAL_S = 0.5
"""Default host / process-tree sampling period, unless the GPU interval is longer."""


def default_host_interval(interval_s: float, host_interval_s: float | None = None) -> float:
    """The host sampling period: as given, else the longer of the GPU interval and 0.5 s."""
    return host_interval_s if host_interval_s is not None else max(interval_s, HOST_INTERVAL_S)


class Sampler:
    """Samples ``nvml`` (may be None) and ``host`` every ``interval_s`` seconds into ``writer``.

    ``cpu_s`` after `stop` is the thread CPU time the sampling cost, in seconds.
    """

    def __init__(
        self,
        writer: BufferedWriter,
        host: Any,
        nvml: Any | None,
        *,
        interval_s: float = 0.1,
        host_interval_s: float | None = None,
        process_interval_s: float = PROCESS_INTERVAL_S,
    ) -> None:
        self.writer = writer
        self.host = host
        self.nvml = nvml
        self.host_interval_s = default_host_interval(interval_s, host_interval_s)
        # with no GPUs to read there is nothing to wake up for between host readings
        self.interval_s = interval_s if nvml is not None else self.host_interval_s
        self.process_interval_s = process_interval_s
        self.ticks = 0
        self.cpu_s = 0.0
        self.errors: list[str] = []
        self._latest: tuple[int, list[Any], Any] | None = None
        self._latest_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuprof-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop after the current tick and take one last sample."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10.0)

    def latest(self) -> tuple[int, list[Any], Any] | None:
        """The newest readings, for live display: ``(t_ns, GPU samples, host sample)``.

        The GPU list is the last tick's `GpuSample` per GPU (empty without NVML); the host
        sample is the last `HostSample` (None before the first). None before the first tick.
        Safe to call from any thread; the caller must not modify what it gets.
        """
        with self._latest_lock:
            return self._latest

    def tick(self, t_ns: int, *, with_host: bool = True, with_processes: bool = False) -> None:
        """Take one sample at ``t_ns`` (ns since the epoch): the GPUs, and the host and the
        processes on each GPU when asked."""
        writer = self.writer
        gpu_samples: list[Any] = []
        host_sample = None
        if self.nvml is not None:
            gpu_samples, events = self.nvml.sample(t_ns)
            writer.add_records("gpu", gpu_samples)
            writer.add_records("events", events)
        if self.host is not None and with_host:
            host_sample, procs = self.host.sample(t_ns)
            writer.add_records("host", [host_sample])
            writer.add_records("procs", procs)
            take_threads = getattr(self.host, "take_threads", None)
            if take_threads is not None:
                writer.add_records("threads", take_threads())
            if with_processes and self.nvml is not None:
                pids = self.host.watched_pids()
                writer.add_records("gpu_procs", self.nvml.sample_processes(t_ns, pids))
        with self._latest_lock:
            previous_host = self._latest[2] if self._latest else None
            self._latest = (t_ns, list(gpu_samples), host_sample or previous_host)
        self.ticks += 1

    def _run(self) -> None:
        cpu0 = time.thread_time()
        start = time.monotonic()
        next_host = next_processes = start
        k = 0
        while True:
            now = time.monotonic()
            with_host = now >= next_host
            if with_host:
                next_host = now + self.host_interval_s - 0.5 * self.interval_s
            with_processes = with_host and now >= next_processes
            if with_processes:
                next_processes = now + self.process_interval_s - 0.5 * self.interval_s
            try:
                self.tick(now_ns(), with_host=with_host, with_processes=with_processes)
            except Exception as exc:  # a collector bug must not end the watch
                if len(self.errors) < 10:
                    self.errors.append(f"sampling failed: {exc!r}")
            if self._stop.is_set():
                break
            k = max(k + 1, int((time.monotonic() - start) / self.interval_s) + 1)
            delay = start + k * self.interval_s - time.monotonic()
            if self._stop.wait(max(0.0, delay)):
                # one last reading so the run ends with the state at exit
                try:
                    self.tick(now_ns())
                except Exception:
                    pass
                break
        self.cpu_s = time.thread_time() - cpu0
