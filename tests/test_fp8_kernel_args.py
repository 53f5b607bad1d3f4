"""The fp8 (e4m3) kernel's boundary without a GPU: its two configurations in the configuration
table and names, and every refusal of _core.gemm_problem (kernel::gemm_can_implement, which
touches no device) with the constraint and the values in words."""

import pytest

from distgemm import _core

needs_runtime = pytest.mark.skipif(
    not getattr(_core, "cuda_runtime", False),
    reason=f"_core built without the CUDA runtime ({_core.cuda_runtime_reason}): no _core.gemm",
)
BASE = 1 << 20  # a 16-byte aligned address; gemm_problem never dereferences it


def problem(m=256, n=256, k=256, dtype="e4m3", **kw):
    return _core.gemm_problem(BASE, BASE, BASE, m, n, k, dtype, **kw)


def test_fp8_configurations_in_the_table():
    table = _core.gemm_config_table()
    fp8 = [c for c in table if table[c]["e4m3"]]
    assert fp8 == ["e4m3_128x192", "e4m3_128x256fa"]
    assert [c for c in fp8 if table[c]["fast_accum"]] == ["e4m3_128x256fa"]
    assert (table["e4m3_128x192"]["tile_n"], table["e4m3_128x256fa"]["tile_n"]) == (192, 256)
    assert _core.gemm_config_names("e4m3") == fp8
    assert _core.gemm_config_names("float8_e4m3fn") == fp8
    # the 16-bit model never sees them
    for dtype in ("bf16", "fp16"):
        assert not set(fp8) & set(_core.gemm_config_names(dtype, stream_k=True))
    with pytest.raises(ValueError, match="fp8 \\(e4m3\\) has no kernel for an N-contiguous B"):
        _core.gemm_config_names("e4m3", b_n_major=True)
    with pytest.raises(ValueError, match="an fp8 \\(e4m3\\) GEMM runs the kernel its fast_accum"):
        _core.choose_config(1024, 1024, 1, "e4m3", slots=132)


@needs_runtime
def test_fp8_gemm_accepted_with_both_scales_of_either_kind():
    for rows_a in (False, True):
        for rows_b in (False, True):
            for fast in (False, True):
                assert (
                    problem(
                        scale_a=BASE,
                        scale_a_rows=rows_a,
                        scale_b=BASE,
                        scale_b_rows=rows_b,
                        fast_accum=fast,
                    )  # fmt: skip
                    == ""
                )
    assert problem(scale_a=BASE, scale_b=BASE, config="e4m3_128x192") == ""
    assert problem(scale_a=BASE, scale_b=BASE, config="e4m3_128x256fa", fast_accum=True) == ""


@needs_runtime
def test_fp8_refusals_name_the_constraint():
    assert problem() == (
        "an fp8 (e4m3) GEMM needs both scales (one float32 per operand, or one per row): "
        "scale_a is null, scale_b is null"
    )
    assert problem(scale_a=BASE).endswith("scale_a is given, scale_b is null")
    assert problem(scale_a=BASE + 2, scale_b=BASE) == (
        f"fp8 scales are float32: their addresses must be 4-byte aligned, got {BASE + 2}"
    )
    assert problem(scale_a=BASE, scale_b=BASE, b_n_major=True).startswith(
        "an fp8 (e4m3) B must be K-contiguous ([n, k], nn.Linear's layout)"
    )
    assert problem(scale_a=BASE, scale_b=BASE, tile_n=256).startswith(
        "tile_n=256 with fp8 (e4m3): its kernel follows fast_accum"
    )
    assert problem(scale_a=BASE, scale_b=BASE, config="e4m3_128x256fa") == (
        "config=e4m3_128x256fa and fast_accum=false name different fp8 kernels: "
        "e4m3_128x256fa is the fast-accumulation one"
    )
    assert problem(scale_a=BASE, scale_b=BASE, config="128x256") == (
        "config=128x256 is a 16-bit kernel; e4m3 has e4m3_128x192 and e4m3_128x256fa "
        "(fast accumulation)"
    )
    # K and N in 16-byte rows of fp8: multiples of 16 elements
    assert problem(k=520, scale_a=BASE, scale_b=BASE).startswith(
        "K=520 of a sub-GEMM is not a multiple of 16 elements"
    )
    assert problem(n=264, scale_a=BASE, scale_b=BASE).startswith(
        "N=264 of a sub-GEMM is not a multiple of 16 elements"
    )


@needs_runtime
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_scales_and_fast_accum_are_refused_for_16_bit_types(dtype):
    want = f"scale_a, scale_b and fast_accum are for fp8 (e4m3) inputs; this GEMM is {dtype}"
    assert problem(dtype=dtype, scale_a=BASE, scale_b=BASE) == want
    assert problem(dtype=dtype, fast_accum=True) == want
    assert problem(dtype=dtype, config="e4m3_128x192") == (
        f"config=e4m3_128x192 is an fp8 (e4m3) kernel; {dtype} has the others"
    )


def test_unknown_dtype_names_the_supported_ones():
    with pytest.raises(ValueError, match="use bf16, fp16 or e4m3"):
        _core.gemm_config_names("e5m2")
