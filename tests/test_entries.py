"""CPU checks of distgemm.runtime.entry_cache: signatures and what every rank raises at entry
creation, the gathered-operand recipe, and an entry's one Plan (built once, handed to its graphs
as it is)."""

import types

import pytest

torch = pytest.importorskip("torch")
from ranks import CPU_TPS  # noqa: E402

from distgemm import _core, ops  # noqa: E402
from distgemm.runtime import entry_cache as entries  # noqa: E402
from distgemm.runtime.paths.collective import CollectiveState  # noqa: E402
from distgemm.runtime.paths.common import gathered_shape  # noqa: E402
from distgemm.runtime.paths.overlapped import gather_recipe  # noqa: E402
from distgemm.runtime.precision import Precision  # noqa: E402

BF16, FP16 = torch.bfloat16, torch.float16
CPU = torch.device("cpu")


def t(*shape, dtype=BF16):
    return torch.zeros(*shape, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# The gathered operand (return_gathered): every row comes from exactly one place.


@pytest.mark.parametrize("schedule", ["ag_rotate_a", "ag_rotate_b"])
@pytest.mark.parametrize("tp,steps", [(tp, tp * k) for tp in CPU_TPS for k in (1, 2)])
def test_gather_recipe_covers_every_row_once(schedule, tp, steps):
    # ag_rotate_b gathers w: N = 384 rows, whole 8-column tiles at every TP and S here.
    a = t(64, 16)
    w = t(16 if schedule == "ag_rotate_a" else 384 // tp, 16)
    for rank in range(tp):
        spec = ops.make_spec("all_gather_gemm", schedule, tp, rank, steps, a, w)
        recipe, shape = gather_recipe(spec, rank), gathered_shape(spec)
        total = spec.m if schedule == "ag_rotate_a" else spec.n
        assert shape == (total, 16)
        covered = torch.zeros(total, dtype=torch.int32)
        own = 0
        for src, off, row0, rows in recipe:
            covered[row0 : row0 + rows] += 1
            if src != "slots":
                own += rows
                # An own chunk is read from this rank's shard at the matching row.
                shard_rows = total // tp
                assert row0 == rank * shard_rows + off // 16
        assert bool((covered == 1).all()), f"rank {rank}: rows covered {covered.tolist()}"
        assert own == total // tp


def sig(**kw):
    base = {
        "op": "all_gather_gemm",
        "schedule": "ag_rotate_a",
        "steps": None,
        "dtype": "torch.bfloat16",
        "a_shard.shape": [64, 32],
        "w.shape": [24, 32],
        "bias.shape": None,
        "beta": 0.0,
        "return_gathered": False,
        "path": "auto",
        "error": None,
    }
    base.update(kw)
    return base


def test_signatures_agree():
    assert entries.signature_mismatch([sig(), sig()], "all_gather_gemm") is None


def test_signature_mismatch_names_rank_and_field():
    msg = entries.signature_mismatch(
        [sig(), sig(), sig(**{"a_shard.shape": [32, 32]})], "all_gather_gemm"
    )
    assert msg == (
        "all_gather_gemm: ranks disagree at plan creation: rank 2 has "
        "a_shard.shape=[32, 32] where rank 0 has a_shard.shape=[64, 32]; every rank "
        "must call the op with the same shapes, dtype, schedule, steps and path"
    )


@pytest.mark.parametrize(
    "field,value",
    [
        ("dtype", "torch.float16"),
        ("schedule", "ag_rotate_b"),
        ("steps", 4),
        ("beta", 1.0),
        ("path", "collective"),
    ],
)
def test_signature_mismatch_in_each_field(field, value):
    msg = entries.signature_mismatch([sig(), sig(**{field: value})], "all_gather_gemm")
    assert f"rank 1 has {field}={value!r} where rank 0 has {field}=" in msg


def test_rank_error_is_reported_before_mismatches():
    msg = entries.signature_mismatch(
        [sig(), sig(error="ValueError: a_shard is on cuda:0 but ...")], "all_gather_gemm"
    )
    assert (
        msg
        == "all_gather_gemm: rank 1 rejected its inputs: ValueError: a_shard is on cuda:0 but ..."
    )


class FakeComm:
    """Just enough of a Communicator for EntryCache.create's exchange: all_gather returns what
    the other ranks would have sent."""

    group = None  # no process group: "auto" entries are decided by the model

    def __init__(self, others, rank=0):
        self.others, self.rank, self.tp = others, rank, len(others) + 1
        self.plans = entries.EntryCache(self)

    def all_gather(self, obj, what):
        out = list(self.others)
        out.insert(self.rank, obj)
        return out

    def workspace_for(self, layout):
        raise AssertionError("a mismatched plan must not allocate a workspace")


def _key(a_shape, path="auto"):
    return entries.EntryKey(
        "all_gather_gemm",
        "ag_rotate_a",
        None,
        Precision(BF16),
        (("a_shard", a_shape), ("w", (24, 32)), ("bias", None)),
        0.0,
        False,
        path,
    )


def test_create_entry_raises_the_same_value_error_for_a_peer_mismatch():
    a, w = t(64, 32), t(24, 32)
    peer = entries.signature(_key((32, 32)), None)
    fake = FakeComm([peer])
    with pytest.raises(
        ValueError,
        match=r"rank 1 has a_shard.shape=\[32, 32\] where rank 0 has "
        r"a_shard.shape=\[64, 32\]",
    ):
        fake.plans.create(
            _key((64, 32)),
            lambda: ops.make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, None, a, w),
        )
    assert fake.plans == {}


def test_create_entry_reraises_an_error_every_rank_shares():
    a, w = t(30, 16), t(48, 16)  # M = 30 on TP = 4: rejected identically on every rank
    make = lambda: ops.make_spec("gemm_reduce_scatter", "rs_tile_a", 4, 0, 4, a, w)  # noqa: E731
    with pytest.raises(ValueError) as first:
        make()
    peer = entries.signature(_key((30, 16)), f"ValueError: {first.value}")
    with pytest.raises(ValueError, match=r"M=30 is not divisible by TP=4") as e:
        FakeComm([peer]).plans.create(_key((30, 16)), make)
    assert "rank" not in str(e.value)  # the plain error, not the cross-rank report


def test_create_entry_reports_a_peer_only_error_on_this_rank():
    a, w = t(64, 32), t(24, 32)
    peer = entries.signature(
        _key((64, 32)), "ValueError: w is on cuda:0 but this rank's device is cuda:1"
    )
    with pytest.raises(
        ValueError,
        match=r"all_gather_gemm: rank 1 rejected its inputs: ValueError: "
        r"w is on cuda:0",
    ):
        FakeComm([peer]).plans.create(
            _key((64, 32)),
            lambda: ops.make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, None, a, w),
        )


