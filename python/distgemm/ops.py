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
(up to ``comm.GRAPHS_PER_PLAN`` per plan; otherwise the least recently used one is retargeted
with a graph-exec update) and launch it on ``torch.cuda.current_stream()``: no host
synchronisation, no collective.

Errors. Inputs are checked before anything reaches the extension: TypeError for a non-tensor or a
dtype that is not bf16/fp16 or differs between operands; ValueError for a CPU tensor, a tensor on
another device than this rank's, a non-contiguous tensor (distgemm does not take strides: call
``.contiguous()``), a data pointer that is not 16-byte aligned (TMA), shapes that do not match
or that the schedule cannot split (the Plan's message, e.g. ``M=8190 is not divisible by S=8``).
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
TP=2; FC2 of 8B from TP=2, of 70B from TP=4, of 405B from TP=8). All-gather: S = TP was faster than
2*TP in 13 of 15 QKV and 8 of 15 FC1 cases at TP=2, and GEMM i+1 follows GEMM i by programmatic
dependent launch, which fills the steps' wave tails. Reduce-scatter: at S = 2*TP each partial is
staged locally and pushed by the copy engine with a step of slack (at S = TP the epilogue writes
it into the peer); with many tokens and a short K per rank that was 2-26% faster than the best
S = TP plan at TP=4 (Llama-70B O at 8192 tokens: 0.512 vs 0.613 ms) and within 3% or faster at
TP=2; with few tokens the extra step costs more than it hides, with a long K the epilogue's
peer writes cost little (benchmarks/results/2026-11-22-tp4.md). The staging slots double the
plan's workspace (Llama-70B O at 8192 tokens, TP=2: 128 instead of 64 MiB per rank).
Pass ``steps`` to choose; ``python -m distgemm.simulate --timeline`` shows the predicted effect.
"""

from __future__ import annotations

import collections
import functools
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import _core
from .comm import (
    GRAPHS_PER_PLAN,
    MAX_PLANS,
    Communicator,
    find_communicator,
    get_communicator,
    signature_mismatch,
)

__all__ = ["all_gather_gemm", "gemm_reduce_scatter", "gemm_all_reduce", "path_choices", "PATHS"]

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
_ALIGN = 16  # bytes: TMA needs 16-byte aligned bases and row strides
_COLLECTIVE = {
    "all_gather_gemm": "all_gather",
    "gemm_reduce_scatter": "reduce_scatter",
    "gemm_all_reduce": "all_reduce",
}


# ---------------------------------------------------------------------------------------------
# Validation (pure: no communicator, no CUDA; the CPU tests call these directly).


def check_types(op: str, tensors: dict[str, torch.Tensor | None]) -> torch.dtype:
    """Every given operand is a tensor, bf16 or fp16, all in one dtype, on a CUDA device.
    Returns the dtype. (Runs on every call: attribute reads only, ~1 us.)"""
    dtype = None
    first = None
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        dt = t.dtype
        if dt is dtype:
            continue
        if dt not in _DTYPES:
            raise TypeError(
                f"{op}: {name} has dtype {dt}; distgemm supports torch.bfloat16 and torch.float16"
            )
        if dtype is not None:
            raise TypeError(
                f"{op}: mixed dtypes: {first} is {dtype} but {name} is {dt}; "
                "pass every operand in one dtype"
            )
        dtype, first = dt, name
    for name, t in tensors.items():
        if t is not None and not t.is_cuda:
            raise ValueError(
                f"{op}: {name} is on {t.device}; distgemm ops need CUDA tensors on "
                "this rank's GPU (torch.cuda.current_device())"
            )
    return dtype


def check_placement(
    op: str, device: torch.device, tensors: dict[str, torch.Tensor | None]
) -> None:
    """Every given operand lives on ``device``, is contiguous and 16-byte aligned."""
    for name, t in tensors.items():
        if t is None:
            continue
        if t.device != device:
            raise ValueError(f"{op}: {name} is on {t.device} but this rank's device is {device}")
        if not t.is_contiguous():
            raise ValueError(
                f"{op}: {name} is not contiguous (shape {list(t.shape)}, strides "
                f"{list(t.stride())}); distgemm takes dense row-major tensors: pass "
                f"{name}.contiguous()"
            )
        ptr = t.data_ptr()
        if ptr % _ALIGN:
            raise ValueError(
                f"{op}: {name}'s data pointer {ptr:#x} is not {_ALIGN}-byte aligned "
                f"(offset {ptr % _ALIGN} bytes; TMA requires it): a view that starts "
                "at an odd element offset is the usual cause; pass a fresh tensor "
                "(.clone())"
            )


PATHS = ("auto", "overlap", "collective")
# The path of calls that pass none: DISTGEMM_PATH at import, else "auto". Pinning it (e.g. to
# "overlap") makes a job's choice reproducible and spares the first calls their measurement.
PATH_ENV = "DISTGEMM_PATH"
DEFAULT_PATH = os.environ.get(PATH_ENV, "auto")


def check_path(op: str, path) -> str:
    """``path`` (None: DEFAULT_PATH) names one of PATHS (ValueError otherwise); returns it."""
    name = f"{PATH_ENV}=" if path is None else "path="
    path = DEFAULT_PATH if path is None else path
    if path not in PATHS:
        raise ValueError(f"{op}: {name}{path!r} is not one of {', '.join(map(repr, PATHS))}")
    return path


def check_no_grad(op: str, tensors: dict[str, torch.Tensor | None]) -> None:
    """The ops have no backward: refuse inputs that require grad while grad mode is on, rather
    than return a result autograd cannot see (a training step would silently get no weight
    gradient)."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if t is not None and t.requires_grad:
            raise RuntimeError(
                f"{op}: {name} requires grad, but distgemm ops have no backward (autograd) yet: "
                "call them under torch.no_grad() or torch.inference_mode(), or pass "
                f"{name}.detach() and compute the gradient yourself"
            )


