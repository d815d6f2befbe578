"""The in-process hooks: no-ops outside a run, nesting, threads, fork, ranks, never raising."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import warnings

import pytest
from conftest import clean_env

import gpuprof
from gpuprof import hooks, store


@pytest.fixture(autouse=True, params=["c", "python"])
def implementation(request, monkeypatch):
    """Every test here runs on both implementations of `phase`: the C hot path
    (`gpuprof._cphase`, what an install compiles) and the pure-Python fallback (a platform
    without a compiler), in this process and in the children tests start."""
    monkeypatch.setattr(hooks, "_warned", set())  # each run of a test sees its own warnings
    if request.param == "python":
        monkeypatch.setenv(hooks.ENV_PURE_PYTHON, "1")
        monkeypatch.setattr(hooks, "phase", hooks._PyPhase)
        monkeypatch.setattr(gpuprof, "phase", hooks._PyPhase)
    elif hooks._cphase is None:
        if os.environ.get(hooks.ENV_PURE_PYTHON):
            pytest.skip(f"{hooks.ENV_PURE_PYTHON} is set")
        pytest.fail("gpuprof._cphase did not build: `pip install -e .` needs a C compiler")
    return request.param


@pytest.fixture
def run_dir(tmp_path):
    assert gpuprof.init(tmp_path)
    yield tmp_path
    gpuprof.shutdown()


def _load(run_dir):
    gpuprof.shutdown()
    return store.load_run(run_dir)


def test_outside_a_run_hooks_do_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    hooks._set_recorder(None, checked=False)

    @gpuprof.phase("reward")
    def score(x):
        return x * 2

    with gpuprof.phase("rollout", tokens=3) as p:
        assert isinstance(p, gpuprof.phase)
    assert score(21) == 42
    gpuprof.step(tokens=10)
    gpuprof.mark("checkpoint")
    with pytest.raises(ZeroDivisionError), gpuprof.phase("update_actor"):
        1 / 0  # noqa: B018 - the user's exception passes through untouched
    assert not gpuprof.enabled()
    assert list(tmp_path.iterdir()) == []
    assert threading.active_count() == 1 or not any(
        t.name == "gpuprof-hooks" for t in threading.enumerate()
    )


def test_nested_phases_decorators_steps_and_errors(run_dir):
    @gpuprof.phase("reward", source="rule")
    def score():
        return 1

    @gpuprof.phase("generate_sequences")
    async def generate():
        await asyncio.sleep(0)
        return "text"

    for step in range(3):
        with gpuprof.phase("rollout"):
            assert asyncio.run(generate()) == "text"
        assert score() == 1
        gpuprof.step(n=step, tokens=100 + step)
    with pytest.raises(ValueError), gpuprof.phase("update_actor"):
        raise ValueError("boom")
    gpuprof.mark("checkpoint", path="/ckpt")
    run = _load(run_dir)
    spans = run.spans
    gen = spans[spans["name"] == "generate_sequences"]
    assert list(gen["phase"]) == ["rollout"] * 3  # framework name → canonical phase
    assert list(gen["depth"]) == [2, 2, 2]  # step ⊃ rollout ⊃ generate_sequences
    assert list(gen["step"]) == [0, 1, 2]
    rewards = spans[spans["phase"] == "reward"]
    assert [a["source"] for a in rewards["attrs"]] == ["rule"] * 3
    steps = spans[spans["phase"] == "step"].sort_values("step")
    assert list(steps["step"]) == [0, 1, 2]
    assert [a["tokens"] for a in steps["attrs"]] == [100, 101, 102]
    # consecutive steps tile the timeline
    assert (steps["start_ns"].to_numpy()[1:] == steps["end_ns"].to_numpy()[:-1]).all()
    failed = spans[spans["phase"] == "update_actor"].iloc[0]
    assert failed["attrs"] == {"error": "ValueError"} and failed["step"] == 3
    for _, rollout in spans[spans["name"] == "rollout"].iterrows():
        inner = gen[gen["step"] == rollout["step"]].iloc[0]
        assert rollout["start_ns"] <= inner["start_ns"] <= inner["end_ns"] <= rollout["end_ns"]
    kinds = run.events.groupby("kind").size().to_dict()
    assert kinds == {"mark": 1, "process": 1, "step": 3}


def test_threads_record_independently(run_dir):
    barrier = threading.Barrier(4)

    def work(k):
        barrier.wait()  # all four run at once, so no thread id is reused
        for _ in range(1000):
            with gpuprof.phase("outer", thread=k), gpuprof.phase("inner"):
                pass

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans = _load(run_dir).spans
    assert len(spans) == 8000
    assert spans.groupby("tid").size().tolist() == [2000] * 4
    assert set(spans.loc[spans["name"] == "inner", "depth"]) == {1}
    assert set(spans.loc[spans["name"] == "outer", "depth"]) == {0}


def test_spans_carry_the_kernel_thread_id(run_dir):
    # the hot path reads the cheap `threading.get_ident`; the writer stores the kernel's id
    # (what /proc/<pid>/task lists) for every thread alive when it writes
    done, release = threading.Barrier(3), threading.Event()

    def work():
        with gpuprof.phase("rollout"):
            pass
        gpuprof.step()
        done.wait()
        release.wait(30)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    done.wait()
    gpuprof.flush()  # both threads alive: written under their kernel ids
    release.set()
    for t in threads:
        t.join()
    spans = _load(run_dir).spans
    native = {t.native_id for t in threads}
    assert set(spans.loc[spans["name"] == "rollout", "tid"]) == native
    assert set(spans.loc[spans["name"] == "step", "tid"]) == native


IMPORT_COST = """
import sys, time
t0 = time.perf_counter()
import gpuprof
with gpuprof.phase("rollout"):
    pass
