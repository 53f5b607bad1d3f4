"""CPU checks of the torch-facing API (distgemm.ops, distgemm.comm): every error that can be
detected without a GPU, with its message, and the pure pieces (plan signatures, group checks,
the gathered-operand recipe) that decide what every rank raises. The GPU paths are in
tests/gpu/test_torchrun_api.py."""

import random
import re
import types

import pytest

torch = pytest.importorskip("torch")

from distgemm import comm as comm_mod  # noqa: E402
from distgemm import ops  # noqa: E402

BF16, FP16 = torch.bfloat16, torch.float16
CPU = torch.device("cpu")


def t(*shape, dtype=BF16):
    return torch.zeros(*shape, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# check_types: run first, before any communicator exists.


def test_non_tensor_is_a_type_error():
    with pytest.raises(TypeError, match=r"all_gather_gemm: w must be a torch.Tensor, got list"):
        ops.check_types("all_gather_gemm", {"a_shard": t(8, 8), "w": [[1.0]]})


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8, torch.float64])
def test_unsupported_dtype_is_a_type_error(dtype):
    with pytest.raises(
        TypeError,
        match=rf"a has dtype {re.escape(str(dtype))}; distgemm supports "
        r"torch.bfloat16 and torch.float16",
    ):
        ops.check_types("gemm_reduce_scatter", {"a": t(8, 8, dtype=dtype), "w": t(8, 8)})


def test_mixed_dtypes_name_both_operands():
    with pytest.raises(
        TypeError,
        match=r"mixed dtypes: a_shard is torch.bfloat16 but bias is "
        r"torch.float16",
    ):
        ops.check_types(
            "all_gather_gemm", {"a_shard": t(8, 8), "w": t(8, 8), "bias": t(8, dtype=FP16)}
        )


def test_cpu_tensor_is_rejected_with_the_device():
    with pytest.raises(ValueError, match=r"a_shard is on cpu; distgemm ops need CUDA tensors"):
        ops.check_types("all_gather_gemm", {"a_shard": t(8, 8), "w": t(8, 8)})


def test_check_types_skips_absent_operands():
    with pytest.raises(ValueError, match=r"gemm_all_reduce: w is on cpu"):
        ops.check_types("gemm_all_reduce", {"bias": None, "w": t(8, 8, dtype=FP16), "c": None})


@pytest.mark.parametrize(
    "call",
    [
        lambda: ops.all_gather_gemm(t(8, 8), t(8, 8)),
        lambda: ops.gemm_reduce_scatter(t(8, 8), t(8, 8)),
        lambda: ops.gemm_all_reduce(t(8, 8), t(8, 8)),
    ],
    ids=["all_gather_gemm", "gemm_reduce_scatter", "gemm_all_reduce"],
)
def test_public_ops_reject_cpu_tensors_before_touching_distributed(call):
    # No process group exists here: the op must fail on the tensors first, not on the setup.
    with pytest.raises(ValueError, match=r"is on cpu; distgemm ops need CUDA tensors"):
        call()


def test_public_op_rejects_mixed_dtypes_and_c_only_when_beta_is_nonzero():
    with pytest.raises(
        TypeError, match=r"mixed dtypes: a is torch.bfloat16 but c is torch.float16"
    ):
        ops.gemm_reduce_scatter(t(8, 8), t(8, 8), c=t(4, 8, dtype=FP16), beta=1.0)
    # beta == 0 never reads c (torch.addmm semantics), so its dtype does not matter; the CPU
    # tensors are what is rejected.
    with pytest.raises(ValueError, match=r"a is on cpu"):
        ops.gemm_reduce_scatter(t(8, 8), t(8, 8), c=t(4, 8, dtype=FP16), beta=0.0)


# ---------------------------------------------------------------------------------------------
# check_placement: device, contiguity, alignment (checked per call).


def test_wrong_device_names_the_rank_device():
    with pytest.raises(ValueError, match=r"w is on cpu but this rank's device is meta"):
        ops.check_placement("all_gather_gemm", torch.device("meta"), {"w": t(8, 8)})


def test_non_contiguous_is_rejected_with_the_remedy():
    x = t(16, 8).t()
    with pytest.raises(
        ValueError,
        match=r"a is not contiguous \(shape \[8, 16\], strides \[1, 8\]\)"
        r".*pass a.contiguous\(\)",
    ):
        ops.check_placement("gemm_reduce_scatter", CPU, {"a": x})


def test_misaligned_pointer_is_rejected():
    base = t(1024 + 8)
    x = base[1 : 1 + 1024].view(128, 8)  # 2 bytes past a 16-byte boundary
    assert x.is_contiguous() and x.data_ptr() % 16 == (base.data_ptr() + 2) % 16
    if base.data_ptr() % 16:
        pytest.fail("torch's CPU allocator returned a base that is not 16-byte aligned")
    with pytest.raises(
        ValueError,
        match=r"a_shard's data pointer 0x[0-9a-f]+ is not 16-byte "
        r"aligned \(offset 2 bytes",
    ):
        ops.check_placement("all_gather_gemm", CPU, {"a_shard": x})


def test_aligned_contiguous_tensors_pass():
    ops.check_placement("all_gather_gemm", CPU, {"a_shard": t(64, 8), "w": t(8, 8), "bias": None})


