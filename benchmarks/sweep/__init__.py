"""The Llama-3 tensor-parallel layer sweep (llama_sweep) and its report, the study of its timing
method, the refit of the path model from its CSV and the summary of the C++ sweep variants."""
