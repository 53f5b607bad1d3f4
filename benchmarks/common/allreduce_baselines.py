"""The unfused baselines of a row-parallel layer at decode: torch.mm, then one all-reduce.

    nccl       torch.mm into ``out``, NCCL ``all_reduce(out)``
    one_shot   torch.mm into a torch symmetric-memory buffer, then
               ``torch.ops.symm_mem.one_shot_all_reduce_out`` (each rank reads every peer's
               partial and writes the sum into ``out``)
    two_shot   torch.mm into a view of a torch symmetric-memory buffer, then
               ``torch.ops.symm_mem.two_shot_all_reduce_`` in place (each rank sums its slice over
               every peer and pushes the sum back to all of them): the result is that view
    nccl_symm  ``mm_nccl`` with ``out`` in an NCCL window (``nccl_window``:
               ``ProcessGroupNCCL.register_mem_pool(symm=True)``, i.e. ``ncclCommWindowRegister``,
               NCCL >= 2.27): NCCL runs the all-reduce of a window buffer with its
               symmetric-memory kernels where it has one for the size

Each call reuses its buffers in the next call (torch's one- and two-shot kernels open and close
with a barrier over the peers, NCCL orders its own calls), so that a CUDA graph of back-to-back
calls replays them. torch is passed in; nothing of distgemm is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NCCL_SYMM_MIN = (2, 27)  # the first NCCL with window registration and symmetric kernels


def symm_buffer(torch, numel: int, dtype, device, group_name: str):
    """A flat torch symmetric-memory buffer of ``numel`` elements, rendezvoused over the group (a
    collective); views of its first elements serve smaller shapes."""
    from torch.distributed import _symmetric_memory as symm_mem

    buf = symm_mem.empty(numel, dtype=dtype, device=device)
    symm_mem.rendezvous(buf, group_name)
    return buf


def rows_view(buf, rows: int, cols: int):
    """The first ``rows * cols`` elements of a flat buffer as a contiguous ``[rows, cols]``."""
    return buf[: rows * cols].view(rows, cols)


def mm_nccl(torch, dist, a, wt, out, group=None):
    """``out = all_reduce(a @ wt)``: the GEMM into ``out``, NCCL's all-reduce in place."""
    torch.mm(a, wt, out=out)
    dist.all_reduce(out, group=group)
    return out


def mm_one_shot(torch, a, wt, buf, group_name: str, out):
    """``out = all_reduce(a @ wt)`` through torch's one-shot all-reduce: the GEMM into the
    symmetric ``buf``, each rank sums every peer's partial into ``out``."""
    partial = rows_view(buf, a.shape[0], wt.shape[1])
    torch.mm(a, wt, out=partial)
    return torch.ops.symm_mem.one_shot_all_reduce_out(partial, "sum", group_name, out)


def mm_two_shot(torch, a, wt, partial, group_name: str):
    """``partial = all_reduce(a @ wt)`` through torch's two-shot all-reduce, in place:
    ``partial`` is an ``[M, N]`` view of a torch symmetric-memory buffer; returns it."""
    torch.mm(a, wt, out=partial)
    return torch.ops.symm_mem.two_shot_all_reduce_(partial, "sum", group_name)


@dataclass
class NcclWindow:
    """A buffer of NCCL's allocator (``ncclMemAlloc``) registered as a symmetric window of the
    group's communicator; ``pool`` keeps the allocation alive (``release`` deregisters it)."""

    buf: Any
    pool: Any
    backend: Any

    def release(self) -> None:
        self.backend.deregister_mem_pool(self.pool)


def nccl_version(torch) -> tuple[int, ...] | None:
    """The NCCL torch runs with, or None where torch has none."""
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a build without NCCL
        return None
    return tuple(v) if isinstance(v, tuple | list) else (v // 10000, v // 100 % 100, v % 100)


def nccl_symm_reason(version: tuple[int, ...] | None) -> str | None:
    """Why NCCL's symmetric-memory all-reduce cannot run with ``version`` (None: it can be
    tried)."""
    if version is None:
        return "torch was built without NCCL"
    if tuple(version[:2]) < NCCL_SYMM_MIN:
        have = ".".join(map(str, version))
        need = ".".join(map(str, NCCL_SYMM_MIN))
        return f"NCCL {have} has no symmetric-memory kernels (they need NCCL >= {need})"
    return None


def nccl_window(torch, dist, numel: int, dtype, device, group=None) -> NcclWindow:
    """A flat ``numel``-element buffer registered as a symmetric NCCL window of ``group``'s (the
    world's) communicator: a collective. Raises where this torch or NCCL cannot (the reason is
    the benchmark's record: ``nccl_symm_reason`` first, then the registration's own error)."""
    why = nccl_symm_reason(nccl_version(torch))
    if why:
        raise RuntimeError(why)
    pg = group if group is not None else dist.group.WORLD
    backend = pg._get_backend(device)
    pool = torch.cuda.MemPool(backend.mem_allocator)
    with torch.cuda.use_mem_pool(pool):
        buf = torch.empty(numel, dtype=dtype, device=device)
    try:
        backend.register_mem_pool(pool, symm=True)
    except TypeError as e:  # a binding without the symm argument: plain registration only
        raise RuntimeError(
            f"this torch's ProcessGroupNCCL.register_mem_pool takes no symm=True ({e}): no "
            "window registration"
        ) from None
    return NcclWindow(buf, pool, backend)
