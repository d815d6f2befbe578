"""``gpuprof watch --metrics-port PORT``: a Prometheus ``/metrics`` endpoint while the command runs.

The exporter serves what the live view shows (`gpuprof.reports.live`), for dashboards and
alerts: the sampler's newest GPU and host readings, and what the hooks have recorded in the run
file (the last phase each rank finished, steps, idle GPU-time by phase). It listens only when
asked, on 127.0.0.1 unless another address is given, with ``prometheus_client``'s own server
over a private `CollectorRegistry` (nothing of the process's default registry is exposed).

It never touches the hardware: the watcher's GPU figures come from ``Sampler.latest()`` (read
at each scrape and four times a second in the exporter's own thread, never in the sampler's),
spans and steps from the run files this machine writes, read incrementally at most once a
second in that same thread (`gpuprof.run_tail`): the watcher's file and the node's
other files (Ray workers started by a raylet that predates the watch write their own), and on
a Ray cluster the files the driver records for every other node, whose GPU and host samples,
spans and steps are served under that node's name, each node with its own idle accounting
(its rows are on its own clock; phase end times are moved onto the watcher's by the offset the
driver measured). A node the driver records as lost, or whose file gives no samples for
`NODE_STALE_S`, leaves the GPU and host gauges. Under a torchrun/Slurm launch the run
directory is shared by the nodes' watchers and each serves its own node. Nothing it does can
raise into the watcher: a failure becomes one of at most `MAX_ERRORS` notices.

Metrics (all prefixed ``gpuprof_``; labels ``node`` everywhere, ``gpu`` and ``uuid`` per GPU,
``rank`` and ``pid`` per process; units in names, base units, ratios 0–1). Every per-GPU series
also carries the labels other exporters name the same GPU by, so that a join needs no
``label_replace`` (docs/DASHBOARDS.md): dcgm-exporter's ``UUID`` (NVML's UUID, as ``uuid``) and
``Hostname`` (the node's name, as ``node``; dcgm-exporter's ``gpu`` is the NVML index, as
gpuprof's), and Ray's ``ip`` and ``GpuIndex`` (the index again). ``ip`` is the address Ray's
node table gives a node the Ray driver records, and for the watcher's own node
``GPUPROF_NODE_IP`` or else the machine's primary address, found as Ray finds a node's
(`gpuprof.nodes.node_ip`). The host series carry ``Hostname`` and ``ip`` too. These labels
are constant per GPU and node: they add no series.

- ``gpu_info{model_name, modelName}`` (1 per GPU: its model name, under gpuprof's and
  dcgm-exporter's label names);
- per GPU: ``gpu_utilization_ratio`` (NVML ``utilization.gpu``: a kernel was running, not how
  busy the SMs were), ``gpu_memory_utilization_ratio``, ``gpu_sm_active_ratio``,
  ``gpu_sm_occupancy_ratio``, ``gpu_tensor_active_ratio``, ``gpu_dram_active_ratio`` (GPM,
  Hopper and newer), ``gpu_memory_used_bytes``, ``gpu_memory_total_bytes``,
  ``gpu_power_watts``, ``gpu_pcie_rx_bytes_per_second``, ``gpu_pcie_tx_bytes_per_second``,
  ``gpu_nvlink_rx_bytes_per_second``, ``gpu_nvlink_tx_bytes_per_second``,
  ``gpu_sm_clock_hertz``, ``gpu_temperature_celsius``. A metric the GPU does not report has no
  sample (never 0); a family no GPU reports is left out;
- host: ``host_cpu_utilization_ratio``, ``host_memory_used_bytes``, ``host_memory_total_bytes``;
- per process that recorded spans or steps: ``rank_phase_info{phase}`` (1 for the phase it
  finished last: hooks record a span when it ends, so this trails the phase it is in by up to
  that phase's length), ``rank_phase_end_timestamp_seconds``, ``steps_total`` and
  ``step_duration_seconds`` (mean over its last 20 steps);
- ``idle_gpu_seconds{phase}``: GPU-seconds with utilization below the idle threshold, charged
  to the innermost span covering each reading, ``(none)`` while no span covers it. A running
  estimate and a gauge, not a counter: time moves from ``(none)`` to a phase when the span that
  covered it ends; ``sampled_gpu_seconds_total`` is the GPU-time read so far;
- ``top_finding_idle_gpu_seconds{kind,phase}`` and ``top_finding_share_ratio{kind,phase}``,
  per node: the "top finding so far", derived cheaply from the idle GPU-time by phase (the
  live view's "most idle" line), not from the full analyzer: the phase in which the most
  GPU-time has gone idle, once it reaches `Thresholds.min_share` of the GPU-time read, with
  the stall kind the analyzer charges idle time in that phase to (``reshard_idle``,
  ``reward_bound``, ``dataloader_starvation``, ``periodic_stall``, ``generation_tail``) or
  ``phase_idle`` for a phase no detector claims by name. ``gpuprof analyze`` gives the
  diagnosis after the run.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import start_http_server
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from gpuprof.analyzers.spans import NO_PHASE
from gpuprof.nodes import node_ip as primary_ip
from gpuprof.reports.live import LiveState, Readings
from gpuprof.reports.live_run import (  # noqa: F401  (READINGS_POLL_S, stall_kind: this API)
    MAX_ERRORS,
    READINGS_POLL_S,
    STALL_KIND_OF_PHASE,
    LiveRun,
    RunFollower,
    stall_kind,
)

DEFAULT_ADDRESS = "127.0.0.1"
"""Where the endpoint listens unless ``--metrics-address`` says otherwise."""
HOLD_S = 5.0
"""A GPU value is served up to this long after it was read: without NVML's PCIe byte counters,
PCIe throughput is read for one GPU per tick, so each GPU's last value stands in between."""

