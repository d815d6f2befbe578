"""The host collector against real processes and real psutil, and the role rules as a table."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import psutil
import pytest

from gpuprof.collectors.host import HostCollector, classify_role, is_launcher
from gpuprof.model import ProcSample

PY = "/usr/bin/python3"
TORCHRUN = [PY, "/venv/bin/torchrun", "--nproc_per_node=2", "train.py", "--lr", "1e-6"]
TRAIN = [PY, "-u", "train.py", "--lr", "1e-6"]
DS_RUNNER = [PY, "/venv/bin/deepspeed", "--num_gpus=2", "train.py"]
DS_LAUNCH = [PY, "-u", "-m", "deepspeed.launcher.launch", "--world_info=eyJ9", "train.py"]
ACCELERATE = [PY, "/venv/bin/accelerate", "launch", "--num_processes", "2", "grpo.py"]
GRPO_WITH_VLLM = [PY, "grpo.py", "--use_vllm", "True", "--vllm_mode", "colocate"]
SWIFT = [PY, "/venv/bin/swift", "rlhf", "--rlhf_type", "grpo", "--use_vllm", "true"]
VERL = [PY, "-m", "verl.trainer.main_ppo", "actor_rollout_ref.rollout.name=vllm"]
SPAWN = [
    PY,
    "-c",
    "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)",
    "--multiprocessing-fork",
]
SITE = "/venv/lib/python3.11/site-packages"

# (case, cmdline, name, parent_cmdline, is_root, root_is_launcher, expected role)
ROLE_CASES = [
    # main: the root, launcher or not
    ("plain python main", [PY, "train.py"], "python3", ["bash"], True, False, "main"),
    ("torchrun root", TORCHRUN, "torchrun", ["bash"], True, True, "main"),
    ("verl driver root", VERL, "python3", ["bash"], True, False, "main"),
    # trainer: Python children of a launcher
    ("torchrun child", TRAIN, "python3", TORCHRUN, False, True, "trainer"),
    (
        "torch.distributed.run child",
        TRAIN,
        "python3",
        [PY, "-m", "torch.distributed.run", "--nproc-per-node=2", "train.py"],
        False,
        True,
        "trainer",
    ),
    ("deepspeed per-node launcher", DS_LAUNCH, "python3", DS_RUNNER, False, True, "other"),
    ("deepspeed rank", [*TRAIN, "--local_rank=0"], "python3", DS_LAUNCH, False, True, "trainer"),
    ("accelerate rank, --use_vllm", GRPO_WITH_VLLM, "python3", ACCELERATE, False, True, "trainer"),
    (
        "torchrun --no-python child",
        ["./train_bin", "--steps", "10"],
        "train_bin",
        ["torchrun", "--no-python", "--nproc_per_node=2", "./train_bin"],
        False,
        True,
        "trainer",
    ),
    (
        "ms-swift training script",
        [PY, f"{SITE}/swift/cli/rlhf.py", "--rlhf_type", "grpo"],
        "python3",
        SWIFT,
        False,
        True,
        "trainer",
    ),
    (
        "torchrun nested under a shell script",
        TRAIN,
        "python3",
        ["torchrun", "--nproc_per_node=2", "train.py"],
        False,
        False,
        "trainer",
    ),
    ("orphan under a launcher root", TRAIN, "python3", None, False, True, "trainer"),
    ("orphan under a plain root", TRAIN, "python3", None, False, False, "other"),
    (
        "python child of a plain main",
        [PY, "reward_server.py"],
        "python3",
        VERL,
        False,
        False,
        "other",
    ),
    # dataloader: forks and multiprocessing machinery
    ("DataLoader fork", TRAIN, "python3", TRAIN, False, True, "dataloader"),
    (
        "fork of a plain main",
        [PY, "train.py"],
        "python3",
        [PY, "train.py"],
        False,
        False,
        "dataloader",
    ),
    ("spawn worker", SPAWN, "python3", [PY, "train.py"], False, False, "dataloader"),
    (
        "forkserver",
        [PY, "-c", "from multiprocessing.forkserver import main; main(8, 9, ['__main__'])"],
        "python3",
        [PY, "train.py"],
        False,
        False,
        "dataloader",
    ),
    (
        "resource tracker",
        [PY, "-c", "from multiprocessing.resource_tracker import main;main(5)"],
        "python3",
        [PY, "train.py"],
        False,
        False,
        "other",
    ),
    # inference: vLLM and SGLang
    ("vLLM EngineCore", ["VLLM::EngineCore"], "VLLM::EngineCor", SPAWN, False, False, "inference"),
    (
        "vLLM DP engine",
        ["VLLM::EngineCore_DP1"],
        "VLLM::EngineCor",
        VERL,
        False,
        False,
        "inference",
    ),
    (
        "vLLM custom prefix",
        ["job7::EngineCore"],
        "job7::EngineCor",
        VERL,
        False,
        False,
        "inference",
    ),
    ("vLLM worker", ["VLLM::Worker_TP0_EP0"], "VLLM::Worker_TP", VERL, False, False, "inference"),
    (
        "fork of an engine",
        ["VLLM::EngineCore"],
        "x",
        ["VLLM::EngineCore"],
        False,
        False,
        "inference",
    ),
    (
        "vllm serve",
        [PY, "/venv/bin/vllm", "serve", "Qwen/Qwen2.5-7B-Instruct"],
        "vllm",
        ["bash"],
        False,
        False,
        "inference",
    ),
    (
        "vLLM OpenAI server module",
        [PY, "-m", "vllm.entrypoints.openai.api_server", "--model", "m"],
        "python3",
        ["bash"],
        False,
        False,
        "inference",
    ),
    (
        "trl vllm-serve",
        [PY, "/venv/bin/trl", "vllm-serve", "--model", "m"],
        "trl",
        ["bash"],
        False,
        False,
        "inference",
    ),
    ("sglang scheduler", ["sglang::scheduler"], "sglang::schedul", VERL, False, False, "inference"),
    (
        "sglang TP scheduler",
        ["sglang::scheduler_TP0"],
        "sglang::schedul",
        VERL,
        False,
        False,
        "inference",
    ),
    (
        "sglang detokenizer",
        ["sglang::detokenizer"],
        "sglang::detoken",
        VERL,
        False,
        False,
        "inference",
    ),
    (
        "sglang server",
        [PY, "-m", "sglang.launch_server", "--model-path", "m"],
        "python3",
        VERL,
        False,
        False,
        "inference",
    ),
    (
        "ms-swift rollout server",
        [PY, f"{SITE}/swift/cli/rollout.py", "--model", "m"],
        "python3",
        [PY, "/venv/bin/swift", "rollout", "--model", "m"],
        False,
        True,
        "inference",
    ),
    # Ray actors
    ("verl WorkerDict", ["ray::WorkerDict"], "ray::WorkerDict", None, False, False, "trainer"),
    (
        "verl WorkerDict in rollout",
        ["ray::WorkerDict.actor_rollout_generate_sequences()"],
        "ray::WorkerDict",
        ["/x/ray/core/src/ray/raylet/raylet"],
        False,
        False,
        "trainer",
    ),
    (
        "verl TaskRunner",
        ["ray::TaskRunner.run()"],
        "ray::TaskRunner",
        None,
        False,
        False,
        "trainer",
    ),
    (
        "OpenRLHF policy",
        ["ray::PolicyModelActor.fit()"],
        "ray::PolicyMode",
        None,
        False,
        False,
        "trainer",
    ),
    ("verl vLLM server", ["ray::vLLMHttpServer.generate()"], "x", None, False, False, "inference"),
    ("verl async vLLM", ["ray::AsyncvLLMServer"], "x", None, False, False, "inference"),
    ("verl SGLang server", ["ray::SGLangHttpServer"], "x", None, False, False, "inference"),
    ("OpenRLHF vLLM", ["ray::LLMRayActor.generate()"], "x", None, False, False, "inference"),
    ("vLLM Ray worker", ["ray::RayWorkerWrapper"], "x", None, False, False, "inference"),
    ("Ray task", ["ray::compute_score()"], "ray::compute_sc", None, False, False, "other"),
    (
        "fork of a Ray worker",
        ["ray::WorkerDict.update_actor()"],
        "ray::WorkerDict",
        ["ray::WorkerDict.compute_log_prob()"],
        False,
        False,
        "dataloader",
    ),
    # Ray infrastructure
    ("ray idle worker", ["ray::IDLE"], "ray::IDLE", None, False, False, "other"),
    ("ray spill worker", ["ray::IDLE_SpillWorker"], "ray::IDLE_Spill", None, False, False, "other"),
    ("ray stats actor", ["ray::_StatsActor"], "ray::_StatsAct", None, False, False, "other"),
    ("ray job supervisor", ["ray::JobSupervisor"], "ray::JobSupervi", None, False, False, "other"),
    (
        "raylet",
        [f"{SITE}/ray/core/src/ray/raylet/raylet", "--raylet_socket_name=/tmp/s"],
        "raylet",
        VERL,
        False,
        False,
        "other",
    ),
    (
        "gcs_server",
        [f"{SITE}/ray/core/src/ray/gcs/gcs_server", "--gcs_server_port=6379"],
        "gcs_server",
        VERL,
        False,
        False,
        "other",
    ),
    (
        "ray dashboard",
        [PY, f"{SITE}/ray/dashboard/dashboard.py", "--host=127.0.0.1"],
        "python3",
        VERL,
        False,
        False,
        "other",
    ),
    (
        "ray log monitor",
        [PY, "-u", f"{SITE}/ray/_private/log_monitor.py", "--logs-dir=/tmp/ray"],
        "python3",
        VERL,
        False,
        False,
        "other",
    ),
    (
        "ray worker before its title",
        [PY, f"{SITE}/ray/_private/workers/default_worker.py", "--node-ip-address=1.2.3.4"],
        "python3",
        [f"{SITE}/ray/core/src/ray/raylet/raylet"],
        False,
        False,
        "other",
    ),
    (
        "ray start child of a ray root",
        [PY, "-m", "ray.util.client.server", "--port=10001"],
        "python3",
        ["/venv/bin/ray", "start", "--head", "--block"],
        False,
        True,
        "other",
    ),
    # everything else
    ("shell", ["bash", "-c", "nvidia-smi"], "bash", VERL, False, False, "other"),
    ("unreadable", [], "", None, False, False, "other"),
]


@pytest.mark.parametrize(
    ("cmdline", "name", "parent_cmdline", "is_root", "root_is_launcher", "expected"),
    [case[1:] for case in ROLE_CASES],
    ids=[case[0] for case in ROLE_CASES],
)
def test_classify_role(
    cmdline: list[str],
    name: str,
    parent_cmdline: list[str] | None,
    is_root: bool,
    root_is_launcher: bool,
    expected: str,
) -> None:
    assert classify_role(cmdline, name, parent_cmdline, is_root, root_is_launcher) == expected


@pytest.mark.parametrize(
    ("cmdline", "expected"),
    [
        (["torchrun", "--nproc_per_node=8", "train.py"], True),
        (TORCHRUN, True),
        ([PY, "-m", "torch.distributed.launch", "train.py"], True),
        (DS_RUNNER, True),
        (DS_LAUNCH, True),
        (ACCELERATE, True),
        ([PY, "-m", "accelerate.commands.launch", "grpo.py"], True),
        ([PY, "/venv/bin/accelerate", "config"], False),
        (["/venv/bin/ray", "start", "--head"], True),
        (SWIFT, True),
        (VERL, False),
        ([PY, "train.py"], False),
        ([], False),
        (None, False),
    ],
)
def test_is_launcher(cmdline: list[str] | None, expected: bool) -> None:
    assert is_launcher(cmdline) is expected


# The watched command of the real-tree test: two fork children (idle and busy), a child whose
# argv[0] is vLLM's engine title, and a command loop on stdin to start or reap children later.
TREE_SCRIPT = textwrap.dedent(
    """
    import json, multiprocessing as mp, subprocess, sys, time

    def idle():
        time.sleep(60)

    def spin():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pass

    ctx = mp.get_context("fork")
    idle_proc = ctx.Process(target=idle, daemon=True)
    spin_proc = ctx.Process(target=spin, daemon=True)
    idle_proc.start()
    spin_proc.start()
    engine = subprocess.Popen(
        ["VLLM::EngineCore", "-c", "import time; time.sleep(60)"], executable=sys.executable
    )
    print(json.dumps({"idle": idle_proc.pid, "spin": spin_proc.pid, "engine": engine.pid}))
    sys.stdout.flush()
    for line in sys.stdin:
        if line.strip() == "spawn":
            late = ctx.Process(target=idle, daemon=True)
            late.start()
            print(json.dumps({"late": late.pid}))
        elif line.strip() == "reap":
            mp.active_children()
            print(json.dumps({}))
        sys.stdout.flush()
    """
)


class Tree:
    """A running watched command and the pids it reported."""

    def __init__(self, popen: subprocess.Popen[str]) -> None:
        self.popen = popen
        self.pids: dict[str, int] = {"root": popen.pid}

    def command(self, line: str) -> dict[str, int]:
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()
        reply = json.loads(self.popen.stdout.readline())
        self.pids.update(reply)
        return reply


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def tree() -> Iterator[Tree]:
    popen = subprocess.Popen(
        [sys.executable, "-c", TREE_SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    started = Tree(popen)
    try:
        assert popen.stdout is not None
        started.pids.update(json.loads(popen.stdout.readline()))
        yield started
    finally:
        _kill_all([pid for name, pid in started.pids.items() if name != "root"])
        popen.kill()
        popen.wait()


def _by_pid(records: list[ProcSample]) -> dict[int, ProcSample]:
    return {record.pid: record for record in records}


def _wait_until(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def _is_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_real_tree(tree: Tree) -> None:
    pids = tree.pids
    refresh_s = 1.5
    collector = HostCollector("host-a", pids["root"], tree_refresh_s=refresh_s)

    # First sample: the tree is listed, every process seen for the first time.
    t0 = time.monotonic()
    spin_cpu_s, wall_s = _cpu_s(pids["spin"]), time.monotonic()
    _, records = collector.sample(time.time_ns())
    refreshed_by = time.monotonic()
    seen = _by_pid(records)
    assert set(seen) == {pids["root"], pids["idle"], pids["spin"], pids["engine"]}
    assert collector.watched_pids() == set(seen)
    roles = {name: seen[pids[name]].role for name in ("root", "idle", "spin", "engine")}
    assert roles == {
        "root": "main",
        "idle": "dataloader",
        "spin": "dataloader",
        "engine": "inference",
    }
    assert seen[pids["root"]].ppid == os.getpid()
    for name in ("idle", "spin", "engine"):
        assert seen[pids[name]].ppid == pids["root"]
    for record in records:
        assert record.host == "host-a"
        assert record.rss_bytes is not None and record.rss_bytes > 0
        assert record.num_threads is not None and record.num_threads >= 1
        assert 0 < len(record.name) <= 64
        assert record.cpu_pct is None
        assert record.io_read_bytes_s is None and record.io_write_bytes_s is None

    # Second sample: CPU per process since the first. The busy loop gets most of a core on a
    # quiet machine, less when other jobs share this small one, so its figure is checked
    # against the CPU time it really got, read independently around both samples.
    time.sleep(0.4)
    _, records = collector.sample(time.time_ns())
    spin_cpu_pct = 100 * (_cpu_s(pids["spin"]) - spin_cpu_s) / (time.monotonic() - wall_s)
    seen = _by_pid(records)
    assert all(record.cpu_pct is not None for record in records)
    assert seen[pids["spin"]].cpu_pct == pytest.approx(spin_cpu_pct, abs=15)
    assert seen[pids["spin"]].cpu_pct > seen[pids["idle"]].cpu_pct
    assert seen[pids["idle"]].cpu_pct < 25
    for record in records:
        for rate in (record.io_read_bytes_s, record.io_write_bytes_s):
            assert rate is None or rate >= 0

    # A child started now is not seen before the next tree refresh.
    late = tree.command("spawn")["late"]
    _, records = collector.sample(time.time_ns())
    assert time.monotonic() - t0 < refresh_s, "too slow to test the refresh interval"
    assert late not in _by_pid(records)

    # Children that exit vanish without errors: one reaped (its pid is gone), one a zombie.
    os.kill(pids["idle"], signal.SIGKILL)
    os.kill(pids["engine"], signal.SIGKILL)
    _wait_until(lambda: _is_zombie(pids["engine"]))
    # SIGKILL is delivered asynchronously: reap only once the kernel has made it a zombie
    _wait_until(lambda: _is_zombie(pids["idle"]) or not psutil.pid_exists(pids["idle"]))
    tree.command("reap")
    _wait_until(lambda: not psutil.pid_exists(pids["idle"]))
    _, records = collector.sample(time.time_ns())
    assert set(_by_pid(records)) == {pids["root"], pids["spin"]}

    # After the refresh interval the late child appears, on its first sighting.
    time.sleep(max(0.0, refreshed_by + refresh_s - time.monotonic()))
    _, records = collector.sample(time.time_ns())
    seen = _by_pid(records)
    assert set(seen) == {pids["root"], pids["spin"], late}
    assert collector.watched_pids() == set(seen)
    assert seen[late].role == "dataloader"
    assert seen[late].ppid == pids["root"]
    assert seen[late].cpu_pct is None
    assert seen[pids["spin"]].cpu_pct is not None


FAKE_TORCHRUN = textwrap.dedent(
    """
    import subprocess, sys, time
    ranks = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        for _ in range(2)
    ]
    print(" ".join(str(rank.pid) for rank in ranks), flush=True)
    time.sleep(30)
    """
)


@contextlib.contextmanager
def _fake_torchrun(tmp_path) -> Iterator[tuple[int, list[int]]]:
    """A stand-in for torchrun (a Python script named torchrun) that has started two Python
    ranks: its pid and theirs."""
    launcher = tmp_path / "torchrun"
    launcher.write_text(FAKE_TORCHRUN)
    popen = subprocess.Popen(
        [sys.executable, str(launcher), "--nproc_per_node=2", "train.py"],
        stdout=subprocess.PIPE,
        text=True,
    )
    ranks: list[int] = []
    try:
        assert popen.stdout is not None
        ranks = [int(pid) for pid in popen.stdout.readline().split()]
        yield popen.pid, ranks
    finally:
        _kill_all(ranks)
        popen.kill()
        popen.wait()


def test_launcher_children_are_trainers(tmp_path) -> None:
    with _fake_torchrun(tmp_path) as (root, ranks):
        # a fresh collector's first reading, as a watcher's first tree walk. `Popen` returns
        # once the rank's close-on-exec files are closed, which the kernel does before it
        # lays out the new arguments: on a loaded machine a rank may still have no command
        # line here, and is read from its executable (see the next test)
        _, records = HostCollector("host-a", root).sample(time.time_ns())
        roles = {record.pid: record.role for record in records}
        commands = {pid: psutil.Process(pid).cmdline() for pid in roles}
        assert roles == {root: "main", ranks[0]: "trainer", ranks[1]: "trainer"}, commands


def test_a_process_between_exec_and_its_arguments_is_read_again(tmp_path, monkeypatch) -> None:
    """What a loaded machine showed: a rank whose ``/proc/<pid>/cmdline`` was still empty
    (running, its new executable in place, one page touched) read ``other`` until the next
    tree refresh. It reads what its executable says, then what its arguments say at the very
    next sample."""
    with _fake_torchrun(tmp_path) as (root, ranks):
        engine = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
        reads = {ranks[0]: [[], engine]}
        real_cmdline = psutil.Process.cmdline

        def cmdline(proc: psutil.Process) -> list[str]:
            queued = reads.get(proc.pid)
            if queued:
                return queued.pop(0) if len(queued) > 1 else queued[0]
            return real_cmdline(proc)

        monkeypatch.setattr(psutil.Process, "cmdline", cmdline)
        collector = HostCollector("host-a", root, tree_refresh_s=3600)
        first = {r.pid: r.role for r in collector.sample(time.time_ns())[1]}
        # a Python process whose parent is a launcher: a rank, as far as its executable says
        assert first == {root: "main", ranks[0]: "trainer", ranks[1]: "trainer"}
        # with its arguments, at the next sample, long before the next tree refresh
        second = {r.pid: r.role for r in collector.sample(time.time_ns())[1]}
        assert second == {root: "main", ranks[0]: "inference", ranks[1]: "trainer"}
        assert not collector._unread
        # a command line that stays empty (a process exiting: no executable either) is
        # asked again each sample and otherwise read as before
        reads[ranks[1]] = [[]]
        monkeypatch.setattr(psutil.Process, "exe", lambda proc: "")
        collector = HostCollector("host-a", root, tree_refresh_s=3600)
        for _ in range(3):
            roles = {r.pid: r.role for r in collector.sample(time.time_ns())[1]}
            assert roles == {root: "main", ranks[0]: "inference", ranks[1]: "other"}
            assert collector._unread


def test_host_figures() -> None:
    collector = HostCollector("host-a", os.getpid())
    time.sleep(0.1)
    own_cpu_s, wall_s = time.process_time(), time.monotonic()
    host, records = collector.sample(123)
    assert host.host == "host-a" and host.t_ns == 123
    assert host.cpu_pct is not None and 0.0 <= host.cpu_pct <= 100.0
    assert host.n_cpus == psutil.cpu_count()
    assert host.mem_total_bytes is not None and host.mem_total_bytes > 2**20
    assert host.mem_used_bytes is not None and 0 < host.mem_used_bytes <= host.mem_total_bytes
    assert [record.pid for record in records if record.role == "main"] == [os.getpid()]

    # Busy-wait in this process: at least its share of the machine shows in the system figure
    # (the loop's core when nothing else runs, less when other jobs share the machine), and
    # the process's own figure matches the CPU time it got.
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:
        pass
    host, records = collector.sample(456)
    own_cpu_pct = 100 * (time.process_time() - own_cpu_s) / (time.monotonic() - wall_s)
    own = _by_pid(records)[os.getpid()]
    assert own.cpu_pct == pytest.approx(own_cpu_pct, abs=15)
    assert host.cpu_pct is not None
    assert host.cpu_pct >= own_cpu_pct / psutil.cpu_count() - 10


def test_root_that_is_gone() -> None:
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    collector = HostCollector("host-a", finished.pid)
    host, records = collector.sample(time.time_ns())
    assert records == []
    assert collector.watched_pids() == set()
    assert host.mem_total_bytes is not None
