"""The public ops: one call per tensor-parallel layer, on torch tensors, one process per GPU.

    all_gather_gemm      column-parallel layers (QKV, FC1/gate/up): all-gather of the activations
                         overlapped with the GEMM
    gemm_reduce_scatter  row-parallel layers (O, FC2/down): GEMM overlapped with the
                         reduce-scatter of its result
    gemm_all_reduce      row-parallel layers without sequence parallelism: GEMM and the
                         all-reduce of its result

Weights are in nn.Linear layout ``[N, K]``; bf16 or fp16 (every operand in one dtype, fp32
accumulation), or fp8 e4m3 inputs and weight with float32 ``scale_a`` / ``scale_b`` and bf16
bias, C and output (``runtime.precision``). Every rank calls the op with the same shapes, dtype,
schedule, steps and path, in the same order (the SPMD contract of collectives).

A call validates its arguments (``runtime.validate``), finds its entry in the communicator's
entry cache (``runtime.entry_cache``; made at the first call with the same ``EntryKey``: the
ranks exchange their signatures, the path is chosen by ``runtime.choose`` and its state made)
and runs the entry's path (``runtime.paths``) on ``torch.cuda.current_stream()``, or records it
into the caller's CUDA graph capture. docs/python-api.md describes the contract: errors, CUDA
graph capture, paths, tuning tables and the default steps; docs/architecture.md the layers.

``path="auto"`` (the default; ``DISTGEMM_PATH`` sets another) chooses among "overlap" (the
plan's CUDA graph), "collective" (NCCL and one torch GEMM) and, for ``gemm_all_reduce``, "fused"
(GEMM and all-reduce in one kernel; "fused_two_shot" forces its two-shot tail), from the shapes
when the entry is made, never by measuring
the call; ``path_choices()`` reports each choice and why. No autograd: an input that requires
grad while grad mode is on is refused (``distgemm.compat.nn`` has the autograd layers).
"""

from __future__ import annotations

from typing import Any

import torch

from .runtime.capture import setup_during_capture
from .runtime.communicator import find_communicator, get_communicator
from .runtime.entry_cache import ATTACHMENT, MAX_PLANS, EntryKey, entry_cache
from .runtime.paths.overlapped import GRAPHS_PER_PLAN
from .runtime.precision import validate_precision
from .runtime.spec import default_steps, make_spec
from .runtime.validate import (
    PATHS,
    n_major_weight,
    validate_extents,
    validate_no_grad,
    validate_path,
    validate_placement,
)

__all__ = [
    "all_gather_gemm",
    "gemm_reduce_scatter",
    "gemm_all_reduce",
    "default_steps",
    "make_spec",
    "memory_stats",
    "path_choices",
    "PATHS",
]


def path_choices(group=None) -> list[dict[str, Any]]:
    """What the cached plans of ``group``'s communicator run ([] when it has none yet; never
    creates a communicator, so any rank may call it alone): one dict per plan with the op,
    schedule, steps, global M/N/K, ``requested`` (the calls' path argument), ``path`` (the path
    it runs: "overlap" or "collective"), ``source`` ("requested", "table" or "model"),
    ``tile_n`` (0: per GEMM) and, for "auto" plans, ``overlap_ms`` / ``collective_ms`` (the
    table's measured or the model's predicted ms per call) with ``why`` in words, or
    ``collective_unavailable`` with the reason when the collective path could not run, and
    where the model chose S (``steps=None``, no table entry) ``steps_ms``: its predicted ms of
    the overlapped plan at each S it priced."""
    comm = find_communicator(group)  # a lookup: creating a communicator is a collective
    cache = comm.attachment(ATTACHMENT) if comm is not None else None
    res: list[dict[str, Any]] = []
    for key, e in (cache or {}).items():
        s = e.spec
        res.append(
            dict(
                op=s.op,
                schedule=s.schedule,
                steps=s.steps,
                m=s.m,
                n=s.n,
                k=s.k,
                requested=key.path,
                path=e.path,
                **e.choice,
            )
        )
    return res


