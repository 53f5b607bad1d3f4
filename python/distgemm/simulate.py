"""``python -m distgemm.simulate``: print a Plan as a step table and prove its invariants.

Example::

    python -m distgemm.simulate --schedule ag_rotate_a --tp 4 --steps 8

One row per (step, device): what the device's compute stream does (waits, the GEMM tile and where
its operands come from, where the result goes, signals) and what its copy engine does. Where S
does not divide the split mode the tiles are uneven; a step whose tile is empty has no GEMM
(``(empty tile t)``), and nothing waits for or sends that tile. Flags are
written ``f3@1`` (flag 3 in device 1's workspace); ``slot2`` is receive slot 2 of the device named
with it. Every launch begins with an entry barrier across all devices (not shown per step).
With FP8 row-wise scales (``--row-scale-a``, ``--row-scale-b``) a GEMM shows where it reads its
rows' scales (``sA=scale_slots[0:512]``) and a copy of scaled rows ends in ``+ row scales``.

``--check`` (default) runs ``distgemm.plan.verify_plan``; on a violation the command prints the
invariant, device and step in words and exits 1. ``--json`` prints the plan, the table and the
check result as JSON instead. Bad input (a size above 2**31-1, an operand whose byte count
overflows 64 bits, a shape the schedule cannot split) exits 2 with one line saying why.
"""

from __future__ import annotations

import json
import sys

from . import _core, cli, llama3
from .plan.invariants import verify_plan
from .plan.timeline import CostModel, format_timeline, predict
from .plan.view import build_plan, schedule_names, workspace_bytes

__all__ = ["step_table", "format_table", "main"]

# Llama-3-70B FC1 at 8192 tokens (the sweep's shape table): the default problem when none is given.
DEFAULT_SHAPE = dict(zip("mnk", llama3.gemm("70B", "FC1", 8192)), l=1)


def default_shape(tp: int, steps: int | None) -> dict:
    """The default problem for TP and S: the Llama shape, each of M, N, K rounded down to a
    multiple of S*TP (which every schedule can split) when it is not one already."""
    unit = max(1, tp) * max(1, steps if steps is not None else tp)
    shape = dict(DEFAULT_SHAPE)
    for d in ("m", "n", "k"):
        if shape[d] % unit and shape[d] > unit:
            shape[d] -= shape[d] % unit
    return shape


def _ref(
    ref: dict | None,
    here: int,
    slot_elems_per_slot: int | None = None,
    rows: int | None = None,
    cols: int | None = None,
) -> str:
    """Short label of an operand: `A`, `D[512:1024, :]`, `slot0@dev1`."""
    if ref is None:
        return "-"
    name = ref["buffer"]
    where = "" if ref["device"] == here else f"@dev{ref['device']}"
    if name == "slots" and slot_elems_per_slot:
        return f"slot{ref['offset'] // slot_elems_per_slot}{where}"
    if ref["offset"] == 0 or rows is None or not ref["ld"]:
        return f"{name}{where}" if ref["offset"] == 0 else f"{name}+{ref['offset']}{where}"
    r0, c0 = divmod(ref["offset"], ref["ld"])
    rs = f"{r0}:{r0 + rows}" if r0 else ":"
    cs = f"{c0}:{c0 + cols}" if c0 else ":"
    return f"{name}[{rs}, {cs}]{where}"


def _slot_size(plan: dict) -> int | None:
    """Elements per receive slot (all slots of a plan have one size)."""
    sizes = set()
    for dev in plan["devices"]:
        for g in dev["gemms"]:
            for key in ("a", "b", "partial", "d"):
                r = g[key]
                if r is not None and r["buffer"] == "slots":
                    sizes.add(r["batch_stride"] * plan["problem"]["l"])
    return min(sizes) if len(sizes) == 1 else None


def _scale_ref(ref: dict, here: int, rows: int) -> str:
    """Short label of the scales of ``rows`` rows: `scale_a[0:512]`, `scale_slots[8:16]@dev1`."""
    where = "" if ref["device"] == here else f"@dev{ref['device']}"
    return f"{ref['buffer']}[{ref['offset']}:{ref['offset'] + rows}]{where}"


