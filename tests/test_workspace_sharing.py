"""CPU checks of a communicator's one workspace (distgemm.runtime.workspace): the control region
every plan shares (C++ layout), the pool's sizing, growth and release on the real plans of a
96-token-count loop, the Communicator's growth (plans re-pointed, the old workspace freed
collective-safely) with the CUDA parts replaced, memory_stats, launches of several plans on one
shared workspace through the reference executor, and a growth's exchanges across gloo ranks at
every TP of ranks.CPU_TPS."""

import collections
import random
import time
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from ranks import CPU_TPS, run_ranks  # noqa: E402

import distgemm  # noqa: E402
from distgemm import _core, llama3, ops  # noqa: E402
from distgemm.plan import reference as ref  # noqa: E402
from distgemm.runtime import communicator as comm_mod  # noqa: E402
from distgemm.runtime import entry_cache as entries  # noqa: E402
from distgemm.runtime.paths.fused import FusedResources, FusedState, fused_layout  # noqa: E402
from distgemm.runtime.paths.overlapped import GRAPHS_PER_PLAN, SEEN_PER_PLAN  # noqa: E402
from distgemm.runtime.precision import Precision  # noqa: E402
from distgemm.runtime.workspace import (  # noqa: E402
    GROWTH_HEADROOM,
    WorkspacePool,
    control_bytes,
    grown_slot_capacity,
)

SCHEDULES = ["ag_rotate_a", "ag_rotate_b", "rs_tile_a", "rs_tile_b", "ar_tile_a"]
CONTROL = control_bytes()
ALIGN = _core.WORKSPACE_SLOT_ALIGN
TOKENS = range(64, 6145, 64)  # the 96 token counts of the issue's serving loop
BF16 = torch.bfloat16

# ---------------------------------------------------------------------------------------------
# The control region: one layout for every plan (C++: control_layout(), Plan::layout).


def test_control_region_sizes_come_from_the_bounds():
    c = _core.workspace_control_layout()
    assert _core.MAX_FLAGS == 2 * _core.MAX_STEPS
    assert (c["flags_offset"], c["flags_bytes"]) == (0, _core.MAX_FLAGS * 4)
    assert c["barrier_offset"] == c["flags_bytes"] and c["barrier_bytes"] >= 4 * _core.MAX_TP
    assert c["epoch_offset"] == c["barrier_offset"] + c["barrier_bytes"]
    assert (c["slots_offset"], c["slots_bytes"]) == (0, 0)
    assert c["total_bytes"] == CONTROL and CONTROL % ALIGN == 0
    assert CONTROL >= c["epoch_offset"] + 4


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("tp", [1, *CPU_TPS])
def test_every_plan_ends_in_the_same_control_region(schedule, tp):
    c = _core.workspace_control_layout()
    for steps in (tp, 2 * tp, 4 * tp):
        for via in ("epilogue", "copy"):
            m = n = 16 * steps * tp
            layout = _core.build_plan(schedule, tp, steps, m, n, 64 * tp, 1, via).layout(2)
            slots = layout["slots_bytes"]
            assert layout["slots_offset"] == 0 and slots % ALIGN == 0
            for part in ("flags", "barrier"):
                assert layout[f"{part}_offset"] == slots + c[f"{part}_offset"]
                assert layout[f"{part}_bytes"] == c[f"{part}_bytes"]
            assert layout["epoch_offset"] == slots + c["epoch_offset"]
            assert layout["total_bytes"] == slots + CONTROL


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_the_flags_of_every_plan_fit_the_control_region(schedule):
    """The most flags a plan has: S = MAX_STEPS (rounded down to a multiple of TP), every TP."""
    worst = 0
    for tp in range(1, _core.MAX_TP + 1):
        steps = _core.MAX_STEPS // tp * tp
        plan = _core.build_plan(schedule, tp, steps, 8 * steps, 8 * steps, 8 * tp, 1)
        assert plan.num_flags <= _core.MAX_FLAGS
        worst = max(worst, plan.num_flags)
    # ar_tile_a comes closest: 2(S - S/TP) flags.
    assert worst > (_core.MAX_FLAGS * 3) // 4 if schedule == "ar_tile_a" else worst > 0


def test_steps_above_the_bound_are_refused():
    tp, steps = 2, _core.MAX_STEPS + 2
    with pytest.raises(
        ValueError, match=rf"S={steps} is out of range: distgemm supports S <= {_core.MAX_STEPS}"
    ):
        _core.build_plan("ag_rotate_a", tp, steps, 8 * steps, 64, 64)
    with pytest.raises(ValueError, match=r"S=130 is out of range"):
        distgemm.build_plan("rs_tile_a", 2, 130, m=8 * 130, n=64, k=64)


# ---------------------------------------------------------------------------------------------
# The serving loops: real plans of 96 token counts.


