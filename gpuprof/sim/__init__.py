"""The simulated cluster used by ``gpuprof demo``, the tests and the diagnosis benchmark.

``simulate(SimConfig(...))`` returns a `SimResult` whose ``run`` is a `gpuprof.model.Run`
with known injected pathologies and whose ``truth`` lists them with the GPU-seconds they cost.
"""

from gpuprof.sim.cluster import SimResult, Truth, simulate
from gpuprof.sim.config import Pathology, SimConfig
from gpuprof.sim.pathologies import PATHOLOGIES, STALL_KINDS, random_config

__all__ = [
    "PATHOLOGIES",
    "STALL_KINDS",
    "Pathology",
    "SimConfig",
    "SimResult",
    "Truth",
    "random_config",
    "simulate",
]
