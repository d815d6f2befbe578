"""A tiny but real GRPO loop on CPU (or a GPU with --device cuda), annotated with gpuprof phases.

The policy is a small causal transformer that learns, from reward alone, to reverse a string
of digits: the prompt ``3141=`` should be answered with ``1413.`` (``.`` ends the answer).
One training step goes through the same phases as a GRPO step in verl, TRL or OpenRLHF:

    dataload      next batch of prompts from a DataLoader
    rollout       sample ``group_size`` answers per prompt from a separate rollout model
    reward        score every answer with a rule (format + per-digit correctness)
    old_logprob   log-probs of the sampled tokens under the current policy (no grad)
    ref_logprob   log-probs under a frozen reference model, for the KL penalty
    advantage     group-normalised advantages: (reward - group mean) / (group std + eps)
    update_actor  clipped policy-gradient loss + KL, AdamW, one or more mini-batches
    reshard       copy the updated weights into the rollout model ("weight sync")

Run it on its own, or under the profiler:

    python examples/grpo_tiny.py --steps 20
    gpuprof watch -- python examples/grpo_tiny.py --steps 20

Outside ``gpuprof watch`` the ``gpuprof.phase`` / ``gpuprof.step`` hooks do nothing.
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import gpuprof

# --------------------------------------------------------------------------------------------
# Task: vocabulary, prompts and the rule-based reward
# --------------------------------------------------------------------------------------------

EOS = "."  # ends an answer
PAD = "_"  # fills a finished answer up to the longest one in the batch
VOCAB = "0123456789+=" + EOS + PAD
TOKEN_ID = {ch: i for i, ch in enumerate(VOCAB)}
EOS_ID = TOKEN_ID[EOS]
PAD_ID = TOKEN_ID[PAD]

FORMAT_WEIGHT = 0.2  # share of the reward for a well-formed answer; the rest is correctness


def encode(text: str) -> list[int]:
    """Characters -> token ids."""
    return [TOKEN_ID[ch] for ch in text]


def decode(ids: Sequence[int]) -> str:
    """Token ids -> characters."""
    return "".join(VOCAB[i] for i in ids)


def make_problem(rng: random.Random, num_digits: int) -> tuple[str, str]:
    """One prompt and its expected answer, e.g. ``("3141=", "1413")``."""
    digits = "".join(rng.choice("0123456789") for _ in range(num_digits))
    return digits + "=", digits[::-1]


def score(completion: str, answer: str) -> float:
    """Rule-based reward in [0, 1] for one sampled completion.

    ``FORMAT_WEIGHT`` is earned by digits-only text terminated by EOS; the remainder is the
    fraction of positions that hold the right digit, divided by the longer of the two strings so
    that padding an answer with extra digits does not pay.
    """
    text, eos, _ = completion.partition(EOS)
    well_formed = bool(eos) and text.isdigit()
    matches = sum(a == b for a, b in zip(text, answer, strict=False))
    accuracy = matches / max(len(text), len(answer))
    return FORMAT_WEIGHT * well_formed + (1.0 - FORMAT_WEIGHT) * accuracy


class PromptDataset(Dataset):
    """Prompts generated deterministically from ``(seed, index)``.

    Each item depends only on its index, so the stream is identical whatever the number of
    DataLoader workers and whichever worker produces the item.
    """

    def __init__(self, size: int, num_digits: int, seed: int, item_cost_s: float = 0.0) -> None:
        self.size = size
        self.num_digits = num_digits
        self.seed = seed
        self.item_cost_s = item_cost_s

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor | str]:
        rng = random.Random(self.seed * 1_000_003 + index)
        prompt, answer = make_problem(rng, self.num_digits)
        burn_cpu(self.item_cost_s)  # e.g. decoding and augmenting a real sample
        return {"prompt_ids": torch.tensor(encode(prompt)), "answer": answer}


def forever(loader: DataLoader) -> Iterator[dict]:
    """Cycle through the loader epoch after epoch, as RL trainers do."""
    while True:
        yield from loader


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


class TinyCausalLM(nn.Module):
    """Token + learned position embeddings, pre-norm transformer blocks, LM head."""

    def __init__(self, max_len: int, d_model: int, n_layers: int, n_heads: int) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(len(VOCAB), d_model)
        self.pos_emb = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d_model,
                n_heads,
                dim_feedforward=4 * d_model,
                dropout=0.0,  # dropout would make old/new log-probs differ for no reason
                batch_first=True,
                norm_first=True,
            )
            for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, len(VOCAB))
        # Not persistent: the mask is derived data, so it stays out of the synced state dict.
        mask = nn.Transformer.generate_square_subsequent_mask(max_len)
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] int64 -> next-token logits [B, T, V]."""
        length = ids.shape[1]
        x = self.tok_emb(ids) + self.pos_emb(torch.arange(length, device=ids.device))
        mask = self.causal_mask[:length, :length]
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        return self.head(self.norm(x))