def test_create_entry_for_the_collective_path_allocates_no_workspace():
    a, w = t(64, 32), t(24, 32)
    fake = FakeComm([entries.signature(_key((64, 32), "collective"), None)])
    entry = fake.plans.create(
        _key((64, 32), "collective"),
        lambda: ops.make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, None, a, w),
    )
    assert entry.path == "collective" and isinstance(entry.state, CollectiveState)
    assert entry.state.out_shape == (128, 24)
    assert list(fake.plans.values()) == [entry]


def test_ranks_asking_for_different_paths_get_the_same_value_error():
    a, w = t(64, 32), t(24, 32)
    fake = FakeComm([entries.signature(_key((64, 32), "overlap"), None)])
    with pytest.raises(ValueError, match=r"rank 1 has path='overlap' where rank 0 has path='auto'"):
        fake.plans.create(
            _key((64, 32), "auto"),
            lambda: ops.make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, None, a, w),
        )


# ---------------------------------------------------------------------------------------------
# One Plan per op entry: built once by make_spec, read by the workspace and graph setup, handed
# to GraphLauncher as it is.


class OneRankComm:
    """A Communicator for EntryCache.create on one rank: the exchange echoes, the workspace is fake
    (bases only), the device a CUDA ordinal that is never touched."""

    rank, tp, wait_timeout_s, group = 0, 1, 3.5, None
    device = torch.device("cuda", 0)

    def __init__(self):
        self.plans = entries.EntryCache(self)
        self.layouts = []

    def all_gather(self, obj, what):
        return [obj]

    def workspace_for(self, layout):
        self.layouts.append(layout)
        return types.SimpleNamespace(order="order"), [1 << 20]


