"""Code every benchmark family shares: steady-state GPU timing (timing), the report pieces
(report) and the Llama-3 case list (llama_cases)."""