def issue_ops(tp):
    """The issue's loop: per token count an all-gather GEMM and a GEMM + reduce-scatter with
    K = 4096 (N = 8192), default steps. Yields (schedule, op, m, n, k, steps)."""
    for m in TOKENS:
        yield "ag_rotate_a", "all_gather_gemm", m, 8192, 4096
        yield "rs_tile_a", "gemm_reduce_scatter", m, 8192, 4096


def llama70b_ops(tp):
    """QKV, O, FC1, FC2 of Llama-70B per token count (the sweep's shapes)."""
    layers = llama3.layers()
    for m in TOKENS:
        for layer, d in layers.items():
            op = "all_gather_gemm" if d["collective"] == "all_gather" else "gemm_reduce_scatter"
            yield (d["schedule"], op, *llama3.gemm("70B", layer, m))


WORKLOADS = {"issue": issue_ops, "llama70b": llama70b_ops}


def plans_of(workload, tp):
    out = []
    for schedule, op, m, n, k in WORKLOADS[workload](tp):
        steps = _core.default_steps(schedule, tp, m, n, k)
        plan = _core.build_plan(schedule, tp, steps, m, n, k, 1)
        assert plan.extent_problem() == "", (schedule, m, n, k)
        out.append((op, schedule, m, n, k, plan))
    return out


class FakeCore:
    """Stands for _core.IpcWorkspace: a base address per allocation, a log of what happens."""

    def __init__(self, log, index, nbytes, tp, rank):
        self.log, self.index, self.nbytes = log, index, nbytes
        self.ptr = (index + 1) << 40
        self.peer_bases = [self.ptr + (r << 34) for r in range(tp)]
        self.peer_bases[rank] = self.ptr
        self.freed = self.unmapped = False

    def close_peers(self):
        self.unmapped = True
        self.log.append(("close_peers", self.index))

    def free(self):
        self.freed = True
        self.log.append(("free", self.index))


class Allocator:
    """The pool's injected CUDA and collective parts, recording the order of events."""

    def __init__(self, tp=2, rank=0):
        self.tp, self.rank, self.log, self.cores = tp, rank, [], []

    def allocate(self, nbytes):
        core = FakeCore(self.log, len(self.cores), nbytes, self.tp, self.rank)
        self.cores.append(core)
        self.log.append(("allocate", core.index))
        return core, list(core.peer_bases)

    def repoint(self, ws):
        self.log.append(("repoint", ws.core.index))

    def release(self, workspaces):
        for w in workspaces:
            w.core.close_peers()
        self.log.append(("barrier", [w.core.index for w in workspaces]))
        for w in workspaces:
            w.core.free()

    @property
    def live(self):
        return [c for c in self.cores if not c.freed]

    def pool(self):
        return WorkspacePool(
            self.allocate, self.repoint, self.release, control=CONTROL, align=ALIGN, order="o"
        )


def test_growth_headroom_stays_within_ten_percent_of_the_plan():
    for slots in [0, 256, 4096, 1 << 20, 3 * (1 << 24) + 512, 96 << 20]:
        cap = grown_slot_capacity(slots, CONTROL, ALIGN)
        assert cap >= slots and cap % ALIGN == 0
        assert cap + CONTROL <= (slots + CONTROL) * (1 + GROWTH_HEADROOM)
        assert cap + CONTROL > (slots + CONTROL) * (1 + GROWTH_HEADROOM) - ALIGN


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_one_workspace_within_ten_percent_of_the_largest_plan(workload, tp):
    alloc = Allocator(tp)
    pool = alloc.pool()
    plans = plans_of(workload, tp)
    assert len(plans) == 96 * (2 if workload == "issue" else 4)
    largest = 0
    for *_, plan in plans:
        layout = plan.layout(2)
        ws, bases = pool.place(layout)
        largest = max(largest, layout["total_bytes"])
        assert [c.index for c in alloc.live] == [ws.core.index] and pool.live == [ws]
        assert pool.largest_plan_bytes == largest
        assert ws.nbytes <= largest * (1 + GROWTH_HEADROOM)
        for r in range(tp):
            # The plan's bytes end where the workspace ends; its control region is the
            # workspace's on every rank.
            assert ws.bases[r] <= bases[r]
            assert bases[r] + layout["total_bytes"] == ws.bases[r] + ws.nbytes
            assert bases[r] + layout["flags_offset"] == ws.bases[r] + ws.slot_capacity
    # Growth is rare next to the distinct layouts, and each one is: allocate, re-point, release
    # the old workspace.
    distinct = len({p.layout(2)["total_bytes"] for *_, p in plans})
    growths = [e for e in alloc.log if e[0] == "allocate"]
    assert pool.allocations == len(growths) < distinct / 2
    expected = [("allocate", 0)]
    for i in range(1, len(growths)):
        expected += [
            ("allocate", i),
            ("repoint", i),
            ("close_peers", i - 1),
            ("barrier", [i - 1]),
            ("free", i - 1),
        ]
    assert alloc.log == expected
    # One workspace per plan layout (no sharing) would hold far more.
    assert sum(p.layout(2)["total_bytes"] for *_, p in plans) > 20 * pool.current.nbytes


