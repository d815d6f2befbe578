"""Dashboards for what ``gpuprof watch --metrics-port`` serves (docs/DASHBOARDS.md).

``grafana.json`` is a Grafana dashboard (the classic JSON model, schema version 41, as in
Grafana 11.6; later versions migrate it on import without change to it): GPU utilization per
GPU and per node, SM activity, memory, idle GPU-time by phase, step time and steps per second
per process, the top finding so far, with variables for the Prometheus data source, the
nodes and the GPUs. ``gpuprof dashboard`` prints it.
"""

from __future__ import annotations

from importlib.resources import files


def grafana_json() -> str:
    """The Grafana dashboard, as the JSON text to import."""
    return (files(__name__) / "grafana.json").read_text(encoding="utf-8")
