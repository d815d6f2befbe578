"""The optional C part of the hooks; everything else is declared in pyproject.toml.

`gpuprof._cphase` is the hot path of `gpuprof.phase` (see gpuprof/_cphase.c). It is optional:
where it cannot be compiled (no C compiler), the install goes on and `phase` runs in pure
Python with the same behaviour.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("gpuprof._cphase", ["gpuprof/_cphase.c"], optional=True)])