PREFIX = "gpuprof_"
GPU_LABELS = ("node", "gpu", "uuid", "UUID", "Hostname", "ip", "GpuIndex")
"""The labels of every per-GPU series: gpuprof's own (``node``, ``gpu``, ``uuid``), the same
values under dcgm-exporter's names (``UUID``, ``Hostname``; its ``gpu`` is the index too) and
under Ray's (``ip``, ``GpuIndex``), so that joins need no ``label_replace``."""
HOST_LABELS = ("node", "Hostname", "ip")
"""The labels of the host series (``ip`` joins Ray's node metrics)."""

_GPU_GAUGES: tuple[tuple[str, str, float, str, str], ...] = (
    ("gpu_utilization_ratio", "util_gpu_pct", 100.0, "ratio",
     "Share of the last sample period in which a kernel ran on the GPU (NVML utilization.gpu); "
     "a one-thread kernel reads 1: see gpuprof_gpu_sm_active_ratio for SM activity."),
    ("gpu_memory_utilization_ratio", "util_mem_pct", 100.0, "ratio",
     "Share of the last sample period in which device memory was read or written "
     "(NVML utilization.memory)."),
    ("gpu_sm_active_ratio", "sm_active_pct", 100.0, "ratio",
     "SM activity: share of time an SM had a warp resident, averaged over SMs (GPM)."),
    ("gpu_sm_occupancy_ratio", "sm_occupancy_pct", 100.0, "ratio",
     "Resident warps over the SMs' maximum, averaged over time (GPM)."),
    ("gpu_tensor_active_ratio", "tensor_active_pct", 100.0, "ratio",
     "Share of time the tensor cores were active (GPM)."),
    ("gpu_dram_active_ratio", "dram_active_pct", 100.0, "ratio",
     "Share of time device memory was transferring data (GPM)."),
    ("gpu_memory_used_bytes", "mem_used_bytes", 1.0, "bytes", "Device memory in use."),
    ("gpu_memory_total_bytes", "mem_total_bytes", 1.0, "bytes", "Device memory in total."),
    ("gpu_power_watts", "power_w", 1.0, "watts", "Power draw."),
    ("gpu_pcie_rx_bytes_per_second", "pcie_rx_bytes_s", 1.0, "bytes_per_second",
     "PCIe bytes received by the GPU per second over the last sample period."),
    ("gpu_pcie_tx_bytes_per_second", "pcie_tx_bytes_s", 1.0, "bytes_per_second",
     "PCIe bytes sent by the GPU per second over the last sample period."),
    ("gpu_nvlink_rx_bytes_per_second", "nvlink_rx_bytes_s", 1.0, "bytes_per_second",
     "NVLink bytes received per second over the last sample period, all links."),
    ("gpu_nvlink_tx_bytes_per_second", "nvlink_tx_bytes_s", 1.0, "bytes_per_second",
     "NVLink bytes sent per second over the last sample period, all links."),
    ("gpu_sm_clock_hertz", "sm_clock_mhz", 1e6, "hertz", "SM clock."),
    ("gpu_temperature_celsius", "temp_c", 1.0, "celsius", "GPU temperature."),
)  # fmt: skip
"""``(name, GpuSample attribute, factor to base units, unit, help)`` of each per-GPU gauge; a
ratio's factor divides (percent → 0–1, exactly: 70 % is 0.7, not 0.7000000000000001)."""