# ---------------------------------------------------------------------------------------------
# make_spec: shapes and divisibility against the Plan (host-only extension).


def test_spec_all_gather_gemm_shapes():
    s = ops.make_spec(
        "all_gather_gemm", "ag_rotate_a", 2, 0, None, t(64, 32), t(24, 32), bias=t(24)
    )
    assert (s.m, s.n, s.k, s.steps) == (128, 48, 32, 2)
    assert s.shapes == {"a": (64, 32), "w": (24, 32), "out": (128, 24), "bias": (24,)}


def test_spec_ag_rotate_b_gathers_the_weight():
    s = ops.make_spec("all_gather_gemm", "ag_rotate_b", 2, 1, 4, t(64, 32), t(32, 32))
    assert (s.m, s.n, s.k, s.steps) == (128, 64, 32, 4)
    assert s.shapes["out"] == (64, 64)


@pytest.mark.parametrize("schedule,out", [("rs_tile_a", (32, 48)), ("rs_tile_b", (64, 24))])
def test_spec_reduce_scatter_shapes(schedule, out):
    s = ops.make_spec(
        "gemm_reduce_scatter", schedule, 2, 0, None, t(64, 16), t(48, 16), c=t(*out), beta=0.5
    )
    assert (s.m, s.n, s.k) == (64, 48, 32)
    assert s.shapes["out"] == out and s.shapes["c"] == out


@pytest.mark.parametrize(
    "schedule,tp,a,w,want",
    [
        ("ag_rotate_a", 2, (4096, 32), (24, 32), 2),  # all-gather: S = TP
        ("ag_rotate_a", 4, (4096, 32), (24, 32), 4),
        ("rs_tile_a", 2, (4096, 16), (48, 16), 4),  # reduce-scatter from 4096 tokens: 2*TP ...
        ("rs_tile_a", 4, (8192, 16), (48, 16), 8),
        ("rs_tile_a", 2, (2048, 16), (48, 16), 2),  # ... below: TP
        ("rs_tile_a", 2, (4098, 16), (48, 16), 2),  # ... M=4098 cannot split in 4: TP
        ("rs_tile_a", 2, (4096, 8192), (48, 8192), 4),  # K/TP = 8192: still 2*TP
        ("rs_tile_a", 2, (4096, 8200), (48, 8200), 2),  # longer K per rank: TP
        ("rs_tile_b", 2, (4096, 16), (64, 16), 4),
        ("rs_tile_b", 2, (4096, 16), (48, 16), 2),  # N/4 = 12 columns: not 16-byte rows
        ("gemm_allreduce", 2, (4096, 16), (48, 16), 2),
        ("rs_tile_a", 1, (4096, 16), (48, 16), 1),  # TP=1: nothing to overlap
    ],
)
def test_default_steps(schedule, tp, a, w, want):
    assert ops.default_steps(schedule, tp, t(*a), t(*w)) == want
    op = {"ag": "all_gather_gemm", "rs": "gemm_reduce_scatter", "ge": "gemm_all_reduce"}[
        schedule[:2]
    ]
    assert ops.make_spec(op, schedule, tp, 0, None, t(*a), t(*w)).steps == want


def test_default_steps_of_a_bad_operand_leaves_the_error_to_validation():
    assert ops.default_steps("rs_tile_a", 2, t(64), t(48, 16)) == 2
    with pytest.raises(ValueError, match="a must be 2-D"):
        ops.make_spec("gemm_reduce_scatter", "rs_tile_a", 2, 0, None, t(64), t(48, 16))


def test_spec_all_reduce_shapes():
    s = ops.make_spec(
        "gemm_all_reduce", "gemm_allreduce", 4, 3, 8, t(64, 16), t(40, 16), bias=t(40)
    )
    assert (s.m, s.n, s.k, s.steps) == (64, 40, 64, 8)
    assert s.shapes == {"a": (64, 16), "w": (40, 16), "out": (64, 40), "bias": (40,)}


def test_schedule_of_the_wrong_collective_is_rejected():
    with pytest.raises(
        ValueError,
        match=r"all_gather_gemm: schedule 'rs_tile_a' is not a all_gather "
        r"schedule; use one of ag_rotate_a, ag_rotate_b",
    ):
        ops.make_spec("all_gather_gemm", "rs_tile_a", 2, 0, None, t(64, 32), t(24, 32))


def test_unknown_schedule_is_rejected():
    with pytest.raises(
        ValueError,
        match=r"schedule 'nope' is not a reduce_scatter schedule; use one "
        r"of rs_tile_a, rs_tile_b",
    ):
        ops.make_spec("gemm_reduce_scatter", "nope", 2, 0, None, t(64, 32), t(24, 32))


def test_schedule_must_be_a_name():
    with pytest.raises(TypeError, match=r"schedule must be a schedule name \(str\), got dict"):
        ops.make_spec("gemm_reduce_scatter", {"name": "rs_tile_a"}, 2, 0, None, t(8, 8), t(8, 8))


def test_steps_not_a_multiple_of_tp_uses_the_plan_message():
    with pytest.raises(ValueError, match=r"S=3 is not a positive multiple of TP=2"):
        ops.make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, 3, t(64, 32), t(24, 32))


