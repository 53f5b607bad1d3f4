"""distgemm's benchmarks, one package per family (see benchmarks/README.md). Each entry point
runs as a module from the repository root: ``python3 -m benchmarks.<family>.<script>``, or
``torchrun --nproc-per-node N -m benchmarks.<family>.<script>``."""