GPU_ATTRS = tuple(spec[1] for spec in _GPU_GAUGES)

_HOST_GAUGES: tuple[tuple[str, str, float, str, str], ...] = (
    ("cpu_pct", "host_cpu_utilization_ratio", 100.0, "ratio",
     "Host CPU busy share over all cores."),
    ("mem_used_bytes", "host_memory_used_bytes", 1.0, "bytes", "Host memory in use."),
    ("mem_total_bytes", "host_memory_total_bytes", 1.0, "bytes", "Host memory in total."),
)  # fmt: skip
"""``(HostSample attribute, name, factor to base units, unit, help)`` of each host gauge."""
NODE_STALE_S = 15.0
"""Another node's readings are served while its file gave samples this recently (a Ray
driver pulls every 1–5 s); a node that stops reporting, or that the driver records as lost,
drops out of the GPU and host gauges."""


def _base(value: float, factor: float, unit: str) -> float:
    return value / factor if unit == "ratio" else value * factor


class GpuprofCollector(LiveRun, Collector):
    """Turns the `LiveRun` (`LiveState` s and the held GPU and host readings) into metric
    families at each scrape.

    ``state`` and ``node`` are the watcher's node, ``node_ip`` its IP address (`node_ip`
    labels): ``readings`` is called at every scrape for its freshest GPU values
    (``Sampler.latest``); ``gpus`` is the run's GPU inventory (``RunMeta.gpus``: host, index,
    uuid, name). The cluster's other nodes, whose rows a Ray driver records on this machine,
    come through `take_rows`, each with a state of its own, and their addresses through
    `set_others`. Thread-safe: the exporter's thread and the HTTP server's threads share
    ``lock``.
    """

    gpu_attrs = GPU_ATTRS
    host_attrs = tuple(spec[0] for spec in _HOST_GAUGES)

    def __init__(
        self,
        state: LiveState,
        node: str,
        *,
        readings: Callable[[], Readings | None] | None = None,
        gpus: Sequence[dict[str, Any]] = (),
        lock: threading.Lock | None = None,
        node_ip: str = "",
    ) -> None:
        super().__init__(state, node, readings=readings, gpus=gpus, lock=lock)
        self.node_ip = node_ip

    def set_node_ip(self, address: str) -> None:
        """The watcher's node's IP address, once found (`gpuprof.nodes.node_ip`)."""
        with self.lock:
            self.node_ip = address

    def _ip(self, node: str) -> str:
        return self.node_ip if node == self.node else self._ips.get(node, "")

    def _gpu_labels(self, key: tuple[str, int], uuid: str) -> list[str]:
        """The values of `GPU_LABELS` for a GPU."""
        node, index = key[0], str(key[1])
        return [node, index, uuid, uuid, node, self._ip(node), index]

    def _serving(self, node: str) -> bool:
        """Whether a node's readings are served: the watcher's always; another node's while
        its file keeps giving samples and the driver has not recorded it lost."""
        if node == self.node:
            return True
        arrived = self._arrived.get(node)
        fresh = arrived is not None and time.monotonic() - arrived <= NODE_STALE_S
        return fresh and node not in self._lost

    # ----- output (the HTTP server's threads)
    def collect(self) -> Iterator[Metric]:
        if self.readings is not None:
            try:
                self.take(self.readings())
            except Exception as exc:
                self.error(f"metrics endpoint: reading the sampler failed: {exc!r}")
        families: list[Metric] = []
        with self.lock:
            for part in (
                self._gpu_families,
                self._host_families,
                self._rank_families,
                self._idle_families,
            ):
                try:
                    families.extend(part())
                except Exception as exc:  # one part failing leaves the others served
                    self.error(f"metrics endpoint: {part.__name__.strip('_')} failed: {exc!r}")
        yield from families

    def _gpu_families(self) -> list[Metric]:
        labels = list(GPU_LABELS)
        info = InfoMetricFamily(PREFIX + "gpu", "The GPUs of the node, one per GPU.", labels=labels)
        listed = set()
        for g in sorted(self.gpus, key=lambda g: (self.order(str(g.get("host") or self.node)),
                                                  int(g.get("index", 0)))):  # fmt: skip
            key = (str(g.get("host") or self.node), int(g.get("index", 0)))
            listed.add(key)
            uuid = g.get("uuid") or self._uuid.get(key, "")
            model = str(g.get("name") or "")
            info.add_metric(self._gpu_labels(key, str(uuid)),
                            {"model_name": model, "modelName": model})  # fmt: skip
        for key in sorted(self._held.keys() - listed, key=self.gpu_order):
            info.add_metric(self._gpu_labels(key, self._uuid.get(key, "")),
                            {"model_name": "", "modelName": ""})  # fmt: skip
        out: list[Metric] = [info] if info.samples else []
        # each node's values against its own newest reading: nodes' clocks differ
        newest: dict[str, int] = {}
        for (host, _), held in self._held.items():
            newest[host] = max([newest.get(host, 0), *(t for t, _ in held.values())])
        served = sorted((k for k in self._held if self._serving(k[0])), key=self.gpu_order)
        for name, attr, factor, unit, doc in _GPU_GAUGES:
            family = GaugeMetricFamily(PREFIX + name, doc, labels=labels, unit=unit)
            for key in served:
                t_ns, value = self._held[key].get(attr, (0, 0.0))
                if t_ns and t_ns >= newest[key[0]] - int(HOLD_S * 1e9):
                    family.add_metric(
                        self._gpu_labels(key, self._uuid.get(key, "")), _base(value, factor, unit)
                    )
            if family.samples:
                out.append(family)
        return out

    def _host_families(self) -> list[Metric]:
        served = [n for n in sorted(self._host, key=self.order) if self._serving(n)]
        out: list[Metric] = []
        for attr, name, factor, unit, doc in _HOST_GAUGES:
            family = GaugeMetricFamily(PREFIX + name, doc, labels=list(HOST_LABELS), unit=unit)
            for node in served:
                value = self._host[node][1].get(attr)
                if value is not None:
                    family.add_metric([node, node, self._ip(node)], _base(value, factor, unit))
            if family.samples:
                out.append(family)
        return out

    def _rank_families(self) -> list[Metric]:
        labels = ["node", "rank", "pid"]
        phase = InfoMetricFamily(
            PREFIX + "rank_phase",
            "The phase each process finished last (spans are recorded when they end, so this "
            "trails the phase it is in).",
            labels=labels,
        )
        ended = GaugeMetricFamily(
            PREFIX + "rank_phase_end_timestamp_seconds",
            "When the phase in gpuprof_rank_phase_info ended (Unix time, on the watcher's clock).",
            labels=labels,
            unit="seconds",
        )
        steps = CounterMetricFamily(
            PREFIX + "steps",
            "Training steps each process has marked (gpuprof.step).",
            labels=labels,
        )
        step_s = GaugeMetricFamily(
            PREFIX + "step_duration_seconds",
            "Mean seconds per step over the process's last 20 steps.",
            labels=labels,
            unit="seconds",
        )
        for node, state in self.states():
            offset_ns = self._offsets.get(node, 0)
            ranks = sorted(state.ranks.values(), key=lambda r: (r.rank is None, r.rank or 0, r.pid))
            for r in ranks:
                values = [node, "" if r.rank is None else str(r.rank), str(r.pid)]
                if r.end_ns:
                    phase.add_metric(values, {"phase": r.phase})
                    ended.add_metric(values, (r.end_ns + offset_ns) / 1e9)
                if r.step_count:
                    steps.add_metric(values, float(r.step_count))
                seconds = state.step_time_s(r)
                if seconds is not None:
                    step_s.add_metric(values, seconds)
        return [f for f in (phase, ended, steps, step_s) if f.samples]

    def _idle_families(self) -> list[Metric]:
        sampled = CounterMetricFamily(
            PREFIX + "sampled_gpu_seconds",
            "GPU-seconds covered by utilization readings so far (the denominator of idle shares).",
            labels=["node"],
            unit="seconds",
        )
        idle = GaugeMetricFamily(
            PREFIX + "idle_gpu_seconds",
            "Idle GPU-seconds so far by the innermost phase covering them ((none): no span yet); "
            "a running estimate: time moves from (none) to a phase when its span ends.",
            labels=["node", "phase"],
            unit="seconds",
        )
        labels = ["node", "kind", "phase"]
        lost_family = GaugeMetricFamily(
            PREFIX + "top_finding_idle_gpu_seconds",
            "Idle GPU-seconds of the phase that has lost the most so far on the node (a running "
            "estimate from idle time by phase, not the full diagnosis).",
            labels=labels,
            unit="seconds",
        )
        share_family = GaugeMetricFamily(
            PREFIX + "top_finding_share_ratio",
            "That idle time as a share of the node's GPU-time read so far.",
            labels=labels,
            unit="ratio",
        )
        for node, state in self.states():
            if state.gpu_s <= 0:
                continue
            sampled.add_metric([node], state.gpu_s)
            by_phase = sorted(state.idle_by_phase().items(), key=lambda kv: str(kv[0]))
            for name, seconds in by_phase:
                idle.add_metric([node, NO_PHASE if name is None else name], seconds)
            top = state.top_idle_phase()
            if top is not None:
                name, lost, share = top
                values = [node, stall_kind(name), name]
                lost_family.add_metric(values, lost)
                share_family.add_metric(values, share)
        return [f for f in (sampled, idle, lost_family, share_family) if f.samples]


