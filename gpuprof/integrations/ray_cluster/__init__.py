"""A watched Ray job, recorded on every node of its cluster.

- `setup_hook`: runs first in every Ray worker (stdlib only): where its hooks write, the
  zero-code instrumentation, the job's own setup hook after gpuprof's;
- `runtime_env`: the job's ``runtime_env`` with gpuprof's additions merged in;
- `sampler`: the actor sampling one node's GPUs, host and Ray processes, and shipping its
  workers' spooled spans;
- `recorder`: the driver's thread that places the samplers, writes their rows into
  ``<run>/<node>.sqlite``, measures the nodes' clocks and records lost nodes.

`gpuprof.integrations.ray_driver` ties them to ``ray.init``.
"""
