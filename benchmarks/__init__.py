"""distgemm's benchmarks: Llama-3 layer sweeps and timelines under torchrun, their reports, and
the C++ binary's comparisons. Each script runs as a file (``python3 benchmarks/X.py``, under
torchrun too) or as a module (``python3 -m benchmarks.X``)."""
