"""One call per tensor-parallel layer, on torch tensors, one process per GPU (torchrun).

    all_gather_gemm      column-parallel layers (QKV, FC1/gate/up): all-gather of the activations
                         overlapped with the GEMM
    gemm_reduce_scatter  row-parallel layers (O, FC2/down): GEMM overlapped with the
                         reduce-scatter of its result
    gemm_all_reduce      row-parallel layers without sequence parallelism: GEMM, reduce-scatter
                         and all-gather of the result in one plan

Weights are in nn.Linear layout ``[N, K]``; bf16 or fp16 (inputs, weight, bias, C and the output
all in one dtype; fp32 accumulation). Every rank of the group calls the op with the same shapes,
dtype, schedule, steps and path, in the same order (the usual SPMD contract of collectives).

How a call runs. The first call with a new (op, shapes, dtype, schedule, steps, bias, beta)
validates the inputs, exchanges a plan signature with the other ranks (any difference raises the
same ValueError on every rank, naming the rank and the field), builds the plan in C++, finds or
allocates its symmetric workspace and instantiates one CUDA graph per rank. Later calls validate
the tensors' device, contiguity and alignment, pick the graph instantiated for these pointers
(up to ``entries.GRAPHS_PER_PLAN`` per plan; otherwise the least recently used one is retargeted
with a graph-exec update) and launch it on ``torch.cuda.current_stream()``: no host
synchronisation, no collective.

Errors. Inputs are checked before anything reaches the extension: TypeError for a non-tensor or a
dtype that is not bf16/fp16 or differs between operands; ValueError for a CPU tensor, a tensor on
another device than this rank's, a non-contiguous tensor (distgemm does not take strides: call
``.contiguous()``), a data pointer that is not 16-byte aligned (TMA), shapes that do not match
or that the schedule cannot split (the Plan's message, e.g. ``M=30 is not divisible by TP=4``).
At the first call errors are exchanged, so every rank raises the same one; at later calls a rank
raises its own, and a rank that then waits for it reports ``RuntimeError`` after the wait timeout.
A launch whose entry barrier or data flag times out (a rank did not launch) is reported as a
RuntimeError naming the rank and the iteration at the next call on the communicator or at
``Communicator.check()``.

CUDA graph capture. The ops are themselves CUDA graph launches whose pointers are updated between
calls; they cannot be captured into a user's graph (``torch.cuda.graph``): a call during capture
raises RuntimeError before anything is enqueued. Capture the rest of the model around them.

Paths. ``path="auto"`` (the default; ``DISTGEMM_PATH`` sets another) lets the first call of a
plan choose between the overlapped plan ("overlap") and the plain collective followed by one
torch GEMM ("collective", the NCCL baseline itself): it times both on the call's tensors in
alternating rounds, takes the maximum over the ranks per round and keeps the lower median, so
every rank makes the same choice (``path_choices()`` shows the choices and the numbers). That
costs 2 x 6 rounds of ~2 ms of calls, or 2 x 3 rounds of 2 calls when a call takes 5 ms or more
(about 0.85 s for Llama-405B FC1 at 16k tokens), with host synchronisations, once per plan, i.e.
again for every new shape. Small problems, where a collective + GEMM is cheaper than the
overlapped plan's extra steps, then cost what the baseline costs. The choice rests on a
measurement, so near-ties may go either way between runs. ``path="overlap"`` / ``"collective"``
force one path (no measurement); the collective path needs a NCCL group (with another backend
"auto" keeps the plan).

No autograd: the ops have no backward. An input that requires grad while grad mode is on is
refused (RuntimeError) rather than given a result without a gradient.

``steps=None`` (``default_steps``): S = TP for the all-gather schedules and gemm_allreduce; for
rs_tile_a/rs_tile_b S = 2*TP from 4096 tokens on with K/TP <= 8192, else TP (Llama-3: O from
TP=2; FC2 of 8B from TP=2, of 70B from TP=4, of 405B from TP=8). The rule and its constants live
in C++ (``schedule/defaults.hpp``); the measurements behind them are in docs/tuning.md. At
S = 2*TP each partial is staged locally and pushed by the copy engine with a step of slack; the
staging slots double the plan's workspace (Llama-70B O at 8192 tokens, TP=2: 128 instead of
64 MiB per rank).
Pass ``steps`` to choose; ``python -m distgemm.simulate --timeline`` shows the predicted effect.
"""