def test_a_pinned_workspace_survives_growth_until_close():
    alloc = Allocator(2)
    pool = alloc.pool()
    layouts = [p.layout(2) for *_, p in plans_of("issue", 2)]
    small, mid, big = layouts[0], layouts[40], layouts[-1]
    ws1, _ = pool.place(small)
    ws1.pinned = True  # graphs captured into a caller's CUDA graph reference it
    ws2, _ = pool.place(mid)
    assert ws2 is not ws1 and pool.kept == [ws1] and not ws1.core.freed
    assert alloc.log[-2:] == [("repoint", 1), ("barrier", [])]  # the barrier still runs
    ws3, _ = pool.place(big)
    assert ws2.core.freed and pool.kept == [ws1] and pool.live == [ws3, ws1]
    assert len(alloc.live) == 2
    held = pool.close()
    assert held == [ws3, ws1] and pool.current is None and pool.kept == []


def test_a_plan_layout_without_the_shared_control_region_is_an_internal_error():
    pool = Allocator(2).pool()
    layout = dict(_core.workspace_layout("ag_rotate_a", 2, 2, 64, 64, 64))
    layout["total_bytes"] += 128
    with pytest.raises(RuntimeError, match="internal: a plan layout"):
        pool.place(layout)


# ---------------------------------------------------------------------------------------------
# The Communicator's workspace with the CUDA parts replaced: growth re-points the cached plans,
# the old workspace is released collective-safely, close() frees everything.


class FakeIpcWorkspace(FakeCore):
    log: list = []
    made: list = []
    rank, tp, fail_open = 0, 2, None

    def __init__(self, device, nbytes):
        super().__init__(FakeIpcWorkspace.log, len(self.made), nbytes, self.tp, self.rank)
        FakeIpcWorkspace.made.append(self)
        self.log.append(("allocate", self.index))

    def handle(self):
        return b"h%d" % self.index

    def open_peers(self, handles, rank):
        if self.fail_open:
            raise RuntimeError(self.fail_open)
        # Every rank allocates at the same call: the handles are of the same allocation.
        assert handles == [b"h%d" % self.index] * len(handles), handles

    def bases(self):
        return list(self.peer_bases)


class TrackedGraphs(collections.OrderedDict):
    """An entry's eager graphs that log when they are dropped."""

    def clear(self):
        if self:
            FakeIpcWorkspace.log.append(("graphs dropped", len(self)))
        super().clear()


def fake_comm(tp=2, rank=0, peer_errors=None, ctl=None):
    """A Communicator over fakes: the exchange echoes this rank's object for every rank (or
    ``peer_errors[what]`` for the peer), or goes through ``ctl`` (a real ControlExchange)."""
    FakeIpcWorkspace.log, FakeIpcWorkspace.made = [], []
    FakeIpcWorkspace.rank, FakeIpcWorkspace.tp, FakeIpcWorkspace.fail_open = rank, tp, None
    c = object.__new__(comm_mod.Communicator)
    c.rank, c.tp, c._closed, c.broken = rank, tp, False, None
    c.timeout_s, c.wait_timeout_s = 30.0, 3.5
    c.device = torch.device("cuda", 0)
    c.order, c.group = "order", None
    c._attachments = {}
    c._ipc_workspace = FakeIpcWorkspace
    c.synchronize = lambda: FakeIpcWorkspace.log.append(("synchronize",))
    if ctl is not None:
        c._ctl = ctl
    else:

        def all_gather(obj, what="", timeout_s=None):
            FakeIpcWorkspace.log.append(("exchange", what))
            peer = (peer_errors or {}).get(what, obj)
            return [obj if r == rank else peer for r in range(tp)]

        c._ctl = types.SimpleNamespace(all_gather=all_gather, seq=0, close=lambda: None)
    c._pool = c.new_pool(c._workspace_grown, control=CONTROL)
    c.plans = entries.entry_cache(c)
    return c


