"""Diagnosis accuracy on hand-labelled runs that the simulator did not make.

Each case is a file a user would import (the real third-party files of ``../shared/fixtures``
and the public-format files of ``tests/labelled/builders.py``) or a real CPU run of the GRPO
example under ``gpuprof watch``, with the stall kinds a person reading it names. Every case
goes through the CLI (``gpuprof import`` / ``watch``, then ``analyze --json``). Prints, per
case, the expected and found kinds, then recall (expected kinds found), false findings (kinds
found that were not expected) and exact matches.

    python benchmarks/diagnosis_labelled.py
"""

from __future__ import annotations

import json
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
EXAMPLE = ROOT / "examples" / "grpo_tiny.py"


def gpuprof(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuprof", *args], capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def imported(path: Path, tmp: Path) -> Path:
    run = tmp / "run"
    proc = gpuprof("import", str(path), "-o", str(run))
    if proc.returncode:
        raise RuntimeError(proc.stderr)
    return run


def watched(tmp: Path, *args: str) -> Path:
    run = tmp / "run"
    proc = gpuprof("watch", "--no-nvml", "-q", "-o", str(run), "--", sys.executable,
                   str(EXAMPLE), "--steps", "6", *args)  # fmt: skip
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
    ("fixture verl 16xH100 GSPO excerpt", fixture("verl/issue_excerpt_16xh100.txt"), set()),
    ("fixture verl GH200 SGLang step", fixture("verl/issue_excerpt_gh200_sglang.txt"), set()),
    ("fixture nvidia-smi RTX 4090 inference", fixture("nvidia_smi/rtx4090_inference.csv"), set()),
    ("verl log: checkpoint+validation every 10th step",
     built(builders.verl_periodic_checkpoint, "ppo.log"), {"periodic_stall"}),
    ("verl log: generation workers 170 s .. 690 s", built(builders.verl_long_tail, "grpo.log"),
     {"generation_tail"}),
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
]  # fmt: skip


def main() -> None:
    t0 = time.perf_counter()
    expected_n = found_n = false_n = exact = ran = 0
    print(f"{'case':50s} {'expected':28s} found")
    for name, make, expected in CASES:
        if name.startswith("fixture") and not FIXTURES.is_dir():
            print(f"{name:50s} skipped: no ../shared/fixtures")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            run = make(Path(tmp))
            doc = json.loads(gpuprof("analyze", str(run), "--json").stdout)
        kinds = {f["kind"] for f in doc["findings"]}
        ran += 1
        expected_n += len(expected)
        found_n += len(expected & kinds)
        false_n += len(kinds - expected)
        exact += kinds == expected
        shown = ", ".join(sorted(kinds)) or "(none)"
        print(f"{name:50s} {', '.join(sorted(expected)) or '(none)':28s} {shown}")
    print(f"\n{ran} labelled runs in {time.perf_counter() - t0:.0f} s")
    print(f"expected kinds found: {found_n}/{expected_n}")
    print(f"false findings:       {false_n}")
    print(f"exact matches:        {exact}/{ran}")


if __name__ == "__main__":
    main()
