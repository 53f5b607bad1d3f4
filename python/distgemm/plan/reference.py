"""CPU reference executor: runs a Plan on simulated devices and compares with the full GEMM.

Each simulated device has its own numpy arrays (the user's A, B, C, D, bias shards per the
Partition, and the symmetric slots) and its own flags. Data moves between devices only as the
Plan's copies and epilogue writes say: slots and D start as NaN, so a copy the plan forgot, or a
GEMM that runs before its data arrived, makes the result wrong (NaN), never accidentally right.

Ops become ready as on the GPU: in stream order, after their local dependency, once every waited
flag holds the launch generation. Among ready ops the executor picks with a *policy*, and
``run_reference`` tries several: consumers-first from either end of the device range and random
interleavings. A plan that is missing a wait therefore reads a slot before it is written in at
least one order; a plan whose waits can never be satisfied raises ``ExecutionError`` (deadlock).
Plans with uneven tiles run the same way: every op carries its own extents, and an empty tile has
no ops, so a device may run fewer GEMMs than S.

FP8 (``fp8=True``): A and B hold values exactly representable in float8_e4m3fn, with float32
scales ``scale_a`` / ``scale_b``: row-wise vectors ([M] / [N], sharded like A's / B's rows) where
the plan row-scales that operand, tensor-wise scalars otherwise. Each GEMM dequantizes, then
multiplies: ``(sa[rows, None] * A_rows) @ (sb[rows, None] * B_rows).T``, reading row scales only
through its own ``scale_a`` / ``scale_b`` references, and every copy with scale references moves
its rows' scales with its rows. Scale slots start as NaN too, so a forgotten scale copy gives
NaN; a GEMM that forgets its scales, or reads another row's, gives a wrong result.

``SharedWorkspace`` runs launches of several plans on one workspace per device, as a
communicator's plans share one: slots keep what the last launch left, flags keep the generation
of the launch that last set them, and each launch takes the next generation. (Scale slots are
the launch's own, NaN at its start: only their placement is shared, which ``Plan::layout`` and
``WorkspacePool`` decide.)
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

__all__ = [
    "ExecutionError",
    "SharedWorkspace",
    "execute_plan",
    "run_reference",
    "reference_inputs",
    "expected_outputs",
    "shard_outputs",
    "POLICIES",
]

POLICIES = (
    "compute_first_low",
    "compute_first_high",
    "copies_first",
    "random:1",
    "random:2",
    "random:3",
)


class ExecutionError(RuntimeError):
    """The plan cannot run to completion (deadlock, out-of-bounds access)."""


def _shard(x: np.ndarray, mode: str, row_mode: str, col_mode: str, d: int, tp: int) -> np.ndarray:
    """Device d's shard of a [L, rows, cols] array."""
    if mode == row_mode:
        r = x.shape[1] // tp
        return x[:, d * r : (d + 1) * r, :]
    if mode == col_mode:
        c = x.shape[2] // tp
        return x[:, :, d * c : (d + 1) * c]
    return x


# FP8 scales: float32 values in [SCALE_LOW, SCALE_HIGH), distinct per row, never 1, so that a
# missing or misplaced scale changes the result.
SCALE_LOW, SCALE_HIGH = 0.25, 4.0


def _e4m3(shape: tuple[int, ...], seed: int, dtype) -> np.ndarray:
    """Standard normal values rounded to float8_e4m3fn (exact in float32 and float64)."""
    import torch  # only FP8 inputs need it: the planning tools work without torch

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float32).to(torch.float8_e4m3fn)
    return x.to(torch.float64).numpy().astype(dtype)


def _scales(rng: np.random.Generator, rows: int | None, dtype) -> np.ndarray:
    """Positive float32 scales: a [rows] vector, or a 0-d scalar for rows=None (tensor-wise)."""
    x = rng.uniform(SCALE_LOW, SCALE_HIGH, () if rows is None else rows).astype(np.float32)
    return np.asarray(x, dtype=dtype)


def reference_inputs(
    plan: dict, seed: int = 0, dtype=np.float64, fp8: bool = False
) -> dict[str, np.ndarray]:
    """Global random inputs A[L,M,K], B[L,N,K], C[L,M,N], bias[N] (never zeros). With ``fp8``,
    A and B are e4m3 values, and ``scale_a`` ([M], or a 0-d scalar where the plan does not
    row-scale A) and ``scale_b`` ([N] or a scalar) are positive float32 values."""
    p = plan["problem"]
    rng = np.random.default_rng(seed)
    L, M, N, K = p["l"], p["m"], p["n"], p["k"]
    out = {
        "A": rng.standard_normal((L, M, K)).astype(dtype),
        "B": rng.standard_normal((L, N, K)).astype(dtype),
        "C": rng.standard_normal((L, M, N)).astype(dtype),
        "bias": rng.standard_normal(N).astype(dtype),
    }
    if fp8:
        out["A"] = _e4m3((L, M, K), seed, dtype)
        out["B"] = _e4m3((L, N, K), seed + 1, dtype)
        out["scale_a"] = _scales(rng, M if plan["row_scale_a"] else None, dtype)
        out["scale_b"] = _scales(rng, N if plan["row_scale_b"] else None, dtype)
    return out