@pytest.mark.parametrize(
    "op,schedule,a,w,kw",
    [
        ("gemm_reduce_scatter", "rs_tile_a", (8192, 64), (48, 64), dict(beta=0.5, c=(8192, 48))),
        ("all_gather_gemm", "ag_rotate_b", (64, 32), (24, 32), dict(bias=(24,))),
        ("gemm_all_reduce", "ar_tile_a", (64, 16), (48, 16), {}),
    ],
)
def test_an_entry_builds_its_plan_once_and_its_graph_takes_that_plan(
    monkeypatch, op, schedule, a, w, kw
):
    built, graphs = [], []

    def counting(real):
        def build(*args, **kwargs):
            plan = real(*args, **kwargs)
            built.append(plan)
            return plan

        return build

    def never(*args, **kwargs):
        raise AssertionError("an entry reads its own Plan's layout, it builds no other plan")

    monkeypatch.setattr(_core, "build_plan", counting(_core.build_plan))
    monkeypatch.setattr(_core, "default_plan", counting(_core.default_plan))  # steps=None
    monkeypatch.setattr(_core, "workspace_layout", never)
    monkeypatch.setattr(
        _core,
        "GraphLauncher",
        lambda *args, **kw: graphs.append(args + tuple(sorted(kw.items()))) or len(graphs),
        raising=False,
    )
    tensors = {k: t(*v) for k, v in kw.items() if k != "beta"}
    beta = kw.get("beta", 0.0)
    a_t, w_t = t(*a), t(*w)
    key = entries.EntryKey(op, schedule, None, Precision(BF16), (("a", a),), beta, False, "overlap")
    comm = OneRankComm()
    entry = comm.plans.create(
        key, lambda: ops.make_spec(op, schedule, 1, 0, None, a_t, w_t, beta=beta, **tensors)
    )
    assert len(built) == 1 and entry.spec.plan is built[0]
    plan = built[0]
    assert comm.layouts == [plan.layout(2)]
    s = entry.state.setup
    assert (s.rank, s.cuda_device, s.dtype, s.timeout_s) == (0, 0, "bf16", 3.5)
    assert (s.workspace_bases, s.workspace_bytes) == ([1 << 20], plan.layout(2)["total_bytes"])
    assert (s.alpha, s.beta, s.bias) == (1.0, beta, "bias" in tensors)
    ptrs = (16, 32, 0, 48, 0, 0, 0)  # a, w, c, out, bias, scale_a, scale_b
    # the first call: the capture-only launcher, launched directly (no graph instantiated)
    assert entry.state.graph_for(ptrs) == (1, True)
    assert entry.state.graph_for(ptrs) == (2, False)  # the pointers came back: their graph
    assert entry.state.graph_for(ptrs) == (2, False)  # cached: no third launcher
    made = [(plan, entry.state.setup, "order", *ptrs[:5], ("capture_only", c)) for c in (1, 0)]
    assert graphs == [(*m, ("scale_a", 0), ("scale_b", 0)) for m in made]
    assert len(built) == 1


def test_plan_object_carries_what_the_dict_does():
    plan = _core.build_plan("rs_tile_b", 2, 4, 4096, 64, 32)
    d = plan.to_dict()
    assert d == _core.build_plan("rs_tile_b", 2, 4, 4096, 64, 32).to_dict()
    assert (plan.schedule, plan.tp, plan.steps, plan.partial_via) == ("rs_tile_b", 2, 4, "copy")
    assert plan.problem == d["problem"] == {"m": 4096, "n": 64, "k": 32, "l": 1}
    assert plan.definition == d["definition"] == _core.schedule_definition("rs_tile_b")
    assert plan.local_shapes == d["local_shapes"]
    assert (plan.slot_elems, plan.num_flags) == (d["slot_elems"], d["num_flags"])
    assert plan.layout(2) == _core.workspace_layout("rs_tile_b", 2, 4, 4096, 64, 32)
    assert plan.extent_problem() == "" and plan.extent_problem(1) == ""
    # N/S = 12 columns per tile: not 16-byte rows of D, on every device.
    narrow = _core.build_plan("rs_tile_b", 2, 4, 4096, 44, 32)  # 22 columns per rank: 8 + 14
    assert "N=14 of a sub-GEMM is not a multiple of 8" in narrow.extent_problem(0)
    assert narrow.extent_problem(-1) == narrow.extent_problem(1) != ""


def test_a_definition_dict_builds_the_same_plan_object_as_its_name():
    defn = _core.schedule_definition("ag_rotate_a")
    by_dict = _core.build_plan(defn, 2, 4, 64, 48, 32)
    by_name = _core.build_plan("ag_rotate_a", 2, 4, 64, 48, 32)
    assert isinstance(by_dict, _core.Plan)
    assert by_dict.to_dict() == by_name.to_dict()
    assert by_dict.layout(2) == by_name.layout(2)


def test_graph_setup_refuses_a_negative_workspace_size():
    with pytest.raises(ValueError, match=r"workspace_bytes=-1 is negative \(0: not checked\)"):
        _core.GraphSetup(0, 0, "bf16", [1], -1, 5.0)
    s = _core.GraphSetup(1, 3, "fp16", [1, 2], 0, 2.5, beta=0.25, bias=True)
    assert (s.rank, s.cuda_device, s.dtype, s.workspace_bases) == (1, 3, "fp16", [1, 2])
    assert (s.workspace_bytes, s.timeout_s, s.alpha, s.beta, s.bias) == (0, 2.5, 1.0, 0.25, True)


@pytest.mark.skipif(
    not _core.cuda_runtime, reason=f"built without the CUDA runtime ({_core.cuda_runtime_reason})"
)
def test_graph_launcher_takes_a_plan_a_setup_and_needs_a_launch_order():
    plan = _core.build_plan("rs_tile_a", 2, 4, 8192, 64, 1024)
    setup = _core.GraphSetup(0, 0, "bf16", [1 << 40, 1 << 41], plan.layout(2)["total_bytes"], 5.0)
    with pytest.raises(ValueError, match="GraphLauncher needs a LaunchOrder"):
        _core.GraphLauncher(plan, setup, None, 16, 32, 0, 48, 0)
    with pytest.raises(TypeError):  # a plan dict is not a Plan: build it with _core.build_plan
        _core.GraphLauncher(plan.to_dict(), setup, None, 16, 32, 0, 48, 0)