@dataclass
class Spec:
    """What a plan needs from the tensors of one call (same on every rank)."""

    op: str
    schedule: str
    tp: int
    steps: int
    m: int
    n: int
    k: int
    shapes: dict[str, tuple[int, ...]]  # expected per-rank shape of every operand the plan uses
    plan: dict[str, Any] = field(repr=False, default_factory=dict)


def default_steps(schedule: str, tp: int, a: torch.Tensor, w: torch.Tensor) -> int:
    """S for ``steps=None`` (measured; see the module docstring): TP for the all-gather schedules
    and gemm_allreduce; for rs_tile_a/rs_tile_b, 2*TP from ``RS_TWO_STEPS_MIN_TOKENS`` tokens (M)
    on with at most ``RS_TWO_STEPS_MAX_K_PER_RANK`` of K per rank, where the plan accepts it
    (partials then travel by copy engine with a step of slack), else TP. Shapes only, so every
    rank agrees; an operand that is not 2-D gets TP and the op's validation names the problem."""
    if schedule not in _RS_TWO_STEPS_PER_SHARD or tp < 2 or a.dim() != 2 or w.dim() != 2:
        return tp
    m, n, k = _global_problem(_core.schedule_definition(schedule)["partition"], tp, a, w)
    steps = 2 * tp
    if (
        m < RS_TWO_STEPS_MIN_TOKENS
        or a.shape[1] > RS_TWO_STEPS_MAX_K_PER_RANK
        or min(n, k) < 1
        or _core.validate(schedule, tp, steps, m, n, k, 1)
    ):
        return tp
    plan = _core.build_plan(schedule, tp, steps, m, n, k, 1)
    if any(_extent_problem(dev["gemms"]) for dev in plan["devices"]):
        return tp
    return steps


def _global_problem(
    partition: dict, tp: int, a: torch.Tensor, w: torch.Tensor
) -> tuple[int, int, int]:
    """Global (M, N, K) from the per-rank A [rows, K_a] and W [N_w, K] and the Partition (read
    from the C++ definition): a sharded mode is TP times the local extent."""
    (ma, ka), nb = tuple(a.shape), int(w.shape[0])
    return (
        ma * tp if partition["a"] == "M" else ma,
        nb * tp if partition["b"] == "N" else nb,
        ka * tp if partition["a"] == "K" else ka,
    )


