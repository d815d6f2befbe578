"""TRL's GRPOTrainer on CPU with a tiny model built here: no hub, no GPU, no gpuprof code.

    gpuprof watch -- python examples/trl_grpo_tiny.py --steps 3

A word-level tokenizer (``tokenizers`` WordLevel wrapped in ``PreTrainedTokenizerFast``), a
2-layer Llama with a 32-wide hidden state, prompts made up in memory and a rule-based reward
(the share of completion words that are "good"). Under ``gpuprof watch`` the bootstrap
records TRL's own phases (generation, reward, log-prob passes, the update) and each step;
this file does not import gpuprof.
"""

from __future__ import annotations

import argparse
import os
import tempfile

WORDS = ["good", "bad", "fast", "slow", "red", "blue", "cat", "dog", "runs", "sits", "the", "a"]
SPECIAL = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]


def build_tokenizer():
    """A whitespace word-level tokenizer over `WORDS`, as a transformers tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="[PAD]",
        unk_token="[UNK]",
        bos_token="[BOS]",
        eos_token="[EOS]",
    )


def build_model(tokenizer, seed: int = 0):
    """A 2-layer Llama small enough to train on one CPU core in seconds."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(config)


def good_word_reward(completions: list[str], **kwargs) -> list[float]:
    """Rule-based reward: the share of a completion's words that are "good"."""
    out = []
    for text in completions:
        words = text.split()
        out.append(sum(w == "good" for w in words) / len(words) if words else 0.0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps")
    parser.add_argument("--generations", type=int, default=4, help="completions per prompt")
    # long enough that generating takes most of the step, as it does in real GRPO runs
    parser.add_argument("--max-completion-length", type=int, default=16)
    parser.add_argument("--output-dir", default=None, help="TRL's output dir (default: a temp)")
    parser.add_argument("--report-to", default="none",
                        help="transformers' report_to: 'mlflow' logs TRL's own profiling "
                             "timings to MLFLOW_TRACKING_URI")  # fmt: skip
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    subjects = ["the cat", "a dog", "the red cat", "a blue dog", "the fast dog", "a slow cat"]
    prompts = [f"{s} {verb}" for s in subjects for verb in ("runs", "sits")]
    dataset = Dataset.from_dict({"prompt": prompts})

    output_dir = args.output_dir or tempfile.mkdtemp(prefix="trl-grpo-tiny-")
    # TRL loads the reference model from the policy's path: save the tiny model locally
    model_dir = os.path.join(output_dir, "tiny-llama")
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    config = GRPOConfig(
        output_dir=output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=args.generations,
        num_generations=args.generations,
        max_completion_length=args.max_completion_length,
        learning_rate=1e-3,
        beta=0.04,  # a reference model, so the reference log-prob pass runs too
        logging_steps=1,
        save_strategy="no",
        report_to=args.report_to,
        use_cpu=True,
        bf16=False,
        dataloader_num_workers=0,
        seed=0,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=good_word_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.train()
    print(f"trained {trainer.state.global_step} steps in {output_dir}", flush=True)


if __name__ == "__main__":
    main()
