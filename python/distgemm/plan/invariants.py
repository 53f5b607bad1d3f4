"""The invariants of a Plan, proved for one launch by executing it symbolically (``verify_plan``).

It executes the plan symbolically. Every buffer region carries a *content* label: which global
rows/cols of A, B, C or bias it holds, or, for D, which K ranges have been summed into it and
whether beta*C and bias were added (``plan.regions``). Alongside, a happens-before graph is built
from stream order (GEMMs in order, copies in order, a copy's ``after_gemm``) and from flags (a
signal happens before every wait on that flag; ``plan.happens_before``). The invariants:

1. coverage     — every element of every device's D is produced exactly once, as the sum over all
                  of K exactly once (reduce-scatter / all-reduce partials summed exactly once),
                  with beta*C and bias added exactly once; every GEMM of a row-scaled operand
                  reads the scales of exactly its rows, and every copy of such rows moves their
                  scales with them;
2. ordering     — every read of data written in the launch (a slot or scale slot filled by a copy,
                  a slot by a peer's epilogue) is ordered after that write by waits/signals; any
                  two conflicting accesses to a region are ordered (no race);
3. slot reuse   — no region is overwritten while a read that needs its old content is unordered or
                  still to come (with the entry barrier, each slot is written at most once per
                  launch);
4. ownership    — each device's D holds exactly its Partition shard; user buffers are only accessed
                  by their own device (one process per GPU cannot reach a peer's tensors); copies
                  only push: a copy never reads another device's memory;
5. progress     — every waited flag is set exactly once, and there is no cyclic wait across devices;
6. extents      — every GEMM and copy moves something (positive extents): the runtime launches
                  each op of a plan, and the GEMM kernel refuses an empty one, so a plan leaves
                  out the ops of an empty tile (with their waits and signals, which invariant 5
                  then checks).

``verify_plan`` returns a list of ``Violation`` (empty when every invariant holds).
"""

from __future__ import annotations

from .happens_before import Event, Violation, build_happens_before, event_name, event_step
from .regions import SCALE_OF, USER, Regions

__all__ = ["Violation", "verify_plan", "event_name", "happens_before_order"]


