"""CPU checks of distgemm.runtime.spec and the public ops' input checks: every error a call can
raise before anything reaches a communicator or a GPU, with its message; make_spec's shapes and
default_steps. The GPU paths are in tests/gpu/test_torchrun_api.py."""

import re

import pytest

torch = pytest.importorskip("torch")

from ranks import CPU_TPS  # noqa: E402

import distgemm  # noqa: E402
from distgemm import ops  # noqa: E402
from distgemm.runtime import validate  # noqa: E402
from distgemm.runtime.spec import make_spec  # noqa: E402

BF16, FP16 = torch.bfloat16, torch.float16
CPU = torch.device("cpu")


def t(*shape, dtype=BF16):
    return torch.zeros(*shape, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# validate_types: run first, before any communicator exists.


def test_non_tensor_is_a_type_error():
    with pytest.raises(TypeError, match=r"all_gather_gemm: w must be a torch.Tensor, got list"):
        validate.validate_types("all_gather_gemm", {"a_shard": t(8, 8), "w": [[1.0]]})


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8, torch.float64])
def test_unsupported_dtype_is_a_type_error(dtype):
    with pytest.raises(
        TypeError,
        match=rf"a has dtype {re.escape(str(dtype))}; distgemm supports "
        r"torch.bfloat16 and torch.float16",
    ):
        validate.validate_types("gemm_reduce_scatter", {"a": t(8, 8, dtype=dtype), "w": t(8, 8)})


def test_mixed_dtypes_name_both_operands():
    with pytest.raises(
        TypeError,
        match=r"mixed dtypes: a_shard is torch.bfloat16 but bias is "
        r"torch.float16",
    ):
        validate.validate_types(
            "all_gather_gemm", {"a_shard": t(8, 8), "w": t(8, 8), "bias": t(8, dtype=FP16)}
        )


def test_cpu_tensor_is_rejected_with_the_device():
    with pytest.raises(ValueError, match=r"a_shard is on cpu; distgemm ops need CUDA tensors"):
        validate.validate_types("all_gather_gemm", {"a_shard": t(8, 8), "w": t(8, 8)})


def test_check_types_skips_absent_operands():
    with pytest.raises(ValueError, match=r"gemm_all_reduce: w is on cpu"):
        validate.validate_types(
            "gemm_all_reduce", {"bias": None, "w": t(8, 8, dtype=FP16), "c": None}
        )


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
# validate_placement: device, contiguity, alignment (checked per call).


def test_wrong_device_names_the_rank_device():
    with pytest.raises(ValueError, match=r"w is on cpu but this rank's device is meta"):
        validate.validate_placement("all_gather_gemm", torch.device("meta"), {"w": t(8, 8)})


def test_non_contiguous_is_rejected_with_the_remedy():
    x = t(16, 8).t()
    with pytest.raises(
        ValueError,
        match=r"a is not contiguous \(shape \[8, 16\], strides \[1, 8\]\)"
        r".*pass a.contiguous\(\)",
    ):
        validate.validate_placement("gemm_reduce_scatter", CPU, {"a": x})


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
        validate.validate_placement("all_gather_gemm", CPU, {"a_shard": x})


def test_aligned_contiguous_tensors_pass():
    validate.validate_placement(
        "all_gather_gemm", CPU, {"a_shard": t(64, 8), "w": t(8, 8), "bias": None}
    )


# ---------------------------------------------------------------------------------------------
# make_spec: shapes and divisibility against the Plan (host-only extension).


def test_spec_all_gather_gemm_shapes():
    s = make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, None, t(64, 32), t(24, 32), bias=t(24))
    assert (s.m, s.n, s.k, s.steps) == (128, 48, 32, 2)
    assert s.shapes == {"a": (64, 32), "w": (24, 32), "out": (128, 24), "bias": (24,)}


def test_spec_ag_rotate_b_gathers_the_weight():
    s = make_spec("all_gather_gemm", "ag_rotate_b", 2, 1, 4, t(64, 32), t(32, 32))
    assert (s.m, s.n, s.k, s.steps) == (128, 64, 32, 4)
    assert s.shapes["out"] == (64, 64)