def _extent_problem(gemms) -> str:
    """The kernel's extent rule (16-byte TMA rows, int32 extents; the C++ definition the runtime
    checks again before launch) for these sub-GEMMs: '' or the first reason."""
    for g in gemms:
        why = _core.gemm_extent_problem(g["m"], g["n"], g["k"], 1, 2)
        if why:
            return why
    return ""


# Reduce-scatter schedules whose default S is 2*TP (see default_steps): from this many tokens on,
# with at most this much K per rank (benchmarks/results/2026-11-22-tp4.md, 2x and 4x H200).
# Fewer tokens: the extra step costs more than the slack gains (at 1024-2048 tokens S=2TP was
# slower than S=TP in 10 of 12 Llama-3 O/FC2 cases at TP=2, by up to 8.7%). Longer K: the
# epilogue's peer writes are a small part of a long mainloop, so S=TP loses little to them and
# saves a step (FC2 at TP=2, K/TP=14336-26624: S=2TP 0-2% slower in the torchrun sweep, 5-16% in
# the C++ one). Short K with many tokens, S=2TP wins: O at TP=4 0.512 vs 0.613 ms (8192 tokens),
# FC2 at TP=4 (K/TP=7168) 1.542 vs 1.616 ms.
_RS_TWO_STEPS_PER_SHARD = ("rs_tile_a", "rs_tile_b")
RS_TWO_STEPS_MIN_TOKENS = 4096
RS_TWO_STEPS_MAX_K_PER_RANK = 8192


def _fmt(s) -> str:
    return "[" + ", ".join(str(x) for x in s) + "]"


def make_spec(
    op: str,
    schedule: str,
    tp: int,
    rank: int,
    steps: int | None,
    a: torch.Tensor,
    w: torch.Tensor,
    *,
    bias=None,
    c=None,
    beta: float = 0.0,
    out=None,
) -> Spec:
    """Global problem, steps and every operand's expected shape for ``op`` with ``schedule`` on
    ``tp`` ranks; ValueError naming the constraint and the values. Shapes only: no device, no
    communicator."""
    if not isinstance(schedule, str):
        raise TypeError(
            f"{op}: schedule must be a schedule name (str), got {type(schedule).__name__}"
        )
    defs = {d["name"]: d for d in _core.schedules()}
    want = _COLLECTIVE[op]
    if schedule not in defs or defs[schedule]["collective"] != want:
        fits = sorted(n for n, d in defs.items() if d["collective"] == want)
        raise ValueError(
            f"{op}: schedule '{schedule}' is not a {want} schedule; use one of {', '.join(fits)}"
        )
    if steps is None:
        steps = default_steps(schedule, tp, a, w)
    if not isinstance(steps, int) or isinstance(steps, bool):
        raise TypeError(f"{op}: steps must be an int or None, got {steps!r}")
    for name, t in (("a" if op != "all_gather_gemm" else "a_shard", a), ("w", w)):
        if t.dim() != 2:
            raise ValueError(f"{op}: {name} must be 2-D, got shape {_fmt(t.shape)}")
    m, n, k = _global_problem(defs[schedule]["partition"], tp, a, w)
    ka = a.shape[1]
    if min(m, n, k) < 1:
        raise ValueError(f"{op}: empty operands: a {_fmt(a.shape)}, w {_fmt(w.shape)}")
    try:
        plan = _core.build_plan(schedule, tp, steps, m, n, k, 1)  # validates; raises ValueError
    except ValueError as e:
        raise ValueError(
            f"{op} ({schedule}, TP={tp}, S={steps}, global M={m} N={n} K={k}): {e}"
        ) from None
    local = plan["local_shapes"]
    a_name = "a_shard" if op == "all_gather_gemm" else "a"
    if tuple(w.shape) != tuple(local["B"]):
        raise ValueError(
            f"{op}: w has shape {_fmt(w.shape)} but {a_name} {_fmt(a.shape)} with "
            f"{schedule} on TP={tp} needs w of shape {_fmt(local['B'])} "
            f"(nn.Linear layout [N, K], K={ka} per rank)"
        )
    why = _extent_problem(plan["devices"][rank]["gemms"])  # every sub-GEMM of this rank
    if why:
        raise ValueError(
            f"{op}: {why} (a sub-GEMM of {schedule}; global M={m} N={n} K={k}, TP={tp}, S={steps})"
        )
    shapes: dict[str, tuple[int, ...]] = {
        "a": tuple(local["A"]),
        "w": tuple(local["B"]),
        "out": tuple(local["D"]),
    }
    if bias is not None:
        shapes["bias"] = (int(local["bias"]),)
    if beta != 0.0:
        if c is None:
            raise ValueError(
                f"{op}: beta={beta} but c is None: pass c (shape {_fmt(local['C'])}) or beta=0"
            )
        shapes["c"] = tuple(local["C"])
    for name, t in (("bias", bias), ("c", c if beta != 0.0 else None), ("out", out)):
        if t is not None and tuple(t.shape) != shapes[name]:
            raise ValueError(
                f"{op}: {name} has shape {_fmt(t.shape)}, expected "
                f"{_fmt(shapes[name])} (per rank; {schedule}, TP={tp}, global M={m} "
                f"N={n} K={k})"
            )
    return Spec(op, schedule, tp, steps, m, n, k, shapes, plan)