from __future__ import annotations

from typing import Any

import torch

from .autopath import choose_path
from .collective import run_collective
from .comm import find_communicator, get_communicator
from .entries import create_entry
from .launch import launch
from .validation import (
    PATHS,
    check_no_grad,
    check_path,
    check_placement,
    check_types,
    default_steps,
    make_spec,
)

__all__ = [
    "all_gather_gemm",
    "gemm_reduce_scatter",
    "gemm_all_reduce",
    "default_steps",
    "make_spec",
    "path_choices",
    "PATHS",
]


def path_choices(group=None) -> list[dict[str, Any]]:
    """What the cached plans of ``group``'s communicator run ([] when it has none yet; never
    creates a communicator, so any rank may call it alone): one dict per plan with the op,
    schedule, steps, global M/N/K, ``requested`` (the calls' path argument), ``path`` (the path
    it runs: "overlap" or "collective") and, for "auto" plans, the measured medians behind the
    choice (``overlap_ms``, ``collective_ms``: per call, max over ranks), or
    ``collective_unavailable`` with the reason when the collective path could not run."""
    comm = find_communicator(group)  # a lookup: creating a communicator is a collective
    res: list[dict[str, Any]] = []
    if comm is None:
        return res
    for key, e in comm.plans.items():
        s = e.spec
        res.append(
            dict(
                op=s.op,
                schedule=s.schedule,
                steps=s.steps,
                m=s.m,
                n=s.n,
                k=s.k,
                requested=key[-1],
                path=e.path,
                **(e.tuning or {}),
            )
        )
    return res


def _run(
    op: str,
    group,
    key,
    make,
    tensors: dict[str, torch.Tensor | None],
    out: torch.Tensor | None,
):
    # The per-call path is written for host time (goal: under 20 us per call with a cached plan):
    # one dict lookup for the plan, one for the graph, a handful of tensor attribute reads.
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"{op} cannot be captured into a CUDA graph (torch.cuda.graph / stream "
            "capture): the op already replays its own CUDA graph and updates its "
            "pointers between calls; call it outside the capture"
        )
    comm = get_communicator(group)
    if comm._broken:
        comm.raise_if_broken()
    plans = comm.plans
    entry = plans.get(key)
    if entry is None:

        def first():
            # Device, contiguity and alignment errors of the first call are exchanged with the
            # shapes, so that every rank raises the same exception.
            check_placement(op, comm.device, dict(tensors, out=out))
            return make(comm)

        entry = create_entry(comm, key, first)
    else:
        plans.move_to_end(key)  # LRU order (O(1), cheaper than checking whether it is needed)
    if entry.path == "overlap":
        return launch(op, comm, entry, tensors, out)
    if entry.path == "collective":
        return run_collective(op, comm, entry, tensors, out)
    return choose_path(op, comm, entry, tensors, out)


