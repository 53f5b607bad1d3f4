"""One-off probes that results in benchmarks/results cite, one file each, as they ran (see
benchmarks/README.md for which result each serves and the commit it needs)."""
