"""CPU checks of the two ways a call runs besides the plan's graph: the collective path
(distgemm.collective) on a one-rank gloo group, the "auto" choice between the paths
(distgemm.autopath) and path_choices."""

import random
import types

import pytest

torch = pytest.importorskip("torch")

from distgemm import autopath, collective, entries, launch, ops  # noqa: E402


def _rounds(rng, n, lo, hi):
    return [lo + (hi - lo) * rng.random() for _ in range(n)]


def test_pick_path_takes_the_per_round_maximum_over_ranks_then_the_median():
    rng = random.Random(7)
    for _ in range(50):
        n = rng.randint(1, 9)
        ranks = [
            {"overlap": _rounds(rng, n, 0.5, 2.0), "collective": _rounds(rng, n, 0.5, 2.0)}
            for _ in range(rng.randint(1, 8))
        ]
        path, med = autopath.pick_path(ranks)
        for p in ("overlap", "collective"):
            per_round = sorted(max(r[p][i] for r in ranks) for i in range(n))
            mid = (per_round[(n - 1) // 2] + per_round[n // 2]) / 2
            assert med[p] == pytest.approx(mid)
        assert path == ("overlap" if med["overlap"] <= med["collective"] else "collective")


def test_pick_path_a_slow_rank_decides_and_ties_keep_the_overlap():
    # rank 0 sees the overlap faster, but rank 1 waits longer in it: the slowest rank counts.
    ranks = [
        {"overlap": [1.0, 1.0, 1.0], "collective": [1.2, 1.2, 1.2]},
        {"overlap": [1.5, 1.4, 1.6], "collective": [1.3, 1.3, 1.3]},
    ]
    assert autopath.pick_path(ranks)[0] == "collective"
    assert autopath.pick_path([{"overlap": [2.0], "collective": [2.0]}]) == (
        "overlap",
        {"overlap": 2.0, "collective": 2.0},
    )
    with pytest.raises(ValueError, match="at least one timed round"):
        autopath.pick_path([{"overlap": [], "collective": [1.0]}])


@pytest.mark.parametrize(
    "schedule,op",
    [
        ("ag_rotate_a", "all_gather_gemm"),
        ("ag_rotate_b", "all_gather_gemm"),
        ("rs_tile_a", "gemm_reduce_scatter"),
        ("rs_tile_b", "gemm_reduce_scatter"),
        ("gemm_allreduce", "gemm_all_reduce"),
    ],
)
def test_collective_path_computes_the_layer_on_a_one_rank_group(monkeypatch, schedule, op):
    """The collective path's math (gather/scatter layout, bias, beta*c, the reused buffers) on a
    one-rank gloo group with CPU tensors; the GPU worker checks it on 2 ranks with NCCL."""
    import types

    import torch.distributed as dist

    monkeypatch.setattr(launch, "_ptr", lambda op_, name, t, device: t.data_ptr())  # CPU tensors
    stream = {"now": 7}
    monkeypatch.setattr(collective, "stream_ptr", lambda device: stream["now"])
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        comm = types.SimpleNamespace(group=dist.group.WORLD, device=torch.device("cpu"))
        ag = op == "all_gather_gemm"
        g = torch.Generator().manual_seed(sum(map(ord, schedule)))  # not hash(): PYTHONHASHSEED
        beta = 0.0 if ag else -0.75
        entry = None
        for _ in range(2):  # fresh inputs per call; the second call reuses the plan's buffers
            m, k, n = 8 * torch.randint(1, 9, (1,), generator=g).item(), 40, 24
            a, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
            bias, c = torch.randn(n, generator=g), torch.randn(m, n, generator=g)
            if entry is None or entry.spec.m != m:
                spec = ops.make_spec(
                    op, schedule, 1, 0, None, a, w, bias=bias, beta=beta, c=None if ag else c
                )
                entry = entries.Entry(
                    spec=spec,
                    dtype=torch.float32,
                    beta=beta,
                    ws=None,
                    bases=[],
                    graphs={},
                    out_shape=torch.Size(spec.shapes["out"]),
                    want_gathered=ag,
                )
            out = torch.full(tuple(entry.out_shape), float("nan"))
            res = collective.run_collective(
                op, comm, entry, {"a": a, "w": w, "bias": bias, "c": c}, out
            )
            y = res[0] if ag else res
            ref = a @ w.t() + bias + beta * c
            assert y.data_ptr() == out.data_ptr()
            assert float((y - ref).norm() / ref.norm()) < 1e-5
            if ag:  # return_gathered: the gathered operand itself
                assert torch.equal(res[1], a if schedule == "ag_rotate_a" else w)
        with pytest.raises(ValueError, match="out shares memory with a"):
            collective.run_collective(op, comm, entry, {"a": a, "w": w, "bias": bias, "c": c}, a)
        # A call on another stream gets its own buffers (none are needed by the all-reduce, and
        # return_gathered hands the gathered operand over instead of keeping it).
        before = dict(entry.scratch)
        stream["now"] = 9
        collective.run_collective(op, comm, entry, {"a": a, "w": w, "bias": bias, "c": c}, None)
        names = {n for n, _ in before}
        assert {k for k in entry.scratch if k[1] == 9} == {(n, 9) for n in names}
        assert all(entry.scratch[k] is before[k] for k in before)
    finally:
        dist.destroy_process_group()


class _NeverDone:
    def query(self):
        return False


class _BrokenComm:
    rank = 1

    def __init__(self):
        self.broken = None

    def mark_broken(self, msg):
        self.broken = msg

    def raise_if_broken(self):
        raise RuntimeError(
            f"rank {self.rank}: {self.broken}. This communicator can no longer launch"
        )


def test_wait_event_is_bounded_and_marks_the_communicator_broken():
    import time

    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"x: the GPU work did not finish within 0.2 s"):
        autopath.wait_event(_NeverDone(), 0.2, "x")
    assert 0.15 < time.perf_counter() - t0 < 5.0
    comm = _BrokenComm()
    with pytest.raises(
        RuntimeError,
        match=r"rank 1: all_gather_gemm path choice \(collective "
        r"path\): the GPU work did not finish",
    ):
        autopath.wait_event(
            _NeverDone(), 0.05, "all_gather_gemm path choice (collective path)", comm
        )
    assert "did not join a collective" in comm.broken


def test_collective_path_needs_nccl_every_rank_decides_from_the_group():
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        why = collective.collective_unavailable(dist.group.WORLD)
        assert why == "the group's backend is 'gloo'; the collective path needs NCCL"
    finally:
        dist.destroy_process_group()


class _FakeEvent:
    """torch.cuda.Event on the CPU: records time.perf_counter()."""

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        import time

        self.t = time.perf_counter()

    def query(self):
        return True

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


@pytest.mark.parametrize(
    "overlap_s,collective_s,expected", [(0.002, 0.0005, "collective"), (0.0005, 0.002, "overlap")]
)
def test_choose_path_measures_both_alike_and_keeps_the_faster(
    monkeypatch, overlap_s, collective_s, expected
):
    import collections
    import time

    calls = collections.Counter()

    def fake(path, seconds):
        def run(op, comm, entry, tensors, out):
            calls[path] += 1
            time.sleep(seconds)
            return path

        return run

    monkeypatch.setattr(autopath, "launch", fake("overlap", overlap_s))
    monkeypatch.setattr(autopath, "run_collective", fake("collective", collective_s))
    monkeypatch.setattr(autopath, "collective_unavailable", lambda group: None)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    exchanged = []

    class TwoRanks:  # the peer reports what this rank measured, 10% slower
        rank, timeout_s, group = 0, 5.0, None

        def check(self):
            pass

        def all_gather(self, obj, what):
            exchanged.append(what)
            slower = {
                k: ([x * 1.1 for x in v] if isinstance(v, list) else v * 1.1)
                for k, v in obj.items()
            }
            return [obj, slower]

    entry = types.SimpleNamespace(path=None, tuning=None, graphs={"g": 1})
    result = autopath.choose_path("all_gather_gemm", TwoRanks(), entry, {}, None)
    assert entry.path == expected and result == expected  # the last call ran the chosen path
    assert exchanged == [
        "all_gather_gemm path choice (probe)",
        "all_gather_gemm path choice (timings)",
    ]
    t = entry.tuning
    assert (
        t["rounds"] == autopath.TUNE_ROUNDS and 1 <= t["calls_per_round"] <= autopath.TUNE_MAX_CALLS
    )
    assert (t["overlap_ms"] < t["collective_ms"]) == (expected == "overlap")
    # Both paths ran the same number of calls before the choice (the chosen one once more).
    other = "overlap" if expected == "collective" else "collective"
    assert calls[expected] == calls[other] + 1
    assert calls[other] == 3 + autopath.TUNE_ROUNDS * (1 + t["calls_per_round"])
    assert entry.graphs == ({} if expected == "collective" else {"g": 1})


def test_choose_path_keeps_the_plan_when_the_group_has_no_nccl(monkeypatch):
    monkeypatch.setattr(autopath, "launch", lambda *a: "overlap")
    monkeypatch.setattr(autopath, "run_collective", lambda *a: pytest.fail("must not run"))
    monkeypatch.setattr(
        autopath, "collective_unavailable", lambda group: "the group's backend is 'gloo'"
    )
    entry = types.SimpleNamespace(path=None, tuning=None, graphs={})
    comm = types.SimpleNamespace(group=None)
    assert autopath.choose_path("gemm_reduce_scatter", comm, entry, {}, None) == "overlap"
    assert entry.path == "overlap"
    assert entry.tuning == {"collective_unavailable": "the group's backend is 'gloo'"}


def test_path_choices_never_creates_a_communicator():
    import torch.distributed as dist

    assert not dist.is_initialized()
    assert ops.path_choices() == []  # no process group, no communicator: nothing to report
