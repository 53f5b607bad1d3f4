"""CPU checks of distgemm's one-shot / two-shot all-reduce without a GPU: its host-only rules from
C++ through _core (algorithms, the control region, receive bytes of both parities, two_shot's
chunks, the grid, the argument check's reasons) at TP 2, 3, 4 and 8, and the Python attachment's
buffers on an injected allocator (grown to the largest call, reported, returned by close()). The
GPU runs the kernel in tests/gpu/test_allreduce_kernel.py."""

import pytest

from distgemm import _core

TPS = [2, 3, 4, 8]
ALGOS = ["one_shot", "two_shot"]


def _chunk(numel, tp):
    return -(-numel // (8 * tp)) * 8


def test_algorithms_and_control_region():
    assert _core.ALLREDUCE_ALGORITHMS == ("one_shot", "two_shot")
    slots = _core.ALLREDUCE_MAX_CTAS
    # a generation word per CTA slot, then flags [phase 2][source 8][slot]
    assert _core.ALLREDUCE_CONTROL_BYTES == (slots + 2 * _core.MAX_TP * slots) * 4
    assert _core.ALLREDUCE_CTA_BYTES % 16 == 0


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("numel", [8, 16, 24, 8 * 1024, 8 * 1024 + 8, 4 * 1024 * 1024, 4194312])
def test_receive_bytes_hold_both_parities(tp, numel):
    assert _core.allreduce_receive_bytes("one_shot", numel, 2, tp) == 2 * tp * numel * 2
    chunk = _core.allreduce_chunk_elems(numel, tp)
    assert chunk == _chunk(numel, tp) and chunk % 8 == 0 and chunk * tp >= numel
    assert (chunk - 8) * tp < numel  # the smallest multiple of 8 that covers numel in tp chunks
    assert _core.allreduce_receive_bytes("two_shot", numel, 2, tp) == 2 * 2 * tp * chunk * 2


@pytest.mark.parametrize("tp", TPS)
def test_two_shot_chunks_of_small_vectors_leave_some_ranks_empty(tp):
    # 8 elements at TP 8: chunk 8, rank 0 owns them all, ranks 1..7 own nothing
    assert _core.allreduce_chunk_elems(8, tp) == 8
    assert _core.allreduce_chunk_elems(8 * tp + 8, tp) == 16


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("algo", ALGOS)
def test_grid_grows_with_the_slice_and_stops_at_resident_and_slots(tp, algo):
    per = _core.ALLREDUCE_CTA_BYTES
    ctas = lambda numel, resident=132: _core.allreduce_ctas(algo, numel, 2, tp, resident)  # noqa: E731
    assert ctas(8) == 1
    # one CTA per ALLREDUCE_CTA_BYTES of the slice: the vector (one_shot) or a chunk (two_shot)
    numel = 16 * 1024 * 1024 // 2  # 16 MB
    work = numel * 2 if algo == "one_shot" else _chunk(numel, tp) * 2
    assert ctas(numel, 10_000) == min(-(-work // per), _core.ALLREDUCE_MAX_CTAS)
    assert ctas(numel, 100) == min(100, -(-work // per))
    assert ctas(numel, 1) == 1
    small = 8 * 1024  # 16 KB
    work = small * 2 if algo == "one_shot" else _chunk(small, tp) * 2
    assert ctas(small) == -(-work // per)
    # never more than the slots, whatever is resident
    assert ctas(1 << 30, 1 << 20) == _core.ALLREDUCE_MAX_CTAS


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("algo", ALGOS)
def test_problem_is_empty_for_runnable_arguments(tp, algo):
    for numel in (8, 1000, 4 * 1024 * 1024):
        assert _core.allreduce_problem(algo, numel, 2, tp) == ""


@pytest.mark.parametrize(
    "args,words",
    [
        (("three_shot", 8, 2, 2), ["'three_shot'", "one_shot or two_shot"]),
        (("one_shot", 12, 2, 2), ["numel=12", "multiple of 8"]),
        (("two_shot", 0, 2, 4), ["numel=0", "positive"]),
        (("one_shot", 8, 4, 2), ["element_bytes=4", "bf16 or fp16"]),
        (("two_shot", 8, 2, 9), ["tp=9", "1..8"]),
        (("one_shot", 8, 2, 0), ["tp=0"]),
    ],
)
def test_problem_names_the_constraint_and_values(args, words):
    problem = _core.allreduce_problem(*args)
    assert problem and all(w in problem for w in words), problem


def test_sizes_and_grid_refuse_unrunnable_arguments_with_the_reason():
    with pytest.raises(ValueError, match="numel=12"):
        _core.allreduce_receive_bytes("one_shot", 12, 2, 2)
    with pytest.raises(ValueError, match="'x'"):
        _core.allreduce_ctas("x", 8, 2, 2, 132)
    with pytest.raises(ValueError, match="resident_ctas=0"):
        _core.allreduce_ctas("one_shot", 8, 2, 2, 0)


class _Core:
    """An injected region: its bytes only."""

    def __init__(self, nbytes):
        self.nbytes = nbytes


class _Comm:
    """The parts of a Communicator the all-reduce's attachment uses, with an injected allocator
    (every rank's bases 0x1000 apart) and no GPU."""

    tp, rank = 4, 0

    def __init__(self):
        from distgemm.runtime.workspace import WorkspacePool

        self.allocated, self.released = [], []
        self._pool_cls = WorkspacePool

    def allocate_symmetric(self, nbytes):
        self.allocated.append(nbytes)
        return _Core(nbytes), [0x100000 * (len(self.allocated)) + 0x1000 * q for q in range(4)]

    def new_pool(self, repoint, *, control):
        return self._pool_cls(
            self.allocate_symmetric,
            repoint,
            self.released.extend,
            control=control,
            align=int(_core.WORKSPACE_SLOT_ALIGN),
        )


def test_attachment_grows_its_receive_region_to_the_largest_call_and_reports_it():
    pytest.importorskip("torch")
    from distgemm.runtime.allreduce import AllReduceResources

    comm = _Comm()
    res = AllReduceResources(comm)
    assert res.memory_stats() == {"allreduce_control_bytes": 0, "allreduce_receive_bytes": 0}
    assert len(res.control_bases()) == 4 and res.control_bases() == res.control_bases()
    assert comm.allocated == [_core.ALLREDUCE_CONTROL_BYTES]  # once
    big = 1 << 20
    ws, parity = res.receive_for("one_shot", big, 2)
    need = _core.allreduce_receive_bytes("one_shot", big, 2, 4)
    assert ws.slot_capacity >= need and parity >= need // 2 and parity % 16 == 0
    # smaller calls and the other algorithm fit: no growth
    for algo, numel in (("two_shot", big), ("one_shot", 8), ("two_shot", 4096)):
        again, p = res.receive_for(algo, numel, 2)
        assert again is ws and p == parity
    assert len(comm.allocated) == 2 and not comm.released
    ws2, _ = res.receive_for("one_shot", 2 * big, 2)  # grows; the old region is released
    assert ws2 is not ws and comm.released == [ws]
    stats = res.memory_stats()
    assert stats["allreduce_receive_bytes"] == ws2.nbytes
    assert stats["allreduce_control_bytes"] == _core.ALLREDUCE_CONTROL_BYTES
    held = res.close()
    assert ws2 in held and len(held) == 2
    assert res.memory_stats() == {"allreduce_control_bytes": 0, "allreduce_receive_bytes": 0}


def test_the_grid_bound_is_the_smallest_resident_count_of_the_ranks(monkeypatch):
    pytest.importorskip("torch")
    from distgemm.runtime.allreduce import AllReduceResources

    comm = _Comm()
    comm.device = type("Dev", (), {"index": 0})()
    monkeypatch.setattr(_core, "allreduce_resident_ctas", lambda d: 132, raising=False)
    comm.all_gather = lambda obj, what: [obj, obj - 18, obj, obj]  # rank 1 holds fewer
    res = AllReduceResources(comm)
    assert res.resident_ctas == 114
    comm.all_gather = None  # agreed once: no second exchange
    assert res.resident_ctas == 114
