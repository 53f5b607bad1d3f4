"""A bounded wait for a CUDA event: what the timing loops of the CLIs wait on instead of
``torch.cuda.Event.synchronize``, which has no bound."""

from __future__ import annotations

import time


def wait_event(event, timeout_s: float, what: str, comm=None) -> None:
    """Wait for a CUDA event with a bound (``torch.cuda.Event.synchronize`` has none): a
    collective that a rank never joined would otherwise hold this rank until NCCL's watchdog.
    RuntimeError after ``timeout_s``; the communicator is then marked broken."""
    deadline = time.monotonic() + timeout_s
    while not event.query():
        if time.monotonic() > deadline:
            msg = (
                f"{what}: the GPU work did not finish within {timeout_s:g} s (a rank did not "
                "join a collective, or a kernel hangs)"
            )
            if comm is None:
                raise RuntimeError(msg)
            comm.mark_broken(msg)
            comm.raise_if_broken()  # the message with this rank and what to do next
        time.sleep(2e-5)
