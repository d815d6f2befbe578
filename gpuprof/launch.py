"""Where a watcher stands in a multi-node launch: its node rank and the number of nodes.

``srun gpuprof watch -o RUN -- torchrun …`` starts one watcher per node (or per task); they all
record into RUN, each node into its own file, and node rank 0 prints the run's summary once the
others are done. The rank comes from what the launcher already says, never from a protocol of
our own: explicit ``GPUPROF_NODE_RANK`` / ``GPUPROF_NNODES``; torchrun's ``--node-rank`` /
``--nnodes`` on the watched command line; Slurm's ``SLURM_NODEID`` / ``SLURM_NNODES``; Open MPI's
``OMPI_COMM_WORLD_NODE_RANK``… With several tasks per node, only the first task of each node
(``SLURM_LOCALID`` / ``OMPI_COMM_WORLD_LOCAL_RANK`` 0) samples the node's GPUs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ENV_NODE_RANK = "GPUPROF_NODE_RANK"
ENV_NNODES = "GPUPROF_NNODES"

_RANK_VARS = (ENV_NODE_RANK, "SLURM_NODEID", "OMPI_COMM_WORLD_NODE_RANK", "GROUP_RANK")
_NNODES_VARS = (ENV_NNODES, "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
_LOCAL_TASK_VARS = ("SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
_TORCHRUN = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


@dataclass(frozen=True)
class Launch:
    """A watcher's place in a launch. ``node_rank`` None: a single-node run."""

    node_rank: int | None = None
    nnodes: int | None = None
    local_task: int = 0
    """This watcher's task index on its node (srun with several tasks per node)."""
    source: str = ""
    """Where the figures came from, for messages ("torchrun --node-rank", "SLURM_NODEID"…)."""

    @property
    def multi_node(self) -> bool:
        return self.node_rank is not None and (self.nnodes or 0) > 1

    @property
    def samples(self) -> bool:
        """Whether this watcher samples its node (the first task on the node does)."""
        return self.local_task == 0


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


def _option(argv: Sequence[str], *names: str) -> str | None:
    """The value of ``--name V`` / ``--name=V`` in ``argv``."""
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def _torchrun_args(argv: Sequence[str]) -> Sequence[str] | None:
    """The launcher's own arguments when ``argv`` runs torchrun, else None."""
    for i, arg in enumerate(argv):
        name = os.path.basename(arg)
        if name in _TORCHRUN or (arg == "-m" and i + 1 < len(argv) and argv[i + 1] in _TORCHRUN):
            return argv[i + 1 :]
        if i > 2:  # the launcher is the program or comes right after the interpreter
            break
    return None


def _nnodes(text: str | None) -> int | None:
    """torchrun's ``--nnodes`` is N or MIN:MAX (elastic): the most nodes it may span."""
    if not text:
        return None
    return _int(text.split(":")[-1])


def detect(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Launch:
    """This watcher's `Launch` from ``env`` (default: the process's) and the watched ``argv``."""
    env = os.environ if env is None else env
    local = next((_int(env.get(v)) for v in _LOCAL_TASK_VARS if _int(env.get(v)) is not None), 0)
    for var in _RANK_VARS[:1]:
        if _int(env.get(var)) is not None:
            nnodes = next((_int(env.get(v)) for v in _NNODES_VARS if env.get(v)), None)
            return Launch(_int(env[var]), nnodes, local or 0, var)
    torchrun = _torchrun_args(argv)
    if torchrun is not None:
        rank = _int(_option(torchrun, "--node-rank", "--node_rank"))
        nnodes = _nnodes(_option(torchrun, "--nnodes"))
        if rank is None and (nnodes or 0) > 1:
            rank = _int(env.get("SLURM_NODEID"))  # `--node-rank $SLURM_NODEID` left to Slurm
        if rank is not None:
            return Launch(rank, nnodes, local or 0, "torchrun --node-rank")
    for var in _RANK_VARS[1:]:
        if _int(env.get(var)) is not None:
            nnodes = next((_int(env.get(v)) for v in _NNODES_VARS if env.get(v)), None)
            return Launch(_int(env[var]), nnodes, local or 0, var)
    return Launch(local_task=local or 0)