def _dequantized(x: np.ndarray, scale: np.ndarray | None) -> np.ndarray:
    """Rows of a [L, rows, K] operand times their scales (a [rows] vector or a scalar)."""
    if scale is None:
        return x
    return x * (scale[None, :, None] if scale.ndim else scale)


def expected_outputs(
    plan: dict, inputs: dict[str, np.ndarray], alpha: float, beta: float, use_bias: bool
) -> list[np.ndarray]:
    """Each device's D per the Partition, from the full un-distributed GEMM (of the dequantized
    operands where the inputs carry FP8 scales)."""
    a = _dequantized(inputs["A"], inputs.get("scale_a"))
    b = _dequantized(inputs["B"], inputs.get("scale_b"))
    full = alpha * np.matmul(a, np.swapaxes(b, 1, 2))
    if beta != 0.0:
        full = full + beta * inputs["C"]
    if use_bias:
        full = full + inputs["bias"][None, None, :]
    return shard_outputs(plan, full)


def shard_outputs(plan: dict, full: np.ndarray) -> list[np.ndarray]:
    """Each device's shard of a full D[L, M, N], per the plan's Partition."""
    mode = plan["definition"]["partition"]["d"]
    return [
        np.ascontiguousarray(_shard(full, mode, "M", "N", d, plan["tp"])) for d in range(plan["tp"])
    ]


class SharedWorkspace:
    """One workspace per simulated device, shared by the launches of several plans: per device
    ``slot_elems`` slot elements (NaN until written) and ``num_flags`` flags, and one launch
    generation. A plan's slots start at an element offset into them (``execute_plan``'s
    ``slot_offset``); its flags are the first of the shared ones."""

    def __init__(self, tp: int, slot_elems: int, num_flags: int, dtype=np.float64):
        self.slots = [np.full(slot_elems, np.nan, dtype=dtype) for _ in range(tp)]
        self.flags = [np.zeros(num_flags, dtype=np.int64) for _ in range(tp)]
        self.epoch = 0  # the generation of the last launch


class _Device:
    def __init__(
        self,
        plan: dict,
        d: int,
        inputs: dict[str, np.ndarray],
        dtype,
        shared: SharedWorkspace | None = None,
        slot_offset: int = 0,
    ):
        part = plan["definition"]["partition"]
        tp = plan["tp"]
        self.buf: dict[str, np.ndarray] = {
            "A": np.ascontiguousarray(_shard(inputs["A"], part["a"], "M", "K", d, tp)).ravel(),
            "B": np.ascontiguousarray(_shard(inputs["B"], part["b"], "N", "K", d, tp)).ravel(),
            "C": np.ascontiguousarray(_shard(inputs["C"], part["d"], "M", "N", d, tp)).ravel(),
            "D": np.full(
                int(np.prod(plan["local_shapes"]["D"])) * plan["problem"]["l"], np.nan, dtype=dtype
            ),
            "slots": np.full(plan["slot_elems"], np.nan, dtype=dtype),
        }
        nb = plan["local_shapes"]["bias"]
        self.buf["bias"] = np.ascontiguousarray(
            inputs["bias"][d * nb : (d + 1) * nb] if part["d"] == "N" else inputs["bias"]
        )
        for name, operand, row_mode in (("scale_a", "A", "M"), ("scale_b", "B", "N")):
            scale = inputs.get(name)
            if scale is None or scale.ndim == 0:
                if plan["row_" + name]:
                    raise ExecutionError(
                        f"the plan row-scales {operand} but the inputs carry "
                        f"{'no' if scale is None else 'a tensor-wise'} {name}: "
                        "make them with reference_inputs(plan, fp8=True)"
                    )
                if scale is not None:
                    self.buf[name] = scale  # tensor-wise: every GEMM reads the scalar
                continue
            rows = plan["local_shapes"][operand][0]
            mode = part["a" if operand == "A" else "b"]
            self.buf[name] = np.ascontiguousarray(
                scale[d * rows : (d + 1) * rows] if mode == row_mode else scale
            )
        self.buf["scale_slots"] = np.full(plan["scale_slot_rows"], np.nan, dtype=dtype)
        self.flags = np.zeros(plan["num_flags"], dtype=np.int64)
        if shared is not None:
            if not 0 <= slot_offset <= shared.slots[d].size - plan["slot_elems"]:
                raise ExecutionError(
                    f"slots at offset {slot_offset} of {plan['slot_elems']} elements do not fit "
                    f"the shared workspace's {shared.slots[d].size}"
                )
            self.buf["slots"] = shared.slots[d][slot_offset : slot_offset + plan["slot_elems"]]
            self.flags = shared.flags[d]


