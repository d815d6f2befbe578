"""The simulated cluster used by ``gpuprof demo``, the tests and the diagnosis benchmark."""