# ---------------------------------------------------------------------------------------------
# Plan cache entries.


class _RawCuda:
    """A device buffer for torch.as_tensor via __cuda_array_interface__ (no ownership)."""

    def __init__(self, ptr: int, numel: int):
        self.__cuda_array_interface__ = {
            "shape": (numel,),
            "typestr": "<i2",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
        }


@dataclass
class _Entry:
    spec: Spec
    dtype: torch.dtype
    beta: float
    ws: Any
    bases: list[int]
    graphs: collections.OrderedDict[tuple[int, ...], Any]
    gather: list[tuple[str, int, int, int]] | None = None  # (src, offset, row0, rows)
    slots: torch.Tensor | None = None
    gather_shape: tuple[int, int] | None = None
    out_shape: tuple[int, ...] = ()
    path: str | None = None  # "overlap" or "collective"; None: "auto", not chosen yet
    want_gathered: bool = False  # all_gather_gemm(..., return_gathered=True)
    scratch: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)  # (name, stream)
    tuning: dict[str, Any] | None = None  # the measurement behind an "auto" choice
    ws_bytes: int = 0  # bytes addressable from each base (the plan's layout total)

    @property
    def has_bias(self) -> bool:
        return "bias" in self.spec.shapes

    @functools.cached_property
    def collective_kind(self) -> str:
        """The collective path's branch, read from the C++ definition once per plan (not per
        call): "gather_a" / "gather_w" (all-gather of the activations or of the weight),
        "all_reduce", "scatter_n" (D sharded on N: rs_tile_b), "scatter_m" (D sharded on M)."""
        d = self.spec.plan["definition"]
        if d["collective"] == "all_gather":
            return "gather_a" if d["rotating"] == "A" else "gather_w"
        if d["collective"] == "all_reduce":
            return "all_reduce"
        return "scatter_n" if d["partition"]["d"] == "N" else "scatter_m"

    @functools.cached_property
    def gathered_shape(self) -> tuple[int, int]:
        """The whole all-gathered operand's shape (all-gather plans)."""
        return _gathered_shape(self.spec)


def _gathered_shape(spec: Spec) -> tuple[int, int]:
    return (spec.m if spec.plan["definition"]["rotating"] == "A" else spec.n, spec.k)


def _gather_recipe(spec: Spec, rank: int):
    """How to assemble the gathered operand of an all-gather plan on ``rank`` after a launch:
    per sub-GEMM, the rotating operand's rows come from the user tensor (own chunks) or from a
    receive slot (the peers' chunks, still valid until this rank's next launch)."""
    d = spec.plan["definition"]
    rot = "a" if d["rotating"] == "A" else "b"
    recipe = []
    for g in spec.plan["devices"][rank]["gemms"]:
        r = g[rot]
        row0, rows = (g["m0"], g["m"]) if rot == "a" else (g["n0"], g["n"])
        recipe.append(("slots" if r["buffer"] == "slots" else rot, r["offset"], row0, rows))
    return recipe, _gathered_shape(spec)