def _view(
    devs: list[_Device], ref: dict, rows: int, cols: int, batches: int, what: str
) -> np.ndarray:
    """A [batches, rows, cols] strided view of a device buffer, bounds-checked."""
    if not 0 <= ref["device"] < len(devs):
        raise ExecutionError(f"{what}: device {ref['device']} does not exist")
    arr = devs[ref["device"]].buf[ref["buffer"]]
    off, ld, bs = ref["offset"], ref["ld"], ref["batch_stride"]
    last = off + (batches - 1) * bs + (rows - 1) * ld + cols
    if off < 0 or last > arr.size:
        raise ExecutionError(
            f"{what}: {ref['buffer']} of device {ref['device']} accessed out of bounds "
            f"(offset {off}, ld {ld}, batch stride {bs}, {batches}x{rows}x{cols} of {arr.size})"
        )
    it = arr.itemsize
    return np.lib.stride_tricks.as_strided(
        arr[off:], shape=(batches, rows, cols), strides=(bs * it, ld * it, it), writeable=True
    )


def execute_plan(
    plan: dict,
    inputs: dict[str, np.ndarray],
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    use_bias: bool = False,
    policy: str = "compute_first_low",
    dtype=np.float64,
    shared: SharedWorkspace | None = None,
    slot_offset: int = 0,
) -> list[np.ndarray]:
    """Run one launch of ``plan`` on simulated devices; returns each device's D as
    [L, rows, cols]. With ``shared``, the launch runs on that workspace (its slots from element
    ``slot_offset`` on) with the next launch generation, after the launches before it."""
    tp, L = plan["tp"], plan["problem"]["l"]
    devs = [_Device(plan, d, inputs, dtype, shared, slot_offset) for d in range(tp)]
    epoch = 1
    if shared is not None:
        shared.epoch += 1
        epoch = shared.epoch
    next_gemm = [0] * tp
    next_copy = [0] * tp
    gemm_done = [[False] * len(plan["devices"][d]["gemms"]) for d in range(tp)]
    rng = random.Random(int(policy.split(":")[1]) if policy.startswith("random") else 0)

    def flags_ok(d: int, waits: Sequence[int]) -> bool:
        for f in waits:
            if not 0 <= f < len(devs[d].flags):
                raise ExecutionError(
                    f"device {d} waits for flag {f}, outside the plan's {len(devs[d].flags)} flags"
                )
            if devs[d].flags[f] != epoch:
                return False
        return True

    def signal(sigs) -> None:
        for s in sigs:
            if not (0 <= s["device"] < tp and 0 <= s["flag"] < len(devs[s["device"]].flags)):
                raise ExecutionError(
                    f"signal to flag {s['flag']} on device {s['device']} is out of range"
                )
            devs[s["device"]].flags[s["flag"]] = epoch

    def ready() -> list[tuple]:
        out = []
        for d in range(tp):
            gi = next_gemm[d]
            if gi < len(plan["devices"][d]["gemms"]) and flags_ok(
                d, plan["devices"][d]["gemms"][gi]["waits"]
            ):
                out.append(("gemm", d, gi))
            ci = next_copy[d]
            if ci < len(plan["devices"][d]["copies"]):
                c = plan["devices"][d]["copies"][ci]
                if (c["after_gemm"] < 0 or gemm_done[d][c["after_gemm"]]) and flags_ok(
                    d, c["waits"]
                ):
                    out.append(("copy", d, ci))
        return out

    def pick(cands: list[tuple]) -> tuple:
        if policy == "compute_first_low":
            return min(cands, key=lambda e: (e[0] != "gemm", e[1]))
        if policy == "compute_first_high":
            return min(cands, key=lambda e: (e[0] != "gemm", -e[1]))
        if policy == "copies_first":
            return min(cands, key=lambda e: (e[0] != "copy", e[1]))
        return rng.choice(cands)

    def move_scales(d: int, j: int, c: dict) -> None:
        """The copy's rows' scales, moved with them (a copy without scale refs moves none)."""
        if (c["scale_src"] is None) != (c["scale_dst"] is None):
            raise ExecutionError(
                f"device {d} copy #{j} has scale_src {c['scale_src']} but scale_dst "
                f"{c['scale_dst']}: scales move from one place to another"
            )
        if c["scale_src"] is not None:
            what = f"device {d} copy #{j} scales"
            src = _view(devs, c["scale_src"], c["rows"], 1, 1, what + " source")
            _view(devs, c["scale_dst"], c["rows"], 1, 1, what + " destination")[...] = src

    def scaled(d: int, g: dict, operand: str, rows: int, x: np.ndarray, what: str) -> np.ndarray:
        """A GEMM operand times its scales: the rows' scales through the GEMM's scale ref, else
        the device's tensor-wise scalar, else none (a GEMM that forgets the row scales it needs
        computes a wrong result)."""
        ref = g["scale_" + operand]
        if ref is not None:
            return x * _view(devs, ref, rows, 1, 1, f"{what} scale_{operand}")[0]
        scalar = devs[d].buf.get("scale_" + operand)
        return x * scalar if scalar is not None and scalar.ndim == 0 else x

    total = sum(len(dv["gemms"]) + len(dv["copies"]) for dv in plan["devices"])
    for _ in range(total):
        cands = ready()
        if not cands:
            stuck = []
            for d in range(tp):
                gi = next_gemm[d]
                if gi < len(plan["devices"][d]["gemms"]):
                    waits = plan["devices"][d]["gemms"][gi]["waits"]
                    stuck.append(f"device {d} GEMM step {gi} waits for flags {waits}")
                ci = next_copy[d]
                if ci < len(plan["devices"][d]["copies"]):
                    stuck.append(f"device {d} copy #{ci} waits")
            raise ExecutionError("deadlock: " + "; ".join(stuck))
        kind, d, j = pick(cands)
        if kind == "copy":
            c = plan["devices"][d]["copies"][j]
            src = _view(devs, c["src"], c["rows"], c["cols"], L, f"device {d} copy #{j} source")
            dst = _view(
                devs, c["dst"], c["rows"], c["cols"], L, f"device {d} copy #{j} destination"
            )
            dst[...] = src
            move_scales(d, j, c)
            next_copy[d] += 1
            signal(c["signals"])
        else:
            g = plan["devices"][d]["gemms"][j]
            what = f"device {d} GEMM step {j}"
            a = _view(devs, g["a"], g["m"], g["k"], L, what + " A")
            b = _view(devs, g["b"], g["n"], g["k"], L, what + " B")
            a, b = scaled(d, g, "a", g["m"], a, what), scaled(d, g, "b", g["n"], b, what)
            acc = alpha * np.matmul(a, np.swapaxes(b, 1, 2))
            if g["partial"] is not None:
                acc = acc + _view(devs, g["partial"], g["m"], g["n"], L, what + " partial")
            if g["user_c"] is not None and beta != 0.0:
                acc = acc + beta * _view(devs, g["user_c"], g["m"], g["n"], L, what + " C")
            if g["bias"] is not None and use_bias:
                acc = (
                    acc + _view(devs, g["bias"], 1, g["n"], 1, what + " bias")[0, 0][None, None, :]
                )
            _view(devs, g["d"], g["m"], g["n"], L, what + " D")[...] = acc
            gemm_done[d][j] = True
            next_gemm[d] += 1
            signal(g["signals"])
    shape = plan["local_shapes"]["D"]
    return [devs[d].buf["D"].reshape(L, shape[0], shape[1]) for d in range(tp)]