def test_steps_must_be_an_int():
    with pytest.raises(TypeError, match=r"steps must be an int or None, got 2.0"):
        ops.make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, 2.0, t(64, 32), t(24, 32))


def test_m_not_divisible_by_steps_names_the_values():
    # a_shard has 63 rows: M = 126 is not divisible by S = 4.
    with pytest.raises(
        ValueError,
        match=r"global M=126 N=48 K=32\): M=126 is not divisible by S=4: "
        r"ag_rotate_a splits M",
    ):
        ops.make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, 4, t(63, 32), t(24, 32))


def test_reduce_scatter_m_not_divisible_by_tp():
    with pytest.raises(ValueError, match=r"M=30 is not divisible by S=4"):
        ops.make_spec("gemm_reduce_scatter", "rs_tile_a", 4, 0, None, t(30, 16), t(48, 16))


def test_weight_shape_mismatch_is_explained():
    with pytest.raises(
        ValueError,
        match=r"w has shape \[24, 16\] but a_shard \[64, 32\] with "
        r"ag_rotate_a on TP=2 needs w of shape \[24, 32\]",
    ):
        ops.make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, None, t(64, 32), t(24, 16))


@pytest.mark.parametrize(
    "mnk,problem",
    [
        ((8, 8, 8), ""),
        ((1, 4096, 8192), ""),
        (
            (64, 64, 12),
            "K=12 of a sub-GEMM is not a multiple of 8 elements: TMA needs 16-byte rows "
            "of A and B; pad K",
        ),
        (
            (64, 20, 64),
            "N=20 of a sub-GEMM is not a multiple of 8 elements: TMA needs 16-byte rows "
            "of D; pad N or pick S so that N/S is",
        ),
        ((0, 8, 8), "GEMM extents must be positive, got m=0 n=8 k=8 l=1"),
        (
            (1 << 31, 8, 8),
            "GEMM extents must fit in int32 (CUTLASS problem shape), got m=2147483648 n=8 k=8 l=1",
        ),
    ],
)
def test_gemm_extent_rule_is_the_kernels(mnk, problem):
    """The C++ rule the runtime checks before launch, seen from Python (one definition)."""
    from distgemm import _core

    assert _core.gemm_extent_problem(*mnk) == problem
    if mnk == (64, 64, 12):  # fp32-sized elements would need multiples of 4
        assert _core.gemm_extent_problem(64, 64, 12, 1, 4) == ""


def test_odd_k_is_rejected_with_the_tma_reason():
    with pytest.raises(
        ValueError,
        match=r"all_gather_gemm: K=12 of a sub-GEMM is not a multiple of 8 "
        r"elements: TMA needs 16-byte rows of A and B; pad K \(a "
        r"sub-GEMM of ag_rotate_a; global M=128 N=48 K=12, TP=2, "
        r"S=2\)",
    ):
        ops.make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, None, t(64, 12), t(24, 12))


def test_local_k_of_reduce_scatter_must_be_a_multiple_of_8():
    with pytest.raises(
        ValueError,
        match=r"K=20 of a sub-GEMM is not a multiple of 8 .* \(a "
        r"sub-GEMM of rs_tile_a;",
    ):
        ops.make_spec("gemm_reduce_scatter", "rs_tile_a", 2, 0, None, t(64, 20), t(48, 20))


def test_column_tile_of_rs_tile_b_must_be_a_multiple_of_8():
    # N = 48 split into S = 4 column tiles of 12.
    with pytest.raises(
        ValueError,
        match=r"N=12 of a sub-GEMM is not a multiple of 8 elements: .* "
        r"pad N or pick S so that N/S is \(a sub-GEMM of "
        r"rs_tile_b; global M=64 N=48 K=32, TP=2, S=4\)",
    ):
        ops.make_spec("gemm_reduce_scatter", "rs_tile_b", 2, 0, 4, t(64, 16), t(48, 16))


def test_odd_n_local_of_all_gather_is_rejected():
    with pytest.raises(ValueError, match=r"N=20 of a sub-GEMM is not a multiple of 8"):
        ops.make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, None, t(64, 32), t(20, 32))


def test_operands_must_be_2d():
    with pytest.raises(
        ValueError, match=r"all_gather_gemm: a_shard must be 2-D, got shape \[2, 32, 32\]"
    ):
        ops.make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, None, t(2, 32, 32), t(24, 32))


def test_bias_shape_is_checked():
    with pytest.raises(
        ValueError,
        match=r"bias has shape \[48\], expected \[24\] \(per rank; "
        r"ag_rotate_a, TP=2",
    ):
        ops.make_spec(
            "all_gather_gemm", "ag_rotate_a", 2, 0, None, t(64, 32), t(24, 32), bias=t(48)
        )


def test_beta_without_c_is_rejected():
    with pytest.raises(
        ValueError, match=r"beta=0.5 but c is None: pass c \(shape \[32, 48\]\) or beta=0"
    ):
        ops.make_spec(
            "gemm_reduce_scatter", "rs_tile_a", 2, 0, None, t(64, 16), t(48, 16), beta=0.5
        )


def test_c_shape_is_checked():
    with pytest.raises(ValueError, match=r"c has shape \[64, 48\], expected \[32, 48\]"):
        ops.make_spec(
            "gemm_reduce_scatter",
            "rs_tile_a",
            2,
            0,
            None,
            t(64, 16),
            t(48, 16),
            c=t(64, 48),
            beta=1.0,
        )


