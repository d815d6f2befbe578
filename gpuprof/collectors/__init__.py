"""Collectors: everything that reads NVML, psutil, torch, the watched process or files to import."""
