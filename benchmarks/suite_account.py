"""Where the test suite's CPU goes, process by process.

    python benchmarks/suite_account.py [--log FILE] -- python -m pytest -q

Runs the command with a ``sitecustomize`` on ``PYTHONPATH`` that makes every Python process it
starts (pytest's workers, each ``python -m gpuprof``, the zygote's forked commands, watched
training scripts, the end of each watch, Ray's Python workers) append one JSON line when it
ends: its command line, its own CPU seconds (``getrusage(RUSAGE_SELF)``: children not
included, so nothing is counted twice) and the test that was running (``PYTEST_CURRENT_TEST``).
A process killed by a signal writes nothing; processes that are not Python (Chromium, py-spy,
Ray's raylets) are not counted. Then prints the CPU by kind of process and by test module.

``--summarize FILE`` prints the tables of a log written before.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SITECUSTOMIZE = """
import atexit, json, os, resource, sys
_LOG = os.environ.get("SUITE_ACCOUNT_LOG")
if _LOG:
    _done = []

    def _record():
        if _done:
            return
        _done.append(1)
        try:
            use = resource.getrusage(resource.RUSAGE_SELF)
            line = {"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv[:6],
                    "orig": list(getattr(sys, "orig_argv", []))[:6],
                    "cpu": use.ru_utime + use.ru_stime,
                    "test": os.environ.get("PYTEST_CURRENT_TEST", "")}
            with open(_LOG, "a") as out:
                out.write(json.dumps(line) + "\\n")
        except Exception:
            pass

    atexit.register(_record)
    _os_exit = os._exit

    def _exit(code):  # gpuprof's commands end with os._exit, which skips atexit
        _record()
        _os_exit(code)

    os._exit = _exit
"""


def kind(line: dict) -> str:
    """What a process was: a pytest worker, a gpuprof command (fresh or forked), ..."""
    orig = " ".join(line["orig"])
    argv = line["argv"]
    if "zygote.py" in orig:
        # argv[0] is gpuprof's __main__.py while it runs, "-m" again once runpy has returned
        if argv and (argv[0].endswith("__main__.py") or argv[0] == "-m"):
            return f"gpuprof {argv[1] if len(argv) > 1 else ''} (forked by the zygote)"
        return "the zygote"
    items = line["orig"]
    if "-m" in items and items.index("-m") + 1 < len(items):
        module = items[items.index("-m") + 1]
        if module == "gpuprof":
            rest = items[items.index("-m") + 2 :]
            return f"gpuprof {rest[0] if rest else ''} (fresh process)"
        if module.startswith("gpuprof."):
            return f"python -m {module}"
    if "watch_end" in orig:
        return "end of a watch (summary, diagnosis, report)"
    if "exec(eval(sys.stdin.readline()))" in orig:
        return "pytest worker (and its forks)"
    if "ray" in orig:
        return "Ray's processes"
    if "pytest" in orig:
        return "pytest"
    return "other Python (watched scripts, torchrun, trackers)"


def summarize(log: Path) -> None:
    lines = [json.loads(text) for text in log.read_text().splitlines() if text.strip()]
    total = sum(line["cpu"] for line in lines)
    print(f"{total:.0f} s of CPU in {len(lines)} Python processes\n")
    print(f"{'CPU s':>8} {'count':>6} {'each':>6}  kind")
    by_kind: dict[str, list[float]] = collections.defaultdict(list)
    for line in lines:
        by_kind[kind(line)].append(line["cpu"])
    for name, cpus in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
        print(f"{sum(cpus):8.1f} {len(cpus):6d} {sum(cpus) / len(cpus):6.2f}  {name}")
    print(f"\n{'CPU s':>8}  test module (processes other than the workers)")
    by_module: dict[str, float] = collections.defaultdict(float)
    for line in lines:
        if not kind(line).startswith("pytest"):
            by_module[line["test"].split("::")[0] or "(no test)"] += line["cpu"]
    for name, cpu in sorted(by_module.items(), key=lambda kv: -kv[1])[:20]:
        print(f"{cpu:8.1f}  {name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", type=Path, help="where the JSON lines go (kept)")
    parser.add_argument("--summarize", type=Path, help="print the tables of a log and stop")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize)
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "sitecustomize.py").write_text(SITECUSTOMIZE)
        log = args.log or Path(folder, "account.jsonl")
        log.unlink(missing_ok=True)
        env = dict(os.environ, SUITE_ACCOUNT_LOG=str(log.resolve()))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [folder, env.get("PYTHONPATH")]))
        started = time.monotonic()
        code = subprocess.call(command, env=env)
        print(f"\nexit {code}, {time.monotonic() - started:.0f} s wall\n")
        if log.exists():
            summarize(log)
    return code


if __name__ == "__main__":
    sys.exit(main())