def test_out_shape_is_checked():
    with pytest.raises(ValueError, match=r"out has shape \[64, 48\], expected \[64, 24\]"):
        ops.make_spec(
            "gemm_reduce_scatter", "rs_tile_b", 2, 0, None, t(64, 16), t(48, 16), out=t(64, 48)
        )


def test_empty_operands_are_rejected():
    with pytest.raises(ValueError, match=r"empty operands"):
        ops.make_spec("gemm_all_reduce", "gemm_allreduce", 2, 0, None, t(0, 16), t(48, 16))


# ---------------------------------------------------------------------------------------------
# The gathered operand (return_gathered): every row comes from exactly one place.


@pytest.mark.parametrize("schedule", ["ag_rotate_a", "ag_rotate_b"])
@pytest.mark.parametrize("tp,steps", [(2, 2), (2, 4), (4, 8)])
def test_gather_recipe_covers_every_row_once(schedule, tp, steps):
    rows_a, rows_w = (64, 16) if schedule == "ag_rotate_a" else (16, 64 // tp)
    a = t(rows_a if schedule == "ag_rotate_a" else 64, 16)
    w = t(16 if schedule == "ag_rotate_a" else 64 // tp, 16)
    for rank in range(tp):
        spec = ops.make_spec("all_gather_gemm", schedule, tp, rank, steps, a, w)
        recipe, shape = ops._gather_recipe(spec, rank)
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


# ---------------------------------------------------------------------------------------------
# What every rank raises: pure functions over all-gathered data.


def info(host="h", uuid="u0", cap=(9, 0), peer_ok=None, device=0, name="NVIDIA H200"):
    return {
        "host": host,
        "uuid": uuid,
        "capability": cap,
        "device": device,
        "name": name,
        "peer_ok": peer_ok if peer_ok is not None else {},
    }


def test_group_info_ok():
    assert (
        comm_mod.check_group_info(
            [info(uuid="a", peer_ok={"b": True}), info(uuid="b", device=1, peer_ok={"a": True})]
        )
        is None
    )


def test_group_on_two_hosts_is_rejected():
    msg = comm_mod.check_group_info([info(host="n1", uuid="a"), info(host="n2", uuid="b")])
    assert msg == (
        "distgemm needs every rank of the group on one host (CUDA IPC and NVLink peer "
        "access): rank 0 on 'n1', rank 1 on 'n2'"
    )


def test_two_ranks_on_one_gpu_are_rejected():
    msg = comm_mod.check_group_info([info(uuid="a"), info(uuid="a")])
    assert msg.startswith("ranks 0 and 1 use the same GPU (cuda:0)")
    assert "torch.cuda.set_device(local_rank)" in msg


def test_shared_gpu_only_when_allowed():
    # DISTGEMM_ALLOW_SHARED_GPU=1: functional tests of the multi-rank paths on one GPU.
    assert (
        comm_mod.check_group_info([info(uuid="a"), info(uuid="a")], allow_shared_gpu=True) is None
    )


def test_non_hopper_is_rejected():
    msg = comm_mod.check_group_info([info(uuid="a"), info(uuid="b", cap=(8, 0), name="A100")])
    assert msg == (
        "rank 1: GPU 'A100' has compute capability 8.0; the distgemm kernels are built "
        "for Hopper (sm_90a)"
    )


def test_missing_peer_access_is_rejected():
    msg = comm_mod.check_group_info(
        [info(uuid="a", peer_ok={"b": False}), info(uuid="b", device=1, peer_ok={"a": True})]
    )
    assert msg.startswith("rank 0 (cuda:0) has no peer access to rank 1's GPU")


def test_unknown_peer_access_is_left_to_the_ipc_open():
    # A GPU hidden by CUDA_VISIBLE_DEVICES cannot be queried; cudaIpcOpenMemHandle decides.
    assert comm_mod.check_group_info([info(uuid="a"), info(uuid="b", device=0)]) is None


def test_group_size_limit_and_query_errors():
    assert comm_mod.check_group_info([info(uuid=str(i)) for i in range(9)]) == (
        "distgemm supports groups of 1 to 8 ranks (TP), this group has 9"
    )
    bad = info(uuid="b")
    bad["error"] = "querying cuda:1 failed: boom"
    assert (
        comm_mod.check_group_info([info(uuid="a"), bad]) == "rank 1: querying cuda:1 failed: boom"
    )


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
    assert comm_mod.signature_mismatch([sig(), sig()], "all_gather_gemm") is None


def test_signature_mismatch_names_rank_and_field():
    msg = comm_mod.signature_mismatch(
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
    msg = comm_mod.signature_mismatch([sig(), sig(**{field: value})], "all_gather_gemm")
    assert f"rank 1 has {field}={value!r} where rank 0 has {field}=" in msg


def test_rank_error_is_reported_before_mismatches():
    msg = comm_mod.signature_mismatch(
        [sig(), sig(error="ValueError: a_shard is on cuda:0 but ...")], "all_gather_gemm"
    )
    assert (
        msg
        == "all_gather_gemm: rank 1 rejected its inputs: ValueError: a_shard is on cuda:0 but ..."
    )


class FakeComm:
    """Just enough of a Communicator for _create_entry's exchange: all_gather returns what the
    other ranks would have sent."""

    def __init__(self, others, rank=0):
        self.others, self.rank, self.tp = others, rank, len(others) + 1
        self.plans = {}

    def all_gather(self, obj, what):
        out = list(self.others)
        out.insert(self.rank, obj)
        return out

    def workspace_for(self, layout):
        raise AssertionError("a mismatched plan must not allocate a workspace")


def _key(a_shape, path="auto"):
    return (
        "all_gather_gemm",
        "ag_rotate_a",
        None,
        BF16,
        (("a_shard", a_shape), ("w", (24, 32)), ("bias", None)),
        0.0,
        False,
        path,
    )


def test_create_entry_raises_the_same_value_error_for_a_peer_mismatch():
    a, w = t(64, 32), t(24, 32)
    peer = ops._signature(_key((32, 32)), None)
    fake = FakeComm([peer])
    with pytest.raises(
        ValueError,
        match=r"rank 1 has a_shard.shape=\[32, 32\] where rank 0 has "
        r"a_shard.shape=\[64, 32\]",
    ):
        ops._create_entry(
            fake,
            _key((64, 32)),
            lambda: ops.make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, None, a, w),
        )
    assert fake.plans == {}


def test_create_entry_reraises_an_error_every_rank_shares():
    a, w = t(63, 32), t(24, 32)  # M = 126 with S = 4: rejected identically on every rank
    make = lambda: ops.make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, 4, a, w)  # noqa: E731
    with pytest.raises(ValueError) as first:
        make()
    peer = ops._signature(_key((63, 32)), f"ValueError: {first.value}")
    with pytest.raises(ValueError, match=r"M=126 is not divisible by S=4") as e:
        ops._create_entry(FakeComm([peer]), _key((63, 32)), make)
    assert "rank" not in str(e.value)  # the plain error, not the cross-rank report


def test_create_entry_reports_a_peer_only_error_on_this_rank():
    a, w = t(64, 32), t(24, 32)
    peer = ops._signature(
        _key((64, 32)), "ValueError: w is on cuda:0 but this rank's device is cuda:1"
    )
    with pytest.raises(
        ValueError,
        match=r"all_gather_gemm: rank 1 rejected its inputs: ValueError: "
        r"w is on cuda:0",
    ):
        ops._create_entry(
            FakeComm([peer]),
            _key((64, 32)),
            lambda: ops.make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, None, a, w),
        )