class _Checker:
    def __init__(self, plan: dict):
        self.plan = plan
        self.tp = plan["tp"]
        self.p = plan["problem"]
        self.part = plan["definition"]["partition"]
        self.local = plan["local_shapes"]
        self.violations: list[Violation] = []

    def fail(self, invariant: str, ev: Event | None, message: str) -> None:
        dev = ev[1] if ev else None
        step = event_step(self.plan, ev) if ev else None
        self.violations.append(Violation(invariant, dev, step, message))

    def run(self) -> list[Violation]:
        order = build_happens_before(self.plan, self.fail)
        if order is None:
            return self.violations
        self.check_extents()
        self.check_user_buffer_access()
        if self.violations:
            return self.violations
        self.regions = Regions(self.plan, order, self.fail)
        for ev in order.order:
            if ev[0] == "copy":
                self.run_copy(ev)
            else:
                self.run_gemm(ev)
        self.check_final_outputs()
        return self.violations

    def check_extents(self) -> None:
        """Every op has positive extents: an empty tile has no ops at all."""
        for d, dev in enumerate(self.plan["devices"]):
            for j, g in enumerate(dev["gemms"]):
                if min(g["m"], g["n"], g["k"]) < 1:
                    self.fail(
                        "extents",
                        ("gemm", d, j),
                        f"GEMM of m={g['m']} n={g['n']} k={g['k']}: the kernel refuses an empty "
                        "GEMM; leave out the ops of an empty tile",
                    )
            for j, c in enumerate(dev["copies"]):
                if min(c["rows"], c["cols"]) < 1:
                    self.fail(
                        "extents",
                        ("copy", d, j),
                        f"copy of {c['rows']} x {c['cols']} elements: leave out the ops of an "
                        "empty tile",
                    )

    def check_user_buffer_access(self) -> None:
        """Ownership of user buffers: only their own device may touch them; copies push."""
        for d, dev in enumerate(self.plan["devices"]):
            for kind, ops, keys in (
                (
                    "gemm",
                    dev["gemms"],
                    ("a", "b", "d", "partial", "user_c", "bias", "scale_a", "scale_b"),
                ),
                ("copy", dev["copies"], ("src", "dst", "scale_src", "scale_dst")),
            ):
                for j, op in enumerate(ops):
                    for key in keys:
                        ref = op[key]
                        if ref is not None and ref["buffer"] in USER and ref["device"] != d:
                            self.fail(
                                "ownership",
                                (kind, d, j),
                                f"{key} is the user's {ref['buffer']} on device "
                                f"{ref['device']}: user tensors are only reachable from their "
                                "own device",
                            )
                        if (
                            kind == "copy"
                            and key in ("src", "scale_src")
                            and ref is not None
                            and ref["device"] != d
                        ):
                            self.fail(
                                "ownership",
                                (kind, d, j),
                                f"copy reads device {ref['device']}'s memory: "
                                "copies must push (write to a peer), never pull (a peer read may "
                                "run on the peer's copy engine, coupling the devices' copy "
                                "queues)",
                            )
                        if ref is not None and not 0 <= ref["device"] < self.tp:
                            self.fail(
                                "ownership",
                                (kind, d, j),
                                f"{key} names device {ref['device']}, outside TP={self.tp}",
                            )

    def run_copy(self, ev: Event) -> None:
        _, d, j = ev
        L = self.p["l"]
        op = self.plan["devices"][d]["copies"][j]
        src = self.regions.rects(ev, op["src"], op["rows"], op["cols"], L)
        dst = self.regions.rects(ev, op["dst"], op["rows"], op["cols"], L)
        if src is None or dst is None:
            return
        moved = None
        for rs, rd in zip(src, dst):
            c = self.regions.read(ev, op["src"], rs, "copy")
            if c is not None:
                self.regions.write(ev, op["dst"], rd, c, "copy")
                moved = c
        self.run_copy_scales(ev, op, moved)

    def run_copy_scales(self, ev: Event, op: dict, moved: tuple | None) -> None:
        """The scales of the rows a copy moves (``moved``: the content of its data) go with
        them: a copy of a row-scaled operand's rows carries exactly those rows' scales, and
        no other copy carries any."""
        src, dst = op["scale_src"], op["scale_dst"]
        kind = moved[0] if moved is not None else None
        scaled = kind in SCALE_OF and self.plan["row_scale_" + kind.lower()]
        if (src is None) != (dst is None):
            self.fail("coverage", ev, f"copy moves scales from {src} to {dst}")
            return
        if src is None:
            if scaled:
                self.fail(
                    "coverage",
                    ev,
                    f"copy moves rows {moved[2]}.. of row-scaled {kind} without their scales "
                    "(no scale_src / scale_dst)",
                )
            return
        if moved is not None and not scaled:
            self.fail(
                "coverage",
                ev,
                f"copy of {kind} moves row scales, but the plan does not row-scale {kind}",
            )
            return
        rs = self.regions.rects(ev, src, op["rows"], 1, 1)
        rd = self.regions.rects(ev, dst, op["rows"], 1, 1)
        if rs is None or rd is None:
            return
        c = self.regions.read(ev, src, rs[0], "copy of scales")
        if c is None:
            return
        if moved is not None and c[:3] != (SCALE_OF[kind], 0, moved[2]):
            self.fail(
                "coverage",
                ev,
                f"copy moves rows {moved[2]}.. of {kind} with the scales of {c[0]} rows {c[2]}..",
            )
        self.regions.write(ev, dst, rd[0], c, "copy of scales")

    def gemm_scales_ok(self, ev: Event, g: dict) -> bool:
        """A GEMM of a row-scaled operand reads the scales of exactly its rows (after they
        arrived); a GEMM of an operand without row scales reads none."""
        ok = True
        for name, row0, rows in (("A", g["m0"], g["m"]), ("B", g["n0"], g["n"])):
            key, scaled = SCALE_OF[name], self.plan["row_scale_" + name.lower()]
            ref = g[key]
            if ref is None or not scaled:
                if scaled or ref is not None:
                    ok = False
                    self.fail(
                        "coverage",
                        ev,
                        f"GEMM of row-scaled {name} reads no row scales ({key} is None)"
                        if scaled
                        else f"GEMM reads {key}, but the plan does not row-scale {name}",
                    )
                continue
            rect = self.regions.rects(ev, ref, rows, 1, 1)
            got = self.regions.read(ev, ref, rect[0], f"GEMM {key}") if rect else None
            if got != (key, 0, row0, 0):
                ok = False
                if got is not None:
                    self.fail(
                        "coverage",
                        ev,
                        f"GEMM needs the scales of {name} rows [{row0}:{row0 + rows}] but reads "
                        f"those of {got[0]} rows [{got[2]}:{got[2] + rows}]",
                    )
        return ok

    def run_gemm(self, ev: Event) -> None:
        _, d, j = ev
        L = self.p["l"]
        g = self.plan["devices"][d]["gemms"][j]
        m, n, k = g["m"], g["n"], g["k"]
        ra = self.regions.rects(ev, g["a"], m, k, L)
        rb = self.regions.rects(ev, g["b"], n, k, L)
        rd = self.regions.rects(ev, g["d"], m, n, L)
        rp = self.regions.rects(ev, g["partial"], m, n, L) if g["partial"] else None
        rc = self.regions.rects(ev, g["user_c"], m, n, L) if g["user_c"] else None
        rbias = self.regions.rects(ev, g["bias"], 1, n, 1) if g["bias"] else None
        if ra is None or rb is None or rd is None:
            return
        scales_ok = self.gemm_scales_ok(ev, g)
        for l in range(L):
            a = self.regions.read(ev, g["a"], ra[l], "GEMM operand A")
            b = self.regions.read(ev, g["b"], rb[l], "GEMM operand B")
            ok = scales_ok
            for name, got, row0 in (("A", a, g["m0"]), ("B", b, g["n0"])):
                if got != (name, l, row0, g["k0"]):
                    ok = False
                    if got is not None:
                        self.fail(
                            "coverage",
                            ev,
                            f"GEMM needs {name}[batch {l}] rows {row0}.. cols {g['k0']}.. but "
                            f"reads {name}[batch {got[1]}] rows {got[2]}.. cols {got[3]}..",
                        )
            ks: tuple[tuple[int, int], ...] = ()
            nc = nb = 0
            if rp is not None:
                pc = self.regions.read(ev, g["partial"], rp[l], "epilogue partial")
                if pc is None or pc[:4] != ("D", l, g["m0"], g["n0"]):
                    ok = False
                    if pc is not None:
                        self.fail(
                            "coverage",
                            ev,
                            f"partial source holds D[batch {pc[1]}] at ({pc[2]}, {pc[3]}), "
                            f"the GEMM computes ({g['m0']}, {g['n0']})",
                        )
                else:
                    ks, nc, nb = pc[4], pc[5], pc[6]
            if rc is not None:
                cc = self.regions.read(ev, g["user_c"], rc[l], "epilogue C")
                if cc != ("C", l, g["m0"], g["n0"]):
                    ok = False
                    self.fail(
                        "coverage",
                        ev,
                        f"user C source holds {cc}, the GEMM computes "
                        f"D[batch {l}] at ({g['m0']}, {g['n0']})",
                    )
                nc += 1
            if rbias is not None:
                bc = self.regions.read(ev, g["bias"], rbias[0], "epilogue bias")
                if bc is None or bc[3] != g["n0"]:
                    ok = False
                    self.fail(
                        "coverage",
                        ev,
                        f"bias slice starts at column {bc[3] if bc else '?'}, "
                        f"the GEMM computes columns from {g['n0']}",
                    )
                nb += 1
            new = (g["k0"], g["k0"] + k)
            for lo, hi in ks:
                if lo < new[1] and new[0] < lo + (hi - lo):
                    ok = False
                    self.fail(
                        "coverage",
                        ev,
                        f"K range [{new[0]}:{new[1]}] is summed twice into "
                        f"D at ({g['m0']}, {g['n0']})",
                    )
            content = (
                ("D", l, g["m0"], g["n0"], tuple(sorted(ks + (new,))), nc, nb)
                if ok
                else ("D?", l, g["m0"], g["n0"], (), 0, 0)
            )
            self.regions.write(ev, g["d"], rd[l], content, "GEMM")

    def check_final_outputs(self) -> None:
        """Each device's D is exactly its shard, finished."""
        L, K = self.p["l"], self.p["k"]
        rows_d, width_d = self.local["D"]
        mode = self.part["d"]
        for d in range(self.tp):
            pieces = self.regions.pieces.get((d, "D"), [])
            area = sum((p.rect[1] - p.rect[0]) * (p.rect[3] - p.rect[2]) for p in pieces)
            if area != rows_d * width_d * L:
                self.violations.append(
                    Violation(
                        "coverage",
                        d,
                        None,
                        f"D of device {d} has {area} of {rows_d * width_d * L} elements "
                        "produced at the end of the launch",
                    )
                )
            roff = d * rows_d if mode == "M" else 0
            coff = d * width_d if mode == "N" else 0
            for p in pieces:
                kind, l, gr, gc, ks, nc, nb = p.content
                where = (
                    f"D of device {d} rows [{p.rect[0]}:{p.rect[1]}] cols [{p.rect[2]}:{p.rect[3]}]"
                )
                want = ("D", p.rect[0] // rows_d, p.rect[0] % rows_d + roff, p.rect[2] + coff)
                if kind != "D":  # computed from wrong operands or scales, reported at its GEMM
                    self.violations.append(
                        Violation(
                            "coverage",
                            d,
                            None,
                            f"{where} holds a GEMM result computed from wrong operands or scales",
                        )
                    )
                    continue
                if (kind, l, gr, gc) != want:
                    self.violations.append(
                        Violation(
                            "ownership",
                            d,
                            None,
                            f"{where} holds D[batch {l}] at ({gr}, {gc}); the Partition puts "
                            f"D[batch {want[1]}] at ({want[2]}, {want[3]}) there",
                        )
                    )
                    continue
                merged, pos = True, 0
                for lo, hi in ks:
                    merged &= lo == pos
                    pos = hi
                if not merged or pos != K:
                    self.violations.append(
                        Violation(
                            "coverage",
                            d,
                            None,
                            f"{where} sums K ranges {list(ks)}, not [0:{K}] exactly once",
                        )
                    )
                if nc != 1 or nb != 1:
                    self.violations.append(
                        Violation(
                            "coverage",
                            d,
                            None,
                            f"{where} adds beta*C {nc} times and bias {nb} times (want once each)",
                        )
                    )


def happens_before_order(plan: dict) -> list[Event] | None:
    """A topological order of the plan's events, or None if the plan has a cyclic wait."""
    order = build_happens_before(plan, lambda invariant, ev, message: None)
    return None if order is None else order.order


def verify_plan(plan: dict) -> list[Violation]:
    """Check every invariant of one launch of ``plan``; an empty list means all hold."""
    return _Checker(plan).run()