def _signature(key, error: str | None) -> dict[str, Any]:
    op, schedule, steps, dtype, shapes, beta, gathered, path = key
    sig = {"op": op, "schedule": schedule, "steps": steps, "dtype": str(dtype), "path": path}
    for name, shape in shapes:
        sig[f"{name}.shape"] = None if shape is None else list(shape)
    sig.update(beta=beta, return_gathered=gathered, error=error)
    return sig


def _create_entry(comm: Communicator, key, make) -> _Entry:
    op, _, _, dtype, _, beta, gathered, path = key
    spec, error, exc = None, None, None
    try:
        spec = make()
    except (ValueError, TypeError) as e:
        error, exc = f"{type(e).__name__}: {e}", e
    sigs = comm.all_gather(_signature(key, error), f"{op} plan signature")
    if exc is not None and all(s["error"] == error for s in sigs):
        raise exc  # every rank rejected the same inputs the same way: the plain error
    problem = signature_mismatch(sigs, op)
    if problem:
        raise ValueError(problem)
    entry = _Entry(
        spec=spec,
        dtype=dtype,
        beta=beta,
        ws=None,
        bases=[],
        graphs=collections.OrderedDict(),
        out_shape=torch.Size(spec.shapes["out"]),
        path=None if path == "auto" else path,
        want_gathered=gathered,
    )
    if entry.path != "collective":  # the collective path launches no plan: no workspace
        _attach_workspace(comm, entry, gathered)
    if len(comm.plans) >= MAX_PLANS:
        comm.drop_plan(next(iter(comm.plans)))
    comm.plans[key] = entry
    return entry


def _attach_workspace(comm: Communicator, entry: _Entry, gathered: bool) -> None:
    """The symmetric workspace of a plan that launches, and the recipe of its gathered operand."""
    spec = entry.spec
    layout = _core.workspace_layout(
        spec.schedule, spec.tp, spec.steps, spec.m, spec.n, spec.k, 1, 2, spec.plan["partial_via"]
    )  # the plan's own options
    entry.ws, entry.bases = comm.workspace_for(layout)
    # workspace_for shifts each base so that exactly the layout's bytes follow it: the graph
    # checks its own plan's layout against this.
    entry.ws_bytes = int(layout["total_bytes"])
    if gathered:
        entry.gather, entry.gather_shape = _gather_recipe(spec, comm.rank)
        slot_elems = int(spec.plan["slot_elems"])
        if slot_elems:
            # This rank's slots start at its shifted base (slots_offset is 0 in Plan::layout).
            raw = _RawCuda(entry.bases[comm.rank] + int(layout["slots_offset"]), slot_elems)
            entry.slots = torch.as_tensor(raw, device=comm.device).view(entry.dtype)


def _graph(comm: Communicator, entry: _Entry, ptrs: tuple[int, int, int, int, int]):
    g = entry.graphs.get(ptrs)
    if g is not None:
        entry.graphs.move_to_end(ptrs)  # LRU order
        return g
    if len(entry.graphs) < GRAPHS_PER_PLAN:
        s = entry.spec
        g = _core.DeviceGraph(
            s.schedule,
            s.tp,
            s.steps,
            s.m,
            s.n,
            s.k,
            1,
            comm.rank,
            comm.device.index,
            _DTYPES[entry.dtype],
            1.0,
            entry.beta,
            entry.has_bias,
            entry.bases,
            *ptrs,
            comm.wait_timeout_s,
            entry.ws.order,
            s.plan["partial_via"],
            entry.ws_bytes,
        )
    else:
        _, g = entry.graphs.popitem(last=False)
        g.update(*ptrs)
    entry.graphs[ptrs] = g
    return g


# torch's current raw stream as an int without building a Stream object (about 2 us less per
# call); the public API where this private binding is missing.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream_ptr(device: torch.device) -> int:
    if _raw_stream is not None:
        return _raw_stream(device.index)
    return torch.cuda.current_stream(device).cuda_stream