@pytest.mark.parametrize("schedule,out", [("rs_tile_a", (32, 48)), ("rs_tile_b", (64, 24))])
def test_spec_reduce_scatter_shapes(schedule, out):
    s = make_spec(
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
        ("rs_tile_b", 2, (4096, 16), (48, 16), 2),  # N/4 = 12 columns: not whole 8-column units
        ("ar_tile_a", 2, (4096, 16), (48, 16), 2),
        ("rs_tile_a", 1, (4096, 16), (48, 16), 1),  # TP=1: nothing to overlap
    ],
)
def test_default_steps(schedule, tp, a, w, want):
    assert distgemm.default_steps(schedule, tp, t(*a), t(*w)) == want
    op = {"ag": "all_gather_gemm", "rs": "gemm_reduce_scatter", "ar": "gemm_all_reduce"}[
        schedule[:2]
    ]
    assert make_spec(op, schedule, tp, 0, None, t(*a), t(*w)).steps == want


def test_default_steps_of_a_bad_operand_leaves_the_error_to_validation():
    assert distgemm.default_steps("rs_tile_a", 2, t(64), t(48, 16)) == 2
    with pytest.raises(ValueError, match="a must be 2-D"):
        make_spec("gemm_reduce_scatter", "rs_tile_a", 2, 0, None, t(64), t(48, 16))


def test_spec_all_reduce_shapes():
    s = make_spec("gemm_all_reduce", "ar_tile_a", 4, 3, 8, t(64, 16), t(40, 16), bias=t(40))
    assert (s.m, s.n, s.k, s.steps) == (64, 40, 64, 8)
    assert s.shapes == {"a": (64, 16), "w": (40, 16), "out": (64, 40), "bias": (40,)}


def test_schedule_of_the_wrong_collective_is_rejected():
    with pytest.raises(
        ValueError,
        match=r"all_gather_gemm: schedule 'rs_tile_a' is not a all_gather "
        r"schedule; use one of ag_rotate_a, ag_rotate_b",
    ):
        make_spec("all_gather_gemm", "rs_tile_a", 2, 0, None, t(64, 32), t(24, 32))


def test_unknown_schedule_is_rejected():
    with pytest.raises(
        ValueError,
        match=r"schedule 'nope' is not a reduce_scatter schedule; use one "
        r"of rs_tile_a, rs_tile_b",
    ):
        make_spec("gemm_reduce_scatter", "nope", 2, 0, None, t(64, 32), t(24, 32))


def test_schedule_must_be_a_name():
    with pytest.raises(TypeError, match=r"schedule must be a schedule name \(str\), got dict"):
        make_spec("gemm_reduce_scatter", {"name": "rs_tile_a"}, 2, 0, None, t(8, 8), t(8, 8))


def test_steps_not_a_multiple_of_tp_uses_the_plan_message():
    with pytest.raises(ValueError, match=r"S=3 is not a positive multiple of TP=2"):
        make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, 3, t(64, 32), t(24, 32))


def test_steps_must_be_an_int():
    with pytest.raises(TypeError, match=r"steps must be an int or None, got 2.0"):
        make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, 2.0, t(64, 32), t(24, 32))


def test_m_not_divisible_by_steps_splits_unevenly():
    # a_shard has 63 rows: M = 126 in S = 4 tiles of 32 and 31 rows.
    s = make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, 4, t(63, 32), t(24, 32))
    assert (s.m, s.steps) == (126, 4)
    rows = sorted(g["m"] for g in s.plan.to_dict()["devices"][0]["gemms"])
    assert rows == [31, 31, 32, 32]


@pytest.mark.parametrize("tp", CPU_TPS)
def test_reduce_scatter_m_not_divisible_by_tp(tp):
    m, k = 8 * tp + 1, 16 * tp
    with pytest.raises(
        ValueError,
        match=rf"gemm_reduce_scatter \(rs_tile_a, TP={tp}, S={tp}, global M={m} N=48 K={k}\): "
        rf"M={m} is not divisible by TP={tp}: rs_tile_a shards C/D on M",
    ):
        make_spec("gemm_reduce_scatter", "rs_tile_a", tp, 0, None, t(m, 16), t(48, 16))


