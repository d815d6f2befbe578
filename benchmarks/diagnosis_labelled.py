"""Diagnosis accuracy on hand-labelled runs that the simulator did not make.

Each case is a file a user would import (the real third-party files of ``../shared/fixtures``
and ``tests/labelled/public`` — issue threads, published logs, profiler traces of real jobs,
labelled in its ``cases.json`` — and the public-format files of ``tests/labelled/builders.py``)
or a real CPU run of the GRPO example under ``gpuprof watch``, with the stall kinds a person
reading it names. Every case goes through the CLI (``gpuprof import`` / ``watch``, then
``analyze --json``). Prints, per case, the expected and found kinds and the phase that bounds
the step, then per kind found / missed / false, recall, false findings and exact matches; a
file the import rejects counts as found nothing. Last, how many public files each framework's
importer took, and each reason an import gave for refusing a file, with its count.

    python benchmarks/diagnosis_labelled.py [--public-only] [--src DIR]

``--src DIR`` runs another checkout's gpuprof (``git worktree add DIR REV``) on the same cases
and labels: the "before" column of docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from labelled import builders  # noqa: E402

FIXTURES = ROOT.parent / "shared" / "fixtures"
PUBLIC = ROOT / "tests" / "labelled" / "public"
EXAMPLE = ROOT / "examples" / "grpo_tiny.py"
TRL_EXAMPLE = ROOT / "examples" / "trl_grpo_tiny.py"
SRC: Path | None = None
"""Another checkout whose gpuprof runs instead of this one (``--src``)."""


class ImportRejected(Exception):
    """The import refused the file: the case found nothing."""


def gpuprof(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if SRC is not None:
        env["PYTHONPATH"] = str(SRC)
    # ``-m`` puts the working directory first on sys.path: run from the checkout measured
    return subprocess.run([sys.executable, "-m", "gpuprof", *args], capture_output=True,
                          text=True, timeout=600, env=env, cwd=SRC or ROOT)  # fmt: skip


def imported(path: Path | list[Path], tmp: Path) -> Path:
    run = tmp / "run"
    paths = path if isinstance(path, list) else [path]
    proc = gpuprof("import", *map(str, paths), "-o", str(run))
    if proc.returncode:
        line = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise ImportRejected(line[:100], line)
    return run


def watched(tmp: Path, *args: str) -> Path:
    run = tmp / "run"
    proc = gpuprof("watch", "--no-nvml", "-q", "-o", str(run), "--", sys.executable,
                   str(EXAMPLE), "--steps", "6", *args)  # fmt: skip
    if proc.returncode:
        raise RuntimeError(proc.stderr)
    return run


def watched_trl(tmp: Path) -> Path:
    """TRL's real GRPOTrainer on the tiny model under watch (no gpuprof code in it)."""
    run = tmp / "run"
    proc = gpuprof("watch", "--no-nvml", "-q", "-o", str(run), "--", sys.executable,
                   str(TRL_EXAMPLE), "--steps", "6", "--output-dir", str(tmp / "out"))  # fmt: skip
    if proc.returncode:
        raise RuntimeError(proc.stderr)
    return run


def fixture(name: str) -> Callable[[Path], Path]:
    return lambda tmp: imported(FIXTURES / name, tmp)


def built(make: Callable[[Path], Path], name: str) -> Callable[[Path], Path]:
    return lambda tmp: imported(make(tmp / name), tmp)


CASES: list[tuple[str, Callable[[Path], Path], set[str]]] = [
    ("fixture verl gemma-2b PPO, test_freq=10", fixture("verl/gemma2b_ppo_2gpu_old_format.log"),
     {"periodic_stall"}),
    ("fixture verl 16xH100 GSPO, update 40x ref", fixture("verl/issue_excerpt_16xh100.txt"),
     {"update_bound"}),
    ("fixture verl GH200 SGLang, slow generation", fixture("verl/issue_excerpt_gh200_sglang.txt"),
     {"rollout_bound"}),
    ("fixture nvidia-smi RTX 4090 inference", fixture("nvidia_smi/rtx4090_inference.csv"), set()),
    ("fixture Kineto DLRM 2 ranks, exposed NCCL",
     lambda tmp: imported([FIXTURES / "kineto" / f"hta_sampled_rank-{r}.json.gz" for r in (0, 1)],
                          tmp), {"comm_bound"}),
    ("fixture Kineto CNN V100, healthy",
     fixture("kineto/hta_ns_resolution_rank-0.pt.trace.json.gz"), set()),
    ("fixture Kineto AlexNet, cudaMalloc/cudaFree", fixture("kineto/hta_alexnet_benchmark.json.gz"),
     {"host_bound"}),
    ("verl log: checkpoint+validation every 10th step",
     built(builders.verl_periodic_checkpoint, "ppo.log"), {"periodic_stall"}),
    ("verl log: generation workers 170 s .. 690 s", built(builders.verl_long_tail, "grpo.log"),
     {"generation_tail"}),
    ("verl log: PPO critic 47% of the step at 1/3 actor MFU",
     built(builders.verl_critic_bound, "ppo.log"), {"update_bound"}),
    ("nvidia-smi: second GPU never used", built(builders.nvidia_smi_unused_second_gpu, "a.csv"),
     {"unused_gpu"}),
    ("nvidia-smi: one GPU far less busy", built(builders.nvidia_smi_one_gpu_underused, "b.csv"),
     {"imbalance"}),
    ("Kineto: ResNet-50, num_workers=0",
     built(builders.kineto_resnet_num_workers_0, "r.json.gz"), {"dataloader_starvation"}),
    ("CPU run: GRPO example, healthy", lambda tmp: watched(tmp), set()),
    ("CPU run: GRPO example, slow verifier", lambda tmp: watched(tmp, "--reward-cost", "0.4"),
     {"reward_bound"}),
    ("CPU run: GRPO example, slow loader", lambda tmp: watched(tmp, "--item-cost", "0.015"),
     {"dataloader_starvation"}),
    ("CPU run: TRL GRPOTrainer, generation-bound", watched_trl, set()),
]  # fmt: skip


