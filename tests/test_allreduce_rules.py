"""CPU checks of distgemm's one-shot / two-shot all-reduce (flag, LL and pull) without a GPU: its
host-only rules from C++ through _core (algorithms, the control region, receive bytes of both
parities or of the pull input, two_shot's chunks, the grid, the argument check's reasons) at TP
2, 3, 4 and 8, and the Python attachment's buffers on an injected allocator (grown to the largest
call, flag, LL and pull algorithms in regions apart, reported, returned by close()). The GPU runs
the kernel in tests/gpu/test_allreduce_kernel.py."""

import pytest

from distgemm import _core

TPS = [2, 3, 4, 8]
ALGOS = ["one_shot", "two_shot", "one_shot_ll", "two_shot_ll", "two_shot_pull"]
LINES = ("one_shot_ll", "two_shot_ll")  # 16-byte lines carry 8 bytes of data
PULL = ("two_shot_pull",)  # reads the inputs in the ranks' receive buffers


def _line_factor(algo):
    return 2 if algo in LINES else 1


def _chunk(numel, tp):
    return -(-numel // (8 * tp)) * 8


def test_algorithms_and_control_region():
    assert _core.ALLREDUCE_ALGORITHMS == tuple(ALGOS)
    assert _core.ALLREDUCE_LINE_ALGORITHMS == LINES
    assert _core.ALLREDUCE_PULL_ALGORITHMS == PULL
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
    # LL: the same layouts as 16-byte lines of 8 data bytes, twice the bytes
    assert _core.allreduce_receive_bytes("one_shot_ll", numel, 2, tp) == 2 * tp * (numel // 4) * 16
    assert _core.allreduce_receive_bytes("two_shot_ll", numel, 2, tp) == 2 * 2 * tp * chunk * 4
    for algo in ("one_shot", "two_shot"):
        flag = _core.allreduce_receive_bytes(algo, numel, 2, tp)
        assert _core.allreduce_receive_bytes(f"{algo}_ll", numel, 2, tp) == 2 * flag
        # each parity of both holds whole 16-byte vectors / lines
        assert flag % 32 == 0
    # pull: this rank's input, one region (no parity)
    assert _core.allreduce_receive_bytes("two_shot_pull", numel, 2, tp) == numel * 2


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
    # one CTA per ALLREDUCE_CTA_BYTES pushed to a peer of the slice: the vector (one_shot) or a
    # chunk (two_shot), as data or as LL lines (twice the data)
    one = algo.startswith("one_shot")
    numel = 16 * 1024 * 1024 // 2  # 16 MB
    work = (numel * 2 if one else _chunk(numel, tp) * 2) * _line_factor(algo)
    assert ctas(numel, 10_000) == min(-(-work // per), _core.ALLREDUCE_MAX_CTAS)
    assert ctas(numel, 100) == min(100, -(-work // per))
    assert ctas(numel, 1) == 1
    small = 8 * 1024  # 16 KB
    work = (small * 2 if one else _chunk(small, tp) * 2) * _line_factor(algo)
    assert ctas(small) == -(-work // per)
    # never more than the slots, whatever is resident
    assert ctas(1 << 30, 1 << 20) == _core.ALLREDUCE_MAX_CTAS


@pytest.mark.parametrize(
    "algo,numel,tp,want",
    [
        ("one_shot", 8192, 4, 2),  # 16 KB: 2 x 8 KB of data
        ("one_shot_ll", 8192, 4, 4),  # 16 KB as 32 KB of lines: one line per thread
        ("two_shot", 8192, 4, 1),  # 4 KB chunks
        ("two_shot_ll", 8192, 4, 1),  # 8 KB of lines per chunk
        ("two_shot_ll", 8192, 2, 2),  # 8 KB chunks, 16 KB of lines
        ("two_shot_pull", 8192, 4, 1),  # 4 KB chunks, as two_shot
        ("two_shot_pull", 1024 * 1024, 4, 64),  # 2 MB: 512 KB chunks
        ("one_shot_ll", 8, 8, 1),
        ("two_shot_ll", 8, 8, 1),
        ("one_shot_ll", 1024 * 1024, 3, 256),  # 4 MB of lines: every slot
    ],
)
def test_grid_examples(algo, numel, tp, want):
    assert _core.allreduce_ctas(algo, numel, 2, tp, 1024) == want


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("algo", ALGOS)
def test_problem_is_empty_for_runnable_arguments(tp, algo):
    for numel in (8, 1000, 4 * 1024 * 1024):
        assert _core.allreduce_problem(algo, numel, 2, tp) == ""


@pytest.mark.parametrize(
    "args,words",
    [
        (
            ("three_shot", 8, 2, 2),
            ["'three_shot'", "one_shot, two_shot, one_shot_ll, two_shot_ll, two_shot_pull"],
        ),
        (("two_shot_pull", 12, 2, 2), ["numel=12", "multiple of 8"]),
        (("one_shot_LL", 8, 2, 2), ["'one_shot_LL'", "not one of"]),
        (("one_shot_ll", 12, 2, 2), ["numel=12", "multiple of 8"]),
        (("two_shot_ll", 8, 2, 9), ["tp=9", "1..8"]),
        (("two_shot_ll", 8, 1, 4), ["element_bytes=1", "bf16 or fp16"]),
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


def test_ll_algorithms_get_a_receive_region_apart_from_the_flag_ones():
    # An LL line has arrived when it carries the launch's generation: a flag algorithm's data in
    # the same bytes could look like one, so the two kinds never share a region.
    pytest.importorskip("torch")
    from distgemm.runtime.allreduce import AllReduceResources

    comm = _Comm()
    res = AllReduceResources(comm)
    big = 1 << 20
    flag, _ = res.receive_for("two_shot", big, 2)
    lines, parity = res.receive_for("one_shot_ll", big, 2)
    assert lines is not flag and not comm.released
    need = _core.allreduce_receive_bytes("one_shot_ll", big, 2, 4)
    assert lines.slot_capacity >= need and parity >= need // 2 and parity % 16 == 0
    # the other LL algorithm and smaller calls share the LL region; flag calls keep theirs
    assert res.receive_for("two_shot_ll", big, 2)[0] is lines
    assert res.receive_for("one_shot_ll", 8, 2)[0] is lines
    assert res.receive_for("one_shot", 8, 2)[0] is flag
    assert len(comm.allocated) == 2 and not comm.released  # no control region asked for yet
    grown, _ = res.receive_for("one_shot_ll", 4 * big, 2)  # grows the LL region only
    assert grown is not lines and comm.released == [lines]
    assert res.receive_for("two_shot", big, 2)[0] is flag
    stats = res.memory_stats()
    assert stats["allreduce_receive_bytes"] == flag.nbytes + grown.nbytes
    held = res.close()
    assert flag in held and grown in held


def test_pull_algorithms_get_a_region_of_their_own_and_a_view_of_the_input_in_it(monkeypatch):
    # A pull region has no parity halves: beside a push algorithm's halves, a peer one launch
    # ahead could push into the bytes this rank still reads (kernel/allreduce.hpp).
    torch = pytest.importorskip("torch")
    from distgemm.runtime import allreduce

    comm = _Comm()
    comm.device = torch.device("cpu")
    res = allreduce.AllReduceResources(comm)
    comm.attachment = lambda name: res
    comm.all_gather = lambda obj, what: [obj] * comm.tp
    monkeypatch.setattr(_core, "allreduce_resident_ctas", lambda d: 132, raising=False)
    big = 1 << 20
    flag, _ = res.receive_for("two_shot", big, 2)
    pull, _ = res.receive_for("two_shot_pull", big, 2)
    assert pull is not flag and pull.slot_capacity >= big * 2
    assert res.receive_for("two_shot_pull", 8, 2)[0] is pull
    assert res.receive_for("two_shot", 8, 2)[0] is flag
    # all_reduce_input: the pull region's start for a pull algorithm, the tensor itself else
    like = torch.empty(4, 8, dtype=torch.bfloat16)
    assert allreduce.all_reduce_input(comm, "two_shot", like, False) is like
    made = []

    def fake_view(ptr, numel, dtype, device):
        made.append((ptr, numel))
        return torch.empty(numel, dtype=dtype)

    monkeypatch.setattr(allreduce, "device_view", fake_view)
    x = allreduce.all_reduce_input(comm, "two_shot_pull", like, False)
    again = allreduce.all_reduce_input(comm, "two_shot_pull", like, False)
    assert x.shape == like.shape and x.dtype == like.dtype and again is x  # made once
    assert made == [(pull.bases[comm.rank], like.numel())]
    # every token count of a server gets its view; the oldest goes past MAX_INPUT_VIEWS
    cap = allreduce.MAX_INPUT_VIEWS
    for tokens in range(1, cap + 2):
        allreduce.all_reduce_input(
            comm, "two_shot_pull", torch.empty(tokens, 8, dtype=torch.bfloat16), False
        )
    assert len(res._inputs) == cap
    shapes = [key[1] for key in res._inputs]
    # the view made first, `like`'s (4, 8), went: it is the oldest
    assert (4, 8) not in shapes and shapes[0] == (1, 8) and shapes[-1] == (cap + 1, 8)


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


class _Mappings:
    """An injected _core.PeerMappings: each handle mapped once, at a base derived from it."""

    def __init__(self, device, fail=False):
        self.opened, self.fail, self.closed = {}, fail, False

    def open(self, handle):
        if self.fail:
            raise RuntimeError("cudaIpcOpenMemHandle failed: invalid handle")
        return self.opened.setdefault(handle, 0x7000_0000 + 0x10_0000 * len(self.opened))

    def close(self):
        self.closed = True

    def __len__(self):
        return len(self.opened)


def _sharing_comm(tp, rank, peer_reports, peer_problems):
    """A _Comm of `tp` ranks seen from `rank`, whose all_gather answers this rank's object at its
    index and the scripted peers' objects elsewhere (the handle exchange, then the verdict)."""
    import torch

    comm = _Comm()
    comm.tp, comm.rank, comm.device = tp, rank, torch.device("cpu")
    scripted = iter([peer_reports, peer_problems])

    def all_gather(obj, what):
        peers = next(scripted)
        return [obj if q == rank else peers[q] for q in range(tp)]

    comm.all_gather = all_gather
    return comm


@pytest.mark.parametrize("tp", [2, 3, 4, 8])
def test_a_captured_pull_call_shares_the_outputs_only_where_every_rank_can(tp, monkeypatch):
    # Each rank exports its output's allocation, maps the peers', and the ranks agree: every rank
    # stores into every output, or every rank copies (a rank that cannot share names itself).
    torch = pytest.importorskip("torch")
    from distgemm.runtime import allreduce

    rank = tp - 1
    monkeypatch.setattr(
        _core, "export_allocation", lambda dev, ptr: (b"h%d" % ptr, 0x40), raising=False
    )
    made = []
    monkeypatch.setattr(
        _core, "PeerMappings", lambda d: made.append(_Mappings(d)) or made[-1], raising=False
    )
    out = torch.empty(64, dtype=torch.bfloat16)
    region = allreduce.Workspace(_Core(1 << 20), 0, 1 << 20, [0x1000 * q for q in range(tp)])
    reports = {q: (b"peer%d" % q, 0x80 * q, "") for q in range(tp)}
    comm = _sharing_comm(tp, rank, reports, {q: "" for q in range(tp)})
    res = allreduce.AllReduceResources(comm)
    bases = res.shared_output(out, region)
    mapped = made[0].opened
    assert bases[rank] == out.data_ptr() and len(bases) == tp
    for q in range(tp - 1):  # each peer's allocation base, plus its output's offset in it
        assert bases[q] == mapped[b"peer%d" % q] + 0x80 * q
    assert (res.outputs_shared, res.outputs_copied, res.copy_reason) == (1, 0, "")
    # the same peer allocations again (a second captured call): mapped once
    comm.all_gather = _sharing_comm(tp, rank, reports, {q: "" for q in range(tp)}).all_gather
    assert res.shared_output(out, region) == bases and len(made[0]) == tp - 1
    res.close()
    assert made[0].closed

    # a peer whose output cannot be exported (e.g. torch's expandable segments): every rank copies
    bad = dict(reports)
    bad[0] = (b"", 0, "rank 0: cudaIpcGetMemHandle failed: invalid argument")
    res = allreduce.AllReduceResources(_sharing_comm(tp, rank, bad, {q: "" for q in range(tp)}))
    assert res.shared_output(out, region) is None
    assert res.outputs_copied == 1 and res.copy_reason.startswith("rank 0: cudaIpcGetMemHandle")

    # a peer that could not map the others' outputs: this rank copies too
    problems = {q: "" for q in range(tp)}
    problems[0] = "rank 0: cudaIpcOpenMemHandle failed: already mapped"
    res = allreduce.AllReduceResources(_sharing_comm(tp, rank, reports, problems))
    assert res.shared_output(out, region) is None and "rank 0" in res.copy_reason

    # this rank cannot map: its reason reaches the verdict
    monkeypatch.setattr(_core, "PeerMappings", lambda d: _Mappings(d, fail=True), raising=False)
    comm = _sharing_comm(tp, rank, reports, {q: "" for q in range(tp)})
    seen = []
    inner = comm.all_gather
    comm.all_gather = lambda obj, what: seen.append(obj) or inner(obj, what)
    res = allreduce.AllReduceResources(comm)
    assert res.shared_output(out, region) is None
    assert seen[1] == f"rank {rank}: cudaIpcOpenMemHandle failed: invalid handle"

    # an output that is the region itself is never exported (peers map the region already)
    at_region = allreduce.Workspace(_Core(1 << 20), 0, 1 << 20, [out.data_ptr()] * tp)
    comm = _sharing_comm(tp, rank, reports, {q: "" for q in range(tp)})
    res = allreduce.AllReduceResources(comm)
    assert res.shared_output(out, at_region) is None
    assert "own region" in res.copy_reason


@pytest.mark.parametrize("algorithm", ["one_shot", "two_shot_pull"])
def test_mm_then_all_reduce_writes_the_gemm_where_the_all_reduce_reads_it(algorithm, monkeypatch):
    # The collective path's call and the calibration's (the same function): torch.mm into the
    # all-reduce's input, a pull algorithm's region or the output itself, then one launch.
    torch = pytest.importorskip("torch")
    from distgemm.runtime import allreduce

    g = torch.Generator().manual_seed(11)
    a = torch.rand(4, 16, generator=g).to(torch.bfloat16)
    w = torch.rand(8, 16, generator=g).to(torch.bfloat16)
    out = torch.zeros(4, 8, dtype=torch.bfloat16)
    region = torch.zeros(4, 8, dtype=torch.bfloat16)

    def fake_input(comm, algo, like, capturing):
        assert (algo, like, capturing) == (algorithm, out, True)
        return region if algo in _core.ALLREDUCE_PULL_ALGORITHMS else like

    launched = []
    monkeypatch.setattr(allreduce, "all_reduce_input", fake_input)
    monkeypatch.setattr(
        allreduce,
        "launch_all_reduce",
        lambda comm, x, o, algo, capturing, chained: (
            launched.append((x, o, algo, capturing, chained)) or o
        ),
    )
    comm = object()
    got = allreduce.mm_then_all_reduce(comm, a, w.t(), out, algorithm, True)
    pull = algorithm in _core.ALLREDUCE_PULL_ALGORITHMS
    x = region if pull else out
    assert got is out and len(launched) == 1
    # a plain launch by default (allreduce.CHAINED), chained to torch.mm's kernel when asked
    assert launched[0][0] is x and launched[0][1:] == (out, algorithm, True, allreduce.CHAINED)
    allreduce.mm_then_all_reduce(comm, a, w.t(), out, algorithm, True, chained=True)
    assert launched[1][1:] == (out, algorithm, True, True)
    assert torch.equal(x, torch.mm(a, w.t()))  # bf16 torch.mm, bit for bit
    assert torch.count_nonzero(out) == (0 if pull else out.numel())  # the launch fills it