def _signals(sigs: list[dict]) -> str:
    return ", ".join(f"f{s['flag']}@{s['device']}" for s in sigs)


# Resident CTAs of either GEMM kernel on an H200 (distgemm_bench prints the device's own counts):
# the default for the tile annotation of the step table.
H200_RESIDENT_CTAS = _core.H200_RESIDENT_CTAS


def gemm_tile(g: dict, l: int, slots: int) -> int:
    """The output tile width (128 or 256) the runtime's wave model (kernel/tile_choice.hpp) picks
    for sub-GEMM ``g`` with ``slots`` resident CTAs per kernel."""
    return int(_core.choose_tile_n(g["m"], g["n"], l, slots, slots)["tile_n"])


def tile_of(plan: dict, d: int, i: int) -> int:
    """The tile of the split mode that device ``d`` visits at iteration ``i``."""
    return _core.tile_map(plan["definition"], plan["tp"], plan["steps"])["tile"][d][i]


def tile_sizes(plan: dict) -> list[int]:
    """Each tile's extent along the split mode, read from the plan's GEMMs (0: no GEMM visits
    the tile, it is empty)."""
    sizes = [0] * plan["steps"]
    key = "m" if plan["definition"]["split"] == "M" else "n"
    for dev in plan["devices"]:
        for g in dev["gemms"]:
            sizes[g["tile"]] = g[key]
    return sizes


def step_table(plan: dict, slots: int = H200_RESIDENT_CTAS) -> list[dict]:
    """Rows of the step table: one per (step, device), with 'compute' and 'copy' cells. A GEMM
    the 128x128-tile kernel would run (with ``slots`` resident CTAs) is marked [128x128]."""
    rows = []
    l = plan["problem"]["l"]
    per_slot = _slot_size(plan)
    split = plan["definition"]["split"]
    for i in range(plan["steps"]):
        for d, dev in enumerate(plan["devices"]):
            cells = []
            for g in dev["gemms"]:
                if g["iteration"] != i:
                    continue
                parts = []
                if g["waits"]:
                    parts.append("wait " + ",".join(f"f{f}" for f in g["waits"]) + ";")
                lo = g["m0"] if split == "M" else g["n0"]
                ext = g["m"] if split == "M" else g["n"]
                parts.append(f"GEMM {split}[{lo}:{lo + ext}] K[{g['k0']}:{g['k0'] + g['k']}]")
                if gemm_tile(g, l, slots) == 128:
                    parts.append("[128x128]")
                rot = plan["definition"]["rotating"]
                if rot in ("A", "B"):
                    ext = (g["m"], g["k"]) if rot == "A" else (g["n"], g["k"])
                    parts.append(f"{rot}={_ref(g[rot.lower()], d, per_slot, *ext)}")
                for key, count in (("scale_a", g["m"]), ("scale_b", g["n"])):
                    if g[key] is not None:
                        parts.append(f"s{key[-1].upper()}={_scale_ref(g[key], d, count)}")
                if g["partial"] is not None:
                    parts.append(f"+{_ref(g['partial'], d, per_slot)}")
                if g["user_c"] is not None:
                    parts.append("+beta*C+bias")
                parts.append(f"-> {_ref(g['d'], d, per_slot, g['m'], g['n'])}")
                if g["signals"]:
                    parts.append(f"; set {_signals(g['signals'])}")
                cells.append(" ".join(parts))
            if not cells and plan["steps"] > len(dev["gemms"]):
                cells.append(f"(empty tile {tile_of(plan, d, i)})")
            copies = []
            for c in dev["copies"]:
                if c["step"] != i:
                    continue
                s = ""
                if c["waits"]:
                    s += "wait " + ",".join(f"f{f}" for f in c["waits"]) + "; "
                if c["after_gemm"] >= 0:
                    s += f"after step{c['after_gemm']}; "
                s += (
                    f"{_ref(c['src'], d, per_slot, c['rows'], c['cols'])} -> "
                    f"{_ref(c['dst'], d, per_slot, c['rows'], c['cols'])}"
                )
                if c["scale_src"] is not None:
                    s += " + row scales"
                if c["signals"]:
                    s += f", set {_signals(c['signals'])}"
                copies.append(s)
            rows.append(
                {"step": i, "device": d, "compute": " ".join(cells), "copy": " | ".join(copies)}
            )
    return rows