def memory_stats(group=None) -> dict[str, int]:
    """What distgemm holds on this rank for ``group`` (a process group, default the world
    group, or a Communicator); never creates a communicator (all zeros where none is open):

    workspace_bytes       the symmetric workspace shared by every plan (device memory)
    kept_bytes            replaced workspaces kept because captured graphs reference them
    largest_plan_bytes    the largest plan layout placed in the workspace (total bytes); the
                          workspace is at most ``runtime.workspace.GROWTH_HEADROOM`` above it
    workspace_allocations workspaces allocated so far (the first one and every growth)
    plans                 cached plans, at most ``max_plans`` (least recently used ones go)
    eager_graphs          instantiated graphs of the eager calls, at most ``graphs_per_plan``
                          per plan
    captured_graphs       graphs recorded into callers' CUDA graphs
    graph_retargets       eager calls (of the cached plans, so far) that retargeted one of their
                          plan's graphs at new pointers (a re-capture and a graph-exec update)
    direct_launches       eager calls (likewise) enqueued without a graph: pointers seen for the
                          first time, or not come back since the stalest graph's last use
                          (``runtime.paths.overlapped.GRAPHS_PER_PLAN``)
    fused_control_bytes   the fused path's control region (launch generation, tile flags,
                          two-shot sum flags; the CUTLASS kernel's partial buffers and its
                          two-shot sum buffers are placed in the workspace)
    fused_receive_bytes   the decode kernel's receive regions (the current one and those kept
                          for captured graphs): every rank's partials of the entries up to
                          ``_core.FUSED_DECODE_MAX_TOKENS`` tokens
    collective_bytes      the collective path's scratch (gathered operands, partial products):
                          one buffer per CUDA stream, shared by every collective plan, each at
                          most ``runtime.paths.collective.SCRATCH_HEADROOM`` above the largest
                          call made on its stream
    collective_buffers    those buffers (one per stream that made a collective call)
    collective_allocations  scratch buffers allocated so far (each stream's first and every
                          growth)
    allreduce_control_bytes  our all-reduce's control region (launch generations, flags)
    allreduce_receive_bytes  its receive regions (the current one, grown to the largest
                          all-reduce, and those kept for captured graphs)
    max_plans, graphs_per_plan  the bounds (``runtime.entry_cache.MAX_PLANS``,
                                ``runtime.paths.overlapped.GRAPHS_PER_PLAN``)
    """
    comm = find_communicator(group)
    held = comm.memory_stats() if comm is not None else {}
    stats = {k: held.get(k, 0) for k in _MEMORY_KEYS}
    stats.update(max_plans=MAX_PLANS, graphs_per_plan=GRAPHS_PER_PLAN)
    return stats


# The counted keys of memory_stats, in its docstring's order: 0 where nothing made them yet (no
# communicator, no entry, no fused entry, no collective call).
_MEMORY_KEYS = (
    "workspace_bytes",
    "kept_bytes",
    "largest_plan_bytes",
    "workspace_allocations",
    "plans",
    "eager_graphs",
    "captured_graphs",
    "graph_retargets",
    "direct_launches",
    "fused_control_bytes",
    "fused_receive_bytes",
    "collective_bytes",
    "collective_buffers",
    "collective_allocations",
    "allreduce_control_bytes",
    "allreduce_receive_bytes",
)


def weight_key(w: torch.Tensor) -> str:
    """The weight's name in a plan's cache key: "w", or "w.T" for a transposed view (read
    N-contiguous, a plan of its own)."""
    return "w.T" if n_major_weight(w) else "w"


def _run(
    op: str,
    group,
    key,
    make,
    tensors: dict[str, torch.Tensor | None],
    out: torch.Tensor | None,
):
    # The per-call path is written for host time: one dict lookup for the entry, one for the
    # graph, a handful of tensor attribute reads.
    capturing = torch.cuda.is_current_stream_capturing()
    if capturing:
        with setup_during_capture():  # a new communicator or plan: allocation, IPC exchange
            comm, entry = _entry(op, group, key, make, tensors, out, True)
    else:
        comm, entry = _entry(op, group, key, make, tensors, out, False)
    # The path was chosen when the entry was created (runtime.choose): "overlap", "collective"
    # or "fused", never a measurement, so "auto" records into a capture like any other path.
    return entry.state.run(op, comm, tensors, out, capturing)