def add_entry(c, op, schedule, m, n, k):
    """The first call of an op on the communicator (EntryCache.create with meta tensors): the
    entry's overlapped state, with one eager graph."""
    tp = c.tp
    if op == "all_gather_gemm":
        a, w = (m // tp, k), (n // tp, k)
    else:
        a, w = (m, k // tp), (n, k // tp)
    at, wt = (torch.empty(s, dtype=BF16, device="meta") for s in (a, w))
    key = entries.EntryKey(
        op, schedule, None, Precision(BF16), (("a", a), ("w", w)), 0.0, False, "overlap"
    )
    state = c.plans.create(key, lambda: ops.make_spec(op, schedule, tp, c.rank, None, at, wt)).state
    state.graphs = TrackedGraphs(state.graphs)
    state.graphs[(1, 2, 0, 3, 0)] = "graph"  # an eager call's graph
    return state


def fused_entry(c, slots, receive):
    """A fused entry's state (no graphs) of ``slots`` bytes of partial buffers, placed by
    FusedState.place: the decode kernel's (``receive``) or the CUTLASS kernel's."""
    layout = {"slots_offset": 0, "slots_bytes": slots, "total_bytes": slots}
    if not receive:
        layout["total_bytes"] += c.workspace_control_bytes
    state = FusedState(
        spec=None,
        precision=None,
        beta=0.0,
        want_gathered=False,
        out_shape=torch.Size(),
        receive=receive,
        layout=layout,
        resources=FusedResources.of(c),
    )
    state.place(c)
    c.plans[f"fused {slots} {receive}"] = entries.Entry(None, "fused", {}, state)
    return state


def parity_halves(entry):
    """Each parity's byte range [start, end) on rank 0, as the kernels address them."""
    base, half = entry.bases[0], entry.parity_bytes
    size = entry.layout["slots_bytes"] // 2
    return [(base, base + size), (base + half, base + half + size)]


def test_growth_gives_a_fused_entry_its_bases_in_the_new_workspace():
    """A CUTLASS fused entry (no graphs; its partial buffers in the workspace's slots) is
    re-pointed at the growth like the plans, so its launches read entry.bases without placing it
    again: the slots' base, each parity in one half of them."""
    c = fake_comm()
    fused = fused_entry(c, 4 * ALIGN, receive=False)
    old = fused.ws
    assert fused.bases == old.bases and fused.parity_bytes == old.slot_capacity // 2
    big = add_entry(c, "all_gather_gemm", "ag_rotate_a", 4096, 512, 256)
    new = big.ws
    assert new is not old and fused.ws is new
    assert fused.bases == new.bases
    assert fused.parity_bytes == new.slot_capacity // 2 // 16 * 16
    assert fused.parity_bytes >= 2 * ALIGN  # each parity fits its half
    assert old.core.freed


def test_decode_receive_buffers_are_sized_for_the_widest_token_count():
    """A server's next batch size must not grow the receive region (a collective allocation and
    a device synchronisation): every decode token count of one layer needs the same region, the
    one of FUSED_DECODE_MAX_TOKENS tokens; the CUTLASS kernel's buffers follow m and end in the
    workspace's control region."""
    control = 4096
    widest = _core.FUSED_DECODE_MAX_TOKENS
    layouts = {m: fused_layout(m, 8192, 1, 2, 2, control) for m in range(1, widest + 1)}
    assert all(lay == layouts[widest] for lay in layouts.values())
    assert layouts[1]["total_bytes"] == layouts[1]["slots_bytes"]  # no control region
    assert layouts[1]["slots_bytes"] >= _core.fused_partial_bytes(widest, 8192, 1, 2, 2)
    assert layouts[1]["slots_bytes"] % ALIGN == 0
    cutlass = [fused_layout(m, 8192, 1, 2, 2, control) for m in (widest + 1, 256)]
    assert cutlass[0]["slots_bytes"] < cutlass[1]["slots_bytes"]
    assert all(lay["total_bytes"] == lay["slots_bytes"] + control for lay in cutlass)


def test_decode_fused_entries_get_a_receive_region_of_their_own():
    """The decode kernel's peers push into its buffers whenever their launch runs: those live in
    a region no plan is placed in, grown (collectively) and re-pointed like the workspace, and
    counted by memory_stats."""
    c = fake_comm()
    plan = add_entry(c, "all_gather_gemm", "ag_rotate_a", 128, 512, 256)
    small = fused_entry(c, 2 * ALIGN, receive=True)
    assert small.ws is not plan.ws and small.ws is c.attachment("fused").receive.current
    assert small.ws.control_bytes == 0 and small.bases == small.ws.bases
    stats = c.memory_stats()
    assert stats["fused_receive_bytes"] == small.ws.nbytes
    assert stats["workspace_bytes"] == plan.ws.nbytes
    assert stats["largest_plan_bytes"] == plan.spec.plan.layout(2)["total_bytes"]  # plans only
    assert c.workspace_bytes == plan.ws.nbytes + small.ws.nbytes
    # A plan's growth leaves the receive region alone; a larger decode entry grows it and
    # re-points the smaller one, and the old region is freed collective-safely.
    add_entry(c, "all_gather_gemm", "ag_rotate_a", 4096, 512, 256)
    assert small.ws is c.attachment("fused").receive.current
    old = small.ws
    FakeIpcWorkspace.log.clear()
    big = fused_entry(c, 16 * ALIGN, receive=True)
    assert big.ws is small.ws is not old and old.core.freed
    assert [e[1] for e in FakeIpcWorkspace.log if e[0] == "exchange"] == [
        "workspace IPC handle exchange",
        "workspace IPC open",
        "workspace release",
    ]
    # Each parity in its own half: one entry's parity 0 never overlaps another's parity 1, so a
    # launch never writes where a peer still reads the previous launch's partials.
    for a in (small, big):
        for b in (small, big):
            (a0, a1), (b0, b1) = parity_halves(a)[0], parity_halves(b)[1]
            assert a1 <= b0 or b1 <= a0, (parity_halves(a), parity_halves(b))
    c.close()
    assert big.ws.core.freed and c.attachment("fused") is None


def test_plans_of_every_schedule_share_one_workspace():
    c = fake_comm()
    layouts = [
        _core.build_plan(s, 2, st, 256, 256, 128, 1, via).layout(2)
        for s in SCHEDULES
        for st in (2, 4)
        for via in ("epilogue", "copy")
    ]
    biggest = max(layouts, key=lambda x: x["slots_bytes"])
    ws, _ = c.workspace_for(biggest)
    for layout in layouts:
        ws_i, bases = c.workspace_for(layout)
        assert ws_i is ws
        assert [b + layout["epoch_offset"] for b in bases] == [
            b + ws.slot_capacity + _core.workspace_control_layout()["epoch_offset"]
            for b in ws.bases
        ]
    exchanges = [e[1] for e in FakeIpcWorkspace.log if e[0] == "exchange"]
    assert exchanges == ["workspace IPC handle exchange", "workspace IPC open"]
    assert c.workspace_bytes == ws.nbytes == FakeIpcWorkspace.made[0].nbytes


def test_growth_repoints_every_cached_plan_then_frees_the_old_workspace(monkeypatch):
    c = fake_comm()
    small = [add_entry(c, "gemm_reduce_scatter", "rs_tile_a", 128, 512, 256)]  # the biggest
    small += [add_entry(c, "all_gather_gemm", "ag_rotate_a", m, 512, 256) for m in (128, 64)]
    old = small[0].ws
    assert all(e.ws is old for e in small) and len(FakeIpcWorkspace.made) == 1
    log = FakeIpcWorkspace.log
    log.clear()
    big = add_entry(c, "all_gather_gemm", "ag_rotate_a", 4096, 512, 256)
    new = big.ws
    assert new is not old and c._pool.current is new
    # The order that makes the release safe: the new workspace is exchanged, the device is
    # synchronised before any graph goes, every cached plan is re-pointed, and the old workspace
    # is freed only after every rank unmapped its peers' copies (the barrier).
    assert log == [
        ("exchange", "all_gather_gemm plan signature"),
        ("allocate", 1),
        ("exchange", "workspace IPC handle exchange"),
        ("exchange", "workspace IPC open"),
        ("synchronize",),
        ("graphs dropped", 1),
        ("graphs dropped", 1),
        ("graphs dropped", 1),
        ("synchronize",),
        ("close_peers", 0),
        ("exchange", "workspace release"),
        ("free", 0),
    ]
    for e in small:
        layout = e.spec.plan.layout(2)
        assert e.ws is new and len(e.graphs) == 0
        shift = new.slot_capacity - layout["slots_bytes"]
        assert e.bases == [b + shift for b in new.bases] == e.setup.workspace_bases
        assert e.setup.workspace_bytes == layout["total_bytes"]
    assert old.core.freed and not new.core.freed
    stats = c.memory_stats()
    assert stats["workspace_bytes"] == new.nbytes and stats["kept_bytes"] == 0
    assert stats["workspace_allocations"] == 2 and stats["plans"] == 4
    assert stats["eager_graphs"] == 1  # the big plan's; the others are rebuilt at their call
    assert stats["largest_plan_bytes"] == big.spec.plan.layout(2)["total_bytes"]
    assert new.nbytes <= stats["largest_plan_bytes"] * (1 + GROWTH_HEADROOM)


def test_a_failed_growth_leaves_the_workspace_and_the_plans_as_they_were():
    c = fake_comm(
        peer_errors={
            "workspace IPC handle exchange": (b"", "allocating 99 bytes on cuda:1: out of memory")
        }
    )
    with pytest.raises(
        RuntimeError,
        match=r"distgemm workspace setup failed on rank 1: allocating 99 bytes on cuda:1: out of "
        r"memory",
    ):
        c.workspace_for(_core.workspace_layout("ag_rotate_a", 2, 2, 64, 64, 64))
    assert FakeIpcWorkspace.made[0].freed and c._pool.current is None


def test_a_peer_ipc_open_failure_raises_on_every_rank_and_frees():
    c = fake_comm(peer_errors={"workspace IPC open": "cudaIpcOpenMemHandle failed"})
    with pytest.raises(RuntimeError, match=r"failed on rank 1: cudaIpcOpenMemHandle failed"):
        c.workspace_for(_core.workspace_layout("ag_rotate_a", 2, 2, 64, 64, 64))
    assert FakeIpcWorkspace.made[0].freed and c._pool.current is None


def test_a_growth_that_fails_keeps_the_old_workspace():
    c = fake_comm()
    e = add_entry(c, "all_gather_gemm", "ag_rotate_a", 64, 512, 256)
    FakeIpcWorkspace.fail_open = "cudaIpcOpenMemHandle failed"
    with pytest.raises(RuntimeError, match="cudaIpcOpenMemHandle failed"):
        c.workspace_for(_core.workspace_layout("ag_rotate_a", 2, 2, 8192, 512, 256))
    assert c._pool.current is e.ws and not e.ws.core.freed and len(e.graphs) == 1
    assert FakeIpcWorkspace.made[1].freed


def test_close_frees_every_workspace_pinned_ones_included(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)  # close()'s barrier runs
    c = fake_comm()
    add_entry(c, "all_gather_gemm", "ag_rotate_a", 64, 512, 256)
    c._pool.current.pinned = True
    add_entry(c, "all_gather_gemm", "ag_rotate_a", 4096, 512, 256)
    pinned, current = FakeIpcWorkspace.made
    assert c.memory_stats()["kept_bytes"] == pinned.nbytes and not pinned.freed
    assert c.workspace_bytes == pinned.nbytes + current.nbytes
    FakeIpcWorkspace.log.clear()
    c.close()
    log = [e for e in FakeIpcWorkspace.log if e[0] in ("close_peers", "exchange", "free")]
    assert ("graphs dropped", 1) in FakeIpcWorkspace.log
    assert sorted(log[:2]) == [("close_peers", 0), ("close_peers", 1)]
    assert log[2] == ("exchange", "")  # every rank unmapped its peers before anyone frees
    assert sorted(log[3:]) == [("free", 0), ("free", 1)]
    assert c.workspace_bytes == 0 and len(c.plans) == 0


class FakeGraph:
    def __init__(self):
        self.updates = []

    def update(self, *ptrs):
        self.updates.append(ptrs)


def full_plan(c):
    """An overlapped entry's state with GRAPHS_PER_PLAN fake graphs for pointer sets 0..3, made
    by two calls of each in that order (graph_for with a stand-in for graph creation): the first
    launched directly, the second with its new graph."""
    state = add_entry(c, "all_gather_gemm", "ag_rotate_a", 128, 512, 256)
    state.graphs.clear()
    state._new_graph = lambda ptrs, capture_only=False: FakeGraph()
    for i in range(GRAPHS_PER_PLAN):
        first, direct = state.graph_for(ptrs_of(i))
        assert direct and first is state.direct
        g, direct = state.graph_for(ptrs_of(i))
        assert not direct and state.graphs[ptrs_of(i)] is g is not state.direct
    assert state.direct_launches == GRAPHS_PER_PLAN and state.graph_retargets == 0
    return state


def ptrs_of(i):
    return (1000 + i, 2, 0, 3, 0, 0, 0)


def calls(state, order, rounds):
    """graph_for over ``order`` ``rounds`` times: per call (pointers, hit/new/retarget/direct)."""
    out = []
    for _ in range(rounds):
        for i in order:
            before = (len(state.graphs), state.graph_retargets, state.direct_launches)
            had = ptrs_of(i) in state.graphs
            g, direct = state.graph_for(ptrs_of(i))
            kind = "direct" if direct else "hit" if had else "retarget"
            if kind == "retarget" and state.graph_retargets == before[1]:
                kind = "new"
            out.append((i, kind))
            assert direct or state.graphs[ptrs_of(i)] is g
    return out


def test_a_cycle_through_more_pointer_sets_than_graphs_keeps_the_graphs_replaying():
    # A model's 8 layers of one shape: 4 keep their graphs, the other 4 go without, and nothing is
    # re-captured (retargeting the least recently used graph would miss at every call).
    c = fake_comm()
    state = full_plan(c)
    got = calls(state, range(2 * GRAPHS_PER_PLAN), 3)
    kinds = {i: {k for j, k in got if j == i} for i in range(2 * GRAPHS_PER_PLAN)}
    assert all(kinds[i] == {"hit"} for i in range(GRAPHS_PER_PLAN))
    assert all(kinds[i] == {"direct"} for i in range(GRAPHS_PER_PLAN, 2 * GRAPHS_PER_PLAN))
    assert state.graph_retargets == 0 and state.direct_launches == 4 * GRAPHS_PER_PLAN
    stats = c.memory_stats()
    assert stats["direct_launches"] == 4 * GRAPHS_PER_PLAN and stats["graph_retargets"] == 0


def test_pointers_that_replace_the_old_ones_get_the_graphs_after_one_round():
    # Steady-state pointers (4..7) after warm-up ones (0..3): the first round goes without graphs,
    # then each set that came back retargets the stalest graph, and every later call replays.
    c = fake_comm()
    state = full_plan(c)
    new = range(GRAPHS_PER_PLAN, 2 * GRAPHS_PER_PLAN)
    first, second, third = (calls(state, new, 1) for _ in range(3))
    assert {k for _, k in first} == {"direct"}
    assert {k for _, k in second} == {"retarget"} and state.graph_retargets == GRAPHS_PER_PLAN
    assert {k for _, k in third} == {"hit"}
    assert set(state.graphs) == {ptrs_of(i) for i in new}
    assert all(g.updates for g in state.graphs.values())


def test_a_first_call_instantiates_no_graph_and_the_workspace_drops_the_direct_launcher():
    c = fake_comm()
    state = add_entry(c, "all_gather_gemm", "ag_rotate_a", 128, 512, 256)
    state.graphs.clear()
    made = []
    state._new_graph = lambda ptrs, capture_only=False: made.append(capture_only) or FakeGraph()
    assert state.graph_for(ptrs_of(0))[1] and made == [True]  # direct, the launcher made once
    assert state.graph_for(ptrs_of(1))[1] and made == [True]
    assert not state.graph_for(ptrs_of(0))[1] and made == [True, False]  # back: a graph
    launcher = state.direct
    state.release()
    assert state.direct is None and not state.graphs and launcher is not None


def test_pointers_seen_once_never_retarget_and_their_memory_is_bounded():
    c = fake_comm()
    state = full_plan(c)
    for i in range(SEEN_PER_PLAN + 10):  # fresh pointers at every call, as an unpooled output
        g, direct = state.graph_for(ptrs_of(100 + i))
        assert direct and not g.updates
    assert len(state.seen_at) == SEEN_PER_PLAN and state.graph_retargets == 0


def test_memory_stats_counts_plans_and_graphs_and_states_the_bounds():
    c = fake_comm()
    es = [add_entry(c, "all_gather_gemm", "ag_rotate_a", m, 512, 256) for m in (192, 128, 64)]
    es[0].graphs[(5, 6, 0, 7, 0)] = "another graph"
    es[1].capturer = object()  # the capture-only graph callers' CUDA graphs replay
    c._pool.current.pinned = True
    stats = distgemm.memory_stats(c)
    assert stats == {
        "workspace_bytes": c._pool.current.nbytes,
        "kept_bytes": 0,
        "largest_plan_bytes": es[0].spec.plan.layout(2)["total_bytes"],
        "workspace_allocations": 1,
        "plans": 3,
        "eager_graphs": 4,
        "captured_graphs": 1,
        "graph_retargets": 0,
        "direct_launches": 0,
        "fused_control_bytes": 0,  # no fused entry: its control region is not allocated
        "fused_receive_bytes": 0,
        "collective_bytes": 0,  # no collective call: no scratch
        "collective_buffers": 0,
        "collective_allocations": 0,
        "allreduce_control_bytes": 0,  # no call of our all-reduce: nothing allocated
        "allreduce_receive_bytes": 0,
        "max_plans": entries.MAX_PLANS,
        "graphs_per_plan": GRAPHS_PER_PLAN,
    }


def test_memory_stats_without_a_communicator_creates_none():
    import torch.distributed as dist

    assert not dist.is_initialized()
    before = dict(comm_mod._DEFAULT)
    stats = distgemm.memory_stats()
    assert comm_mod._DEFAULT == before
    assert stats["max_plans"] == entries.MAX_PLANS
    assert stats["graphs_per_plan"] == GRAPHS_PER_PLAN
    assert all(v == 0 for k, v in stats.items() if k not in ("max_plans", "graphs_per_plan"))
    c = fake_comm()
    c._closed = True
    assert distgemm.memory_stats(c) == stats


# ---------------------------------------------------------------------------------------------
# Launches of several plans on one shared workspace through the reference executor: slots keep
# the last launch's data and flags its generation, and the results stay exact.


def shared_launch_plans(tp):
    """Plans of every schedule with different shapes, S and partial transports (so different
    slot bytes and flag counts), as (plan dict, layout)."""
    out = []
    for i, schedule in enumerate(SCHEDULES):
        for k_steps in (1, 2):
            steps = k_steps * tp
            via = "copy" if i % 2 else "epilogue"
            m, n, k = 16 * steps * (1 + i % 3), 16 * steps * (2 - i % 2), 24 * tp
            plan = _core.build_plan(schedule, tp, steps, m, n, k, 1, via)
            out.append((plan.to_dict(), plan.layout(2)))
    return out


def run_shared(tp, order, plans, advance_generation=True, seed=0):
    """Launch ``plans[i]`` for i in ``order`` on one pool-placed workspace per device; the
    worst relative error against the full GEMM."""
    alloc = Allocator(tp)
    pool = alloc.pool()
    shared, ws_now, worst = None, None, 0.0
    rng = random.Random(seed)
    for n, i in enumerate(order):
        plan, layout = plans[i]
        ws, bases = pool.place(layout)
        if ws is not ws_now:  # a grown workspace: zeroed flags and epoch on every device
            shared = ref.SharedWorkspace(tp, ws.slot_capacity // 2, _core.MAX_FLAGS)
            ws_now = ws
        if not advance_generation:
            shared.epoch = 0  # every launch takes generation 1: stale flags look current
        inputs = ref.reference_inputs(plan, seed=seed * 1000 + n)
        got = ref.execute_plan(
            plan,
            inputs,
            policy=rng.choice(ref.POLICIES),
            shared=shared,
            slot_offset=(bases[0] - ws.bases[0]) // 2,
        )
        for g, w in zip(got, ref.expected_outputs(plan, inputs, 1.0, 0.0, False)):
            if not np.all(np.isfinite(g)):
                return float("inf")
            worst = max(worst, float(np.linalg.norm(g - w) / np.linalg.norm(w)))
    return worst


@pytest.mark.parametrize("tp", CPU_TPS)
def test_plans_sharing_one_workspace_stay_exact(tp):
    plans = shared_launch_plans(tp)
    by_size = sorted(range(len(plans)), key=lambda i: plans[i][1]["slots_bytes"])
    rng = random.Random(tp)
    # Growing then steady: every plan after a smaller one and before a bigger one, then 60
    # launches in random order on the final workspace (a plan right after itself included).
    order = by_size + [rng.randrange(len(plans)) for _ in range(60)]
    assert run_shared(tp, order, plans, seed=tp) < 1e-12


def test_without_new_generations_a_stale_flag_lets_a_gemm_read_stale_slots():
    """The control: if launches did not take new generations, the flags a previous launch set
    would satisfy the next launch's waits and a GEMM would read the previous launch's slots."""
    plans = shared_launch_plans(2)
    ag = next(i for i, (p, _) in enumerate(plans) if p["schedule"] == "ag_rotate_a")
    errors = [run_shared(2, [ag] * 4, plans, advance_generation=False, seed=s) for s in range(4)]
    assert max(errors) > 0.1
    assert run_shared(2, [ag] * 4, plans, seed=0) < 1e-12


# ---------------------------------------------------------------------------------------------
# Ranks over gloo, at every TP of CPU_TPS: the issue's serving loop (with shapes that split over
# each TP) through the real control exchange on the process group's store. Every rank grows at the
# same call (the fake IPC open checks that the handles are of the same allocation), and no rank
# frees a workspace before every rank unmapped it. Then a growth whose IPC open fails on the last
# rank raises the same error on every rank, which keeps its workspace.


def every_tp_ops(tp):
    """issue_ops with M a multiple of 96 (64 token counts), N = 6144 and K = 3072: M, N and K
    and their shards split over every TP of CPU_TPS."""
    for m in range(96, 6145, 96):
        yield "ag_rotate_a", "all_gather_gemm", m, 6144, 3072
        yield "rs_tile_a", "gemm_reduce_scatter", m, 6144, 3072


def _gloo_worker(rank, tp):
    from distgemm.runtime.control import ControlExchange, default_store

    ctl = ControlExchange(default_store(), list(range(tp)), rank, 60.0)
    c = fake_comm(tp=tp, rank=rank, ctl=ctl)
    stamps = collections.defaultdict(dict)

    class StampedLog(list):
        def append(self, event):
            if event[0] in ("close_peers", "free"):
                stamps[event[1]][event[0]] = time.monotonic()
            super().append(event)

    FakeIpcWorkspace.log = StampedLog()
    steps = []
    for schedule, op, m, n, k in every_tp_ops(tp):
        add_entry(c, op, schedule, m, n, k)
        s = c.memory_stats()
        steps.append((s["workspace_allocations"], s["workspace_bytes"], s["largest_plan_bytes"]))
    before = c._pool.current
    FakeIpcWorkspace.fail_open = "cudaIpcOpenMemHandle failed" if rank == tp - 1 else None
    try:
        c.workspace_for(_core.workspace_layout("ag_rotate_a", tp, tp, 16 * 6144, 6144, 3072))
        error = None
    except RuntimeError as e:
        error = str(e)
    failed = FakeIpcWorkspace.made[-1]
    failed_growth = {
        "error": error,
        "kept": c._pool.current is before and not before.core.freed,
        "new freed": failed is not before.core and failed.freed,
    }
    stamps.pop(failed.index, None)  # never mapped by the peers: freed at once
    final = c.memory_stats()
    c.close()
    stamps = {index: dict(events) for index, events in stamps.items()}
    return {"steps": steps, "final": final, "stamps": stamps, "failed growth": failed_growth}


@pytest.mark.parametrize("tp", CPU_TPS)
def test_growth_stays_in_step_across_gloo_ranks_and_a_failed_one_raises_on_every_rank(tmp_path, tp):
    res = run_ranks(_gloo_worker, tmp_path, tp=tp)
    assert all(r["steps"] == res[0]["steps"] for r in res)  # every rank grew at the same call
    final = res[0]["final"]
    assert final["plans"] == entries.MAX_PLANS and final["workspace_allocations"] > 1
    assert final["workspace_bytes"] <= final["largest_plan_bytes"] * (1 + GROWTH_HEADROOM)
    # Each workspace was unmapped by every rank before any rank freed it.
    for index in res[0]["stamps"]:
        unmapped = max(r["stamps"][index]["close_peers"] for r in res)
        freed = min(r["stamps"][index]["free"] for r in res)
        assert unmapped < freed, index
    want = f"distgemm workspace setup failed on rank {tp - 1}: cudaIpcOpenMemHandle failed"
    assert [r["failed growth"] for r in res] == [
        {"error": want, "kept": True, "new freed": True}
    ] * tp
