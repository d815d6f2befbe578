from gpuprof.redact import is_secret_name, redact_command


def test_secret_names_match_whole_words():
    for name in [
        "WANDB_API_KEY",
        "--hf-token",
        "trainer.secret",
        "PASSWORD",
        "--apiKey",
        "db_passwd",
    ]:
        assert is_secret_name(name), name
    for name in [
        "model.tokenizer",
        "--max_tokens",
        "data.max_prompt_length",
        "--keyboard",
        "monkey",
    ]:
        assert not is_secret_name(name), name


def test_redact_command_hides_values_and_keeps_the_rest():
    argv = [
        "WANDB_API_KEY=abc123",
        "python",
        "-m",
        "verl.trainer.main_ppo",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        "trainer.hf_token=hf_xyz",
        "--api-key",
        "sk-live",
        "--password=hunter2",
        "--token",
        "--next-flag",
        "https://user:pw@example.org/repo.git",
        "model.tokenizer=Qwen/Qwen2.5",
    ]
    out = redact_command(argv)
    text = " ".join(out)
    for secret in ["abc123", "hf_xyz", "sk-live", "hunter2", ":pw@"]:
        assert secret not in text
    assert out[4] == "actor_rollout_ref.rollout.gpu_memory_utilization=0.3"
    assert out[9:11] == ["--token", "--next-flag"]  # a flag after a secret flag is not a value
    assert out[-1] == "model.tokenizer=Qwen/Qwen2.5"
    assert len(out) == len(argv)
