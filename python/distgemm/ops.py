"""One call per tensor-parallel layer, on torch tensors, one process per GPU (torchrun).

    all_gather_gemm      column-parallel layers (QKV, FC1/gate/up): all-gather of the activations
                         overlapped with the GEMM
    gemm_reduce_scatter  row-parallel layers (O, FC2/down): GEMM overlapped with the
                         reduce-scatter of its result
    gemm_all_reduce      row-parallel layers without sequence parallelism: GEMM, reduce-scatter
                         and all-gather of the result in one plan

Weights are in nn.Linear layout ``[N, K]``; bf16 or fp16 (inputs, weight, bias, C and the output
all in one dtype; fp32 accumulation), or fp8: inputs and weight ``torch.float8_e4m3fn`` with
float32 ``scale_a`` / ``scale_b`` (tensor-wise or row-wise), bias, C and the output bf16
(``distgemm.precision``). Every rank of the group calls the op with the same shapes,
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

CUDA graph capture. Every op, schedule and path works inside ``torch.cuda.graph(...)`` (any
capture of the current stream, in any capture mode): the call records its work into the caller's
graph instead of running it, on the caller's stream, and returns the output tensor the replays
write (allocated from the graph's pool when ``out`` is not given). The overlapped path records
the plan's nodes themselves (entry barrier, GEMMs, copy-engine transfers, flags; forked from the
caller's stream and joined back into it), so a replay needs no host work: the entry barrier
advances the launch generation on the device. Replays read the tensors the capture was given:
overwrite them in place between replays (static buffers). The first call of a new shape may
happen inside the capture (its plan, workspace and IPC exchange are set up without any
device-wide synchronisation), with ``path="auto"`` too: the path is decided from the shapes when
the plan is created, nothing is measured. Eager calls and replays that
share a communicator interleave freely on one stream; on different streams the caller orders
them (``torch.cuda.Stream.wait_stream``), since a replay runs no host code that could. Every
rank replays the same graphs in the same order as it calls the ops (the SPMD contract), or the
peers' waits time out: a replay whose peer never replays ends after ``wait_timeout_s``, the
later captured ops that share its workspace skipped at once, and is reported as RuntimeError
naming the rank and the iteration at ``Communicator.check()`` or at the next overlapped call
on that workspace (a plain replay runs no host code to raise from). The communicator keeps
every plan recorded into a graph (never evicted) and its workspace until ``close()``; replaying
such a graph after ``close()`` is invalid.

Paths. ``path="auto"`` (the default; ``DISTGEMM_PATH`` sets another) runs either the overlapped plan
("overlap") or the plain collective followed by one torch GEMM ("collective", the NCCL baseline
itself), decided when the plan is created, from the shapes, never by measuring the call. With
``steps=None`` a tuning table decides where it has an entry for the call's shape bucket (op,
schedule, TP, dtype, N, K, and M in power-of-two buckets): its path, S and GEMM tile, measured ahead
of time by ``python -m distgemm.tune`` and loaded from ``DISTGEMM_TUNING_TABLE`` or with
``distgemm.load_tuning_table(path)``; every rank must load the same table (the plan signature
carries its digest). Otherwise a cost model (``distgemm.pathmodel``, calibrated on the Llama sweep,
docs/tuning.md) predicts both paths at the default S and keeps the overlapped one where it is faster
by at least 5 us; below 1024 tokens (decode sizes, never measured on the overlapped path) and at TP
other than 2 (where it is not calibrated) it keeps the collective path. ``gemm_all_reduce`` has
a third path, "fused" (``distgemm.fused``: the GEMM and the all-reduce in one kernel, no
collective kernel, no copy engine), which "auto" takes where ``_core.fused_auto_problem``
allows (up to ``_core.FUSED_MAX_AUTO_TOKENS`` tokens at TP 2; see docs/serving.md).
``path_choices()`` shows each choice, its source ("table" / "model") and the ms behind it.
``path="overlap"`` / ``"collective"`` force one path; the collective path needs a NCCL group
(with another backend "auto" keeps the plan). A first call then costs the signature exchange,
the plan build and, for the overlapped path, workspace and graph setup
(``benchmarks/first_call.py`` times each).

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

from .collective import run_collective
from .comm import find_communicator, get_communicator
from .entries import create_entry
from .fused import launch_fused
from .launch import launch, setup_during_capture
from .precision import check_precision
from .validation import (
    PATHS,
    check_no_grad,
    check_path,
    check_placement,
    default_steps,
    make_spec,
    n_major_weight,
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
    it runs: "overlap" or "collective"), ``source`` ("requested", "table" or "model"),
    ``tile_n`` (0: per GEMM) and, for "auto" plans, ``overlap_ms`` / ``collective_ms`` (the
    table's measured or the model's predicted ms per call) with ``why`` in words, or
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
    # The per-call path is written for host time (goal: under 20 us per call with a cached plan):
    # one dict lookup for the plan, one for the graph, a handful of tensor attribute reads.
    capturing = torch.cuda.is_current_stream_capturing()
    if capturing:
        with setup_during_capture():  # a new communicator or plan: allocation, IPC exchange
            comm, entry = _entry(op, group, key, make, tensors, out)
    else:
        comm, entry = _entry(op, group, key, make, tensors, out)
    # The path was decided when the entry was created (autopath.decide_path): "overlap",
    # "collective" or "fused", never a measurement, so "auto" records into a capture like any
    # other path.
    if entry.path == "overlap":
        return launch(op, comm, entry, tensors, out, capturing)
    if entry.path == "fused":
        return launch_fused(op, comm, entry, tensors, out, capturing)
    return run_collective(op, comm, entry, tensors, out, capturing)


def _entry(op, group, key, make, tensors, out):
    """The communicator and the plan entry of a call (created at the plan's first call)."""
    comm = get_communicator(group)
    if comm._broken:
        comm.raise_if_broken()
    plans = comm.plans
    entry = plans.get(key)
    if entry is None:

        def first():
            # Device, contiguity and alignment errors of the first call are exchanged with the
            # shapes, so that every rank raises the same exception.
            # Scales need no TMA alignment (the kernel reads them as floats): check_precision
            # checked them.
            operands = {n: t for n, t in tensors.items() if not n.startswith("scale_")}
            check_placement(op, comm.device, dict(operands, out=out))
            return make(comm)

        entry = create_entry(comm, key, first)
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
    path = check_path(op, path)
    prec = check_precision(
        op, {"a_shard": a_shard, "w": w}, {"bias": bias, "out": out}, scale_a, scale_b, fast_accum
    )
    check_no_grad(op, {"a_shard": a_shard, "w": w, "bias": bias})
    key = (
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
    ``path``: "auto", "overlap", "collective" (torch GEMM + NCCL all-reduce), as for
    ``all_gather_gemm``, or "fused": one kernel computes this rank's partial into the symmetric
    workspace, signals each tile to every rank and sums its own tiles over every rank's
    partials (NVLink reads); "auto" takes it where ``_core.fused_auto_problem`` allows. It
    needs a K-contiguous ``w`` (not a ``.t()`` view) and bf16/fp16; ``path="fused"`` on a call
    it cannot run is a ValueError with the reason. fp8 (``scale_a``, ``scale_b``,
    ``fast_accum``) as for ``gemm_reduce_scatter``; the fused path is bf16/fp16 only.
    """
    return _gemm_then_reduce(
        "gemm_all_reduce", "gemm_allreduce", a, w, bias, c, beta, steps, out, group, path,
        (scale_a, scale_b, fast_accum),
    )  # fmt: skip


def _gemm_then_reduce(op, schedule, a, w, bias, c, beta, steps, out, group, path, fp8):
    """gemm_reduce_scatter and gemm_all_reduce: the same operands, only the plan differs."""
    path = check_path(op, path)
    beta = float(beta)
    c_used = c if beta != 0.0 else None  # like torch.addmm: beta == 0 never reads c
    scale_a, scale_b, fast_accum = fp8
    prec = check_precision(
        op, {"a": a, "w": w}, {"bias": bias, "c": c_used, "out": out}, scale_a, scale_b,
        fast_accum,
    )  # fmt: skip
    check_no_grad(op, {"a": a, "w": w, "bias": bias, "c": c_used})
    tensors = {"a": a, "w": w, "bias": bias, "c": c_used, "scale_a": scale_a, "scale_b": scale_b}
    key = (
        op,
        schedule,
        steps,
        prec,
        (
            ("a", a.shape),
            (weight_key(w), w.shape),
            ("bias", None if bias is None else bias.shape),
            ("c", None if c_used is None else c_used.shape),
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

    return _run(op, group, key, make, tensors, out)
