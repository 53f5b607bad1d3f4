"""distgemm.runtime.scales.validate_scales: every error path names what it saw and what it accepts,
and the accepted FP8 scale shapes give the right kinds (and so the right plan options)."""

import re

import pytest

torch = pytest.importorskip("torch")

from distgemm import build_plan  # noqa: E402
from distgemm.runtime.scales import FP8_DTYPE, ScaleKind, validate_scales  # noqa: E402

E4M3 = torch.float8_e4m3fn
A_ROWS, W_ROWS, K = 8, 12, 16


def operands(a_dtype=E4M3, w_dtype=E4M3):
    return torch.zeros(A_ROWS, K, dtype=a_dtype), torch.zeros(W_ROWS, K, dtype=w_dtype)


def scale(*shape, dtype=torch.float32, device="cpu"):
    return torch.ones(shape, dtype=dtype, device=device)


def check(a, w, sa, sb):
    return validate_scales("all_gather_gemm", a, w, sa, sb, a_rows=A_ROWS, w_rows=W_ROWS)


# -- success paths ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_bf16_and_fp16_take_no_scales(dtype):
    kind = check(*operands(dtype, dtype), None, None)
    assert kind == ScaleKind("none", "none")
    assert not kind.fp8 and not kind.row_scale_a and not kind.row_scale_b


TENSOR_WISE = [(), (1,), (1, 1)]


@pytest.mark.parametrize("shape_a", TENSOR_WISE, ids=str)
@pytest.mark.parametrize("shape_b", TENSOR_WISE, ids=str)
def test_tensor_wise_scales(shape_a, shape_b):
    kind = check(*operands(), scale(*shape_a), scale(*shape_b))
    assert kind == ScaleKind("tensor", "tensor")
    assert kind.fp8 and not kind.row_scale_a and not kind.row_scale_b


@pytest.mark.parametrize("a_col", [False, True], ids=["sa[rows]", "sa[rows,1]"])
@pytest.mark.parametrize("b_col", [False, True], ids=["sb[rows]", "sb[rows,1]"])
def test_row_wise_scales(a_col, b_col):
    sa = scale(A_ROWS, 1) if a_col else scale(A_ROWS)
    sb = scale(W_ROWS, 1) if b_col else scale(W_ROWS)
    kind = check(*operands(), sa, sb)
    assert kind == ScaleKind("row", "row") and kind.row_scale_a and kind.row_scale_b


def test_tensor_wise_a_with_row_wise_b_and_back():
    assert check(*operands(), scale(), scale(W_ROWS)) == ScaleKind("tensor", "row")
    assert check(*operands(), scale(A_ROWS, 1), scale(1)) == ScaleKind("row", "tensor")


def test_the_kinds_are_the_plan_options():
    """Row-wise scales become the plan's row_scale_a / row_scale_b, tensor-wise ones nothing."""
    kind = check(*operands(), scale(A_ROWS), scale(1, 1))
    plan = build_plan(
        "ag_rotate_a",
        2,
        2,
        m=2 * A_ROWS,
        n=2 * W_ROWS,
        k=K,
        row_scale_a=kind.row_scale_a,
        row_scale_b=kind.row_scale_b,
    )
    assert (plan["row_scale_a"], plan["row_scale_b"]) == (True, False)
    assert plan["local_shapes"]["A"] == (A_ROWS, K) and plan["local_shapes"]["B"] == (W_ROWS, K)


def test_one_row_makes_shape_1_tensor_wise():
    """With one row, [1] is both kinds; it reads as tensor-wise (the same product)."""
    a, w = torch.zeros(1, K, dtype=E4M3), torch.zeros(W_ROWS, K, dtype=E4M3)
    kind = validate_scales("op", a, w, scale(1), scale(W_ROWS), a_rows=1, w_rows=W_ROWS)
    assert kind == ScaleKind("tensor", "row")


# -- error paths --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "a_dtype,w_dtype",
    [
        (torch.float8_e5m2, torch.float8_e5m2),
        (E4M3, torch.float8_e5m2),
        (torch.float8_e5m2, E4M3),
        (E4M3, torch.bfloat16),
        (torch.bfloat16, E4M3),
        (E4M3, torch.float16),
    ],
    ids=lambda d: str(d).removeprefix("torch."),
)
def test_unsupported_fp8_dtypes_name_both_and_what_is_supported(a_dtype, w_dtype):
    with pytest.raises(TypeError) as e:
        check(*operands(a_dtype, w_dtype), scale(), scale())
    msg = str(e.value)
    assert msg.startswith("all_gather_gemm: ")
    assert f"a is {a_dtype} and w is {w_dtype}" in msg
    assert f"{FP8_DTYPE} A and B with float32 scale_a and scale_b" in msg
    assert "bf16/fp16 A and B without scales" in msg