def test_create_entry_for_the_collective_path_allocates_no_workspace():
    a, w = t(64, 32), t(24, 32)
    fake = FakeComm([ops._signature(_key((64, 32), "collective"), None)])
    entry = ops._create_entry(
        fake,
        _key((64, 32), "collective"),
        lambda: ops.make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, None, a, w),
    )
    assert entry.path == "collective" and entry.ws is None and entry.graphs == {}
    assert entry.out_shape == (128, 24)
    assert list(fake.plans.values()) == [entry]


def test_ranks_asking_for_different_paths_get_the_same_value_error():
    a, w = t(64, 32), t(24, 32)
    fake = FakeComm([ops._signature(_key((64, 32), "overlap"), None)])
    with pytest.raises(ValueError, match=r"rank 1 has path='overlap' where rank 0 has path='auto'"):
        ops._create_entry(
            fake,
            _key((64, 32), "auto"),
            lambda: ops.make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, None, a, w),
        )


@pytest.mark.parametrize("op", ["all_gather_gemm", "gemm_reduce_scatter", "gemm_all_reduce"])
def test_unknown_path_is_rejected_before_anything_else(op):
    a, w = t(64, 32), t(24, 32)  # CPU tensors: the path is checked first
    with pytest.raises(
        ValueError,
        match=rf"{op}: path='fastest' is not one of 'auto', 'overlap', "
        r"'collective'",
    ):
        getattr(ops, op)(a, w, path="fastest")


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
        path, med = ops.pick_path(ranks)
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
    assert ops.pick_path(ranks)[0] == "collective"
    assert ops.pick_path([{"overlap": [2.0], "collective": [2.0]}]) == (
        "overlap",
        {"overlap": 2.0, "collective": 2.0},
    )
    with pytest.raises(ValueError, match="at least one timed round"):
        ops.pick_path([{"overlap": [], "collective": [1.0]}])


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

    monkeypatch.setattr(ops, "_ptr", lambda op_, name, t, device: t.data_ptr())  # CPU tensors
    stream = {"now": 7}
    monkeypatch.setattr(ops, "_stream_ptr", lambda device: stream["now"])
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
                entry = ops._Entry(
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
            res = ops._collective(op, comm, entry, {"a": a, "w": w, "bias": bias, "c": c}, out)
            y = res[0] if ag else res
            ref = a @ w.t() + bias + beta * c
            assert y.data_ptr() == out.data_ptr()
            assert float((y - ref).norm() / ref.norm()) < 1e-5
            if ag:  # return_gathered: the gathered operand itself
                assert torch.equal(res[1], a if schedule == "ag_rotate_a" else w)
        with pytest.raises(ValueError, match="out shares memory with a"):
            ops._collective(op, comm, entry, {"a": a, "w": w, "bias": bias, "c": c}, a)
        # A call on another stream gets its own buffers (none are needed by the all-reduce, and
        # return_gathered hands the gathered operand over instead of keeping it).
        before = dict(entry.scratch)
        stream["now"] = 9
        ops._collective(op, comm, entry, {"a": a, "w": w, "bias": bias, "c": c}, None)
        names = {n for n, _ in before}
        assert {k for k in entry.scratch if k[1] == 9} == {(n, 9) for n in names}
        assert all(entry.scratch[k] is before[k] for k in before)
    finally:
        dist.destroy_process_group()


def test_inputs_that_require_grad_are_refused_while_grad_mode_is_on():
    w = torch.randn(24, 32, requires_grad=True)
    a = torch.randn(64, 32)
    with pytest.raises(
        RuntimeError,
        match=r"gemm_reduce_scatter: w requires grad, but distgemm "
        r"ops have no backward \(autograd\) yet: call them under "
        r"torch.no_grad\(\)",
    ):
        ops.check_no_grad("gemm_reduce_scatter", {"a": a, "w": w, "bias": None})
    with torch.no_grad():
        ops.check_no_grad("gemm_reduce_scatter", {"a": a, "w": w, "bias": None})
    with torch.inference_mode():
        ops.check_no_grad("gemm_reduce_scatter", {"a": a, "w": w})
    ops.check_no_grad("gemm_reduce_scatter", {"a": a, "w": w.detach(), "bias": None})


def test_path_none_takes_the_default_and_a_bad_default_is_named(monkeypatch):
    assert ops.check_path("all_gather_gemm", None) == ops.DEFAULT_PATH
    monkeypatch.setattr(ops, "DEFAULT_PATH", "collective")
    assert ops.check_path("all_gather_gemm", None) == "collective"
    assert ops.check_path("all_gather_gemm", "overlap") == "overlap"  # an explicit path wins
    monkeypatch.setattr(ops, "DEFAULT_PATH", "fast")
    with pytest.raises(
        ValueError,
        match=r"all_gather_gemm: DISTGEMM_PATH='fast' is not one of "
        r"'auto', 'overlap', 'collective'",
    ):
        ops.check_path("all_gather_gemm", None)


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
        ops.wait_event(_NeverDone(), 0.2, "x")
    assert 0.15 < time.perf_counter() - t0 < 5.0
    comm = _BrokenComm()
    with pytest.raises(
        RuntimeError,
        match=r"rank 1: all_gather_gemm path choice \(collective "
        r"path\): the GPU work did not finish",
    ):
        ops.wait_event(_NeverDone(), 0.05, "all_gather_gemm path choice (collective path)", comm)
    assert "did not join a collective" in comm.broken


def test_collective_path_needs_nccl_every_rank_decides_from_the_group():
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        why = ops.collective_unavailable(dist.group.WORLD)
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

    monkeypatch.setattr(ops, "_launch", fake("overlap", overlap_s))
    monkeypatch.setattr(ops, "_collective", fake("collective", collective_s))
    monkeypatch.setattr(ops, "collective_unavailable", lambda group: None)
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
    result = ops._choose_path("all_gather_gemm", TwoRanks(), entry, {}, None)
    assert entry.path == expected and result == expected  # the last call ran the chosen path
    assert exchanged == [
        "all_gather_gemm path choice (probe)",
        "all_gather_gemm path choice (timings)",
    ]
    t = entry.tuning
    assert t["rounds"] == ops.TUNE_ROUNDS and 1 <= t["calls_per_round"] <= ops.TUNE_MAX_CALLS
    assert (t["overlap_ms"] < t["collective_ms"]) == (expected == "overlap")
    # Both paths ran the same number of calls before the choice (the chosen one once more).
    other = "overlap" if expected == "collective" else "collective"
    assert calls[expected] == calls[other] + 1
    assert calls[other] == 3 + ops.TUNE_ROUNDS * (1 + t["calls_per_round"])
    assert entry.graphs == ({} if expected == "collective" else {"g": 1})


def test_choose_path_keeps_the_plan_when_the_group_has_no_nccl(monkeypatch):
    monkeypatch.setattr(ops, "_launch", lambda *a: "overlap")
    monkeypatch.setattr(ops, "_collective", lambda *a: pytest.fail("must not run"))
    monkeypatch.setattr(
        ops, "collective_unavailable", lambda group: "the group's backend is 'gloo'"
    )
    entry = types.SimpleNamespace(path=None, tuning=None, graphs={})
    comm = types.SimpleNamespace(group=None)
    assert ops._choose_path("gemm_reduce_scatter", comm, entry, {}, None) == "overlap"
    assert entry.path == "overlap"
    assert entry.tuning == {"collective_unavailable": "the group's backend is 'gloo'"}


def test_path_choices_never_creates_a_communicator():
    import torch.distributed as dist

    assert not dist.is_initialized()
    assert ops.path_choices() == []  # no process group, no communicator: nothing to report


# ---------------------------------------------------------------------------------------------
# The control exchange over the job's key-value store (two ranks as two threads).


def _exchange_pair(store, timeout_s=5.0):
    comm_mod._EXCHANGES_PER_RANKS.clear()  # both "processes" count from 1: the same prefix
    a = comm_mod.ControlExchange(store, [3, 5], 0, timeout_s)
    comm_mod._EXCHANGES_PER_RANKS.clear()
    b = comm_mod.ControlExchange(store, [3, 5], 1, timeout_s)
    return a, b


def test_control_exchange_all_gathers_in_rank_order_and_cleans_up():
    import threading

    import torch.distributed as dist

    store = dist.HashStore()
    ex = _exchange_pair(store)
    got = [[], []]
    rng = random.Random(5)
    payloads = [[{"r": r, "i": i, "x": rng.random()} for i in range(4)] for r in range(2)]

    def run(r):
        for obj in payloads[r]:
            got[r].append(ex[r].all_gather(obj))

    ts = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    for r in range(2):
        assert got[r] == [[payloads[0][i], payloads[1][i]] for i in range(4)]
    # Keys of exchanges 1-3 were deleted by their writers (the verdicts by rank 0); only the
    # last exchange's remain.
    assert not any(
        store.check([f"distgemm/ctl/3-5/1/{s}/{r}"]) for s in (1, 2, 3) for r in (0, 1, "verdict")
    )
    assert store.check(
        ["distgemm/ctl/3-5/1/4/0", "distgemm/ctl/3-5/1/4/1", "distgemm/ctl/3-5/1/4/verdict"]
    )


def test_control_exchange_over_torchruns_tcp_store():
    """The store torchrun gives the ranks (a TCPStore server and a client): exchanges in order,
    stale keys deleted, a timeout bounded and naming the absent rank."""
    import datetime
    import threading
    import time

    import torch.distributed as dist

    server = dist.TCPStore(
        "127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=10), wait_for_workers=False
    )
    client = dist.TCPStore(
        "127.0.0.1", server.port, 2, False, timeout=datetime.timedelta(seconds=10)
    )
    comm_mod._EXCHANGES_PER_RANKS.clear()
    ex = [comm_mod.ControlExchange(server, [0, 1], 0, 5.0)]
    comm_mod._EXCHANGES_PER_RANKS.clear()
    ex.append(comm_mod.ControlExchange(client, [0, 1], 1, 5.0))
    rng = random.Random(11)
    sent = [[rng.random() for _ in range(3)] for _ in range(2)]
    got = {}

    def run(r):
        got[r] = [ex[r].all_gather(x, "plan signature") for x in sent[r]]

    ts = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert got[0] == got[1] == [[sent[0][i], sent[1][i]] for i in range(3)]
    assert not any(
        server.check([f"distgemm/ctl/0-1/1/{s}/{k}"]) for s in (1, 2) for k in (0, 1, "verdict")
    )
    t0 = time.perf_counter()
    with pytest.raises(comm_mod.ExchangeTimeout) as e:
        ex[0].all_gather("alone", "close", timeout_s=0.4)
    assert e.value.missing == [1] and time.perf_counter() - t0 < 5.0


def test_control_exchange_names_the_rank_that_did_not_arrive():
    import time

    import torch.distributed as dist

    a, _ = _exchange_pair(dist.HashStore(), timeout_s=0.3)
    t0 = time.perf_counter()
    with pytest.raises(comm_mod.ExchangeTimeout) as e:
        a.all_gather("hello")
    assert e.value.missing == [1]
    assert 0.25 < time.perf_counter() - t0 < 5.0


def test_control_exchange_a_late_rank_raises_too():
    """Rank 0 gives up after 0.3 s; rank 1 arrives later and finds every key present, but the
    exchange was settled as late: it raises as well instead of going on alone."""
    import threading
    import time

    import torch.distributed as dist

    a, b = _exchange_pair(dist.HashStore(), timeout_s=0.3)
    errors = {}

    def late():
        time.sleep(0.6)
        try:
            b.all_gather("late", "setup")
        except comm_mod.ExchangeTimeout as e:
            errors[1] = e

    t = threading.Thread(target=late)
    t.start()
    with pytest.raises(comm_mod.ExchangeTimeout) as first:
        a.all_gather("early", "setup")
    t.join(10)
    assert first.value.missing == [1]
    assert 1 in errors and errors[1].missing == []  # everyone had arrived, too late
    assert "gave up waiting before this rank arrived" in str(errors[1])


def test_control_exchange_out_of_step_ranks_raise_a_mismatch():
    import threading

    import torch.distributed as dist

    ex = _exchange_pair(dist.HashStore())
    errors = {}

    def run(r, what):
        try:
            ex[r].all_gather({"r": r}, what)
        except comm_mod.ExchangeMismatch as e:
            errors[r] = e.whats

    ts = [
        threading.Thread(target=run, args=(0, "plan signature")),
        threading.Thread(target=run, args=(1, "close")),
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    assert errors == {0: ["plan signature", "close"], 1: ["plan signature", "close"]}


def test_each_new_exchange_of_the_same_ranks_gets_a_fresh_prefix():
    import torch.distributed as dist

    comm_mod._EXCHANGES_PER_RANKS.clear()
    store = dist.HashStore()
    first = comm_mod.ControlExchange(store, [0, 1], 0, 1.0)
    second = comm_mod.ControlExchange(store, [0, 1], 0, 1.0)
    other = comm_mod.ControlExchange(store, [0, 2], 0, 1.0)
    assert first.prefix == "distgemm/ctl/0-1/1" and second.prefix == "distgemm/ctl/0-1/2"
    assert other.prefix == "distgemm/ctl/0-2/1"


# ---------------------------------------------------------------------------------------------
# Communicator setup errors that need no GPU.


def test_communicator_needs_torch_distributed():
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.fail("a test left torch.distributed initialised")
    with pytest.raises(RuntimeError, match=r"call torch.distributed.init_process_group\(\) first"):
        comm_mod.Communicator()


def test_communicator_needs_cuda(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # also on a GPU machine
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        with pytest.raises(
            RuntimeError, match=r"distgemm.Communicator needs CUDA GPUs; torch sees none"
        ):
            comm_mod.Communicator()
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# Workspace sharing (Communicator.workspace_for) with the CUDA parts replaced: which workspace a
# plan gets, and the base shift that puts every plan's control region on the same addresses.


class FakeIpcWorkspace:
    allocated = []

    def __init__(self, device, nbytes):
        self.device, self.nbytes, self.freed = device, nbytes, False
        self.base = 0x10000000 * (len(FakeIpcWorkspace.allocated) + 1)
        FakeIpcWorkspace.allocated.append(self)

    def handle(self):
        return b"h" * 64

    def open_peers(self, handles, rank):
        self.peer_bases = [self.base + 0x1000000 * r for r in range(len(handles))]
        self.peer_bases[rank] = self.base

    def bases(self):
        return self.peer_bases

    def free(self):
        self.freed = True


def fake_comm(peer_errors=None):
    import types

    FakeIpcWorkspace.allocated = []
    c = object.__new__(comm_mod.Communicator)
    c.rank, c.tp, c._closed, c._workspaces = 0, 2, False, []
    c._core = types.SimpleNamespace(IpcWorkspace=FakeIpcWorkspace, LaunchOrder=lambda dev: "order")
    sent = []

    def all_gather(obj, what):
        sent.append(what)
        peer = (peer_errors or {}).get(
            what, obj if not isinstance(obj, tuple) else (b"p" * 64, None)
        )
        return [obj, peer]

    c.all_gather = all_gather
    c.device = types.SimpleNamespace(index=0)
    return c, sent


def layout(slots, flags_bytes=128):
    control = flags_bytes + 128 + 256
    return {
        "slots_offset": 0,
        "slots_bytes": slots,
        "flags_offset": slots,
        "flags_bytes": flags_bytes,
        "barrier_offset": slots + flags_bytes,
        "barrier_bytes": 128,
        "epoch_offset": 0,
        "total_bytes": slots + control,
    }


def test_plans_share_the_biggest_workspace_with_aligned_control_regions():
    c, sent = fake_comm()
    ws1, bases1 = c.workspace_for(layout(4096))
    assert len(FakeIpcWorkspace.allocated) == 1 and sent == [
        "workspace IPC handle exchange",
        "workspace IPC open",
    ]
    assert ws1.core.nbytes == 4096 + 512
    # A smaller plan reuses it: its slots end where the big plan's end, so its flags, barrier
    # slots and epoch word (after the slots) are at the same addresses as the big plan's.
    ws2, bases2 = c.workspace_for(layout(1024))
    assert ws2 is ws1 and len(FakeIpcWorkspace.allocated) == 1
    assert [b2 + 1024 for b2 in bases2] == [b1 + 4096 for b1 in bases1]
    # A bigger plan needs a new workspace; later small plans use the biggest one.
    ws3, _ = c.workspace_for(layout(8192))
    assert ws3 is not ws1 and len(FakeIpcWorkspace.allocated) == 2
    ws4, bases4 = c.workspace_for(layout(512))
    assert ws4 is ws3 and bases4[0] == ws3.bases[0] + 8192 - 512
    # A different control layout (more flags) never shares one.
    ws5, _ = c.workspace_for(layout(512, flags_bytes=256))
    assert ws5 not in (ws1, ws3) and len(FakeIpcWorkspace.allocated) == 3


def test_a_peer_allocation_failure_raises_on_every_rank_and_frees():
    c, _ = fake_comm(
        peer_errors={
            "workspace IPC handle exchange": (b"", "allocating 4608 bytes on cuda:1: out of memory")
        }
    )
    with pytest.raises(
        RuntimeError,
        match=r"distgemm workspace setup failed on rank 1: allocating "
        r"4608 bytes on cuda:1: out of memory",
    ):
        c.workspace_for(layout(4096))
    assert FakeIpcWorkspace.allocated[0].freed and c._workspaces == []


def test_a_peer_ipc_open_failure_raises_on_every_rank():
    c, _ = fake_comm(peer_errors={"workspace IPC open": "cudaIpcOpenMemHandle failed"})
    with pytest.raises(RuntimeError, match=r"failed on rank 1: cudaIpcOpenMemHandle failed"):
        c.workspace_for(layout(4096))
    assert FakeIpcWorkspace.allocated[0].freed


# ---------------------------------------------------------------------------------------------
# steps=None


def test_explicit_steps_are_kept():
    assert (
        ops.make_spec("gemm_reduce_scatter", "rs_tile_a", 2, 0, 2, t(8192, 16), t(64, 16)).steps
        == 2
    )
    assert (
        ops.make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, 4, t(4096, 16), t(64, 16)).steps == 4
    )