gpuprof.step(tokens=3)
gpuprof.mark("m")
print(sorted({m.split(".")[0] for m in sys.modules} & {"pandas", "pyarrow", "numpy", "sqlite3"}))
print(gpuprof.enabled())
"""


def test_a_process_outside_a_run_loads_no_data_libraries():
    # every training script with hooks imports gpuprof, in every Ray worker and data-loader
    # process, watched or not: outside a run it must not pull in pandas, Arrow or SQLite
    out = subprocess.run([sys.executable, "-c", IMPORT_COST], env=clean_env(), capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[]", "False"], out.stdout


def test_a_recording_process_loads_sqlite_alone_on_its_first_hook(tmp_path):
    # a recording process (every rank, every Ray worker of a watched run) writes SQLite and
    # needs nothing of pandas, Arrow or NumPy: ~90 MB of RSS and a fraction of a second each
    env = clean_env(GPUPROF_RUN_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", IMPORT_COST], env=env, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["['sqlite3']", "True"], out.stdout
    spans = store.load_run(tmp_path).spans
    assert spans["name"].tolist().count("rollout") == 1


def test_ranks_come_from_launcher_variables(tmp_path):
    code = "import gpuprof, sys; gpuprof.init(sys.argv[1])\nwith gpuprof.phase('rollout'): pass"
    for env in ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8"},
                {"SLURM_PROCID": "5", "SLURM_LOCALID": "2", "SLURM_NTASKS": "16"}):  # fmt: skip
        subprocess.run(
            [sys.executable, "-c", code, str(tmp_path)], env=clean_env(**env), check=True
        )
    run = store.load_run(tmp_path)
    assert sorted(zip(run.spans["rank"], run.spans["local_rank"])) == [(3, 1), (5, 2)]
    sizes = sorted(a["world_size"] for a in run.events[run.events["kind"] == "process"]["attrs"])
    assert sizes == [8, 16]


FORKING = textwrap.dedent(
    """
    import os, sys, multiprocessing as mp, gpuprof
    gpuprof.init(sys.argv[1])

    def worker(i):
        with gpuprof.phase("dataload", worker=i):
            pass

    with gpuprof.phase("rollout"):
        pass
    gpuprof.step(n=4)
    # queued but unflushed parent spans must not be duplicated by the children
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=worker, args=(i,)) for i in range(3)]
    [p.start() for p in procs]
    [p.join() for p in procs]
    pid = os.fork()
    if pid == 0:
        with gpuprof.phase("reward"):
            pass
        gpuprof.shutdown()
        os._exit(0)
    os.waitpid(pid, 0)
    """
)


def test_hooks_survive_fork(tmp_path):
    subprocess.run(
        [sys.executable, "-c", FORKING, str(tmp_path)], env=clean_env(), check=True, timeout=60
    )
    spans = store.load_run(tmp_path).spans
    counts = spans.groupby("phase").size().to_dict()
    assert counts == {"dataload": 3, "reward": 1, "rollout": 1, "step": 1}
    loaders = spans[spans["phase"] == "dataload"]
    assert loaders["pid"].nunique() == 3
    assert set(loaders["step"]) == {5}  # children continue the parent's step count


RACING_THREADS = textwrap.dedent(
    """
    import sys, threading, gpuprof
    n = int(sys.argv[1])
    start = threading.Barrier(4)
    def work():
        start.wait()  # all four reach their first hook together
        for _ in range(n):
            with gpuprof.phase("update"):
                pass
    threads = [threading.Thread(target=work) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    """
)


def test_threads_racing_to_the_first_hook_all_record(tmp_path):
    """The recorder is made by the first hook of a watched process; threads arriving while it
    is built wait for it rather than skip their spans (a quarter of 80k spans were lost)."""
    for i in range(3):
        run = tmp_path / f"run{i}"
        env = clean_env(GPUPROF_RUN_DIR=str(run))
        subprocess.run([sys.executable, "-c", RACING_THREADS, "5000"], env=env, check=True,
                       timeout=60)  # fmt: skip
        spans = store.load_run(run).spans
        assert spans.groupby("tid").size().tolist() == [5000] * 4


def test_unwritable_run_warns_once_and_never_raises(tmp_path, capsys):
    target = tmp_path / "file-not-dir"
    target.write_text("x")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("error")  # a training's strict filters must not turn it into a raise
        gpuprof.init(target)  # can't create a run inside a regular file
        for _ in range(100):
            with gpuprof.phase("rollout"):
                pass
        gpuprof.flush()
        gpuprof.shutdown()
    assert not [w for w in caught if "gpuprof" in str(w.message)]
    lines = [line for line in capsys.readouterr().err.splitlines() if "gpuprof" in line]
    assert len(lines) == 1 and lines[0].startswith("gpuprof: "), lines


def test_odd_attribute_values_are_stored_as_text(run_dir):
    with gpuprof.phase("reward", obj=object(), n=float("nan")):
        pass
    spans = _load(run_dir).spans
    assert spans.iloc[0]["attrs"]["obj"].startswith("<object object")


def test_no_hook_thread_until_first_use(tmp_path):
    code = textwrap.dedent(
        """
        import threading, gpuprof
        assert not any(t.name == "gpuprof-hooks" for t in threading.enumerate())
        with gpuprof.phase("x"): pass
        print(any(t.name == "gpuprof-hooks" for t in threading.enumerate()))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], env=clean_env(GPUPROF_RUN_DIR=str(tmp_path)),
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == "True"
    assert (
        os.path.exists(store.host_file(tmp_path, __import__("socket").gethostname(), None)) is False
    )