@pytest.mark.parametrize("tp", CPU_TPS)
@pytest.mark.parametrize("tokens", [1, 3, 7, 255])
def test_all_reduce_takes_any_token_count(tp, tokens):
    s = make_spec("gemm_all_reduce", "ar_tile_a", tp, 0, None, t(tokens, 64), t(48, 64))
    assert (s.m, s.steps) == (tokens, tp) and s.shapes["out"] == (tokens, 48)


def test_weight_shape_mismatch_is_explained():
    with pytest.raises(
        ValueError,
        match=r"w has shape \[24, 16\] but a_shard \[64, 32\] with "
        r"ag_rotate_a on TP=2 needs w of shape \[24, 32\]",
    ):
        make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, None, t(64, 32), t(24, 16))


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
            "of D; pad N so that each of its tiles (N/TP per rank where N is split) is a "
            "multiple of 8",
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
        make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, None, t(64, 12), t(24, 12))


def test_local_k_of_reduce_scatter_must_be_a_multiple_of_8():
    with pytest.raises(
        ValueError,
        match=r"K=20 of a sub-GEMM is not a multiple of 8 .* \(a "
        r"sub-GEMM of rs_tile_a;",
    ):
        make_spec("gemm_reduce_scatter", "rs_tile_a", 2, 0, None, t(64, 20), t(48, 20))


def test_column_tile_of_rs_tile_b_must_be_a_multiple_of_8():
    # N = 44: 22 columns per rank, cut into S/TP = 2 tiles of whole 8-column units, 8 + 14.
    with pytest.raises(
        ValueError,
        match=r"N=14 of a sub-GEMM is not a multiple of 8 elements: .* "
        r"is a multiple of 8 \(a sub-GEMM of "
        r"rs_tile_b; global M=64 N=44 K=32, TP=2, S=4\)",
    ):
        make_spec("gemm_reduce_scatter", "rs_tile_b", 2, 0, 4, t(64, 16), t(44, 16))


def test_column_tiles_of_rs_tile_b_are_whole_8_column_units():
    # N = 48: 24 columns per rank in S/TP = 2 tiles: 16 + 8, not 12 + 12.
    made = make_spec("gemm_reduce_scatter", "rs_tile_b", 2, 0, 4, t(64, 16), t(48, 16))
    widths = sorted({g["n"] for g in made.plan.to_dict()["devices"][0]["gemms"]})
    assert widths == [8, 16]


def test_odd_n_local_of_all_gather_is_rejected():
    with pytest.raises(ValueError, match=r"N=20 of a sub-GEMM is not a multiple of 8"):
        make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, None, t(64, 32), t(20, 32))


def test_operands_must_be_2d():
    with pytest.raises(
        ValueError, match=r"all_gather_gemm: a_shard must be 2-D, got shape \[2, 32, 32\]"
    ):
        make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, None, t(2, 32, 32), t(24, 32))


def test_bias_shape_is_checked():
    with pytest.raises(
        ValueError,
        match=r"bias has shape \[48\], expected \[24\] \(per rank; "
        r"ag_rotate_a, TP=2",
    ):
        make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, None, t(64, 32), t(24, 32), bias=t(48))


def test_beta_without_c_is_rejected():
    with pytest.raises(
        ValueError, match=r"beta=0.5 but c is None: pass c \(shape \[32, 48\]\) or beta=0"
    ):
        make_spec("gemm_reduce_scatter", "rs_tile_a", 2, 0, None, t(64, 16), t(48, 16), beta=0.5)


