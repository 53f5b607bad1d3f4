"""Invariant checker for Plans: proves, for one launch, that a plan computes the right thing.

It executes the plan symbolically. Every buffer region carries a *content* label: which global
rows/cols of A, B, C or bias it holds, or, for D, which K ranges have been summed into it and
whether beta*C and bias were added. Alongside, a happens-before graph is built from stream order
(GEMMs in order, copies in order, a copy's ``after_gemm``) and from flags (a signal happens before
every wait on that flag). The invariants:

1. coverage     — every element of every device's D is produced exactly once, as the sum over all
                  of K exactly once (reduce-scatter / all-reduce partials summed exactly once),
                  with beta*C and bias added exactly once;
2. ordering     — every read of data written in the launch (a slot filled by a copy or by a peer's
                  epilogue) is ordered after that write by waits/signals; any two conflicting
                  accesses to a region are ordered (no race);
3. slot reuse   — no region is overwritten while a read that needs its old content is unordered or
                  still to come (with the entry barrier, each slot is written at most once per launch);
4. ownership    — each device's D holds exactly its Partition shard; user buffers are only accessed
                  by their own device (one process per GPU cannot reach a peer's tensors); copies
                  only push: a copy never reads another device's memory;
5. progress     — every waited flag is set exactly once, and there is no cyclic wait across devices.

``check_plan`` returns a list of ``Violation`` (empty when every invariant holds).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Violation", "check_plan", "event_name", "happens_before_order"]

INPUTS = ("A", "B", "C", "bias")
USER = ("A", "B", "C", "D", "bias")


@dataclass
class Violation:
    invariant: str
    device: int | None
    step: int | None
    message: str

    def __str__(self) -> str:  # pragma: no cover - formatting only
        where = []
        if self.device is not None:
            where.append(f"device {self.device}")
        if self.step is not None:
            where.append(f"step {self.step}")
        return (
            f"[{self.invariant}] {', '.join(where)}: {self.message}"
            if where
            else f"[{self.invariant}] {self.message}"
        )


Event = tuple[str, int, int]  # ("gemm" | "copy", device, index)


def event_name(plan: dict, ev: Event) -> str:
    kind, d, j = ev
    if kind == "gemm":
        return f"GEMM dev{d} step{j}"
    return f"copy dev{d} #{j} (step{plan['devices'][d]['copies'][j]['step']})"


def _event_step(plan: dict, ev: Event) -> int:
    kind, d, j = ev
    return j if kind == "gemm" else plan["devices"][d]["copies"][j]["step"]


@dataclass
class _Piece:
    rect: tuple[int, int, int, int]  # rows [r0, r1) x cols [c0, c1) in the buffer's 2-D view
    content: tuple  # see _content_at
    writer: Event
    readers: list[Event] = field(default_factory=list)


def _intersects(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]


def _contains(outer, inner) -> bool:
    return (
        outer[0] <= inner[0]
        and inner[1] <= outer[1]
        and outer[2] <= inner[2]
        and inner[3] <= outer[3]
    )


class _Checker:
    def __init__(self, plan: dict):
        self.plan = plan
        self.tp = plan["tp"]
        self.p = plan["problem"]
        self.part = plan["definition"]["partition"]
        self.local = plan["local_shapes"]
        self.violations: list[Violation] = []
        self.slot_width: int | None = None

    # -- reporting ----------------------------------------------------------------------------
    def fail(self, invariant: str, ev: Event | None, message: str) -> None:
        dev = ev[1] if ev else None
        step = _event_step(self.plan, ev) if ev else None
        self.violations.append(Violation(invariant, dev, step, message))

    # -- happens-before -------------------------------------------------------------------------
    def build_graph(self) -> list[Event] | None:
        plan = self.plan
        events: list[Event] = []
        preds: dict[Event, set] = {}
        for d, dev in enumerate(plan["devices"]):
            for i in range(len(dev["gemms"])):
                events.append(("gemm", d, i))
            for j in range(len(dev["copies"])):
                events.append(("copy", d, j))
        for ev in events:
            preds[ev] = set()
        setters: dict[tuple[int, int], Event] = {}
        nflags = plan["num_flags"]
        for d, dev in enumerate(plan["devices"]):
            for kind, ops in (("gemm", dev["gemms"]), ("copy", dev["copies"])):
                for j, op in enumerate(ops):
                    ev = (kind, d, j)
                    if j > 0:
                        preds[ev].add((kind, d, j - 1))
                    if kind == "copy" and op["after_gemm"] >= 0:
                        if op["after_gemm"] >= len(dev["gemms"]):
                            self.fail(
                                "progress",
                                ev,
                                f"depends on GEMM {op['after_gemm']}, which device {d} does not have",
                            )
                        else:
                            preds[ev].add(("gemm", d, op["after_gemm"]))
                    for s in op["signals"]:
                        key = (s["device"], s["flag"])
                        if not (0 <= s["device"] < self.tp and 0 <= s["flag"] < nflags):
                            self.fail(
                                "progress",
                                ev,
                                f"signals flag {s['flag']} on device {s['device']}, "
                                f"outside the plan's {nflags} flags x {self.tp} devices",
                            )
                            continue
                        if key in setters:
                            self.fail(
                                "progress",
                                ev,
                                f"sets flag {s['flag']} on device {s['device']}, already set by "
                                f"{event_name(plan, setters[key])}: a generation flag must be set once per "
                                "launch, or a wait cannot tell the two apart",
                            )
                        else:
                            setters[key] = ev
        self.setters = setters
        for d, dev in enumerate(plan["devices"]):
            for kind, ops in (("gemm", dev["gemms"]), ("copy", dev["copies"])):
                for j, op in enumerate(ops):
                    ev = (kind, d, j)
                    for f in op["waits"]:
                        if (d, f) not in setters:
                            self.fail(
                                "progress",
                                ev,
                                f"waits for flag {f} on device {d}, which nothing sets: "
                                "it would time out",
                            )
                        else:
                            preds[ev].add(setters[(d, f)])
        # Kahn's algorithm; leftover events are on (or behind) a cyclic wait.
        succ: dict[Event, list[Event]] = {ev: [] for ev in events}
        indeg = {ev: len(preds[ev]) for ev in events}
        for ev in events:
            for p in preds[ev]:
                succ[p].append(ev)
        order: list[Event] = []
        ready = [ev for ev in events if indeg[ev] == 0]
        while ready:
            ev = ready.pop(0)
            order.append(ev)
            for s in succ[ev]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    ready.append(s)
        if len(order) != len(events):
            stuck = [ev for ev in events if indeg[ev] > 0]
            names = "; ".join(
                f"{event_name(plan, ev)} waits for "
                + ", ".join(event_name(plan, p) for p in sorted(preds[ev]) if indeg.get(p, 0) > 0)
                for ev in stuck[:4]
            )
            self.fail("progress", stuck[0], f"cyclic wait across devices: {names}")
            return None
        # Ancestors as bitmasks over the topological order.
        index = {ev: i for i, ev in enumerate(order)}
        self.anc: dict[Event, int] = {}
        for ev in order:
            m = 0
            for p in preds[ev]:
                m |= self.anc[p] | (1 << index[p])
            self.anc[ev] = m
        self.index = index
        return order

    def hb(self, a: Event, b: Event) -> bool:
        """a happens before b."""
        return bool(self.anc[b] >> self.index[a] & 1)

    # -- geometry -------------------------------------------------------------------------------
    def buffer_shape(self, name: str) -> tuple[int, int]:
        """(rows per batch, width) of a user buffer's 2-D view."""
        if name == "bias":
            return 1, self.local["bias"]
        return tuple(self.local[name])

    def rects(
        self, ev: Event, ref: dict, rows: int, cols: int, batches: int
    ) -> list[tuple[int, int, int, int]] | None:
        name = ref["buffer"]
        if name == "bias":
            off = ref["offset"]
            if off < 0 or off + cols > self.local["bias"]:
                self.fail(
                    "ownership",
                    ev,
                    f"bias slice [{off}:{off + cols}] is outside bias[{self.local['bias']}]",
                )
                return None
            return [(0, 1, off, off + cols)]
        if name == "slots":
            width = ref["ld"]
            if self.slot_width is None:
                self.slot_width = width
            if width != self.slot_width or width <= 0 or ref["batch_stride"] % width:
                self.fail(
                    "ownership",
                    ev,
                    f"slot access with row stride {width} and batch stride "
                    f"{ref['batch_stride']} does not fit the slots' row width {self.slot_width}",
                )
                return None
            total_rows = self.plan["slot_elems"] // width
        else:
            rpb, width = self.buffer_shape(name)
            if ref["ld"] != width or ref["batch_stride"] != rpb * width:
                self.fail(
                    "ownership",
                    ev,
                    f"{name} accessed with strides ({ref['ld']}, {ref['batch_stride']}), "
                    f"the user's {name} is dense [{rpb}, {width}] per batch",
                )
                return None
            total_rows = rpb * self.p["l"]
        r0, c0 = divmod(ref["offset"], width)
        bstep = ref["batch_stride"] // width
        out = []
        for l in range(batches):
            rr = r0 + l * bstep
            rect = (rr, rr + rows, c0, c0 + cols)
            if rect[0] < 0 or rect[1] > total_rows or rect[3] > width:
                self.fail(
                    "ownership",
                    ev,
                    f"{name} on device {ref['device']} accessed out of bounds: rows "
                    f"[{rect[0]}:{rect[1]}] of {total_rows}, cols [{c0}:{c0 + cols}] of {width}",
                )
                return None
            out.append(rect)
        return out

    def input_content(self, dev: int, name: str, rect) -> tuple | None:
        """Content of a region of a user input buffer: (operand, batch, global row, global col)."""
        if name == "bias":
            coff = dev * self.local["bias"] if self.part["d"] == "N" else 0
            return ("bias", 0, 0, rect[2] + coff)
        rpb, width = self.buffer_shape(name)
        l = rect[0] // rpb
        if rect[1] > (l + 1) * rpb:
            return None
        mode = self.part["a"] if name == "A" else self.part["b"] if name == "B" else self.part["d"]
        row_mode = {"A": "M", "B": "N", "C": "M"}[name]
        roff = dev * rpb if mode == row_mode else 0
        coff = dev * width if mode not in ("none", row_mode) else 0
        return (name, l, rect[0] - l * rpb + roff, rect[2] + coff)

    # -- symbolic execution -----------------------------------------------------------------------
    def read(self, ev: Event, ref: dict, rect, what: str) -> tuple | None:
        dev, name = ref["device"], ref["buffer"]
        if name in INPUTS:
            c = self.input_content(dev, name, rect)
            if c is None:
                self.fail(
                    "coverage",
                    ev,
                    f"{what} read of {name} rows [{rect[0]}:{rect[1]}] crosses a batch boundary",
                )
            return c
        pieces = self.pieces.setdefault((dev, name), [])
        hits = [p for p in pieces if _intersects(p.rect, rect)]
        loc = f"{name} of device {dev} rows [{rect[0]}:{rect[1]}] cols [{rect[2]}:{rect[3]}]"
        if not hits:
            self.fail(
                "ordering",
                ev,
                f"{what} reads {loc}, which nothing has written in this launch "
                "(a missing copy or partial)",
            )
            return None
        if len(hits) > 1 or not _contains(hits[0].rect, rect):
            self.fail("coverage", ev, f"{what} reads {loc}, which is not one written region")
            return None
        p = hits[0]
        if not self.hb(p.writer, ev):
            self.fail(
                "ordering",
                ev,
                f"{what} reads {loc} written by {event_name(self.plan, p.writer)} without "
                "waiting for its signal (read before arrival)",
            )
        p.readers.append(ev)
        kind, l, gr, gc = p.content[:4]
        return (kind, l, gr + rect[0] - p.rect[0], gc + rect[2] - p.rect[2]) + tuple(p.content[4:])

    def write(self, ev: Event, ref: dict, rect, content: tuple, what: str) -> None:
        dev, name = ref["device"], ref["buffer"]
        if name in INPUTS:
            self.fail("ownership", ev, f"{what} writes the user's input {name} on device {dev}")
            return
        pieces = self.pieces.setdefault((dev, name), [])
        keep = []
        for p in pieces:
            if not _intersects(p.rect, rect):
                keep.append(p)
                continue
            if name == "D":
                self.fail(
                    "coverage",
                    ev,
                    f"{what} writes D of device {dev} rows [{rect[0]}:{rect[1]}] cols "
                    f"[{rect[2]}:{rect[3]}], already produced by {event_name(self.plan, p.writer)}: "
                    "an output element produced twice",
                )
                keep.append(p)
                continue
            pending = [r for r in p.readers if not self.hb(r, ev)] if p.readers else []
            if not self.hb(p.writer, ev) or pending:
                who = (
                    event_name(self.plan, pending[0])
                    if pending
                    else event_name(self.plan, p.writer)
                )
                self.fail(
                    "slot reuse",
                    ev,
                    f"{what} overwrites {name} of device {dev} rows [{rect[0]}:{rect[1]}] "
                    f"while {who} may still need it",
                )
            if not _contains(rect, p.rect):
                keep.append(
                    p
                )  # partly overwritten: later reads of it are reported as not one region
        keep.append(_Piece(rect, content, ev))
        self.pieces[(dev, name)] = keep

    def run(self) -> list[Violation]:
        plan = self.plan
        order = self.build_graph()
        if order is None:
            return self.violations
        self.pieces: dict[tuple[int, str], list[_Piece]] = {}
        L, K = self.p["l"], self.p["k"]

        # Ownership of user buffers: only their own device may touch them.
        for d, dev in enumerate(plan["devices"]):
            for kind, ops, keys in (
                ("gemm", dev["gemms"], ("a", "b", "d", "partial", "user_c", "bias")),
                ("copy", dev["copies"], ("src", "dst")),
            ):
                for j, op in enumerate(ops):
                    for key in keys:
                        ref = op[key]
                        if ref is not None and ref["buffer"] in USER and ref["device"] != d:
                            self.fail(
                                "ownership",
                                (kind, d, j),
                                f"{key} is the user's {ref['buffer']} on device "
                                f"{ref['device']}: user tensors are only reachable from their own device",
                            )
                        if (
                            kind == "copy"
                            and key == "src"
                            and ref is not None
                            and ref["device"] != d
                        ):
                            self.fail(
                                "ownership",
                                (kind, d, j),
                                f"copy reads device {ref['device']}'s memory: "
                                "copies must push (write to a peer), never pull (a peer read may run on "
                                "the peer's copy engine, coupling the devices' copy queues)",
                            )
                        if ref is not None and not 0 <= ref["device"] < self.tp:
                            self.fail(
                                "ownership",
                                (kind, d, j),
                                f"{key} names device {ref['device']}, outside TP={self.tp}",
                            )
        if self.violations:
            return self.violations

        for ev in order:
            kind, d, j = ev
            if kind == "copy":
                op = plan["devices"][d]["copies"][j]
                src = self.rects(ev, op["src"], op["rows"], op["cols"], L)
                dst = self.rects(ev, op["dst"], op["rows"], op["cols"], L)
                if src is None or dst is None:
                    continue
                for rs, rd in zip(src, dst):
                    c = self.read(ev, op["src"], rs, "copy")
                    if c is not None:
                        self.write(ev, op["dst"], rd, c, "copy")
                continue
            g = plan["devices"][d]["gemms"][j]
            m, n, k = g["m"], g["n"], g["k"]
            ra = self.rects(ev, g["a"], m, k, L)
            rb = self.rects(ev, g["b"], n, k, L)
            rd = self.rects(ev, g["d"], m, n, L)
            rp = self.rects(ev, g["partial"], m, n, L) if g["partial"] else None
            rc = self.rects(ev, g["user_c"], m, n, L) if g["user_c"] else None
            rbias = self.rects(ev, g["bias"], 1, n, 1) if g["bias"] else None
            if ra is None or rb is None or rd is None:
                continue
            for l in range(L):
                a = self.read(ev, g["a"], ra[l], "GEMM operand A")
                b = self.read(ev, g["b"], rb[l], "GEMM operand B")
                ok = True
                if a != ("A", l, g["m0"], g["k0"]):
                    ok = False
                    if a is not None:
                        self.fail(
                            "coverage",
                            ev,
                            f"GEMM needs A[batch {l}] rows {g['m0']}.. cols {g['k0']}.. but "
                            f"reads A[batch {a[1]}] rows {a[2]}.. cols {a[3]}..",
                        )
                if b != ("B", l, g["n0"], g["k0"]):
                    ok = False
                    if b is not None:
                        self.fail(
                            "coverage",
                            ev,
                            f"GEMM needs B[batch {l}] rows {g['n0']}.. cols {g['k0']}.. but "
                            f"reads B[batch {b[1]}] rows {b[2]}.. cols {b[3]}..",
                        )
                ks: tuple[tuple[int, int], ...] = ()
                nc = nb = 0
                if rp is not None:
                    pc = self.read(ev, g["partial"], rp[l], "epilogue partial")
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
                    cc = self.read(ev, g["user_c"], rc[l], "epilogue C")
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
                    bc = self.read(ev, g["bias"], rbias[0], "epilogue bias")
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
                self.write(ev, g["d"], rd[l], content, "GEMM")

        # Final state: each device's D is exactly its shard, finished.
        rows_d, width_d = self.local["D"]
        mode = self.part["d"]
        for d in range(self.tp):
            pieces = self.pieces.get((d, "D"), [])
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
        return self.violations


def happens_before_order(plan: dict) -> list[Event] | None:
    """A topological order of the plan's events, or None if the plan has a cyclic wait."""
    return _Checker(plan).build_graph()


def check_plan(plan: dict) -> list[Violation]:
    """Check every invariant of one launch of ``plan``; an empty list means all hold."""
    return _Checker(plan).run()