class _FakeCudaEvent:
    """Stands in for torch.cuda.Event (no CUDA device here): an event runs ``lag_ms`` after it
    was recorded (the GPU queue's depth), and completes only when the test says so."""

    completed = False
    lag_ms = 0.0

    def __init__(self, enable_timing=False):
        self.t_ms = None

    def record(self):
        import time as _time

        self.t_ms = _time.monotonic_ns() / 1e6 + _FakeCudaEvent.lag_ms

    def query(self):
        return _FakeCudaEvent.completed

    def elapsed_time(self, other):
        return other.t_ms - self.t_ms


def test_cuda_event_timing_never_waits_and_fills_gpu_times(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "Event", _FakeCudaEvent)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    _FakeCudaEvent.completed, _FakeCudaEvent.lag_ms = False, 0.0
    gpuprof.init(tmp_path, cuda_events=True)  # the reference event: the queue is empty
    _FakeCudaEvent.lag_ms = 5.0  # later work waits 5 ms behind the host
    with gpuprof.phase("update_actor"):
        pass
    hooks.flush()  # events not complete yet: the span waits, nothing blocks
    assert len(hooks._recorder.pending_gpu) == 1
    _FakeCudaEvent.completed = True
    with gpuprof.phase("rollout"):
        pass
    spans = _load(tmp_path).spans.set_index("phase")
    for phase_name in ("update_actor", "rollout"):
        row = spans.loc[phase_name]
        assert row["gpu_start_ns"] - row["start_ns"] == pytest.approx(5e6, abs=5e5)
        assert row["gpu_end_ns"] >= row["gpu_start_ns"]


def test_a_phase_named_with_a_non_string_does_not_stop_recording(run_dir):
    import enum

    class Stage(enum.Enum):
        ROLLOUT = 1

    with gpuprof.phase(7):
        pass
    with gpuprof.phase(Stage.ROLLOUT):
        pass
    gpuprof.mark(3.5)
    with gpuprof.phase("reward"):
        pass
    run = _load(run_dir)
    assert sorted(run.spans["name"]) == ["7", "Stage.ROLLOUT", "reward"]
    assert list(run.events.loc[run.events["kind"] == "mark", "name"]) == ["3.5"]


