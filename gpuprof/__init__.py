"""gpuprof: where do my GPU-seconds go in RL post-training, why, and which knob do I turn.

The in-process API is re-exported here::

    import gpuprof

    with gpuprof.phase("rollout"):
        ...
    gpuprof.step(tokens=n_tokens)
"""

from gpuprof.hooks import enabled, flush, init, mark, phase, shutdown, step

__version__ = "0.1.0"

__all__ = ["__version__", "enabled", "flush", "init", "mark", "phase", "shutdown", "step"]
