"""A GRPO-like loop with one deliberately slow part, for the stack-sampling tests.

    python grpo_slow.py --steps 5 --slow reward   # the reward function burns the CPU
    python grpo_slow.py --steps 5 --slow loader   # the dataset's __getitem__ does, in a
                                                  # DataLoader worker process

Each step loads a batch (``dataload``), "generates" (``rollout``: small matrix products),
scores it (``reward``) and "trains" (``update_actor``), annotated with gpuprof phases. The
slow function does its work in its own body, so it is the innermost user frame of its stacks.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset

import gpuprof


def matmuls(seconds: float) -> None:
    """Stand-in for generation or an update: tensor work for ``seconds``."""
    x = torch.randn(64, 64)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        x = (x @ x).tanh()


class SlowPrompts(Dataset):
    """Prompts whose decoding costs ``cost_s`` of CPU each."""

    def __init__(self, size: int, cost_s: float) -> None:
        self.size, self.cost_s = size, cost_s

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        acc, end = index, time.perf_counter() + self.cost_s
        while time.perf_counter() < end:  # decoding and augmenting a sample, slowly
            acc = (acc * 1103515245 + 12345) % 2147483648
        return torch.tensor([acc % 10, index % 10, 1, 2])


def verify(batch: torch.Tensor, cost_s: float) -> list[float]:
    """The reward: checks every answer, slowly (a symbolic-math verifier would)."""
    rewards, end = [], time.perf_counter() + cost_s
    acc = int(batch.sum())
    while time.perf_counter() < end:
        acc = (acc * 1103515245 + 12345) % 2147483648
    for row in batch.tolist():
        rewards.append(float(sum(row) % 2 == acc % 2))
    return rewards


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--slow", choices=["reward", "loader", "none"], default="reward")
    p.add_argument("--cost", type=float, default=1.0, help="seconds the slow part takes a step")
    p.add_argument("--batch-size", type=int, default=8)
    args = p.parse_args()
    torch.set_num_threads(1)
    item_cost = args.cost / args.batch_size if args.slow == "loader" else 0.0
    reward_cost = args.cost if args.slow == "reward" else 0.02
    loader = DataLoader(SlowPrompts(args.steps * args.batch_size, item_cost),
                        batch_size=args.batch_size, num_workers=1)  # fmt: skip
    batches = iter(loader)
    for step in range(args.steps):
        start = time.perf_counter()
        with gpuprof.phase("dataload"):
            batch = next(batches)
        with gpuprof.phase("rollout"):
            matmuls(0.15)
        with gpuprof.phase("reward"):
            rewards = verify(batch, reward_cost)
        with gpuprof.phase("update_actor"):
            matmuls(0.15)
        gpuprof.step(n=step)
        print(f"step {step} reward {sum(rewards) / len(rewards):.2f} "
              f"time {(time.perf_counter() - start) * 1000:.1f} ms", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