@pytest.mark.parametrize("given", ["scale_a", "scale_b", "both"])
def test_bf16_with_scales_is_refused(given):
    sa = scale() if given in ("scale_a", "both") else None
    sb = scale() if given in ("scale_b", "both") else None
    names = "scale_a and scale_b" if given == "both" else given
    with pytest.raises(ValueError, match=f"{names} given for torch.bfloat16 inputs"):
        check(*operands(torch.bfloat16, torch.bfloat16), sa, sb)


@pytest.mark.parametrize(
    "sa,sb,missing",
    [(None, 1, "scale_a"), (1, None, "scale_b"), (None, None, "scale_a and scale_b")],
)
def test_fp8_needs_both_scales(sa, sb, missing):
    with pytest.raises(ValueError) as e:
        check(*operands(), sa and scale(), sb and scale())
    assert f"need scale_a and scale_b, {missing} missing" in str(e.value)


@pytest.mark.parametrize("which", ["scale_a", "scale_b"])
def test_a_scale_that_is_not_a_tensor(which):
    args = {"scale_a": scale(), "scale_b": scale()}
    args[which] = 1.0
    with pytest.raises(TypeError, match=f"{which} must be a torch.Tensor, got float"):
        check(*operands(), args["scale_a"], args["scale_b"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64, E4M3], ids=str)
@pytest.mark.parametrize("which", ["scale_a", "scale_b"])
def test_scales_are_float32(which, dtype):
    args = {"scale_a": scale(), "scale_b": scale()}
    args[which] = scale(dtype=dtype)
    with pytest.raises(TypeError, match=re.escape(f"{which} has dtype {dtype}; scales are")):
        check(*operands(), args["scale_a"], args["scale_b"])


@pytest.mark.parametrize("which", ["scale_a", "scale_b"])
def test_scales_live_on_the_inputs_device(which):
    args = {"scale_a": scale(), "scale_b": scale()}
    args[which] = scale(device="meta")
    operand = "a" if which == "scale_a" else "w"
    with pytest.raises(ValueError, match=f"{which} is on meta but {operand} is on cpu"):
        check(*operands(), args["scale_a"], args["scale_b"])


BAD_SHAPES = {
    "scale_a": [(A_ROWS + 1,), (A_ROWS, 2), (1, A_ROWS), (2,), (2, 2), (1, 1, 1), (W_ROWS,)],
    "scale_b": [(W_ROWS - 1,), (W_ROWS, 2), (1, W_ROWS), (A_ROWS,), (1, 1, 1)],
}


@pytest.mark.parametrize(
    "which,shape",
    [(w, s) for w, shapes in BAD_SHAPES.items() for s in shapes],
    ids=lambda x: str(x),
)
def test_a_scale_of_another_shape_names_it_and_the_accepted_ones(which, shape):
    args = {"scale_a": scale(), "scale_b": scale()}
    args[which] = scale(*shape)
    rows, operand = (A_ROWS, "a") if which == "scale_a" else (W_ROWS, "w")
    with pytest.raises(ValueError) as e:
        check(*operands(), args["scale_a"], args["scale_b"])
    seen = "[" + ", ".join(map(str, shape)) + "]"
    assert str(e.value) == (
        f"all_gather_gemm: {which} has shape {seen}; accepted: tensor-wise [], [1] or [1, 1], "
        f"or row-wise [{rows}] or [{rows}, 1] (one float per row of {operand}, {rows} rows here)"
    )


def test_quantize_round_trips_within_e4m3_precision_and_scaled_mm_scales_broadcast():
    from distgemm.runtime.scales import E4M3_MAX, dequantize, quantize, scaled_mm_scales

    x = (
        torch.randn(16, 32, generator=torch.Generator().manual_seed(3))
        * torch.arange(1, 17)[:, None]
    )
    for rowwise in (True, False):
        q, s = quantize(x, rowwise)
        assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
        assert s.shape == ((16,) if rowwise else (1,))
        assert float(q.float().abs().max()) <= E4M3_MAX
        # e4m3 keeps 3 mantissa bits: each element within 2^-4 of itself (+ the subnormal step)
        err = (dequantize(q, s) - x).abs() - (x.abs() * 2**-4 + s.max() * 2**-9)
        assert float(err.max()) <= 0
    row, one = torch.rand(16), torch.rand(1)
    sx, sy = scaled_mm_scales(row, one, 16, 8)
    assert sx.shape == (16, 1) and sy.shape == (1, 8) and torch.equal(sy[0], one.expand(8))
    sx, sy = scaled_mm_scales(one, one, 16, 8)
    assert sx.shape == () and sy.shape == ()