def format_table(plan: dict, rows: list[dict]) -> str:
    wc = max([len("compute")] + [len(r["compute"]) for r in rows])
    head = f"step dev | {'compute'.ljust(wc)} | copy engine"
    lines = [head, "-" * len(head)]
    for r in rows:
        step = str(r["step"]) if r["device"] == 0 else ""
        lines.append(f"{step:>4} {r['device']:>3} | {r['compute'].ljust(wc)} | {r['copy']}")
    return "\n".join(lines)


def describe(plan: dict) -> str:
    p, dfn = plan["problem"], plan["definition"]
    ls = plan["local_shapes"]
    tile = dfn["tile"]
    transport = (
        "the copy engine (staged locally)"
        if plan["partial_via"] == "copy"
        else "the epilogue (peer writes)"
    )
    scaled = [x for x in "AB" if plan["row_scale_" + x.lower()]]
    # Row scales come with FP8 inputs: 1-byte slots where the slots hold A or B (the partials of
    # reduce-scatter plans stay bf16).
    elem = 1 if scaled and plan["slot_operand"] in ("A", "B") else 2
    scales = []
    if scaled:
        travel = (
            f"the rotating {plan['slot_operand']}'s travel with its rows into "
            f"{plan['scale_slot_rows']} scale-slot floats per device"
            if plan["scale_slot_rows"]
            else "every GEMM reads its device's own scale vectors"
        )
        scales = [f"FP8 row-wise scales of {' and '.join(scaled)} (float32 per row): {travel}"]
    sizes = tile_sizes(plan)
    uneven = (
        [
            f"uneven tiles of {dfn['split']} (S does not divide it): "
            + ", ".join(map(str, sizes))
            + (f"; {sizes.count(0)} empty, with no ops" if 0 in sizes else "")
        ]
        if len(set(sizes)) > 1
        else []
    )
    return "\n".join(
        [
            f"schedule {plan['schedule']}: {dfn['summary']}",
            f"problem M={p['m']} N={p['n']} K={p['k']} L={p['l']}, TP={plan['tp']}, "
            f"S={plan['steps']} (k={plan['chunks_per_shard']} chunk(s) per shard)",
            *uneven,
            *scales,
            f"tile map: tile(d, i) = ({tile['a']}*k*d + {tile['b']}*i + {tile['c']}*k) mod S "
            f"over {dfn['split']}",
            f"per device: A{list(ls['A'])} B{list(ls['B'])} D{list(ls['D'])} bias[{ls['bias']}]; "
            f"extra memory {workspace_bytes(plan, elem) / 2**20:.2f} MiB at {elem}-byte elements "
            f"({plan['num_flags']} flags, slots of {plan['slot_operand']})",
            "each launch starts with an entry barrier across all devices"
            + ("" if dfn["collective"] == "all_gather" else f"; partials travel by {transport}"),
        ]
    )


