"""Buffer regions for the plan verifier: their bounds and contents, and checked reads and writes.

Reads and writes make the ordering, slot-reuse and coverage checks. A region is a rectangle of a
buffer's 2-D view (rows per batch stacked over batches). Its *content* label says which global
rows/cols of A, B, C or bias it holds, or, for D, which K ranges have been summed into it and how
often beta*C and bias were added. FP8 row scales are buffers of one column (``scale_a``,
``scale_b``: the user's, one row per local row of A / B; ``scale_slots``: the workspace's); their
content is ``("scale_a" | "scale_b", 0, global row, 0)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .happens_before import Event, Fail, HappensBefore, event_name

__all__ = ["INPUTS", "SCALES", "SCALE_OF", "USER", "Piece", "Regions"]

INPUTS = ("A", "B", "C", "bias", "scale_a", "scale_b")
USER = ("A", "B", "C", "D", "bias", "scale_a", "scale_b")
SCALES = ("scale_a", "scale_b", "scale_slots")
# The scale vector that carries the row scales of each operand.
SCALE_OF = {"A": "scale_a", "B": "scale_b"}

Rect = tuple[int, int, int, int]  # rows [r0, r1) x cols [c0, c1) in the buffer's 2-D view


@dataclass
class Piece:
    rect: Rect
    content: tuple  # (operand, batch, global row, global col) or, for D, + (K ranges, nC, nbias)
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


class Regions:
    """The written regions of every (device, buffer) during the symbolic execution of a plan."""

    def __init__(self, plan: dict, order: HappensBefore, fail: Fail):
        self.plan = plan
        self.p = plan["problem"]
        self.part = plan["definition"]["partition"]
        self.local = plan["local_shapes"]
        self.order = order
        self.fail = fail
        self.slot_width: int | None = None
        self.pieces: dict[tuple[int, str], list[Piece]] = {}

    # -- geometry -------------------------------------------------------------------------------
    def buffer_shape(self, name: str) -> tuple[int, int]:
        """(rows per batch, width) of a user buffer's 2-D view."""
        if name == "bias":
            return 1, self.local["bias"]
        if name in SCALE_OF.values():
            return self.local["A" if name == "scale_a" else "B"][0], 1
        return tuple(self.local[name])

    def scale_rects(self, ev: Event, ref: dict, rows: int) -> list[Rect] | None:
        """The one-column rectangle of ``rows`` row scales through ``ref`` (a row index with
        ld 1 and batch stride 0), or None (reported) when it does not fit the buffer."""
        name = ref["buffer"]
        total = (
            self.plan["scale_slot_rows"] if name == "scale_slots" else self.buffer_shape(name)[0]
        )
        off = ref["offset"]
        if ref["ld"] != 1 or ref["batch_stride"] != 0:
            self.fail(
                "ownership",
                ev,
                f"{name} accessed with strides ({ref['ld']}, {ref['batch_stride']}); a scale "
                "reference is a row index with ld 1 and batch stride 0",
            )
            return None
        if off < 0 or off + rows > total:
            self.fail(
                "ownership",
                ev,
                f"{name} on device {ref['device']} accessed out of bounds: rows "
                f"[{off}:{off + rows}] of {total}",
            )
            return None
        return [(off, off + rows, 0, 1)]

    def rects(self, ev: Event, ref: dict, rows: int, cols: int, batches: int) -> list[Rect] | None:
        """One rectangle per batch of a rows x cols access through ``ref``, or None (reported)
        when the access does not fit the buffer."""
        name = ref["buffer"]
        if name in SCALES:
            return self.scale_rects(ev, ref, rows)
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
        if name in SCALE_OF.values():
            rows = self.buffer_shape(name)[0]
            sharded = self.part["a"] == "M" if name == "scale_a" else self.part["b"] == "N"
            return (name, 0, rect[0] + (dev * rows if sharded else 0), 0)
        rpb, width = self.buffer_shape(name)
        l = rect[0] // rpb
        if rect[1] > (l + 1) * rpb:
            return None
        mode = self.part["a"] if name == "A" else self.part["b"] if name == "B" else self.part["d"]
        row_mode = {"A": "M", "B": "N", "C": "M"}[name]
        roff = dev * rpb if mode == row_mode else 0
        coff = dev * width if mode not in ("none", row_mode) else 0
        return (name, l, rect[0] - l * rpb + roff, rect[2] + coff)

    # -- reads and writes -------------------------------------------------------------------------
    def read(self, ev: Event, ref: dict, rect, what: str) -> tuple | None:
        """The content ``ev`` reads from ``rect``, or None (reported) when it is not one region
        written before the read."""
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
        if not self.order.hb(p.writer, ev):
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
        """Records that ``ev`` writes ``content`` to ``rect``, checking that no output element is
        produced twice and that no old content a reader still needs is overwritten."""
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
                    f"[{rect[2]}:{rect[3]}], already produced by "
                    f"{event_name(self.plan, p.writer)}: an output element produced twice",
                )
                keep.append(p)
                continue
            pending = [r for r in p.readers if not self.order.hb(r, ev)] if p.readers else []
            if not self.order.hb(p.writer, ev) or pending:
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
                # Partly overwritten: later reads of it are reported as not one region.
                keep.append(p)
        keep.append(Piece(rect, content, ev))
        self.pieces[(dev, name)] = keep