def _entry(op, group, key: EntryKey, make, tensors, out, capturing: bool):
    """The communicator and the entry of a call (created at the entry's first call; capturing:
    whether the call is being captured)."""
    comm = get_communicator(group)
    if comm.broken:
        comm.raise_if_broken()
    plans = comm.attachment(ATTACHMENT)
    if plans is None:  # the communicator's first op call
        plans = entry_cache(comm)
    entry = plans.get(key)
    if entry is None:

        def first():
            # Empty operands (a token count of 0), device, contiguity and alignment errors of
            # the first call are exchanged with the shapes, so that every rank raises the same
            # exception. Scales need no TMA alignment (the kernel reads them as floats):
            # check_precision checked them.
            a_name = "a_shard" if op == "all_gather_gemm" else "a"
            validate_extents(op, a_name, tensors["a"], tensors["w"])
            operands = {n: t for n, t in tensors.items() if not n.startswith("scale_")}
            validate_placement(op, comm.device, dict(operands, out=out))
            return make(comm)

        entry = plans.create(key, first, capturing)
    else:
        plans.move_to_end(key)  # LRU order (O(1), cheaper than checking whether it is needed)
    return comm, entry


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
    scale_a: torch.Tensor | None = None,
    scale_b: torch.Tensor | None = None,
    fast_accum: bool = False,
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
    resp. the N tiles for ag_rotate_b) a multiple of 8. ``w`` may also be the ``.t()`` view of
    a contiguous ``[K, N_local]`` tensor: the GEMM reads it in place (not with ag_rotate_b,
    which moves the weight). ``steps``: S = k*TP pipeline steps; None:
    the tuning table's, else ``default_steps`` (S = TP for all-gather).
    ``group``: a ProcessGroup (default: the world group) or a ``distgemm.Communicator``.
    ``path``: "auto" (the tuning table or the cost model decides), "overlap" (the plan) or
    "collective" (NCCL all-gather + torch GEMM); None: ``DEFAULT_PATH`` (env DISTGEMM_PATH, else
    "auto"); see the module docstring. No autograd: inputs that require grad are refused while
    grad mode is on.
    Where S does not divide M (ag_rotate_a; N for ag_rotate_b) the steps are uneven: tiles differ
    by a row (along N by 8 columns), and a step whose tile is empty is skipped.

    fp8: ``a_shard`` and ``w`` in ``torch.float8_e4m3fn`` with float32 ``scale_a`` and
    ``scale_b``, each tensor-wise (one value) or row-wise (``[M/TP]`` for ``a_shard``'s rows,
    ``[N_local]`` for ``w``'s; ag_rotate_b: ``[N/TP]``); ``out = (scale_a[:, None] * a) @
    (scale_b[:, None] * w).T + bias`` in bf16 (``bias`` and ``out`` bf16). Row scales are
    gathered with their rows. ``fast_accum``: CUTLASS's fast-accumulation kernel (see
    benchmarks/results for its accuracy); K and N multiples of 16; ``w`` K-contiguous.
    """
    op = "all_gather_gemm"
    path = validate_path(op, path)
    prec = validate_precision(
        op, {"a_shard": a_shard, "w": w}, {"bias": bias, "out": out}, scale_a, scale_b, fast_accum
    )
    validate_no_grad(op, {"a_shard": a_shard, "w": w, "bias": bias})
    key = EntryKey(
        op,
        schedule,
        steps,
        prec,
        (
            ("a_shard", a_shard.shape),
            (weight_key(w), w.shape),
            ("bias", None if bias is None else bias.shape),
        ),
        0.0,
        bool(return_gathered),
        path,
    )

    def make(comm):
        return make_spec(
            op, schedule, comm.tp, comm.rank, steps, a_shard, w, bias=bias, out=out,
            row_scale_a=prec.row_scale_a, row_scale_b=prec.row_scale_b,
        )  # fmt: skip

    tensors = {"a": a_shard, "w": w, "bias": bias, "scale_a": scale_a, "scale_b": scale_b}
    return _run(op, group, key, make, tensors, out)


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
    scale_a: torch.Tensor | None = None,
    scale_b: torch.Tensor | None = None,
    fast_accum: bool = False,
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

    Args: bf16 or fp16 tensors on this rank's GPU, contiguous (``w`` may also be the ``.t()``
    view of a contiguous ``[K_local, N]`` tensor, read in place), 16-byte aligned; K_local and N
    (N's tiles for rs_tile_b) multiples of 8; M (rs_tile_a) resp. N (rs_tile_b) divisible by TP
    (steps may be uneven where S does not divide it).
    ``beta``: default 0.0. ``steps``: S = k*TP; None: ``default_steps``. ``group``: a
    ProcessGroup (default: the world group) or a ``distgemm.Communicator``. ``path``: "auto",
    "overlap" or "collective" (torch GEMM + NCCL reduce-scatter), as for ``all_gather_gemm``.
    fp8: ``a`` and ``w`` in ``torch.float8_e4m3fn`` with float32 ``scale_a`` (one value or
    ``[M]``, per row of ``a``) and ``scale_b`` (one value or ``[N]``, per row of ``w``): each
    rank's partial ``(scale_a[:, None] * a) @ (scale_b[:, None] * w).T`` is reduced in bf16;
    ``bias``, ``c`` and ``out`` bf16; ``fast_accum`` as for ``all_gather_gemm``.
    """
    return _gemm_then_reduce(
        "gemm_reduce_scatter", schedule, a, w, bias, c, beta, steps, out, group, path,
        (scale_a, scale_b, fast_accum),
    )  # fmt: skip


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
    scale_a: torch.Tensor | None = None,
    scale_b: torch.Tensor | None = None,
    fast_accum: bool = False,
) -> torch.Tensor:
    """A GEMM overlapped with the all-reduce of its result (schedule ``ar_tile_a``:
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
    ``path``: "auto", "overlap", "collective" (torch GEMM + NCCL all-reduce), as for
    ``all_gather_gemm``, or "fused": one kernel computes this rank's partial into the symmetric
    workspace, signals each tile to every rank and sums its own tiles over every rank's
    partials (NVLink reads); "auto" takes it where the machine's decode model predicts it the
    fastest (``runtime.reduce_cost``). "fused_two_shot": the same kernel above
    ``_core.FUSED_DECODE_MAX_TOKENS`` tokens with its two-shot tail (each slice of a tile summed
    by one owner rank, which the others copy it from; the same bits). It needs a K-contiguous
    ``w`` (not a ``.t()`` view) and bf16/fp16; a fused path on a call it cannot run is a
    ValueError with the reason. fp8 (``scale_a``, ``scale_b``,
    ``fast_accum``) as for ``gemm_reduce_scatter``; the fused path is bf16/fp16 only.
    """
    return _gemm_then_reduce(
        "gemm_all_reduce", "ar_tile_a", a, w, bias, c, beta, steps, out, group, path,
        (scale_a, scale_b, fast_accum),
    )  # fmt: skip