# --------------------------------------------------------------------------------------------
# The GRPO pieces, one function per phase
# --------------------------------------------------------------------------------------------


@torch.inference_mode()
def generate(
    model: nn.Module,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """Sample completions autoregressively.

    prompt_ids [B, P] -> completion ids [B, N] with N <= max_new_tokens; after a row's EOS the
    row is filled with PAD. No KV cache: every step re-runs the whole (short) sequence.
    """
    seq = prompt_ids
    finished = torch.zeros(prompt_ids.shape[0], dtype=torch.bool, device=prompt_ids.device)
    new_tokens = []
    for _ in range(max_new_tokens):
        logits = model(seq)[:, -1] / temperature
        token = torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(1)
        token = token.masked_fill(finished, PAD_ID)
        new_tokens.append(token)
        seq = torch.cat([seq, token[:, None]], dim=1)
        finished |= token == EOS_ID
        if finished.all():  # stop early: the batch is as long as its longest answer
            break
    return torch.stack(new_tokens, dim=1)


def completion_mask(completion_ids: torch.Tensor) -> torch.Tensor:
    """[B, N] ids -> [B, N] float mask, 1 for tokens up to and including the first EOS."""
    is_eos = (completion_ids == EOS_ID).long()
    eos_before = is_eos.cumsum(dim=1) - is_eos  # EOS strictly before this position
    return (eos_before == 0).float()


def completion_logprobs(
    model: nn.Module, prompt_ids: torch.Tensor, completion_ids: torch.Tensor
) -> torch.Tensor:
    """Log-probability of each sampled token: [B, P] + [B, N] -> [B, N] (nats)."""
    seq = torch.cat([prompt_ids, completion_ids], dim=1)
    # Logits at position t predict token t+1, so the completion is predicted from P-1 on.
    logits = model(seq[:, :-1])[:, prompt_ids.shape[1] - 1 :]
    return logits.log_softmax(-1).gather(-1, completion_ids[..., None]).squeeze(-1)


def burn_cpu(seconds: float) -> None:
    """Busy the calling thread for ``seconds`` of wall time (CPU work, not a sleep)."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x = (x * 1103515245 + 12345) % 2147483648


def score_batch(
    completion_ids: torch.Tensor, answers: Sequence[str], cost_s: float = 0.0
) -> torch.Tensor:
    """Rule-based reward per completion: [B, N] ids + B answers -> [B] rewards in [0, 1].

    ``cost_s``: extra CPU seconds per batch, as a verifier that runs code in a sandbox costs.
    """
    texts = [decode(row) for row in completion_ids.tolist()]
    burn_cpu(cost_s)
    return torch.tensor([score(text, ans) for text, ans in zip(texts, answers, strict=True)])


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """GRPO advantage: each reward relative to the other answers to the same prompt.

    rewards [B*G] (grouped consecutively) -> advantages [B*G]. A group whose answers all score
    the same gets zero advantage: it carries no signal about which answer is better.
    """
    grouped = rewards.view(-1, group_size)
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True)
    return ((grouped - mean) / (std + eps)).flatten()


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    kl_coef: float,
) -> torch.Tensor:
    """Clipped policy-gradient loss plus a KL penalty towards the reference model.

    Token tensors are [B, N]; ``advantages`` is [B], shared by every token of an answer.
    The KL uses the non-negative estimator exp(ref - logp) - (ref - logp) - 1. Each answer's
    tokens are averaged first, then answers are averaged, as in the GRPO paper.
    """
    ratio = torch.exp(logp - old_logp)
    adv = advantages[:, None]
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    log_ref_ratio = ref_logp - logp
    kl = torch.exp(log_ref_ratio) - log_ref_ratio - 1
    per_token = -surrogate + kl_coef * kl
    per_answer = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    return per_answer.mean()


def update_actor(
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    prompt_ids: torch.Tensor,
    completion_ids: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor,
    advantages: torch.Tensor,
    args: argparse.Namespace,
    generator: torch.Generator,
) -> float:
    """One pass over the rollout batch in ``args.mini_batches`` shuffled mini-batches.

    Returns the mean loss. From the second mini-batch on the policy has moved, so the ratio
    to the old log-probs departs from 1 and the clip starts to matter.
    """
    mask = completion_mask(completion_ids)
    order = torch.randperm(len(prompt_ids), generator=generator)
    losses = []
    for idx in order.chunk(args.mini_batches):
        logp = completion_logprobs(policy, prompt_ids[idx], completion_ids[idx])
        loss = grpo_loss(
            logp, old_logp[idx], ref_logp[idx], advantages[idx], mask[idx], args.clip, args.kl_coef
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    return sum(losses) / len(losses)


def state_dict_bytes(model: nn.Module) -> int:
    """Size of the weights a reshard moves, in bytes."""
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


# --------------------------------------------------------------------------------------------
# Training loop
# --------------------------------------------------------------------------------------------


@dataclass
class StepStats:
    """What one step printed: mean reward in [0, 1], loss, wall time (s), generated tokens."""

    step: int
    reward: float
    exact: float
    loss: float
    seconds: float
    tokens: int


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options; every default is sized for a step of ~0.1-0.2 s on one CPU core."""
    p = argparse.ArgumentParser(description="A tiny GRPO loop on CPU, annotated with gpuprof.")
    p.add_argument("--steps", type=int, default=20, help="training steps")
    p.add_argument("--batch-size", type=int, default=32, help="prompts per step")
    p.add_argument("--group-size", type=int, default=4, help="answers sampled per prompt")
    p.add_argument("--num-digits", type=int, default=4, help="length of the digit string")
    p.add_argument("--max-new-tokens", type=int, default=8, help="answer length limit")
    p.add_argument("--temperature", type=float, default=1.0, help="rollout sampling temperature")
    p.add_argument("--d-model", type=int, default=128, help="transformer width")
    p.add_argument("--layers", type=int, default=2, help="transformer blocks")
    p.add_argument("--heads", type=int, default=4, help="attention heads")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    p.add_argument("--clip", type=float, default=0.2, help="PPO ratio clip epsilon")
    p.add_argument(
        "--kl-coef", type=float, default=0.01, help="KL penalty weight (towards the initial model)"
    )
    p.add_argument("--mini-batches", type=int, default=2, help="optimizer steps per step")
    p.add_argument("--seed", type=int, default=0, help="seed for data, init and sampling")
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument(
        "--reward-cost", type=float, default=0.0,
        help="extra CPU seconds the reward takes per step (a slow verifier)",
    )  # fmt: skip
    p.add_argument(
        "--item-cost", type=float, default=0.0,
        help="extra CPU seconds per dataset item (a slow loader)",
    )  # fmt: skip
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument(
        "--device", default="cpu",
        help="where the models run: cpu (default) or cuda[:N] on a machine with a GPU",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.group_size < 2:
        p.error("--group-size must be at least 2: advantages compare answers within a group")
    if not 1 <= args.mini_batches <= args.batch_size * args.group_size:
        p.error("--mini-batches must be between 1 and batch-size x group-size")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        p.error(f"--device {args.device!r}: not a device torch knows (cpu, cuda, cuda:1, ...)")
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device {args.device}: this torch sees no CUDA GPU")
    return args


def main(argv: Sequence[str] | None = None) -> list[StepStats]:
    """Train and print one line per step; returns the per-step statistics."""
    args = parse_args(argv)
    # One thread by default leaves a core for the profiler's sampler on small machines.
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    device = torch.device(args.device)
    # Sampling draws on the models' device, so its generator lives there too.
    sampler = generator if device.type == "cpu" else torch.Generator(device)
    sampler.manual_seed(args.seed)

    dataset = PromptDataset(
        max(args.steps, 1) * args.batch_size, args.num_digits, args.seed, args.item_cost
    )
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        persistent_workers=args.num_workers > 0,
        drop_last=True,
    )
    batches = forever(loader)

    max_len = args.num_digits + 1 + args.max_new_tokens
    policy = TinyCausalLM(max_len, args.d_model, args.layers, args.heads).to(device)
    # The reference stays at the initial weights; the rollout model is a separate copy, as an
    # inference engine holds its own weights and only sees updates through a reshard.
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    rollout_model = copy.deepcopy(policy).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr, weight_decay=0.0)
    weight_bytes = state_dict_bytes(policy)
    num_params = sum(p.numel() for p in policy.parameters())
    print(
        f"policy {num_params / 1e6:.2f} M params; {args.batch_size} prompts x "
        f"{args.group_size} answers per step; {args.threads} thread(s); {device}",
        flush=True,
    )

    history: list[StepStats] = []
    for step in range(args.steps):
        start = time.perf_counter()

        with gpuprof.phase("dataload"):
            batch = next(batches)
        # Every prompt is repeated group_size times, so rows i*G .. i*G+G-1 form one group.
        prompt_ids = batch["prompt_ids"].to(device).repeat_interleave(args.group_size, dim=0)
        answers = [a for a in batch["answer"] for _ in range(args.group_size)]

        with gpuprof.phase("rollout"):
            completion_ids = generate(
                rollout_model, prompt_ids, args.max_new_tokens, args.temperature, sampler
            )
        num_tokens = int(completion_mask(completion_ids).sum())

        with gpuprof.phase("reward"):
            rewards = score_batch(completion_ids, answers, args.reward_cost).to(device)

        with gpuprof.phase("old_logprob"), torch.no_grad():
            old_logp = completion_logprobs(policy, prompt_ids, completion_ids)

        with gpuprof.phase("ref_logprob"), torch.no_grad():
            ref_logp = completion_logprobs(reference, prompt_ids, completion_ids)

        with gpuprof.phase("advantage"):
            advantages = group_advantages(rewards, args.group_size)

        with gpuprof.phase("update_actor"):
            loss = update_actor(
                policy,
                optimizer,
                prompt_ids,
                completion_ids,
                old_logp,
                ref_logp,
                advantages,
                args,
                generator,
            )

        with gpuprof.phase("reshard", bytes=weight_bytes):
            rollout_model.load_state_dict(policy.state_dict())

        gpuprof.step(n=step, tokens=num_tokens)
        seconds = time.perf_counter() - start

        stats = StepStats(
            step=step,
            reward=rewards.mean().item(),
            exact=(rewards > 0.999).float().mean().item(),  # fully right answers
            loss=loss,
            seconds=seconds,
            tokens=num_tokens,
        )
        history.append(stats)
        print(
            f"step {step:4d}  reward {stats.reward:.3f}  exact {stats.exact:.2f}  "
            f"loss {stats.loss:+.4f}  time {seconds * 1000:6.1f} ms  "
            f"tokens/s {num_tokens / seconds:8.0f}",
            flush=True,
        )

    if history:
        median_ms = statistics.median(s.seconds for s in history) * 1000
        print(f"done: {len(history)} steps, median step {median_ms:.1f} ms", flush=True)
    return history


if __name__ == "__main__":
    main()