def _ptr(op: str, name: str, t: torch.Tensor, device: torch.device) -> int:
    """The data pointer of a tensor that passes check_placement (the fast path of it)."""
    p = t.data_ptr()
    if p & (_ALIGN - 1) or t.device != device or not t.is_contiguous():
        check_placement(op, device, {name: t})
    return p


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

        entry = _create_entry(comm, key, first)
    else:
        plans.move_to_end(key)  # LRU order (O(1), cheaper than checking whether it is needed)
    if entry.path == "overlap":
        return _launch(op, comm, entry, tensors, out)
    if entry.path == "collective":
        return _collective(op, comm, entry, tensors, out)
    return _choose_path(op, comm, entry, tensors, out)


def _user_ptrs(op: str, entry: _Entry, tensors, out, device):
    """The per-call checks of both paths (the fast path of check_placement, the output's shape,
    no aliasing with an input) and the output, allocated when not given. Returns
    ((a, w, c, out, bias) data pointers, 0 where absent; out)."""
    a, w = tensors["a"], tensors["w"]
    c = tensors.get("c")  # only passed when beta != 0 (_gemm_then_reduce)
    bias = tensors.get("bias")
    pa = _ptr(op, "a_shard" if op == "all_gather_gemm" else "a", a, device)
    pw = _ptr(op, "w", w, device)
    pc = 0 if c is None else _ptr(op, "c", c, device)
    pb = 0 if bias is None else _ptr(op, "bias", bias, device)
    if out is None:
        out = torch.empty(entry.out_shape, dtype=entry.dtype, device=device)
        return (pa, pw, pc, out.data_ptr(), pb), out
    po = _ptr(op, "out", out, device)
    if po in (pa, pw, pc, pb):
        name = {pa: "a", pw: "w", pc: "c", pb: "bias"}[po]
        raise ValueError(f"{op}: out shares memory with {name}; pass a separate output")
    if out.shape != entry.out_shape:
        raise ValueError(f"{op}: out has shape {_fmt(out.shape)}, expected {_fmt(entry.out_shape)}")
    return (pa, pw, pc, po, pb), out


def _launch(op: str, comm: Communicator, entry: _Entry, tensors, out):
    """The overlapped path: replay this rank's CUDA graph of the plan."""
    device = comm.device
    a, w = tensors["a"], tensors["w"]
    ptrs, out = _user_ptrs(op, entry, tensors, out, device)
    g = _graph(comm, entry, ptrs)
    err = g.error()
    if err:
        comm.mark_broken(err)
        comm.raise_if_broken()
    stream = _stream_ptr(device)
    g.launch(stream)
    if entry.gather is None:
        return out
    gathered = torch.empty(entry.gather_shape, dtype=entry.dtype, device=device)
    kdim = entry.gather_shape[1]
    for src, off, row0, rows in entry.gather:
        base = entry.slots if src == "slots" else (a if src == "a" else w).view(-1)
        gathered[row0 : row0 + rows].copy_(base[off : off + rows * kdim].view(rows, kdim))
    # The slots are rewritten by the peers after this rank's next entry barrier: a launch on
    # another stream must wait for these copies too, not only for the graph.
    entry.ws.order.record(stream)
    return out, gathered


