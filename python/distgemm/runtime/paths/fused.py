"""The fused path of ``gemm_all_reduce`` (``path="fused"``; ``"auto"`` where
``_core.fused_auto_problem`` allows: up to ``_core.FUSED_MAX_AUTO_TOKENS`` tokens): one kernel per
rank computes its partial product and sums the tiles it owns over every rank's partials
(kernel/fused_allreduce.hpp). No collective kernel, no copy engine, one kernel node inside a
caller's CUDA graph. Two kernels:
- up to ``_core.FUSED_DECODE_MAX_TOKENS`` tokens the hand-written decode kernel (the weight
  streamed at memory bandwidth) pushes each partial, as generation-tagged lines, into every
  rank's receive buffer, and each rank sums what arrived in its own;
- above that CUTLASS's kernel writes its partials into its own rank's buffer, signals each
  finished tile to every rank, and the peers read them over NVLink.

Where it runs: the shapes (``fused_problem``) and a K-contiguous weight (a transposed ``.t()``
view is not read by this kernel). Its buffers (``_core.fused_partial_bytes``), two by launch
parity, each in one half of its region (``place_fused``):
- the decode kernel's receive buffers: a region of their own per communicator
  (``Communicator.fused_receive_for``), grown like the workspace;
- the CUTLASS kernel's partial buffers: the communicator's one workspace, in its slots;
- one small control region per communicator (launch generation and per-tile flags), allocated
  at the first fused call.
All are kept until ``close()``.

Ordering: a fused launch is ordered on the device after this rank's previous launch (the
stream, or the communicator's LaunchOrder across streams).
- **Plans sharing the workspace:** a plan's launch writes the workspace only after its entry
  barrier, i.e. after every rank finished its previous launch (fused ones included). A CUTLASS
  fused launch writes only its own rank's partial buffer.
- **Parities:** a launch writes the parity its peers do not read, since a peer is at most one
  launch behind. The decode kernel's pushes go to the receive region, which no plan writes."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from . import _core
from .launch import stream_ptr, user_ptrs
from .validation import DTYPES

if TYPE_CHECKING:
    from .comm import Communicator
    from .entries import Entry
    from .validation import Spec

__all__ = [
    "fused_problem",
    "fused_auto",
    "attach_fused",
    "fused_layout",
    "place_fused",
    "launch_fused",
]


def _problem_shape(spec: Spec) -> tuple[int, int, int]:
    """This rank's (m, n, k) of a gemm_all_reduce spec: a [m, k], w [n, k]."""
    m, k = spec.shapes["a"]
    return int(m), int(spec.shapes["w"][0]), int(k)


def fused_problem(spec: Spec, dtype: torch.dtype) -> str:
    """'' when the fused kernel runs this gemm_all_reduce entry, else the reason (shapes, dtype,
    weight layout and the build only: the same on every rank)."""
    if spec.op != "gemm_all_reduce":
        return f"the fused path is gemm_all_reduce's only, not {spec.op}'s"
    if not getattr(_core, "cuda_runtime", False):
        return "distgemm was built without the CUDA runtime"
    if dtype not in DTYPES:
        return f"dtype {dtype} is not bf16 or fp16"
    if spec.b_n_major:
        return "the weight is a transposed view (N-contiguous); the fused kernel reads [N, K]"
    m, n, k = _problem_shape(spec)
    return _core.fused_shape_problem(m, n, k, 1, spec.tp)


def fused_auto(spec: Spec, dtype: torch.dtype) -> tuple[bool, str]:
    """Whether ``path="auto"`` runs this entry fused: shapes the kernel takes, at most
    ``_core.FUSED_MAX_AUTO_TOKENS`` tokens and where the measured rule picks it
    (``_core.fused_auto_problem``); with the reason in words."""
    problem = fused_problem(spec, dtype)
    if problem:
        return False, problem
    m, n, k = _problem_shape(spec)
    problem = _core.fused_auto_problem(m, n, k, dtype.itemsize, spec.tp)
    if problem:
        return False, problem
    return True, f"fused: M={m} tokens <= {int(_core.FUSED_MAX_AUTO_TOKENS)} (decode size)"