def _gemm_then_reduce(op, schedule, a, w, bias, c, beta, steps, out, group, path, fp8):
    """gemm_reduce_scatter and gemm_all_reduce: the same operands, only the plan differs."""
    path = validate_path(op, path)
    beta = float(beta)
    c_used = c if beta != 0.0 else None  # like torch.addmm: beta == 0 never reads c
    scale_a, scale_b, fast_accum = fp8
    prec = validate_precision(
        op, {"a": a, "w": w}, {"bias": bias, "c": c_used, "out": out}, scale_a, scale_b,
        fast_accum,
    )  # fmt: skip
    validate_no_grad(op, {"a": a, "w": w, "bias": bias, "c": c_used})
    tensors = {"a": a, "w": w, "bias": bias, "c": c_used, "scale_a": scale_a, "scale_b": scale_b}
    key, make = _reduce_entry(op, schedule, tensors, beta, steps, out, prec, path)
    return _run(op, group, key, make, tensors, out)


def _reduce_entry(op, schedule, tensors, beta, steps, out, prec, path):
    """The EntryKey of a gemm_reduce_scatter / gemm_all_reduce call and the function that makes
    its Spec at the entry's first call, from the call's validated ``tensors`` (``c`` only where
    ``beta != 0``)."""
    a, w, bias, c = tensors["a"], tensors["w"], tensors["bias"], tensors["c"]
    key = EntryKey(
        op,
        schedule,
        steps,
        prec,
        (
            ("a", a.shape),
            (weight_key(w), w.shape),
            ("bias", None if bias is None else bias.shape),
            ("c", None if c is None else c.shape),
        ),
        beta,
        False,
        path,
    )

    def make(comm):
        return make_spec(
            op, schedule, comm.tp, comm.rank, steps, a, w, bias=bias, c=c, beta=beta, out=out,
            row_scale_a=prec.row_scale_a, row_scale_b=prec.row_scale_b,
        )  # fmt: skip

    return key, make