@cli.quiet_on_broken_pipe
def main(argv: list[str] | None = None) -> int:
    ap = cli.ArgumentParser("python -m distgemm.simulate", __doc__)
    ap.add_argument("--schedule", required=True, help="one of: " + ", ".join(schedule_names()))
    ap.add_argument(
        "--tp",
        type=cli.int_in(1, _core.MAX_TP),
        required=True,
        help=f"number of devices (1..{_core.MAX_TP})",
    )
    ap.add_argument(
        "--steps",
        type=cli.int_in(1, _core.MAX_STEPS),
        default=None,
        help=f"S, a multiple of TP, at most {_core.MAX_STEPS} (default TP)",
    )
    for dim in ("m", "n", "k", "l"):
        ap.add_argument(
            f"--{dim}",
            type=cli.extent,
            default=None,
            help=f"problem {dim.upper()}, 1..2**31-1 (default {DEFAULT_SHAPE[dim]}, Llama-3-70B "
            "FC1 at 8192 tokens, rounded down to a multiple of S*TP when that does not divide it)",
        )
    ap.add_argument(
        "--partial-via",
        choices=("epilogue", "copy"),
        default=None,
        help="reduce-scatter partials: written to the peer by the epilogue, or staged "
        "locally and pushed by the copy engine (default: the library's choice)",
    )
    for x in "ab":
        ap.add_argument(
            f"--row-scale-{x}",
            action="store_true",
            help=f"FP8 row-wise scales of {x.upper()} (one float32 per row; needs --l 1)",
        )
    ap.add_argument(
        "--slots",
        type=int,
        default=H200_RESIDENT_CTAS,
        help="resident CTAs per GEMM kernel for the [128x128] tile marks (default "
        f"{H200_RESIDENT_CTAS}, an H200)",
    )
    ap.add_argument(
        "--check",
        dest="check",
        action="store_true",
        default=True,
        help="prove the invariants (default)",
    )
    ap.add_argument("--no-check", dest="check", action="store_false", help="print the table only")
    ap.add_argument(
        "--json", action="store_true", help="print plan, table and check result as JSON"
    )
    ap.add_argument(
        "--timeline",
        action="store_true",
        help="also print the predicted per-stream timeline (cost model in distgemm.plan.timeline)",
    )
    ap.add_argument(
        "--tflops",
        type=cli.positive_float,
        default=CostModel.tflops,
        help=f"GEMM rate per GPU for --timeline, TFLOP/s (default {CostModel.tflops})",
    )
    ap.add_argument(
        "--link-gbs",
        type=cli.positive_float,
        default=CostModel.link_gbs,
        help=f"peer bandwidth for --timeline, GB/s (default {CostModel.link_gbs})",
    )
    args = ap.parse_args(argv)
    try:
        shape = default_shape(args.tp, args.steps)
        shape.update({d: getattr(args, d) for d in shape if getattr(args, d) is not None})
        too_big = cli.operand_size_problem(**shape)
        if too_big:
            raise ValueError(too_big)
        plan = build_plan(
            args.schedule,
            args.tp,
            args.steps,
            partial_via=args.partial_via,
            row_scale_a=args.row_scale_a,
            row_scale_b=args.row_scale_b,
            **shape,
        )
        if args.slots < 1:
            raise ValueError(f"--slots={args.slots} must be at least 1")
        if args.slots > cli.MAX_EXTENT:
            raise ValueError(f"--slots={args.slots} is above 2**31-1")
    except ValueError as e:
        print(f"python -m distgemm.simulate: error: {e}", file=sys.stderr)
        return 2
    rows = step_table(plan, args.slots)
    violations = verify_plan(plan) if args.check else []
    if args.json:
        json.dump(
            {
                "plan": plan,
                "table": rows,
                "checked": args.check,
                "ok": not violations,
                "violations": [v.__dict__ for v in violations],
            },
            sys.stdout,
            indent=1,
        )
        print()
    else:
        print(describe(plan))
        print(
            "GEMMs marked [128x128] run the 128x128-tile kernel, the others 128x256 (wave model "
            f"of kernel/tile_choice.hpp at {args.slots} resident CTAs)"
        )
        print()
        print(format_table(plan, rows))
        print()
        if args.check and not violations:
            print(
                "all invariants hold: coverage (each D element once, K summed exactly once), "
                "ordering (no read before arrival, no race), slot reuse, ownership (D per "
                "Partition, user tensors local), progress (each flag set once, no cyclic wait)"
                + (
                    ", row scales (each GEMM reads its rows' scales, copies move them)"
                    if plan["row_scale_a"] or plan["row_scale_b"]
                    else ""
                )
            )
        for v in violations:
            print(f"VIOLATION {v}")
        if args.timeline and not violations:
            print()
            print(
                format_timeline(
                    plan, predict(plan, CostModel(tflops=args.tflops, link_gbs=args.link_gbs))
                )
            )
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