def _collective(op: str, comm: Communicator, entry: _Entry, tensors, out):
    """The plain path, the baseline the overlapped one must beat: the group's collective (NCCL)
    and one torch GEMM, in the op's dtype, on the current stream. Same operands, shapes and
    result as the plan of ``entry.spec``.

    Written for host time, since it is chosen for small problems whose calls take tens of us:
    the process group's own methods (``_allgather_base`` etc., what ``torch.distributed``'s
    wrappers call, without their per-call argument checks and deprecation shims), the plan's
    buffers reused, and the overlapped path's per-call checks (``_user_ptrs``)."""
    pg, device = comm.group, comm.device
    a, w, bias, c = tensors["a"], tensors["w"], tensors.get("bias"), tensors.get("c")
    _, out = _user_ptrs(op, entry, tensors, out, device)
    kind = entry.collective_kind  # the branch follows the C++ definition, not the name
    if kind in ("gather_a", "gather_w"):
        part = a if kind == "gather_a" else w
        shape = entry.gathered_shape
        # The gathered operand goes back to the caller only with return_gathered; otherwise one
        # buffer per plan, as a hand-written baseline keeps it (a fresh allocation per call makes
        # the caching allocator alternate blocks that NCCL's stream still holds).
        gathered = (
            torch.empty(shape, dtype=part.dtype, device=part.device)
            if entry.want_gathered
            else _scratch(entry, "gathered", shape, part, _stream_ptr(device))
        )
        pg._allgather_base(gathered, part).wait()  # wait(): the current stream waits for NCCL
        x, wf = (gathered, w) if kind == "gather_a" else (a, gathered)
        if bias is None:
            torch.mm(x, wf.t(), out=out)
        else:
            torch.addmm(bias, x, wf.t(), out=out)
        return (out, gathered) if entry.want_gathered else out
    if kind == "all_reduce":
        torch.mm(a, w.t(), out=out)
        pg.allreduce([out]).wait()
    elif kind == "scatter_n":  # rs_tile_b
        # reduce-scatter splits dim 0: reduce D^T = W A^T and transpose this rank's rows.
        stream = _stream_ptr(device)
        part_t = torch.mm(
            w, a.t(), out=_scratch(entry, "partial", (w.shape[0], a.shape[0]), a, stream)
        )
        mine = _scratch(
            entry, "mine", (part_t.shape[0] // entry.spec.tp, part_t.shape[1]), a, stream
        )
        pg._reduce_scatter_base(mine, part_t).wait()  # default op: sum
        out.copy_(mine.t())
    else:  # scatter_m: rs_tile_a
        partial = torch.mm(
            a,
            w.t(),
            out=_scratch(entry, "partial", (a.shape[0], w.shape[0]), a, _stream_ptr(device)),
        )
        pg._reduce_scatter_base(out, partial).wait()
    if c is not None:
        out.add_(c, alpha=entry.beta)
    if bias is not None:
        out.add_(bias)
    return out


def _scratch(entry: _Entry, name: str, shape, like: torch.Tensor, stream: int) -> torch.Tensor:
    """A buffer of the collective path kept with the plan, one per CUDA stream: calls on one
    stream are ordered, calls on two streams (e.g. overlapped micro-batches) must not share a
    buffer that one's NCCL kernel writes while the other's GEMM reads it."""
    key = (name, stream)
    t = entry.scratch.get(key)
    if t is None:
        t = entry.scratch[key] = torch.empty(shape, dtype=like.dtype, device=like.device)
    return t


# "auto": how the first call measures both paths. Alternating rounds (overlap, collective,
# collective, overlap, ...) so that clock ramp-up and other ranks' noise hit both alike.
TUNE_ROUNDS = 6
TUNE_ROUNDS_LONG, TUNE_LONG_MS = 3, 5.0  # calls of >= 5 ms: 3 rounds
TUNE_ROUND_MS = 2.0  # timed calls per round: enough for ~2 ms of work ...
TUNE_MAX_CALLS = 16  # ... at most this many (plus one untimed call that fills the queue)


def pick_path(everyone: Sequence[dict[str, Sequence[float]]]) -> tuple[str, dict[str, float]]:
    """The "auto" verdict from every rank's per-round ms of both paths (``everyone[r][path][i]``):
    per round the maximum over ranks, then the median over rounds; "overlap" unless the
    collective path is strictly faster. Pure, so that every rank computes the same verdict."""
    rounds = min(len(t[p]) for t in everyone for p in ("overlap", "collective"))
    if rounds < 1:
        raise ValueError("pick_path needs at least one timed round of each path")
    med = {
        p: statistics.median(max(t[p][i] for t in everyone) for i in range(rounds))
        for p in ("overlap", "collective")
    }
    return ("overlap" if med["overlap"] <= med["collective"] else "collective"), med


def _choose_path(op: str, comm: Communicator, entry: _Entry, tensors, out):
    """``path="auto"``, first call of a plan: time the overlapped and the collective path on
    these very tensors, take every round's maximum over the ranks (the slowest rank sets a
    collective's pace) and keep the path with the lower median. Every rank gets the same numbers
    through the control group, hence the same choice. Costs 2 x TUNE_ROUNDS rounds of calls (each
    ~2 ms of work, 3 rounds for calls of 5 ms or more) and as many host synchronisations, once
    per plan; the result of the last call of the chosen path is returned (both paths compute the
    same thing)."""
    runs = {
        "overlap": lambda: _launch(op, comm, entry, tensors, out),
        "collective": lambda: _collective(op, comm, entry, tensors, out),
    }
    why_not = collective_unavailable(comm.group)
    if why_not:  # the same verdict on every rank: it depends on the group only
        entry.path, entry.tuning = "overlap", dict(collective_unavailable=why_not)
        return runs["overlap"]()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(path: str, calls: int) -> float:
        # An untimed call first keeps the GPU busy while the host enqueues the timed ones: the
        # steady state of a model, where launch latency hides behind queued work. (Without it
        # the collective path, whose host side is longer, was charged its launch latency:
        # measured 0.146 ms where it runs at 0.078 ms, Llama-8B QKV at 1024 tokens on 2x H200.)
        runs[path]()
        start.record()
        for _ in range(calls):
            runs[path]()
        stop.record()
        wait_event(stop, comm.timeout_s, f"{op} path choice ({path} path)", comm)
        return start.elapsed_time(stop) / calls

    # One untimed call each (graph upload, NCCL's lazy communicator set-up), then one timed call
    # to size the rounds; the count must be the same on every rank (collectives). An error here
    # propagates: it is a real failure, not a reason to pick the other path on this rank only.
    probe = {p: (runs[p](), timed(p, 1))[1] for p in runs}
    comm.check()
    probe = comm.all_gather(probe, f"{op} path choice (probe)")
    slowest = max(max(pr.values()) for pr in probe)
    calls = max(1, min(TUNE_MAX_CALLS, int(TUNE_ROUND_MS / max(slowest, 1e-3))))
    # Long calls: fewer rounds (their choice is rarely close, and each round costs 2 calls).
    rounds = TUNE_ROUNDS if slowest < TUNE_LONG_MS else TUNE_ROUNDS_LONG
    times: dict[str, list[float]] = {p: [] for p in runs}
    for r in range(rounds):
        order = ("overlap", "collective") if r % 2 == 0 else ("collective", "overlap")
        for p in order:
            times[p].append(timed(p, calls))
    comm.check()
    everyone = comm.all_gather(times, f"{op} path choice (timings)")
    entry.path, med = pick_path(everyone)
    entry.tuning = dict(
        overlap_ms=med["overlap"],
        collective_ms=med["collective"],
        rounds=rounds,
        calls_per_round=calls,
    )
    if entry.path == "collective":
        entry.graphs.clear()  # synchronised above: nothing of them is in flight
    return runs[entry.path]()


def collective_unavailable(group) -> str | None:
    """Why the collective path cannot run on ``group`` (None: it can): it needs a backend that
    runs collectives on CUDA tensors (NCCL). Depends on the group only, so every rank agrees."""
    import torch.distributed as dist

    try:
        backend = str(dist.get_backend(group))
    except Exception as e:  # noqa: BLE001 - an unusual group object: say so, keep the plan
        return f"the group's backend is unknown ({type(e).__name__}: {e})"
    if "nccl" not in backend.lower():
        return f"the group's backend is {backend!r}; the collective path needs NCCL"
    return None


def wait_event(event, timeout_s: float, what: str, comm: Communicator | None = None) -> None:
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


# ---------------------------------------------------------------------------------------------
# The ops.


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
    resp. N/S for ag_rotate_b) a multiple of 8. ``steps``: S = k*TP pipeline steps; None:
    ``default_steps`` (S = TP for all-gather: the faster S in 21 of 30 Llama-3 QKV/FC1 cases on
    2x H200).
    ``group``: a ProcessGroup (default: the world group) or a ``distgemm.Communicator``.
    ``path``: "auto" (measure both at the first call, keep the faster), "overlap" (the plan) or
    "collective" (NCCL all-gather + torch GEMM); None: ``DEFAULT_PATH`` (env DISTGEMM_PATH, else
    "auto"); see the module docstring. No autograd: inputs that require grad are refused while
    grad mode is on.
    M must be divisible by S (ag_rotate_a; N by S for ag_rotate_b).
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
    (N/S for rs_tile_b) multiples of 8; M (rs_tile_a) resp. N (rs_tile_b) divisible by S.
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
    multiples of 8; M divisible by S. ``beta``: default 0.0. ``steps``: S = k*TP; None:
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
