"""Renderers of a `Run` and its analysis; they never touch NVML, psutil or the child."""