def all_gather_gemm(
    a_shard: torch.Tensor,
    w: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    schedule: str = "ag_rotate_a",
    steps: int | None = None,
    out: torch.Tensor | None = None,
    return_gathered: bool = False,
    group=None,
    path: str | None = None,
):
    """All-gather along dim 0 overlapped with a GEMM (column-parallel linear layer).

    Plain torch equivalent (``schedule="ag_rotate_a"``, the default)::

        a = torch.empty(tp * a_shard.shape[0], K); dist.all_gather_into_tensor(a, a_shard, group)
        out = torch.nn.functional.linear(a, w, bias)          # a @ w.T + bias

    Per-rank shapes, with TP ranks, global M and N = TP * N_local:

    - ``a_shard``: ``[M/TP, K]``, this rank's rows of the activations (rank r holds rows
      ``r*M/TP ...``)
    - ``w``: ``[N_local, K]``, this rank's rows of the nn.Linear weight
    - ``bias``: ``[N_local]`` or None
    - ``out`` (returned): ``[M, N_local]``; written in place when given
    - with ``return_gathered=True`` the op returns ``(out, a)``, ``a`` the gathered ``[M, K]``
      (copied from the receive slots after the GEMMs; costs one device copy of ``a``)

    ``schedule="ag_rotate_b"`` gathers the weight instead (the activations stay sharded)::

        wf = all_gather(w, dim=0)                              # [N, K]
        out = torch.nn.functional.linear(a_shard, wf, bias)    # [M/TP, N]

    with ``w``: ``[N/TP, K]``, ``bias``: ``[N]``, ``out``: ``[M/TP, N]`` and, with
    ``return_gathered``, the gathered ``[N, K]`` weight.

    Args: bf16 or fp16 tensors on this rank's GPU, contiguous, 16-byte aligned; K (and N_local,
    resp. the N tiles for ag_rotate_b) a multiple of 8. ``steps``: S = k*TP pipeline steps; None:
    ``default_steps`` (S = TP for all-gather).
    ``group``: a ProcessGroup (default: the world group) or a ``distgemm.Communicator``.
    ``path``: "auto" (measure both at the first call, keep the faster), "overlap" (the plan) or
    "collective" (NCCL all-gather + torch GEMM); None: ``DEFAULT_PATH`` (env DISTGEMM_PATH, else
    "auto"); see the module docstring. No autograd: inputs that require grad are refused while
    grad mode is on.
    Where S does not divide M (ag_rotate_a; N for ag_rotate_b) the steps are uneven: tiles differ
    by a row (along N by 8 columns), and a step whose tile is empty is skipped.
    """
    op = "all_gather_gemm"
    path = check_path(op, path)
    dtype = check_types(op, {"a_shard": a_shard, "w": w, "bias": bias, "out": out})
    check_no_grad(op, {"a_shard": a_shard, "w": w, "bias": bias})
    key = (
        op,
        schedule,
        steps,
        dtype,
        (
            ("a_shard", a_shard.shape),
            ("w", w.shape),
            ("bias", None if bias is None else bias.shape),
        ),
        0.0,
        bool(return_gathered),
        path,
    )

    def make(comm):
        return make_spec(op, schedule, comm.tp, comm.rank, steps, a_shard, w, bias=bias, out=out)

    return _run(op, group, key, make, {"a": a_shard, "w": w, "bias": bias}, out)


def gemm_reduce_scatter(
    a: torch.Tensor,
    w: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    c: torch.Tensor | None = None,
    beta: float = 0.0,
    schedule: str = "rs_tile_a",
    steps: int | None = None,
    out: torch.Tensor | None = None,
    group=None,
    path: str | None = None,
) -> torch.Tensor:
    """A GEMM overlapped with the reduce-scatter of its result (row-parallel linear layer).

    Plain torch equivalent (``schedule="rs_tile_a"``, the default: scatter along M)::

        p = a @ w.T                                            # [M, N] partial sum of this rank
        out = torch.empty(M // tp, N); dist.reduce_scatter_tensor(out, p, group=group)
        out = out + beta * c + bias

    Per-rank shapes, with TP ranks and global K = TP * K_local:

    - ``a``: ``[M, K_local]``, this rank's columns of the activations
    - ``w``: ``[N, K_local]``, this rank's columns of the nn.Linear weight
    - ``bias``: ``[N]`` or None, added once (pass the same bias on every rank)
    - ``c``: ``[M/TP, N]``, added with ``beta`` (only read when ``beta != 0``)
    - ``out`` (returned): ``[M/TP, N]``, rank r's rows ``r*M/TP ...``; written in place when given

    ``schedule="rs_tile_b"`` scatters along N instead: ``out``, ``c``: ``[M, N/TP]`` (rank r's
    columns), ``bias``: ``[N/TP]`` (rank r's slice); the equivalent scatters ``p`` along dim 1.

    Args: bf16 or fp16 tensors on this rank's GPU, contiguous, 16-byte aligned; K_local and N
    (N's tiles for rs_tile_b) multiples of 8; M (rs_tile_a) resp. N (rs_tile_b) divisible by TP
    (steps may be uneven where S does not divide it).
    ``beta``: default 0.0. ``steps``: S = k*TP; None: ``default_steps``. ``group``: a
    ProcessGroup (default: the world group) or a ``distgemm.Communicator``. ``path``: "auto",
    "overlap" or "collective" (torch GEMM + NCCL reduce-scatter), as for ``all_gather_gemm``.
    """
    return _gemm_then_reduce(
        "gemm_reduce_scatter", schedule, a, w, bias, c, beta, steps, out, group, path
    )


