"""The serving benchmark: a Llama-70B layer stack at decode and prefill (serving_step), the stack,
the runtime pieces it shares with the decode benchmark, and the report."""
