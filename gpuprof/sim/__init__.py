"""The simulated cluster used by ``gpuprof demo``, the tests and the diagnosis benchmark.

``simulate(SimConfig(...))`` returns a `SimResult` whose ``run`` is a `gpuprof.model.Run`
with known injected pathologies and whose ``truth`` lists them with the GPU-seconds they cost.
``simulate_to(SimConfig(...), run_dir)`` writes the same run as a run directory, one host and
one GPU at a time, for runs too large to hold in memory.
"""

from gpuprof.sim.cluster import SimResult, SimWritten, Truth, simulate, simulate_to
from gpuprof.sim.config import MAX_GPUS, Pathology, SimConfig
from gpuprof.sim.pathologies import PATHOLOGIES, STALL_KINDS, random_config

__all__ = [
    "MAX_GPUS",
    "PATHOLOGIES",
    "STALL_KINDS",
    "Pathology",
    "SimConfig",
    "SimResult",
    "SimWritten",
    "Truth",
    "random_config",
    "simulate",
    "simulate_to",
]