def test_queue_is_bounded_and_drops_are_counted(tmp_path, monkeypatch):
    """A writer that falls behind drops the oldest queued spans, counts every one, and the
    run says how many; stored + dropped = recorded."""
    import gpuprof
    from gpuprof import hooks
    from gpuprof.analyzers.diagnose import data_notes, dropped_spans
    from gpuprof.api import load_run

    monkeypatch.setenv(hooks.ENV_MAX_QUEUED, "1000")
    run_dir = tmp_path / "run"
    assert gpuprof.init(run_dir)
    try:
        recorder = hooks._recorder
        assert recorder.spans.maxlen == 1000
        with recorder.lock:  # the writer is stuck (a slow disk) while the loop records
            for _ in range(25_000):
                with gpuprof.phase("rollout"):
                    pass
            assert len(recorder.spans) == 1000  # memory stays bounded
    finally:
        gpuprof.shutdown()
    run = load_run(run_dir)
    stored = int((run.spans["phase"] == "rollout").sum())
    assert stored == 1000
    assert dropped_spans(run) == 24_000
    assert any("24000 spans were dropped" in n for n in data_notes(run))


def test_children_use_the_implementation_they_are_given(implementation):
    code = "from gpuprof import hooks; print(hooks.phase is hooks._PyPhase)"
    out = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True,
                         text=True, check=True, timeout=120)  # fmt: skip
    assert out.stdout.strip() == str(implementation == "python")


def test_a_phase_holds_no_reference_after_its_span_is_written(run_dir):
    # the C path counts references by hand: a leaked name, attribute dict or step number
    # would grow without bound over a long run
    name, value = "rollout-" + str(os.getpid()), object()
    with gpuprof.phase(name):  # the writer's cache of phase names keeps one for good
        pass
    gpuprof.flush()
    before = sys.getrefcount(name), sys.getrefcount(value)
    for _ in range(10_000):
        with gpuprof.phase(name, obj=value):
            pass
        with gpuprof.phase(name):
            pass
    gpuprof.flush()
    assert (sys.getrefcount(name), sys.getrefcount(value)) == before
    spans = _load(run_dir).spans
    assert (spans["name"] == name).sum() == 20_001


def test_a_phase_in_a_reference_cycle_is_collected(run_dir):
    import gc

    collected = threading.Event()

    class Finalised:
        def __del__(self):
            collected.set()

    span = gpuprof.phase("reward", holder=None)
    span.attrs["holder"] = [span, Finalised()]  # span → attrs → list → span
    del span
    gc.collect()
    assert collected.is_set()


def test_phase_arguments_are_checked_alike():
    assert gpuprof.phase(name="rollout", tokens=3).name == "rollout"
    assert gpuprof.phase(name="rollout", tokens=3).attrs == {"tokens": 3}
    assert gpuprof.phase("rollout").attrs is None
    attrs = {"tokens": 3}
    assert gpuprof.phase("rollout", **attrs).attrs is not attrs  # a dict of its own
    with pytest.raises(TypeError):
        gpuprof.phase()
    with pytest.raises(TypeError):
        gpuprof.phase("a", "b")
    with pytest.raises(TypeError):
        gpuprof.phase("a", name="b")


def test_an_error_on_the_recording_path_disables_the_hooks_without_raising(run_dir, capsys):
    recorder = hooks._recorder

    def broken():
        raise RuntimeError("queue broke")

    recorder.tick = broken
    hooks._set_recorder(recorder)  # the hot path picks up the broken counter
    with gpuprof.phase("rollout"):
        pass
    with gpuprof.phase("reward"):  # now a no-op
        pass
    assert not gpuprof.enabled() or hooks._recorder is None
    err = capsys.readouterr().err
    assert err.count("hooks disabled after an internal error") == 1
    assert "queue broke" in err


def test_a_phase_whose_name_was_deleted_never_crashes_or_raises(run_dir, capsys):
    recorder = hooks._recorder
    span = gpuprof.phase("rollout")
    del span.name  # by hand: the C hot path must not read a missing reference
    with span:
        pass
    with gpuprof.phase("reward"):
        pass
    recorder.flush()
    # a span that could not be made is not one the queue let go
    assert "dropped" not in capsys.readouterr().err