def test_c_shape_is_checked():
    with pytest.raises(ValueError, match=r"c has shape \[64, 48\], expected \[32, 48\]"):
        make_spec(
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
        make_spec(
            "gemm_reduce_scatter", "rs_tile_b", 2, 0, None, t(64, 16), t(48, 16), out=t(64, 48)
        )


@pytest.mark.parametrize(
    "a,w,message",
    [
        ((0, 16), (48, 16), "a [0, 16] has 0 rows (M=0 tokens)"),
        ((8, 0), (48, 0), "a [8, 0] has 0 columns (K=0)"),
        ((8, 16), (0, 16), "w [0, 16] has 0 rows (N=0)"),
        ((8, 16), (48, 0), "w [48, 0] has 0 columns (K=0)"),
    ],
)
def test_empty_operands_name_the_extent(a, w, message):
    """Checked at an entry's first call (exchanged over the ranks: tests/test_bad_input_ranks.py):
    a batch of 0 tokens names M and the remedy."""
    with pytest.raises(ValueError) as e:
        validate.validate_extents("gemm_all_reduce", "a", t(*a), t(*w))
    assert str(e.value) == (
        f"gemm_all_reduce: {message}; every rank must call it with M, N and K of at least 1: "
        "skip the call on every rank when the batch is empty"
    )
    validate.validate_extents("gemm_all_reduce", "a", t(1, 16), t(48, 16))
    validate.validate_extents("gemm_all_reduce", "a", t(0), t(48, 16))  # not 2-D: make_spec's


def test_empty_operands_are_rejected():
    with pytest.raises(ValueError, match=r"empty operands"):
        make_spec("gemm_all_reduce", "ar_tile_a", 2, 0, None, t(0, 16), t(48, 16))


@pytest.mark.parametrize("op", ["all_gather_gemm", "gemm_reduce_scatter", "gemm_all_reduce"])
def test_unknown_path_is_rejected_before_anything_else(op):
    a, w = t(64, 32), t(24, 32)  # CPU tensors: the path is checked first
    with pytest.raises(
        ValueError,
        match=rf"{op}: path='fastest' is not one of 'auto', 'overlap', "
        r"'collective'",
    ):
        getattr(ops, op)(a, w, path="fastest")


def test_inputs_that_require_grad_are_refused_while_grad_mode_is_on():
    w = torch.randn(24, 32, requires_grad=True)
    a = torch.randn(64, 32)
    with pytest.raises(
        RuntimeError,
        match=r"gemm_reduce_scatter: w requires grad, but distgemm "
        r"ops have no backward \(autograd\) yet: call them under "
        r"torch.no_grad\(\)",
    ):
        validate.validate_no_grad("gemm_reduce_scatter", {"a": a, "w": w, "bias": None})
    with torch.no_grad():
        validate.validate_no_grad("gemm_reduce_scatter", {"a": a, "w": w, "bias": None})
    with torch.inference_mode():
        validate.validate_no_grad("gemm_reduce_scatter", {"a": a, "w": w})
    validate.validate_no_grad("gemm_reduce_scatter", {"a": a, "w": w.detach(), "bias": None})


def test_path_none_takes_the_default_and_a_bad_default_is_named(monkeypatch):
    assert validate.validate_path("all_gather_gemm", None) == validate.DEFAULT_PATH
    monkeypatch.setattr(validate, "DEFAULT_PATH", "collective")
    assert validate.validate_path("all_gather_gemm", None) == "collective"
    assert (
        validate.validate_path("all_gather_gemm", "overlap") == "overlap"
    )  # an explicit path wins
    monkeypatch.setattr(validate, "DEFAULT_PATH", "fast")
    with pytest.raises(
        ValueError,
        match=r"all_gather_gemm: DISTGEMM_PATH='fast' is not one of "
        r"'auto', 'overlap', 'collective'",
    ):
        validate.validate_path("all_gather_gemm", None)


# ---------------------------------------------------------------------------------------------
# steps=None


def test_explicit_steps_are_kept():
    assert make_spec("gemm_reduce_scatter", "rs_tile_a", 2, 0, 2, t(8192, 16), t(64, 16)).steps == 2
    assert make_spec("all_gather_gemm", "ag_rotate_a", 2, 0, 4, t(4096, 16), t(64, 16)).steps == 4


def test_default_steps_of_an_unknown_schedule_leaves_the_error_to_validation():
    assert distgemm.default_steps("nope", 2, t(8192, 16), t(48, 16)) == 2
    with pytest.raises(ValueError, match="schedule 'nope' is not a reduce_scatter schedule"):
        make_spec("gemm_reduce_scatter", "nope", 2, 0, None, t(8192, 16), t(48, 16))