def gemm_all_reduce(
    a: torch.Tensor,
    w: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    c: torch.Tensor | None = None,
    beta: float = 0.0,
    steps: int | None = None,
    out: torch.Tensor | None = None,
    group=None,
    path: str | None = None,
) -> torch.Tensor:
    """A GEMM overlapped with the all-reduce of its result (schedule ``gemm_allreduce``:
    reduce-scatter of tiles along M, then all-gather of the finished tiles, in one plan).

    Plain torch equivalent::

        out = a @ w.T                                          # [M, N] partial sum of this rank
        dist.all_reduce(out, group=group)
        out = out + beta * c + bias

    Per-rank shapes, with TP ranks and global K = TP * K_local:

    - ``a``: ``[M, K_local]``, ``w``: ``[N, K_local]`` (nn.Linear layout)
    - ``bias``: ``[N]`` or None, ``c``: ``[M, N]`` (read when ``beta != 0``): pass the same on every
      rank; each tile takes them from the rank that finishes it
    - ``out`` (returned): ``[M, N]``, identical on every rank; written in place when given

    Args: bf16 or fp16 tensors on this rank's GPU, contiguous, 16-byte aligned; K_local and N
    multiples of 8; any M >= 1 (steps are uneven where S does not divide M, and a decode step of
    fewer tokens than S skips the empty ones). ``beta``: default 0.0. ``steps``: S = k*TP; None:
    ``default_steps``.
    ``group``: a ProcessGroup (default: the world group) or a ``distgemm.Communicator``.
    ``path``: "auto", "overlap" or "collective" (torch GEMM + NCCL all-reduce), as for
    ``all_gather_gemm``.
    """
    return _gemm_then_reduce(
        "gemm_all_reduce", "gemm_allreduce", a, w, bias, c, beta, steps, out, group, path
    )


def _gemm_then_reduce(op, schedule, a, w, bias, c, beta, steps, out, group, path):
    """gemm_reduce_scatter and gemm_all_reduce: the same operands, only the plan differs."""
    path = check_path(op, path)
    beta = float(beta)
    c_used = c if beta != 0.0 else None  # like torch.addmm: beta == 0 never reads c
    dtype = check_types(op, {"a": a, "w": w, "bias": bias, "c": c_used, "out": out})
    tensors = {"a": a, "w": w, "bias": bias, "c": c_used}
    check_no_grad(op, tensors)
    key = (
        op,
        schedule,
        steps,
        dtype,
        (
            ("a", a.shape),
            ("w", w.shape),
            ("bias", None if bias is None else bias.shape),
            ("c", None if c_used is None else c_used.shape),
        ),
        beta,
        False,
        path,
    )

    def make(comm):
        return make_spec(
            op, schedule, comm.tp, comm.rank, steps, a, w, bias=bias, c=c, beta=beta, out=out
        )

    return _run(op, group, key, make, tensors, out)