def run_reference(
    plan: dict,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    use_bias: bool = False,
    seed: int = 0,
    policies: Sequence[str] | None = None,
    fp8: bool = False,
) -> float:
    """Run ``plan`` under every policy with fresh random inputs (FP8 values and scales with
    ``fp8``); return the worst relative Frobenius error against the full GEMM in float64 (``inf``
    if any output element is NaN). Raises ``ExecutionError`` if the plan cannot complete, and
    ``ValueError`` above the sizes it runs in seconds to a minute: 2**34 multiply-adds per GEMM
    (each policy runs two in float64) and 2**27 elements of A, B and C together."""
    p = plan["problem"]
    macs = p["m"] * p["n"] * p["k"] * p["l"]
    elems = p["l"] * (p["k"] * (p["m"] + p["n"]) + p["m"] * p["n"])
    if macs > 2**34 or elems > 2**27:
        raise ValueError(
            f"run_reference: M={p['m']} N={p['n']} K={p['k']} L={p['l']} ({macs} multiply-adds, "
            f"{elems} input elements) is above the CPU reference executor's 2**34 multiply-adds "
            "or 2**27 elements: check a smaller shape with the same schedule, TP and S, or run "
            "execute_plan once"
        )
    worst = 0.0
    for n, policy in enumerate(policies or POLICIES):
        inputs = reference_inputs(plan, seed=seed + 7919 * n, fp8=fp8)
        got = execute_plan(plan, inputs, alpha=alpha, beta=beta, use_bias=use_bias, policy=policy)
        want = expected_outputs(plan, inputs, alpha, beta, use_bias)
        for g, w in zip(got, want):
            if not np.all(np.isfinite(g)):
                return float("inf")
            err = float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-300))
            worst = max(worst, err)
    return worst
