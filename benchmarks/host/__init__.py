"""Host-side costs: first calls of new token counts under torchrun (first_call) and the time of
the Python layer alone (python_layer_overhead)."""
