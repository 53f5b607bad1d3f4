"""The TPs the CPU suite covers, and the gloo harness that runs a function on that many ranks."""

import os
import pathlib
import sys
import time

CPU_TPS = (2, 3, 4, 6, 8)
"""Every TP the CPU suite runs each family at (schedules, simulator, reference executor, gloo
ops): the powers of two up to a host's 8 GPUs, and 3 and 6, where what splits by powers of two
does not. Shapes in these tests divide by every one of them (multiples of 24) or take the uneven
paths."""


def _rank_entry(rank, fn, tp, tmp, args):
    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", store=dist.FileStore(f"{tmp}/store", tp), rank=rank, world_size=tp
    )
    try:
        result = fn(rank, tp, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    torch.save(result, f"{tmp}/result{rank}.pt")
    # The result is on disk: leave without the interpreter's teardown, where gloo's threads
    # have ended a finished rank with SIGABRT ("terminate called without an active exception")
    # about once in several CPU suite runs.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# What every rank imports, imported once by the forkserver that forks the ranks: about 4 s of CPU
# per rank started afresh (torch, then torch._dynamo at the first custom op call).
PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "distgemm.compat.custom_ops"]


def run_ranks(fn, tmp_path: pathlib.Path, *args, tp: int = 2, timeout_s: float = 300.0) -> list:
    """``fn(rank, tp, *args)`` on ``tp`` processes joined in one gloo group; returns each rank's
    result (anything ``torch.save`` takes). A rank that raises fails the run; ranks still running
    after ``timeout_s`` are killed and the test fails (a hang). The processes are forked by a
    forkserver that has imported PRELOAD (and nothing else: no threads, no CUDA)."""
    import multiprocessing

    import pytest
    import torch
    import torch.multiprocessing as mp

    multiprocessing.set_forkserver_preload(PRELOAD)  # once the server runs, it has no effect
    ctx = mp.start_processes(
        _rank_entry,
        args=(fn, tp, str(tmp_path), args),
        nprocs=tp,
        join=False,
        start_method="forkserver",
    )
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            for p in ctx.processes:  # the ranks this call started
                if p.is_alive():
                    p.kill()
            pytest.fail(f"{tp} ranks of {fn.__name__} did not finish within {timeout_s:g} s")
    return [torch.load(tmp_path / f"result{r}.pt") for r in range(tp)]


def value_error(call) -> str | None:
    """The message of the ValueError ``call()`` raises; None where it returns."""
    try:
        call()
    except ValueError as e:
        return str(e)
    return None
