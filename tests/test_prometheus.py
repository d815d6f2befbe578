"""`gpuprof watch --metrics-port`: the Prometheus endpoint's metrics for known readings, served
while a command runs on simulated GPUs, scraped by a real Prometheus server, and a port that is
already taken."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import clean_env, gpuprof_cmd, run_gpuprof
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry
from simnvml import simnvml_env, write_scenario

from gpuprof import store
from gpuprof.model import GpuSample, HostSample
from gpuprof.reports.live import LiveState
from gpuprof.reports.prometheus import GpuprofCollector, MetricsExporter

pytest_plugins = ["simnvml.fixtures"]

S = 1_000_000_000
GIB = 2**30
NODE = "promtest-node"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scrape(url: str, timeout: float = 2.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def samples(text: str) -> dict[str, list[tuple[dict, float]]]:
    """Sample name → [(labels, value)] of an exposition, parsed by prometheus_client."""
    out: dict[str, list[tuple[dict, float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def by(series: list[tuple[dict, float]], label: str) -> dict[str, float]:
    return {labels[label]: value for labels, value in series}


# ----- the collector, for known readings


def _gpu(gpu: int, t_ns: int, util: float, **extra) -> GpuSample:
    memory = {"mem_used_bytes": (gpu + 1) * GIB, "mem_total_bytes": 80 * GIB}
    return GpuSample("n1", gpu, f"GPU-{gpu}", t_ns, util_gpu_pct=util, power_w=300.0 + gpu,
                     **memory, **extra)  # fmt: skip


def _exposition(collector: GpuprofCollector) -> str:
    from prometheus_client import generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry).decode()


def test_collector_serves_known_readings_phases_steps_and_idle_time():
    state = LiveState(idle_util_pct=10)
    inventory = [{"host": "n1", "index": i, "uuid": f"GPU-{i}", "name": "NVIDIA H100 80GB HBM3"}
                 for i in range(2)]  # fmt: skip
    collector = GpuprofCollector(state, "n1", gpus=inventory, node_ip="10.0.0.1")
    for k in range(41):  # 10 s at 4 Hz; GPU 0 idle from 2 s to 6 s
        t = k * S // 4
        gpus = [_gpu(0, t, 0 if 2 * S <= t < 6 * S else 90, sm_active_pct=55.0),
                _gpu(1, t, 90, pcie_rx_bytes_s=1.5e9, nvlink_tx_bytes_s=2e9)]  # fmt: skip
        collector.take((t, gpus, HostSample("n1", t, cpu_pct=25.0, mem_used_bytes=8 * GIB)))
    state.add_spans([(7, 0, "update_actor", 0, 10 * S), (7, 0, "reward", 2 * S, 6 * S),
                     (8, 1, "rollout", 0, 9 * S)])  # fmt: skip
    state.add_steps([(7, 0, 3 * S), (7, 0, 5 * S), (7, 0, 7 * S), (8, 1, 7 * S)])

    got = samples(_exposition(collector))
    assert all(name.startswith("gpuprof_") for name in got)
    # gpuprof's labels, and the same GPU under dcgm-exporter's and Ray's label names
    gpu_labels = {"node": "n1", "gpu": "0", "uuid": "GPU-0", "UUID": "GPU-0", "Hostname": "n1",
                  "ip": "10.0.0.1", "GpuIndex": "0"}  # fmt: skip
    assert (gpu_labels, 0.9) in got["gpuprof_gpu_utilization_ratio"]
    assert by(got["gpuprof_gpu_utilization_ratio"], "gpu") == {"0": 0.9, "1": 0.9}
    assert by(got["gpuprof_gpu_memory_used_bytes"], "gpu") == {"0": GIB, "1": 2 * GIB}
    assert by(got["gpuprof_gpu_memory_total_bytes"], "gpu") == {"0": 80 * GIB, "1": 80 * GIB}
    assert by(got["gpuprof_gpu_power_watts"], "gpu") == {"0": 300.0, "1": 301.0}
    # a metric only some GPUs report has samples for those alone; none reported: no family
    assert by(got["gpuprof_gpu_sm_active_ratio"], "gpu") == {"0": 0.55}
    assert by(got["gpuprof_gpu_pcie_rx_bytes_per_second"], "gpu") == {"1": 1.5e9}
    assert by(got["gpuprof_gpu_nvlink_tx_bytes_per_second"], "gpu") == {"1": 2e9}
    assert "gpuprof_gpu_temperature_celsius" not in got
    assert "gpuprof_gpu_pcie_tx_bytes_per_second" not in got
    model = "NVIDIA H100 80GB HBM3"
    assert got["gpuprof_gpu_info"] == [
        ({**gpu_labels, "gpu": str(i), "GpuIndex": str(i), "uuid": f"GPU-{i}", "UUID": f"GPU-{i}",
          "model_name": model, "modelName": model}, 1.0) for i in range(2)
    ]  # fmt: skip
    host = {"node": "n1", "Hostname": "n1", "ip": "10.0.0.1"}
    assert got["gpuprof_host_cpu_utilization_ratio"] == [(host, 0.25)]
    assert got["gpuprof_host_memory_used_bytes"] == [(host, 8 * GIB)]
    # per process: the last phase it finished, when, its steps and step time
    assert sorted(got["gpuprof_rank_phase_info"], key=lambda s: s[0]["pid"]) == [
        ({"node": "n1", "rank": "0", "pid": "7", "phase": "update_actor"}, 1.0),
        ({"node": "n1", "rank": "1", "pid": "8", "phase": "rollout"}, 1.0),
    ]
    assert by(got["gpuprof_rank_phase_end_timestamp_seconds"], "rank") == {"0": 10.0, "1": 9.0}
    assert by(got["gpuprof_steps_total"], "rank") == {"0": 3.0, "1": 1.0}
    assert got["gpuprof_step_duration_seconds"] == [
        ({"node": "n1", "rank": "0", "pid": "7"}, pytest.approx(2.0))
    ]
    # idle GPU-time by phase: GPU 0's 4 idle seconds inside the reward span
    idle = by(got["gpuprof_idle_gpu_seconds"], "phase")
    assert idle["reward"] == pytest.approx(4.0, abs=0.3)
    assert sum(idle.values()) == pytest.approx(4.0, abs=0.3)
    assert got["gpuprof_sampled_gpu_seconds_total"] == [({"node": "n1"}, pytest.approx(20.0))]
    top = {"node": "n1", "kind": "reward_bound", "phase": "reward"}
    assert got["gpuprof_top_finding_idle_gpu_seconds"] == [(top, pytest.approx(4.0, abs=0.3))]
    assert got["gpuprof_top_finding_share_ratio"] == [(top, pytest.approx(0.2, abs=0.02))]
    assert collector.errors == []


def test_stale_values_go_and_nothing_stands_out_before_a_phase_does():
    state = LiveState()
    collector = GpuprofCollector(state, "n1")
    # without PCIe counters NVML's window is read for one GPU per tick: each keeps its value
    collector.take((1 * S, [_gpu(0, 1 * S, 80, pcie_tx_bytes_s=5e6), _gpu(1, 1 * S, 80)], None))
    collector.take((2 * S, [_gpu(0, 2 * S, 80), _gpu(1, 2 * S, 80, pcie_tx_bytes_s=7e6)], None))
    got = samples(_exposition(collector))
    assert by(got["gpuprof_gpu_pcie_tx_bytes_per_second"], "gpu") == {"0": 5e6, "1": 7e6}
    # a GPU that stops reporting (lost) loses its values once they are older than HOLD_S
    collector.take((9 * S, [_gpu(0, 9 * S, 40)], None))
    got = samples(_exposition(collector))
    assert by(got["gpuprof_gpu_utilization_ratio"], "gpu") == {"0": 0.4}
    assert "gpuprof_gpu_pcie_tx_bytes_per_second" not in got
    assert "gpuprof_top_finding_idle_gpu_seconds" not in got  # no span, no finding
    assert "gpuprof_steps_total" not in got and "gpuprof_host_cpu_utilization_ratio" not in got


def test_a_failing_source_is_a_notice_and_the_rest_is_served():
    calls = []

    def broken():
        calls.append(1)
        raise RuntimeError("sampler gone")

    state = LiveState()
    collector = GpuprofCollector(state, "n1", readings=broken)
    collector.take((S, [_gpu(0, S, 50)], None))
    for _ in range(5):
        got = samples(_exposition(collector))
    assert by(got["gpuprof_gpu_utilization_ratio"], "gpu") == {"0": 0.5}
    assert len(calls) == 5
    assert collector.errors == [
        "metrics endpoint: reading the sampler failed: RuntimeError('sampler gone')"
    ]


def test_exporter_serves_over_http_on_loopback_and_stop_closes_the_socket(tmp_path):
    readings = (S, [_gpu(0, S, 70)], None)
    exporter = MetricsExporter(lambda: readings, tmp_path / "absent.sqlite", node="n1",
                               address=("127.0.0.1", 0))  # fmt: skip
    exporter.start()
    try:
        host, port = exporter.bound
        assert host == "127.0.0.1" and port > 0
        assert exporter.url == f"http://127.0.0.1:{port}/metrics"
        got = samples(scrape(exporter.url))
        assert by(got["gpuprof_gpu_utilization_ratio"], "gpu") == {"0": 0.7}
        # the process's default registry (python_info, process_*) is not exposed
        assert all(name.startswith("gpuprof_") for name in got)
    finally:
        exporter.stop()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass
    assert exporter.errors == []


# ----- `gpuprof watch --metrics-port` on simulated GPUs, scraped directly and by Prometheus

CHILD = textwrap.dedent(
    """
    import os, sys, time, gpuprof
    for step in range(400):
        with gpuprof.phase("rollout"):
            time.sleep(0.01)
        with gpuprof.phase("reward"):
            time.sleep(0.14)
        gpuprof.step(n=step)
        if os.path.exists(sys.argv[1]):
            break
    sys.exit(3)
    """
)


def _scenario() -> dict:
    def gpu(i: int, util: float) -> dict:
        series = {"util_gpu_pct": util, "mem_used_bytes": (10 + 10 * i) * GIB,
                  "power_mw": 250_000 + 50_000 * i, "pcie_rx_kb_s": 2000 + 1000 * i,
                  "nvlink_rx_kib_s": 4000, "sm_active_pct": 40 + i}  # fmt: skip
        return {"name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{i:08d}-test", "gpm": True,
                "series": series}  # fmt: skip

    return {"gpus": [gpu(0, 5), gpu(1, 80)]}  # GPU 0 idle, GPU 1 busy


class WatchedRun:
    """A `gpuprof watch --metrics-port` running the CHILD loop until `finish`."""

    def __init__(self, lib: Path, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self.stop_file = tmp / "stop"
        self.run_dir = tmp / "run"
        env = simnvml_env(lib, write_scenario(tmp / "scenario.txt", _scenario()),
                          base=clean_env(GPUPROF_HOST=NODE))  # fmt: skip
        argv = gpuprof_cmd("watch", "--interval", "0.05", "--metrics-port", str(self.port),
                           "-o", str(self.run_dir), "--", sys.executable, "-c", CHILD,
                           str(self.stop_file))  # fmt: skip
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)  # fmt: skip
        self.result: tuple[int, str] | None = None

    def wait_for(self, ready, timeout: float = 30.0) -> dict:
        """Scrape until ``ready(samples)`` holds; the last samples."""
        deadline, got = time.monotonic() + timeout, {}
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.communicate()[1]
            with contextlib.suppress(OSError):
                got = samples(scrape(self.url))
                if ready(got):
                    return got
            time.sleep(0.2)
        raise AssertionError(f"metrics never ready; last scrape: {sorted(got)}")

    def finish(self) -> tuple[int, str]:
        if self.result is None:
            self.stop_file.touch()
            try:
                _, err = self.proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                _, err = self.proc.communicate()
            self.result = (self.proc.returncode, err)
        return self.result


@pytest.fixture(scope="module")
def watched(simnvml_lib, tmp_path_factory):
    run = WatchedRun(simnvml_lib, tmp_path_factory.mktemp("prom-watch"))
    yield run
    run.finish()


def _ready(got: dict) -> bool:
    steps = got.get("gpuprof_steps_total", [])
    return bool(steps) and steps[0][1] >= 12 and "gpuprof_top_finding_idle_gpu_seconds" in got


def test_watch_serves_gpus_phases_steps_and_the_top_finding_while_it_runs(watched):
    got = watched.wait_for(_ready)
    assert {labels["node"] for series in got.values() for labels, _ in series} == {NODE}
    assert by(got["gpuprof_gpu_utilization_ratio"], "gpu") == {"0": 0.05, "1": 0.8}
    assert by(got["gpuprof_gpu_sm_active_ratio"], "gpu") == {"0": 0.40, "1": 0.41}
    assert by(got["gpuprof_gpu_memory_used_bytes"], "gpu") == {"0": 10 * GIB, "1": 20 * GIB}
    assert by(got["gpuprof_gpu_power_watts"], "gpu") == {"0": 250.0, "1": 300.0}
    rx = by(got["gpuprof_gpu_pcie_rx_bytes_per_second"], "gpu")
    assert rx == {
        "0": pytest.approx(2000 * 1024, rel=0.05),
        "1": pytest.approx(3000 * 1024, rel=0.05),
    }
    nvlink = by(got["gpuprof_gpu_nvlink_rx_bytes_per_second"], "gpu")
    assert nvlink == {
        "0": pytest.approx(4000 * 1024, rel=0.05),
        "1": pytest.approx(4000 * 1024, rel=0.05),
    }
    assert [(s["gpu"], s["uuid"], s["model_name"]) for s, _ in got["gpuprof_gpu_info"]] == [
        ("0", "GPU-00000000-test", "NVIDIA H100 80GB HBM3"),
        ("1", "GPU-00000001-test", "NVIDIA H100 80GB HBM3"),
    ]
    assert {s["uuid"] for s, _ in got["gpuprof_gpu_utilization_ratio"]} == {
        "GPU-00000000-test", "GPU-00000001-test"}  # fmt: skip
    # the hooked process: its last finished phase, its steps and their pace (0.15 s a step)
    ((phase, _),) = got["gpuprof_rank_phase_info"]
    assert phase["phase"] in ("rollout", "reward") and phase["rank"] == ""
    ((_, step_s),) = got["gpuprof_step_duration_seconds"]
    assert step_s == pytest.approx(0.155, abs=0.04)
    # GPU 0 idles all along, mostly inside the far longer reward phase (each reading's idle
    # GPU-time goes to the phase it falls in: few readings, so only the order is certain)
    idle = by(got["gpuprof_idle_gpu_seconds"], "phase")
    assert idle["reward"] > idle.get("rollout", 0.0)
    ((top, lost),) = got["gpuprof_top_finding_idle_gpu_seconds"]
    assert (top["kind"], top["phase"]) == ("reward_bound", "reward")
    assert lost == pytest.approx(idle["reward"], rel=0.5)


PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


@pytest.fixture
def prometheus(watched, tmp_path):
    """A real Prometheus server scraping the watch's endpoint every second; its API's URL."""
    if not os.path.exists(PROMETHEUS):
        if os.environ.get("CI"):
            pytest.fail("the prometheus binary is missing (CI installs Debian's prometheus)")
        pytest.skip("the prometheus binary is missing (apt-get install prometheus)")
    config = tmp_path / "prometheus.yml"
    config.write_text(textwrap.dedent(f"""\
        global:
          scrape_interval: 1s
          scrape_timeout: 1s
        scrape_configs:
          - job_name: gpuprof
            static_configs:
              - targets: ["127.0.0.1:{watched.port}"]
        """))  # fmt: skip
    port = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _query(api: str, expr: str) -> list:
    url = f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    answer = json.loads(scrape(url))
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def test_a_real_prometheus_scrapes_the_endpoint(watched, prometheus):
    api, proc = prometheus
    watched.wait_for(_ready)
    deadline = time.monotonic() + 30
    result: list = []
    while time.monotonic() < deadline:
        assert proc.poll() is None, "prometheus exited"
        with contextlib.suppress(OSError):
            result = _query(api, 'up{job="gpuprof"} == 1 and on() count(gpuprof_steps_total) > 0')
            if result:
                break
        time.sleep(0.3)
    assert result, "prometheus never scraped the endpoint"
    (utilization,) = _query(api, "max(gpuprof_gpu_utilization_ratio)")
    assert float(utilization["value"][1]) == pytest.approx(0.8)
    (memory,) = _query(api, "sum by (node) (gpuprof_gpu_memory_used_bytes)")
    assert memory["metric"] == {"node": NODE}
    assert float(memory["value"][1]) == 30 * GIB
    (power,) = _query(api, "sum(gpuprof_gpu_power_watts)")
    assert float(power["value"][1]) == pytest.approx(550.0)
    (gpus,) = _query(api, 'count(gpuprof_gpu_info{model_name="NVIDIA H100 80GB HBM3"})')
    assert float(gpus["value"][1]) == 2
    (top,) = _query(api, "gpuprof_top_finding_idle_gpu_seconds")
    assert (top["metric"]["kind"], top["metric"]["node"]) == ("reward_bound", NODE)
    assert top["metric"]["job"] == "gpuprof"  # Prometheus's own target labels sit beside ours
    (steps,) = _query(api, "sum(gpuprof_steps_total)")
    assert float(steps["value"][1]) >= 12
    # the README's example: the share of GPU-time idle in each phase (GPU 0 of 2 idles)
    share = (
        "sum by (node, phase) (gpuprof_idle_gpu_seconds) / ignoring(phase) group_left "
        "sum by (node) (gpuprof_sampled_gpu_seconds_total)"
    )
    shares = _query(api, share)
    by_phase = {s["metric"]["phase"]: float(s["value"][1]) for s in shares}
    assert max(by_phase, key=by_phase.get) == "reward"
    assert sum(by_phase.values()) == pytest.approx(0.5, abs=0.1)


def test_the_command_exit_code_and_run_are_kept(watched):
    code, err = watched.finish()
    assert code == 3, err
    assert f"gpuprof: Prometheus metrics at {watched.url}" in err.splitlines()
    run = store.load_run(watched.run_dir)
    assert run.meta.exit_code == 3
    assert (run.spans["phase"] == "reward").sum() >= 12
    assert not [n for n in run.meta.notices if "metrics" in n]
    # the endpoint is gone with the watch
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", watched.port), timeout=1):
        pass


# ----- faults


def test_a_taken_port_is_one_line_and_the_watch_goes_on(tmp_path):
    run_dir = tmp_path / "run"
    code = "import gpuprof\nwith gpuprof.phase('rollout'): print('hello')\nraise SystemExit(4)"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_gpuprof("watch", "--no-nvml", "--metrics-port", str(port), "-o",
                             str(run_dir), "--", sys.executable, "-c", code)  # fmt: skip
    assert result.returncode == 4, result.stderr
    assert result.stdout == "hello\n"
    line = f"--metrics-port {port}: address already in use; going on without the metrics endpoint"
    # one line at the time (the end-of-run summary lists the run's notices again)
    assert [n for n in result.stderr.splitlines() if n.startswith("gpuprof:")] == [
        f"gpuprof: {line}"
    ]
    run = store.load_run(run_dir)
    assert line in run.meta.notices
    assert run.meta.exit_code == 4 and len(run.spans) == 1


def test_an_address_that_is_not_ours_is_one_line(tmp_path):
    run_dir = tmp_path / "run"
    port = free_port()
    # 192.0.2.1 (TEST-NET-1) is no address of this machine
    result = run_gpuprof("watch", "--no-nvml", "--metrics-port", str(port), "--metrics-address",
                         "192.0.2.1", "-o", str(run_dir), "--", sys.executable, "-c",
                         "raise SystemExit(0)")  # fmt: skip
    assert result.returncode == 0, result.stderr
    notes = [n for n in result.stderr.splitlines() if n.startswith("gpuprof:")]
    assert notes == [f"gpuprof: --metrics-port {port} on 192.0.2.1: cannot assign requested "
                     "address; going on without the metrics endpoint"]  # fmt: skip
    assert notes[0].removeprefix("gpuprof: ") in store.load_run(run_dir).meta.notices


def test_metrics_address_needs_a_port(tmp_path):
    result = run_gpuprof("watch", "--metrics-address", "0.0.0.0", "-o", str(tmp_path / "run"),
                         "--", sys.executable, "-c", "pass")  # fmt: skip
    assert result.returncode == 2
    assert "--metrics-address needs --metrics-port" in result.stderr
    assert not (tmp_path / "run").exists()