class MetricsExporter:
    """Serves ``/metrics`` on ``address`` (host, port) until `stop`.

    ``readings`` is ``Sampler.latest``; ``db_path`` the run file the hooks write spans and steps
    to; ``node`` the node's name; ``gpus`` the run's GPU inventory; ``node_ip`` the node's IP
    address for the ``ip`` label (None: found by `gpuprof.nodes.node_ip` in the exporter's
    thread). With ``run_dir`` it also
    follows the node's other files there and, with ``run_id`` and ``other_nodes``, the files a
    Ray driver records for the cluster's other nodes (`gpuprof.run_tail`). `start`
    raises `OSError` when the address cannot be bound (`bind_failure` words it); nothing else
    raises.
    """

    def __init__(
        self,
        readings: Callable[[], Readings | None],
        db_path: Path | str,
        *,
        node: str,
        address: tuple[str, int],
        gpus: Sequence[dict[str, Any]] = (),
        run_dir: Path | None = None,
        run_id: str | None = None,
        other_nodes: bool = True,
        node_ip: str | None = None,
    ) -> None:
        self.readings = readings
        self.address = (address[0] or DEFAULT_ADDRESS, int(address[1]))
        self.state = LiveState()
        self.collector = GpuprofCollector(self.state, node, readings=readings, gpus=gpus,
                                          node_ip=node_ip or "")  # fmt: skip
        self._find_ip = node_ip is None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self.follower = RunFollower(self.collector, db_path, run_dir=run_dir, run_id=run_id,
                                    other_nodes=other_nodes, what="metrics endpoint",
                                    name="gpuprof-metrics",
                                    on_start=self._find_node_ip)  # fmt: skip
        self.tail = self.follower.tail
        self.bound: tuple[str, int] | None = None
        """The address actually listened on (the port chosen by the system for port 0)."""
        self._server: Any = None
        self._server_thread: threading.Thread | None = None
        self._thread = self.follower.thread

    @property
    def errors(self) -> list[str]:
        """Notices about failures while serving (at most `MAX_ERRORS`)."""
        return self.collector.errors

    @property
    def url(self) -> str:
        host, port = self.bound or self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"

    def start(self) -> None:
        """Listen and start the polling thread; `OSError` when the address cannot be bound."""
        host, port = self.address
        self._server, self._server_thread = start_http_server(port, host, registry=self.registry)
        self.bound = tuple(self._server.server_address[:2])
        self.follower.start()

    def bind_failure(self, exc: OSError, option: str = "--metrics-port") -> str:
        """One line for a failed `start`: what was asked, why it failed, and that the watch
        goes on."""
        host, port = self.address
        if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
            where = f"{option} {port} on {host}"
        else:
            where = f"{option} {port}" + ("" if host == DEFAULT_ADDRESS else f" on {host}")
        reason = exc.strerror or str(exc) or type(exc).__name__
        reason = reason[:1].lower() + reason[1:]
        return f"{where}: {reason}; going on without the metrics endpoint"

    def stop(self) -> None:
        """Stop polling, close the listening socket and wait for the server's thread."""
        self.follower.stop()
        if self._server is not None:
            with contextlib.suppress(Exception):
                self._server.shutdown()
            with contextlib.suppress(Exception):
                self._server.server_close()
            if self._server_thread is not None:
                self._server_thread.join(timeout=5.0)
            self._server = None

    def _find_node_ip(self) -> None:
        """The node's IP address for the ``ip`` label, in the follower's thread, not the
        watcher's: it may wait on name resolution."""
        if self._find_ip:
            try:
                self.collector.set_node_ip(primary_ip())
            except Exception as exc:
                self.collector.error(f"metrics endpoint: finding the node's IP failed: {exc!r}")
