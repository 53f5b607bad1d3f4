"""The precision of an op call without a GPU: distgemm.runtime.precision.validate_precision's
refusals and its result, make_spec's plans for fp8 row scales (the scale refs the GPU graph
reads), and the workspace layout an fp8 entry sizes (one-byte slots for a gathered operand, bf16
for partials)."""

import pytest

torch = pytest.importorskip("torch")

from distgemm import _core  # noqa: E402
from distgemm.runtime.precision import Precision, validate_precision  # noqa: E402
from distgemm.runtime.scales import ScaleKind  # noqa: E402
from distgemm.runtime.spec import make_spec  # noqa: E402

E4M3 = torch.float8_e4m3fn
OP = "all_gather_gemm"


def fp8(*shape):
    return torch.zeros(shape, dtype=E4M3)


def f32(*shape):
    return torch.ones(shape, dtype=torch.float32)


def check(a, w, sa=None, sb=None, fast=False, **outputs):
    outs = {"bias": None, "out": None, **outputs}
    return validate_precision(OP, {"a_shard": a, "w": w}, outs, sa, sb, fast)


def test_precision_of_each_kind():
    p = Precision(E4M3, ScaleKind("row", "tensor"), True)
    assert (p.fp8, p.out_dtype, p.name, p.row_scale_a, p.row_scale_b) == (
        True, torch.bfloat16, "e4m3", True, False,
    )  # fmt: skip
    assert str(p) == "torch.float8_e4m3fn (scale_a row-wise, scale_b tensor-wise, fast_accum)"
    q = Precision(torch.float16)
    assert (q.fp8, q.out_dtype, q.name, str(q)) == (False, torch.float16, "fp16", "torch.float16")
    # part of the plan cache key: equal precisions hash equal, different ones differ
    rows = ScaleKind("row", "row")
    assert Precision(E4M3, rows) == Precision(E4M3, ScaleKind("row", "row"))
    assert len({Precision(E4M3, rows), Precision(E4M3, rows, True)}) == 2


def test_fp8_on_the_cpu_is_refused_with_the_device():
    with pytest.raises(ValueError, match="all_gather_gemm: a_shard is on cpu; distgemm ops need"):
        check(fp8(64, 32), fp8(48, 32), f32(64), f32(48))


def test_fp8_refusals_at_the_boundary():
    with pytest.raises(TypeError, match="a is torch.float8_e4m3fn and w is torch.bfloat16"):
        check(fp8(64, 32), torch.zeros(48, 32, dtype=torch.bfloat16), f32(64), f32(48))
    with pytest.raises(TypeError, match="a is torch.float8_e5m2"):
        check(torch.zeros(64, 32, dtype=torch.float8_e5m2), fp8(48, 32), f32(64), f32(48))
    with pytest.raises(ValueError, match="need scale_a and scale_b, scale_b missing"):
        check(fp8(64, 32), fp8(48, 32), f32(64))
    with pytest.raises(ValueError, match="scale_a has shape \\[63\\]; accepted"):
        check(fp8(64, 32), fp8(48, 32), f32(63), f32(48))
    with pytest.raises(ValueError, match="fast_accum=True is for torch.float8_e4m3fn inputs"):
        check(torch.zeros(64, 32), torch.zeros(48, 32), fast=True)
    with pytest.raises(TypeError, match="fast_accum must be a bool, got 1"):
        check(fp8(64, 32), fp8(48, 32), f32(64), f32(48), fast=1)
    with pytest.raises(ValueError, match="scale_a and scale_b given for torch.bfloat16 inputs"):
        check(torch.zeros(64, 32, dtype=torch.bfloat16), torch.zeros(48, 32, dtype=torch.bfloat16),
              f32(64), f32(48))  # fmt: skip


@pytest.mark.parametrize(
    "schedule,tp,a_shape,w_shape",
    [
        ("ag_rotate_a", 2, (64, 32), (48, 32)),
        ("ag_rotate_b", 2, (64, 32), (48, 32)),
        ("rs_tile_a", 4, (64, 32), (48, 32)),
        ("ar_tile_a", 2, (64, 32), (48, 32)),
    ],
)
def test_make_spec_carries_fp8_row_scales_into_the_plan(schedule, tp, a_shape, w_shape):
    op = {"ag": "all_gather_gemm", "rs": "gemm_reduce_scatter", "ar": "gemm_all_reduce"}[
        schedule[:2]
    ]
    a, w = fp8(*a_shape), fp8(*w_shape)
    spec = make_spec(op, schedule, tp, 0, None, a, w, row_scale_a=True, row_scale_b=True)
    plan = spec.plan
    assert (plan.row_scale_a, plan.row_scale_b) == (True, True)
    d = plan.to_dict()
    for g in d["devices"][0]["gemms"]:
        assert g["scale_a"] is not None and g["scale_b"] is not None
    gathers = schedule.startswith("ag")
    assert (plan.scale_slot_rows > 0) == gathers
    # the slots of an fp8 entry: one byte per gathered element, bf16 partials otherwise
    assert plan.slot_elem_bytes(1, 2) == (1 if gathers else 2)
    layout = plan.layout(plan.slot_elem_bytes(1, 2))
    assert layout["scale_slots_bytes"] == (
        0 if not gathers else -(-plan.scale_slot_rows * 4 // 256) * 256
    )
    bare = make_spec(op, schedule, tp, 0, None, a, w)
    assert not bare.plan.row_scale_a and bare.plan.scale_slot_rows == 0


def test_make_spec_refuses_an_fp8_transposed_weight_and_short_k():
    a, wt = fp8(64, 32), fp8(32, 48).t()
    with pytest.raises(ValueError, match="an fp8 weight must be K-contiguous"):
        make_spec(OP, "ag_rotate_a", 2, 0, None, a, wt)
    with pytest.raises(ValueError, match="K=40 of a sub-GEMM is not a multiple of 16"):
        make_spec(OP, "ag_rotate_a", 2, 0, None, fp8(64, 40), fp8(48, 40))
    # the same K in bf16 (16-byte rows of 8 elements) is accepted
    bf = torch.bfloat16
    make_spec(OP, "ag_rotate_a", 2, 0, None, torch.zeros(64, 40, dtype=bf),
              torch.zeros(48, 40, dtype=bf))  # fmt: skip


def test_default_plan_takes_row_scales():
    plan = _core.default_plan("rs_tile_a", 2, 8192, 4096, 4096, 1, row_scale_a=True)
    assert plan.steps == 4 and plan.row_scale_a and not plan.row_scale_b
