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


# ----------------------------------------------------------------- output lines and knobs
import contextlib  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402

import pandas as pd  # noqa: E402
from conftest import clean_env, gpuprof_cmd, run_gpuprof  # noqa: E402
from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gpuprof.redact import redact_knobs, redact_text  # noqa: E402

_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_SECRET = st.text(alphabet=_ALNUM, min_size=36, max_size=48)
_PLANTINGS = [
    "Authorization: Bearer {s}",
    "curl -H 'Authorization: Basic {s}' https://x",
    "--passphrase {s} --lr 1e-5",
    "--api-key -{s}",
    "redis://:{s}@cache:6379/0",
    "https://{s}@github.com/org/repo.git",
    "https://user:{s}@host/path",
    "HF_TOKEN={s} python train.py",
    '{{"wandb_api_key": "{s}", "max_tokens": 512}}',
    "['train.py', '--api-key', '{s}', '--lr', '1e-5']",
    "('--hf_token', '{s}')",
    '["--password", "{s}", "--seed", "1"]',
    "sys.argv=['x','--wandb-key','{s}']",
    "trainer.wandb_token={s}",
    "hf_{s}",
    "sk-proj-{s}",
    "ghp_{s}",
    "AKIA{u16}",
]


@settings(max_examples=150, deadline=None)
@example(  # a "name: value" before the assignment swallowed it (found in CI)
    secret="0" * 36, planting="HF_TOKEN={s} python train.py", before="A:", after=""
)
@given(
    secret=_SECRET,
    planting=st.sampled_from(_PLANTINGS),
    before=st.text(alphabet=_ALNUM + " .:/-", max_size=30),
    after=st.text(alphabet=_ALNUM + " .:/-", max_size=30),
)
def test_no_planted_secret_survives_an_output_line(secret, planting, before, after):
    u16 = "".join(c for c in secret.upper() if c.isalnum())[:16].ljust(16, "Z")
    line = f"{before} {planting.format(s=secret, u16=u16)} {after}"
    out = redact_text(line)
    assert secret not in out and "-" + secret not in out
    assert u16 not in out or "AKIA" not in planting


def test_ordinary_lines_are_kept():
    for line in [
        "step:3 - timing_s/gen:12.5 - response_length/mean:300.2 - actor/pg_loss:-0.01",
        "max_tokens=512 tokenizer=gpt2 num_tokens: 1024",
        "{'loss': 0.51, 'grad_norm': 1.2, 'learning_rate': 1e-06, 'epoch': 0.33}",
        "Global step 4: {'policy_loss': 0.1, 'timing/generation': 12.0}",
    ]:
        assert redact_text(line) == line


def test_knobs_with_secret_names_or_values_are_redacted():
    knobs = {"trainer.wandb_api_key": "abc", "lr": 1e-5, "report_url": "https://u:pw@h/x"}
    out = redact_knobs(knobs)
    assert out == {"trainer.wandb_api_key": "***", "lr": 1e-5, "report_url": "https://u:***@h/x"}


