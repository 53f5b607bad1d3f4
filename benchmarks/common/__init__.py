"""Code every benchmark family shares: steady-state GPU timing (timing), the report pieces
(report), the Llama-3 case list (llama_cases), the decode and serving models (models), the
unfused GEMM + all-reduce baselines (allreduce_baselines) and the best of them per point with
issue 42's acceptance (best_unfused)."""
