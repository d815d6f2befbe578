"""TensorBoard event files: one ``events.out.tfevents.*`` file or a log directory (searched
recursively), as verl (``trainer.logger=['tensorboard']``), OpenRLHF (``--use_tensorboard``) and
transformers' ``TensorBoardCallback`` (TRL, ms-swift ``report_to tensorboard``) write them.

Every scalar carries its step and the wall-clock second it was written, so steps are anchored:
a step ends when its values were written. The files are read with TensorBoard's own
``EventAccumulator`` (through ``EventMultiplexer`` for a directory, which finds every
sub-directory holding event files — TensorBoard calls each a *run*); TF1-style scalar summaries
and TF2-style scalar tensors are both read. Sub-directories are taken as parts of one training
run — the common layouts (``<logdir>/<project>/<experiment>/``, HF's ``runs/<date>_<host>/``)
have one — unless two of them log the same tag, which means they are several runs: then the
import stops and names them. The keys are mapped by `tracker_keys`.

TensorBoard reads event files in pure Python when TensorFlow is absent (a CRC per record):
about 50 000 scalars a second on one core; see docs/PERFORMANCE.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gpuprof.collectors.importers import Imported, ImportFormatError
from gpuprof.collectors.importers.tracker_keys import (
    TrackerRun,
    points_frame,
    require,
    to_imported,
)

FORMAT = "tensorboard"

EVENTS_GLOB = "events.out.tfevents.*"


def sniff(head: str, path: Path) -> bool:
    """An event file: TensorBoard's name, ``events.out.tfevents.<time>.<host>…``."""
    return path.name.startswith("events.out.tfevents.")


def sniff_dir(path: Path) -> bool:
    """A directory with an event file in it or below it."""
    return next(iter(path.rglob(EVENTS_GLOB)), None) is not None


def parse(path: Path) -> Imported:
    """Every scalar of the file or directory as (tag, step, wall time, value) points."""
    require("tensorboard", path, "TensorBoard event files")
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    # 0 = keep everything: the defaults sample 10 000 scalars per tag (reservoir), and keep
    # nothing heavy that is no scalar
    guidance = {ea.SCALARS: 0, ea.TENSORS: 0, ea.IMAGES: 1, ea.AUDIO: 1, ea.HISTOGRAMS: 1,
                ea.COMPRESSED_HISTOGRAMS: 1}  # fmt: skip
    if path.is_dir():
        mux = EventMultiplexer(size_guidance=guidance)
        mux.AddRunsFromDirectory(str(path))
        mux.Reload()
        accumulators = {name: mux.GetAccumulator(name) for name in sorted(mux.Runs())}
    else:
        acc = ea.EventAccumulator(str(path), size_guidance=guidance)
        acc.Reload()
        accumulators = {path.name: acc}
    keys: list[str] = []
    steps: list[float] = []
    times: list[float] = []
    values: list[float] = []
    owner: dict[str, str] = {}
    skipped: dict[str, int] = {}
    for run_name, acc in accumulators.items():
        tags = acc.Tags()
        for tag in tags.get("scalars", []):
            _claim(owner, tag, run_name, path)
            for event in acc.Scalars(tag):
                keys.append(tag)
                steps.append(float(event.step))
                times.append(event.wall_time * 1e9)
                values.append(float(event.value))
        for tag in tags.get("tensors", []):
            if _plugin(acc, tag) != "scalars":
                skipped[tag] = skipped.get(tag, 0) + 1
                continue
            _claim(owner, tag, run_name, path)
            for event in acc.Tensors(tag):
                value = _scalar(event.tensor_proto)
                if value is None:
                    continue
                keys.append(tag)
                steps.append(float(event.step))
                times.append(event.wall_time * 1e9)
                values.append(value)
    if not keys and not skipped:
        raise ImportFormatError(f"{path}: TensorBoard event files with no scalars")
    run = TrackerRun(
        source=path,
        format=FORMAT,
        tracker="TensorBoard",
        points=points_frame(keys, steps, times, values),
        skipped=skipped,
    )
    if len(accumulators) > 1:
        run.notes.append(
            f"{len(accumulators)} TensorBoard runs under the directory taken as one training "
            f"run ({', '.join(list(accumulators)[:4])})"
        )
    return to_imported(run)


def _claim(owner: dict[str, str], tag: str, run_name: str, path: Path) -> None:
    """Note which sub-run logs ``tag``; two sub-runs logging one tag are two training runs."""
    first = owner.setdefault(tag, run_name)
    if first != run_name:
        raise ImportFormatError(
            f"{path}: the TensorBoard runs {first!r} and {run_name!r} both log {tag!r}: "
            "several training runs; import one directory at a time"
        )


def _plugin(acc: Any, tag: str) -> str | None:
    try:
        return acc.SummaryMetadata(tag).plugin_data.plugin_name
    except (KeyError, AttributeError):
        return None


def _scalar(tensor_proto: Any) -> float | None:
    """The one value of a scalar tensor (TF2 ``tf.summary.scalar``), else None."""
    from tensorboard.util import tensor_util

    try:
        array = np.asarray(tensor_util.make_ndarray(tensor_proto))
    except Exception:
        return None
    if array.size != 1 or array.dtype.kind not in "fiub":
        return None
    return float(array.reshape(-1)[0])
