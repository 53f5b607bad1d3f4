"""The training-step benchmark (a Llama-70B MLP block, forward and backward) and its report."""
