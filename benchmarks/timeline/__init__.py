"""The per-stream overlap timeline of one Llama-3 case under torch.profiler: the torchrun part,
the trace analysis (events) and the reports."""