PLANTED = {
    "bearer": "eyJhbGciOiJIUzI1NiJ9payloadSecretA1",
    "hf": "hf_" + "Q" * 34,
    "sk": "sk-proj-" + "R" * 40,
    "ghp": "ghp_" + "S" * 36,
    "aws": "AKIA" + "T" * 16,
    "pw": "redisPasswordU2v9",
    "flag": "passphraseValueV7x",
    "cmd": "apiKeyOnTheCommandLineW3",
}
CHILD = f"""
import sys
p = {PLANTED!r}
print("Authorization: Bearer " + p["bearer"])
print("logging in with " + p["hf"] + " and " + p["sk"])
print("cloning https://" + p["ghp"] + "@github.com/org/repo.git", file=sys.stderr)
print("aws key " + p["aws"] + " redis://:" + p["pw"] + "@cache:6379")
print("argv:", " ".join(sys.argv))
print(sys.argv)
import os, time
# held open until the test has scraped the metrics endpoint (the gate file appears)
gate = os.environ.get("GATE")
deadline = time.monotonic() + 120
while gate and not os.path.exists(gate) and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_no_planted_secret_anywhere_in_the_run_report_or_exports(tmp_path):
    """A watched program prints secrets and gets one on its command line: neither the run
    directory, nor the report, nor the exports, nor the trackers gpuprof logs to (TensorBoard,
    MLflow), nor its Prometheus endpoint hold any of them."""
    run = tmp_path / "run"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    gate, port = tmp_path / "scraped", _free_port()
    mlruns = tmp_path / "mlruns"
    env = clean_env(GATE=str(gate), MLFLOW_TRACKING_URI=mlruns.as_uri())
    watch = subprocess.Popen(
        gpuprof_cmd("watch", "--no-nvml", "-q", "-o", str(run), "--metrics-port", str(port),
                    "--log-to", "tensorboard,mlflow", "--", sys.executable, str(script),
                    "--passphrase", PLANTED["flag"], "--api-key", PLANTED["cmd"]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    scraped = ""
    try:  # the endpoint while the command runs: every series it serves
        deadline = time.monotonic() + 60
        while "gpuprof_" not in scraped and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                url = f"http://127.0.0.1:{port}/metrics"
                with urllib.request.urlopen(url, timeout=2) as response:
                    scraped = response.read().decode()
            time.sleep(0.2)
    finally:
        gate.touch()
    stdout, stderr = watch.communicate(timeout=300)
    assert watch.returncode == 0, stderr
    assert "gpuprof_" in scraped
    # the child's own output passes through untouched: only what is stored is redacted
    assert PLANTED["hf"] in stdout
    out = tmp_path / "out"
    out.mkdir()
    for args in (["report", str(run), "-o", str(out / "r.html")],
                 ["export", str(run), "--format", "perfetto", "-o", str(out / "t.json")],
                 ["export", str(run), "--format", "parquet", "-o", str(out / "pq")],
                 ["analyze", str(run), "--json"]):  # fmt: skip
        done = run_gpuprof(*args)
        assert done.returncode == 0, done.stderr
        (out / f"{args[0]}-{len(list(out.iterdir()))}.stdout").write_text(done.stdout)
    texts = []
    assert list(run.glob("tensorboard/**/events.out.tfevents.*")) and mlruns.is_dir()
    texts.append(scraped)
    for f in [*run.rglob("*"), *out.rglob("*"), *mlruns.rglob("*")]:  # (not child.py)
        if f.is_file():
            texts.append(f.read_bytes().decode("utf-8", "replace"))
            if f.suffix == ".parquet":  # compressed: read it back
                texts.append(pd.read_parquet(f).to_json())
    # the loaded run too (Parquet side files are compressed on disk)
    from gpuprof.api import load_run

    loaded = load_run(run)
    texts.append(json.dumps(loaded.meta.command))
    texts.append(loaded.logs.to_json())
    assert "Authorization: Bearer ***" in loaded.logs.to_json()
    for name, secret in PLANTED.items():
        assert not any(secret in t for t in texts), name


def test_argument_list_reprs_hide_the_value_after_a_secret_flag_only():
    assert redact_text("['t.py', '--api-key', 'SECRET123', '--lr', '1e-5']") == (
        "['t.py', '--api-key', '***', '--lr', '1e-5']"
    )
    assert redact_text('["--password", "hunter2"]') == '["--password", "***"]'
    # a secret flag followed by another flag keeps both; ordinary flags keep their values
    assert redact_text("['--api-key', '--lr', '1']") == "['--api-key', '--lr', '1']"
    kept = "['--tokenizer', 'gpt2', '--max_tokens', '5']"
    assert redact_text(kept) == kept


def test_a_program_printing_its_own_argv_after_dash_c_stores_no_secret(tmp_path):
    """``python -c "print('args', sys.argv)" --api-key V --password=W``: the printed list
    holds ``'-c', '--api-key', 'V'``; neither value reaches the run's logs (SQLite, the
    Parquet side file), its stored command, its kept form or the analysis."""
    run = tmp_path / "run"
    secret, password = "SECRET123abcXYZ", "hunter2hunter2"
    proc = run_gpuprof(
        "watch", "--no-nvml", "-q", "-o", str(run), "--", sys.executable, "-c",
        "import sys; print('args', sys.argv)", "--api-key", secret, f"--password={password}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert secret in proc.stdout  # the program's own output is its own
    analyzed = run_gpuprof("analyze", str(run), "--json")
    assert analyzed.returncode == 0, analyzed.stderr
    texts = [analyzed.stdout]
    for f in run.rglob("*"):
        if f.is_file():
            texts.append(f.read_bytes().decode("utf-8", "replace"))
            if f.suffix == ".parquet":
                texts.append(pd.read_parquet(f).to_json())
    from gpuprof.api import load_run

    loaded = load_run(run)
    logs = loaded.logs.to_json()
    texts += [json.dumps(loaded.meta.command), logs]
    assert "'--api-key', '***'" in loaded.logs["line"].iloc[0]
    for value in (secret, password):
        assert not any(value in t for t in texts), value
