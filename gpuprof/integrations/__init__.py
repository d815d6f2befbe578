"""Adapters that map training frameworks' own timers and callbacks onto gpuprof phases."""
