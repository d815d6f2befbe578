"""Self time: every sum of phase time counts a span less the spans of other phases nested in it.

`spans.self_ns` is checked against a brute-force reference (each elementary stretch of a
process handed to the deepest span covering it, found by counting containments) on generated
span trees, flat and nested, several processes and threads; then hand-nested hooks in a real
process are read back through the summary's phase table, the step's composition and the JSON
document, whose shares must add up and match the spans' own arithmetic.
"""

from __future__ import annotations

import itertools
import json
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
from conftest import clean_env, run_gpuprof
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuprof.analyzers.basic import phase_table
from gpuprof.analyzers.spans import owned_segments, self_in_steps_ns, self_ns
from gpuprof.api import load_run
from gpuprof.intervals import covered_ns
from gpuprof.model import span_depths

PHASES = ["rollout", "reward", "ref_logprob", "update_actor"]


def _frame(rows: list[tuple]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=["host", "pid", "tid", "phase", "start_ns", "end_ns"])
    frame["depth"] = span_depths(frame)
    frame["is_step"] = (frame["phase"] == "step").to_numpy(bool)
    return frame


def _reference(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per span, its self time and its self time inside a step, the slow way: every stretch
    between two boundaries of a process goes to the covering phase span that the most other
    covering phase spans contain (the innermost), else to a covering step span."""
    own = np.zeros(len(frame), dtype=np.int64)
    in_step = np.zeros(len(frame), dtype=np.int64)
    start, end = frame["start_ns"].tolist(), frame["end_ns"].tolist()
    is_step = frame["is_step"].tolist()

    def depth(i: int, among: list[int]) -> int:  # how many of ``among`` enclose span i
        return sum(1 for j in among if j != i and start[j] <= start[i] and end[i] <= end[j]
                   and (start[j], -end[j]) < (start[i], -end[i]))  # fmt: skip

    for rows in frame.groupby(["host", "pid"]).indices.values():
        bounds = sorted({start[i] for i in rows} | {end[i] for i in rows})
        for a, b in itertools.pairwise(bounds):
            cover = [i for i in rows if start[i] <= a < end[i]]
            phases = [i for i in cover if not is_step[i]]
            steps = [i for i in cover if is_step[i]]
            if not cover:
                continue
            owner = max(phases, key=lambda i, among=phases: depth(i, among)) if phases else steps[0]
            own[owner] += b - a
            if steps:
                in_step[owner] += b - a
    return own, in_step


@st.composite
def span_trees(draw: st.DrawFn) -> list[tuple]:
    """Processes of properly nested spans (one thread each, or two threads side by side
    that never overlap), each step holding a random tree of phases, some phases laid after
    their step."""
    rows: list[tuple] = []

    def tree(pid: int, start: int, end: int, level: int) -> None:
        cursor = start
        # children strictly shorter than their parent: two spans of one extent have no
        # inner one (hooks' nanosecond clocks never make them)
        while end - cursor >= 2 and level < 4 and draw(st.booleans()):
            s = cursor + draw(st.integers(0, (end - cursor) // 3))
            e = s + draw(st.integers(1, end - s))
            if (s, e) == (start, end):
                e -= 1
            rows.append(("h", pid, 1, draw(st.sampled_from(PHASES)), s, e))
            tree(pid, s, e, level + 1)
            cursor = e + draw(st.integers(0, 5))

    for pid in range(draw(st.integers(1, 3))):
        t = draw(st.integers(0, 50)) + 1_700_000_000_000_000_000 * draw(st.integers(0, 1))
        for _ in range(draw(st.integers(1, 3))):
            length = draw(st.integers(10, 400))
            rows.append(("h", pid, 1, "step", t, t + length))

            tree(pid, t, t + length, 0)
            t += length
            if draw(st.booleans()):  # a phase timed after the step's own timer stopped
                after = draw(st.integers(1, 30))
                rows.append(("h", pid, 1, "checkpoint", t, t + after))
                t += after
            t += draw(st.integers(0, 20))
    return rows


@given(span_trees())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_self_time_matches_a_brute_force_reference(rows):
    frame = _frame(rows)
    own, in_step = _reference(frame)
    # two identical spans may share their time either way: compare per distinct span
    key = [frame[c] for c in ("pid", "phase", "start_ns", "end_ns")]

    def same(got: np.ndarray, want: np.ndarray) -> None:
        by_span = pd.Series(got).groupby(key).sum().to_dict()
        assert by_span == pd.Series(want).groupby(key).sum().to_dict()

    same(self_ns(frame), own)
    same(self_in_steps_ns(frame), in_step)
    # the segments each process's time is cut into add up to what its spans cover
    s, e, _ = owned_segments(frame)
    assert int((e - s).sum()) == int(own.sum())
    for _, group in frame.groupby("pid"):
        covered = covered_ns(group["start_ns"].to_numpy(), group["end_ns"].to_numpy())
        assert covered == int(own[group.index].sum())


def test_the_quick_path_for_side_by_side_phases_agrees_with_the_full_one():
    rng = np.random.default_rng(3)
    rows = []
    for pid in range(4):
        t = 1_700_000_000_000_000_000 + int(rng.integers(0, 10**6))
        for _ in range(50):
            rows.append(("h", pid, 7, "step", t, t + 1000))
            cursor = t + int(rng.integers(0, 50))
            for phase in PHASES:
                length = int(rng.integers(0, 250))
                rows.append(("h", pid, 7, phase, cursor, cursor + length))
                cursor += length
            t += 1000 + int(rng.integers(0, 100))
    frame = _frame(rows)
    s, e, owner = owned_segments(frame)  # the full computation, segment by segment
    full = np.bincount(owner, weights=e - s, minlength=len(frame)).astype(np.int64)
    assert self_ns(frame).tolist() == full.tolist()
    assert self_ns(frame).tolist() == _reference(frame)[0].tolist()


def test_trl_shaped_nesting_charges_generation_to_rollout_not_to_the_update():
    """TRL's shape: the callback's training step (update_actor) encloses _prepare_inputs
    (rollout) → generate (rollout), the reference pass and the reward, then compute_loss and
    the optimizer step (update_actor)."""
    ms = 1_000_000
    rows = [
        ("h", 1, 1, "step", 0, 100 * ms),
        ("h", 1, 1, "update_actor", 0, 100 * ms),  # training_step
        ("h", 1, 1, "rollout", 1 * ms, 71 * ms),  # _prepare_inputs
        ("h", 1, 1, "rollout", 5 * ms, 55 * ms),  # generate
        ("h", 1, 1, "ref_logprob", 58 * ms, 66 * ms),
        ("h", 1, 1, "reward", 67 * ms, 70 * ms),
        ("h", 1, 1, "update_actor", 72 * ms, 90 * ms),  # compute_loss
        ("h", 1, 1, "update_actor", 95 * ms, 99 * ms),  # optimizer step
    ]
    frame = _frame(rows)
    by_phase = pd.Series(self_ns(frame)).groupby(frame["phase"]).sum() / ms
    assert by_phase["rollout"] == pytest.approx(70 - 8 - 3)
    assert by_phase["ref_logprob"] == 8 and by_phase["reward"] == 3
    assert by_phase["update_actor"] == pytest.approx(100 - 70)
    assert by_phase["step"] == 0
    assert by_phase.sum() == pytest.approx(100)


HAND_NESTED = textwrap.dedent(
    """
    import time
    import gpuprof

    def busy(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    for n in range(4):
        with gpuprof.phase("update_actor"):            # an outer phase a user opened first
            busy(0.02)
            with gpuprof.phase("rollout"):
                busy(0.03)
                with gpuprof.phase("rollout"):        # the same phase nested: counted once
                    busy(0.05)
                with gpuprof.phase("reward"):
                    busy(0.01)
            busy(0.02)
        busy(0.005)                                    # step time outside every phase
        gpuprof.step(n=n)
    """
)


@pytest.fixture(scope="module")
def hand_nested(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nested")
    script = tmp / "loop.py"
    script.write_text(HAND_NESTED)
    run_dir = tmp / "run"
    proc = run_gpuprof("watch", "--no-nvml", "-q", "-o", str(run_dir), "--", sys.executable,
                       str(script), timeout=120, env=clean_env())  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return run_dir


def _by_hand(run) -> dict[str, float]:
    """Each phase's seconds from the spans' own arithmetic: rollout = the outer rollout less
    the reward inside it; reward = its spans; update_actor = its spans less the outer
    rollout; the step's own = the step less the update."""
    sp = run.spans
    dur = (sp["end_ns"] - sp["start_ns"]) / 1e9
    steps = sp["phase"] == "step"
    update = sp["phase"] == "update_actor"
    reward = sp["phase"] == "reward"
    rollout = sp["phase"] == "rollout"
    # outer rollouts: those no other rollout span encloses (the longer of each pair)
    longest = dur.where(rollout).groupby(sp["step"]).transform("max")
    outer = rollout & (dur >= longest)
    return {
        "rollout": float(dur[outer].sum() - dur[reward].sum()),
        "reward": float(dur[reward].sum()),
        "update_actor": float(dur[update].sum() - dur[outer].sum()),
        "step": float(dur[steps].sum() - dur[update].sum()),
    }


def test_hand_nested_hooks_add_up_by_self_time_on_every_screen(hand_nested):
    run = load_run(hand_nested)
    expected = _by_hand(run)
    steps = run.spans[run.spans["phase"] == "step"]
    step_total = float((steps["end_ns"] - steps["start_ns"]).sum()) / 1e9
    table = phase_table(run).set_index("phase")
    for phase, seconds in expected.items():
        assert table.loc[phase, "total_s"] == pytest.approx(seconds, abs=1e-6), phase
        assert table.loc[phase, "step_share"] == pytest.approx(seconds / step_total, abs=1e-6)
    assert table["step_share"].sum() == pytest.approx(1.0, abs=1e-6)
    # the bound, from the same arithmetic, in the JSON document and on the terminal
    proc = run_gpuprof("analyze", str(hand_nested), "--json")
    assert proc.returncode == 0, proc.stderr
    bound = json.loads(proc.stdout)["summary"]["bound"]
    shares = {r["phase"]: r["share"] for r in bound["composition"]}
    assert sum(shares.values()) == pytest.approx(1.0, abs=0.01)
    assert shares["rollout"] == pytest.approx(expected["rollout"] / step_total, abs=0.01)
    assert shares["update_actor"] == pytest.approx(expected["update_actor"] / step_total,
                                                   abs=0.01)  # fmt: skip
    assert bound["bound"] == ["rollout"], bound["verdict"]
    text = run_gpuprof("analyze", str(hand_nested)).stdout
    assert "rollout bounds the step" in text
    # the summary's table: the 'of steps' column adds up to 100% (within rounding)
    summary = run_gpuprof("summary", str(hand_nested)).stdout
    rows = [line.split() for line in summary.splitlines()]
    column = [r[-2] for r in rows if len(r) > 2 and r[-1].endswith("%") and r[-2].endswith("%")]
    assert abs(sum(float(c.rstrip("%")) for c in column) - 100) <= len(column)


def test_efficiency_walls_keep_the_collectives_an_update_waits_on():
    """The per-phase walls behind MFU count a phase's self time with the collectives nested
    in it (an update's MFU is over its whole time; exposed communication is comm_bound's),
    but not another phase nested in it."""
    from gpuprof.analyzers.phase_work import phase_walls

    ms = 1_000_000
    rows = [
        ("h", 1, 1, "step", 0, 100 * ms),
        ("h", 1, 1, "update_actor", 0, 100 * ms),
        ("h", 1, 1, "rollout", 10 * ms, 50 * ms),
        ("h", 1, 1, "collective", 60 * ms, 80 * ms),  # the gradient all-reduce
    ]
    frame = pd.DataFrame(rows, columns=["host", "pid", "tid", "phase", "start_ns", "end_ns"])
    frame["step"] = 0
    frame["depth"] = span_depths(frame)
    frame["attrs"] = [{}] * len(frame)
    walls = phase_walls(frame).set_index("phase")["wall_s"]
    assert walls["update_actor"] == pytest.approx(0.060)  # 100 − 40 of generation
    assert walls["rollout"] == pytest.approx(0.040)