def attach_fused(comm: Communicator, entry: Entry) -> None:
    """The fused entry's division of work (the CUTLASS kernel's split-K factor, the decode
    kernel's grid and pieces per tile) and buffers, and the communicator's control region and
    launcher (made at the first fused entry; collective, like plan creation)."""
    m, n, k = _problem_shape(entry.spec)
    dtype = DTYPES[entry.dtype]
    resident = _core.fused_resident_ctas(dtype, m, comm.device.index)
    splits = _core.fused_splits(m, n, k, resident)
    ctas = _core.fused_ctas(m, n, k, resident)
    decode = _core.fused_kernel(m) == "decode"
    layout = fused_layout(m, n, splits, entry.dtype.itemsize, comm.tp, comm.workspace_control_bytes)
    control = comm.fused_control()  # allocates and exchanges it at the first fused entry
    entry.fused = {
        "m": m,
        "n": n,
        "k": k,
        "dtype": dtype,
        "splits": splits,
        "ctas": ctas,
        # The decode kernel's peers push into this rank's buffers: a region of its own, which no
        # plan writes (comm.fused_receive_for); the CUTLASS kernel's are read by the peers from
        # the workspace's slots.
        "receive": decode,
        "layout": layout,
        "control": control,
    }
    if entry.tuning is not None:
        entry.tuning.update(
            fused_kernel=_core.fused_kernel(m),
            fused_splits=splits,
            fused_ctas=ctas,
            fused_token_tile=_core.fused_token_tile(m),
        )
    place_fused(comm, entry)


def fused_layout(
    m: int, n: int, splits: int, itemsize: int, tp: int, workspace_control: int
) -> dict[str, int]:
    """The region a fused entry needs (``WorkspacePool.place``'s layout). The decode kernel's
    receive buffers are sized for its widest token count (``_core.FUSED_DECODE_MAX_TOKENS``; its
    grid and pieces do not depend on the tokens), so that a server's next batch size never grows
    them; they end in no control region. The CUTLASS kernel's partial buffers go in the workspace's
    slots, before its control region of ``workspace_control`` bytes."""
    decode = _core.fused_kernel(m) == "decode"
    rows = int(_core.FUSED_DECODE_MAX_TOKENS) if decode else m
    part_bytes = int(_core.fused_partial_bytes(rows, n, splits, itemsize, tp))
    align = int(_core.WORKSPACE_SLOT_ALIGN)
    slots = -(-part_bytes // align) * align
    return {
        "slots_offset": 0,
        "slots_bytes": slots,
        "total_bytes": slots + (0 if decode else workspace_control),
    }


def place_fused(comm: Communicator, entry: Entry) -> None:
    """The fused entry's buffers in the communicator's current region (grown first when too
    small; collective then): every rank's base, and the bytes between the two launch parities,
    half the region's slots, so that the parities of entries of every size stay apart and a
    launch never writes where a peer still reads the previous launch's partials."""
    f = entry.fused
    place = comm.fused_receive_for if f["receive"] else comm.workspace_for
    entry.ws, _ = place(f["layout"])
    line = int(_core.FUSED_LINE_BYTES)
    entry.bases = list(entry.ws.bases)
    f["parity_bytes"] = entry.ws.slot_capacity // 2 // line * line


def launch_fused(
    op: str, comm: Communicator, entry: Entry, tensors, out, capturing: bool = False
) -> torch.Tensor:
    """One fused launch on the current stream (recorded into its capture when one is in
    progress)."""
    f = entry.fused
    (pa, pw, pc, po, pb, _, _), out = user_ptrs(op, entry, tensors, out, comm.device)
    launcher = comm.fused_launcher
    if capturing:
        entry.ws.pinned = True  # callers' graphs keep reading it: never freed before close()
    else:
        err = launcher.error() or (entry.ws.order.capture_error() if entry.ws.pinned else "")
        if err:
            comm.mark_broken(err)
            comm.raise_if_broken()
    launcher.launch(
        stream_ptr(comm.device),
        f["dtype"],
        f["m"],
        f["n"],
        f["k"],
        pa,
        pw,
        po,
        pb,
        pc,
        1.0,
        entry.beta if pc else 0.0,
        f["splits"],
        f["ctas"],
        comm.rank,
        entry.bases,
        f["parity_bytes"],
        f["control"],
    )
    return out