RL_FRAMEWORKS = frozenset({"verl", "trl", "swift", "openrlhf", "other"})
"""Frameworks of RL post-training runs, whose labels say which phase bounds the step."""

FRAMEWORKS: dict[str, str] = {}
"""Public case name -> the framework or tool its cases.json entry names."""


def public_cases() -> list[tuple[str, Callable[[Path], Path], set[str], str | None]]:
    """The labelled files of tests/labelled/public (name, make, expected kinds, bound)."""
    cases = json.loads((PUBLIC / "cases.json").read_text())
    FRAMEWORKS.update({f"public {c['file'][:44]}": c.get("framework") or "?" for c in cases})
    return [
        (f"public {c['file'][:44]}", lambda tmp, f=c["file"]: imported(PUBLIC / f, tmp),
         set(c["expected_kinds"]), c.get("bound"))
        for c in cases
    ]  # fmt: skip


def main() -> None:
    global SRC
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--public-only", action="store_true", help="only tests/labelled/public")
    parser.add_argument("--src", type=Path, help="run this checkout's gpuprof instead")
    args = parser.parse_args()
    SRC = args.src.resolve() if args.src else None
    t0 = time.perf_counter()
    cases = [] if args.public_only else [(n, m, e, None) for n, m, e in CASES]
    cases += public_cases()
    per_kind: dict[str, list[int]] = {}  # kind -> [found, missed, false]
    expected_n = found_n = false_n = exact = ran = rejected = 0
    bound_right = bound_cases = verdict_right = 0
    verdict_extra: list[str] = []  # RL runs labelled without a bound that the verdict bounds
    by_framework: dict[str, list[int]] = {}  # framework -> [imported, cases]
    reasons: dict[str, int] = {}  # why the import refused a file -> files
    print(f"{'case':52s} {'expected':26s} {'found':30s} bound")
    for name, make, expected, bound in cases:
        if name.startswith("fixture") and not FIXTURES.is_dir():
            print(f"{name:52s} skipped: no ../shared/fixtures")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            try:
                run = make(Path(tmp))
                doc = json.loads(gpuprof("analyze", str(run), "--json").stdout)
            except ImportRejected as exc:
                doc, note = {"findings": [], "summary": {}}, f"import rejected: {exc.args[0]}"
                rejected += 1
                # the reason without the file: 'gpuprof: error: /x/a.log: format not recognised'
                why = re.sub(r"^gpuprof: error: (\S+: )?", "", exc.args[-1])
                reasons[why] = reasons.get(why, 0) + 1
            else:
                note = ""
        kinds = {f["kind"] for f in doc["findings"]}
        # the phase that takes most of the step (the bound when one dominates)
        composition = (doc["summary"].get("bound") or {}).get("composition") or [{}]
        got_bound = composition[0].get("phase")
        verdict = (doc["summary"].get("bound") or {}).get("bound") or []
        ran += 1
        if name in FRAMEWORKS:
            counts = by_framework.setdefault(FRAMEWORKS[name], [0, 0])
            counts[0] += not note
            counts[1] += 1
        expected_n += len(expected)
        found_n += len(expected & kinds)
        false_n += len(kinds - expected)
        exact += kinds == expected
        for kind in expected | kinds:
            row = per_kind.setdefault(kind, [0, 0, 0])
            row[0 if kind in expected & kinds else 1 if kind in expected else 2] += 1
        if bound:
            bound_cases += 1
            bound_right += got_bound == bound
            verdict_right += bound in verdict
        elif verdict and FRAMEWORKS.get(name) in RL_FRAMEWORKS:
            verdict_extra.append(f"{name}: {' and '.join(verdict)}")
        shown = note or ", ".join(sorted(kinds)) or "(none)"
        want = ", ".join(sorted(expected)) or "(none)"
        bound_text = f"{got_bound or '-'}" + (f" (want {bound})" if bound else "")
        bound_text += f" [{'+'.join(verdict) or 'none dominates' if composition[0] else '-'}]"
        print(f"{name:52s} {want:26s} {shown[:30]:30s} {bound_text}")
    print(f"\n{ran} labelled runs in {time.perf_counter() - t0:.0f} s ({rejected} rejected)")
    print(f"{'kind':24s} found missed false")
    for kind, (f, m, x) in sorted(per_kind.items()):
        print(f"{kind:24s} {f:5d} {m:6d} {x:5d}")
    print(f"expected kinds found: {found_n}/{expected_n}")
    print(f"false findings:       {false_n}")
    print(f"exact matches:        {exact}/{ran}")
    print(f"largest phase named:  {bound_right}/{bound_cases}")
    print(f"bound verdict names the labelled phase: {verdict_right}/{bound_cases}")
    print(f"RL runs labelled without a bound that the verdict bounds: {len(verdict_extra)}")
    for line in verdict_extra:
        print(f"  {line}")
    if by_framework:
        shown = ", ".join(f"{fw} {i}/{n}" for fw, (i, n) in sorted(by_framework.items()))
        print(f"public files imported by framework: {shown}")
    for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"rejected ({n}): {why}")


if __name__ == "__main__":
    main()
