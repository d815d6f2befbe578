"""How many of the RL stacks' public files import with steps, file by file.

    python benchmarks/stacks_imported.py [--src WORKTREE]

Reads every file of ``tests/fixtures_logs/stacks/`` (README.md aside) with ``parse_file`` of
the gpuprof in ``--src`` (default: this checkout; a worktree of an older commit gives the
"before" column) and prints, per file, the format it was read as (or the refusal), its steps
and its phases, then the count of files imported with steps.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STACKS = ROOT / "tests" / "fixtures_logs" / "stacks"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=ROOT)
    args = parser.parse_args()
    sys.path.insert(0, str(args.src.resolve()))
    from gpuprof.collectors.importers import ImportFormatError
    from gpuprof.importing import parse_file

    files = sorted(p for p in STACKS.glob("*") if p.name != "README.md")
    imported = 0
    for path in files:
        try:
            part = parse_file(path)
        except ImportFormatError as exc:
            print(f"{path.name} | refused: {str(exc).split(': ', 1)[-1][:70]}")
            continue
        spans = part.frames.get("spans")
        steps = 0 if spans is None else int((spans["phase"] == "step").sum())
        phases = 0 if spans is None else len(set(spans["phase"]) - {"step"})
        imported += steps > 0
        print(f"{path.name} | {part.format} | {steps} steps | {phases} phases")
    print(f"{imported}/{len(files)} files imported with steps")


if __name__ == "__main__":
    main()
