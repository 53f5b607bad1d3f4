"""Predicted per-stream timeline of a Plan under a simple cost model.

When each device's compute stream and copy engine are busy: it explains a schedule's overlap (and
why S > TP shrinks the first bubble) before anything runs on a GPU; measured timelines come from
the benchmarks.

Cost model (all overridable): a sub-GEMM takes 2*m*n*k*L / rate, or longer if its epilogue writes
more bytes across NVLink than the link moves in that time (reduce-scatter partials); a copy takes
bytes / link bandwidth; a flag becomes visible `flag_us` after its setter ends; every launch starts
with an entry barrier of `barrier_us`. Defaults are an H200's rates: ~790 TFLOP/s dense bf16
GEMM, ~370 GB/s one-way copy-engine peer copies. The model ignores wave quantisation and the
efficiency loss of small tiles, so it is optimistic for small problems.
"""

from __future__ import annotations

from dataclasses import dataclass

from .invariants import happens_before_order

__all__ = ["CostModel", "predict", "format_timeline"]


@dataclass
class CostModel:
    tflops: float = 790.0  # per GPU
    link_gbs: float = 370.0  # one-way peer bandwidth per GPU
    elem_bytes: int = 2
    flag_us: float = 2.0
    barrier_us: float = 5.0


def predict(plan: dict, cost: CostModel | None = None) -> dict:
    """Start/end (µs) of every op, the launch time, the local-GEMM floor and overlap efficiency,
    under ``cost`` (default ``CostModel()``)."""
    if cost is None:
        cost = CostModel()
    order = happens_before_order(plan)
    if order is None:
        raise ValueError("the plan has a cyclic wait; no timeline exists")
    L = plan["problem"]["l"]
    end: dict[tuple[str, int, int], float] = {}
    start: dict[tuple[str, int, int], float] = {}
    flag_time: dict[tuple[int, int], float] = {}
    for ev in order:
        kind, d, j = ev
        dev = plan["devices"][d]
        op = dev["gemms"][j] if kind == "gemm" else dev["copies"][j]
        t = cost.barrier_us
        if j > 0:
            t = max(t, end[(kind, d, j - 1)])
        if kind == "copy" and op["after_gemm"] >= 0:
            t = max(t, end[("gemm", d, op["after_gemm"])])
        for f in op["waits"]:
            t = max(t, flag_time.get((d, f), t))
        if kind == "gemm":
            dur = 2.0 * op["m"] * op["n"] * op["k"] * L / (cost.tflops * 1e6)
            if op["d"]["device"] != d:  # the epilogue writes the partial across NVLink
                dur = max(dur, op["m"] * op["n"] * L * cost.elem_bytes / (cost.link_gbs * 1e3))
        else:
            dur = op["rows"] * op["cols"] * L * cost.elem_bytes / (cost.link_gbs * 1e3)
            if op["src"]["device"] == op["dst"]["device"] == d:
                dur /= 8.0  # a local copy runs at HBM speed, several times the link
        start[ev], end[ev] = t, t + dur
        for s in op["signals"]:
            flag_time[(s["device"], s["flag"])] = t + dur + cost.flag_us
    total = max(end.values()) if end else 0.0
    p = plan["problem"]
    floor = 2.0 * p["m"] * p["n"] * p["k"] * L / plan["tp"] / (cost.tflops * 1e6)
    return {
        "start": start,
        "end": end,
        "total_us": total,
        "local_gemm_us": floor,
        "overlap_efficiency": floor / total if total else 0.0,
    }


def format_timeline(plan: dict, pred: dict, width: int = 72) -> str:
    """ASCII Gantt chart: per device a compute row (GEMM steps as digits) and a copy-engine row."""
    total = pred["total_us"] or 1.0
    scale = width / total
    lines = [
        f"predicted timeline ({total:.0f} us; each column {total / width:.1f} us; "
        "digits = GEMM step mod 10, '=' = copy engine busy, '.' = idle)"
    ]
    for d in range(plan["tp"]):
        for kind, label in (("gemm", "SM"), ("copy", "CE")):
            row = ["."] * width
            for (k, dd, j), s in pred["start"].items():
                if k != kind or dd != d:
                    continue
                a = int(s * scale)
                b = max(a + 1, int(pred["end"][(k, dd, j)] * scale))
                step = plan["devices"][d]["gemms"][j]["iteration"] if kind == "gemm" else 0
                for x in range(a, min(b, width)):
                    row[x] = str(step % 10) if kind == "gemm" else "="
            lines.append(f"dev{d} {label} |{''.join(row)}|")
    lines.append(
        f"local GEMM alone {pred['local_gemm_us']:.0f} us, predicted launch {total:.0f} us, "
        f"overlap efficiency {pred['overlap_efficiency']:.3f}"
    )
    return "\n".join(lines)
