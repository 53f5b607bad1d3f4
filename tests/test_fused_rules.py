"""CPU checks of gemm_all_reduce's fused path without a GPU: the kernel's host-only rules (which
kernel, token tile and width, split-K factor, the decode kernel's grid and pieces, the tails and
their slice owners, buffer sizes, the control region's flag layout, the shape check, from C++
through _core), the two-shot sum buffers' placement against the launch's own check, the path
choice (``path="fused"`` and ``"fused_two_shot"`` requested, the reasons ``"auto"`` does not take
them; where it does, by the decode model: test_reduce_cost.py) and the path argument's validate.
The GPU runs it in tests/gpu/test_fused.py."""

import pytest

torch = pytest.importorskip("torch")

from distgemm import _core, ops  # noqa: E402
from distgemm.runtime import validate  # noqa: E402
from distgemm.runtime.choose import choose_path  # noqa: E402
from distgemm.runtime.paths import fused  # noqa: E402


def _spec(tokens, n=8192, k_local=4096, tp=2, transposed=False):
    a = torch.empty(tokens, k_local, device="meta", dtype=torch.bfloat16)
    w = torch.empty(n, k_local, device="meta", dtype=torch.bfloat16)
    if transposed:
        w = torch.empty(k_local, n, device="meta", dtype=torch.bfloat16).t()
    return ops.make_spec("gemm_all_reduce", "ar_tile_a", tp, 0, None, a, w)


def test_decode_kernel_runs_up_to_its_token_limit_and_cutlass_above():
    limit = _core.FUSED_DECODE_MAX_TOKENS
    assert limit == 32
    assert [_core.fused_kernel(m) for m in (1, 7, 32, limit, limit + 1, 4096)] == [
        "decode",
        "decode",
        "decode",
        "decode",
        "cutlass",
        "cutlass",
    ]


@pytest.mark.parametrize(
    "m,tile",
    [
        (1, 32),  # the decode kernel's block
        (32, 32),
        (33, 64),  # one 64-token tile
        (64, 64),
        (65, 96),  # one 96-token tile pads 31 tokens, a 128-token one 63
        (96, 96),
        (97, 128),  # 128 tokens padded by two 64-token tiles or one 128-token tile: the larger
        (128, 128),
        (129, 192),  # 192 padded by 64, 96 or 192: one 192-token tile
        (192, 192),
        (193, 256),  # 256 by 64, 128 or 256: one tile
        (256, 256),
        (300, 64),  # 320 by 64-token tiles, 384 by 96, 128 or 192, 512 by 256
        (4096, 256),
    ],
)
def test_token_tile_pads_the_fewest_tokens_the_larger_tile_on_a_tie(m, tile):
    assert _core.fused_token_tile(m) == tile


def test_token_tile_above_the_decode_kernel_pads_no_more_than_any_other_tile():
    tiles = (64, 96, 128, 192, 256)
    for m in range(33, 1025):
        t = _core.fused_token_tile(m)
        assert t in tiles
        padded = -(-m // t) * t
        assert all(padded <= -(-m // o) * o for o in tiles), (m, t)
        if m <= 256:
            assert m <= t < m + 64, (m, t)  # one token tile holds every token, pads at most 63


def test_decode_token_width_pads_a_block_to_16_or_32():
    got = [_core.fused_decode_token_width(m) for m in (1, 3, 8, 9, 16, 17, 32)]
    assert got == [16, 16, 16, 16, 16, 32, 32]


@pytest.mark.parametrize(
    "m,n,k,resident,splits",
    [
        # CUTLASS kernel (m > 32): up to 4 splits of whole 64-element k-blocks, every CTA resident
        (64, 8192, 4096, 132, 2),  # 64 tiles of 64 tokens x 128 columns x 2 = 128 CTAs
        (128, 8192, 4096, 132, 2),  # 64 tiles of 128 tokens x 128 columns x 2 = 128 CTAs
        (256, 8192, 4096, 132, 2),  # one 256-token tile x 64 column tiles x 2 = 128 CTAs
        (200, 8192, 4096, 100, 1),  # 64 tiles x 2 would exceed 100 resident CTAs
        (300, 1024, 192, 132, 3),  # 5 tiles of 64 tokens x 8: 40 x 3 (192 = 3 k-blocks)
    ],
)
def test_cutlass_splits_fill_the_resident_ctas(m, n, k, resident, splits):
    assert _core.fused_splits(m, n, k, resident) == splits
    assert _core.fused_ctas(m, n, k, resident) == 0  # its grid is its own
    assert _core.fused_shape_problem(m, n, k, splits, 2) == ""


def _decode_shares(tiles, steps, ctas):
    """The decode kernel's division, modelled here: the tiles' K steps in tile-major order cut
    into ``ctas`` contiguous shares, on whole tiles where the tiles are at least the CTAs, on K
    steps otherwise."""
    grain = steps if tiles >= ctas else 1
    grains = tiles * steps // grain
    return [(grains * c // ctas * grain, grains * (c + 1) // ctas * grain) for c in range(ctas)]


def _check_division(m, n, k, ctas):
    """The kernel's division over ``ctas`` CTAs against the model: every share non-empty, equal
    within one grain, every tile's pieces from the consecutive CTAs whose shares cross it.
    Returns the most pieces of a tile."""
    tiles, steps = -(-n // 64), -(-k // 64)
    shares = _decode_shares(tiles, steps, ctas)
    lengths = [end - begin for begin, end in shares]
    grain = steps if tiles >= ctas else 1
    assert min(lengths) >= 1 and max(lengths) - min(lengths) <= grain
    assert shares[-1][1] == tiles * steps
    pieces = _core.fused_decode_pieces(m, n, k, ctas)
    assert len(pieces) == tiles
    for t, (first, count) in enumerate(pieces):
        crossing = [c for c, (b, e) in enumerate(shares) if b < (t + 1) * steps and e > t * steps]
        assert crossing == list(range(first, first + count)), t
    return max(count for _, count in pieces)


@pytest.mark.parametrize(
    "m,n,k,resident,ctas,splits",
    [
        # more tiles than resident CTAs: the fewest CTAs for the fewest rounds, whole tiles each
        (8, 16384, 8192, 132, 128, 1),  # 405B O: 256 tiles, 2 a CTA
        (32, 16384, 26624, 132, 128, 1),  # 405B FC2
        (8, 16896, 8192, 132, 132, 1),  # 264 tiles: 2 a CTA on all 132
        (8, 16448, 8192, 132, 129, 1),  # 257 tiles: 2 rounds on 129 CTAs, 2 or 1 a CTA
        (1, 8192, 14336, 114, 114, 1),  # 128 tiles on 114: 64 CTAs would leave half idle
        (8, 16384, 8192, 140, 128, 1),  # 256 on 140: 128 CTAs of 2 keep 91% busy
        (8, 16384, 8192, 144, 144, 1),  # 256 on 144: 128 would keep 89% busy, all 144 run
        # fewer: every tile in the most equal pieces that keep the CTAs resident (<= 8)
        (8, 8192, 4096, 132, 128, 1),  # 70B O: 128 tiles, one a CTA
        (16, 8192, 14336, 264, 256, 2),  # twice the CTAs: half a tile each
        (1, 4096, 2048, 132, 128, 2),  # 8B O: 64 tiles in halves
        (8, 1024, 4096, 132, 128, 8),  # 16 tiles: the most pieces there are
        (8, 1024, 192, 132, 48, 3),  # k = 3 steps of 64: at most 3 pieces
        (24, 1000, 200, 132, 64, 4),  # a partial tile; k = 200: 4 steps, the last partial
        (3, 1024, 4104, 132, 128, 8),  # 65 K steps in 8 pieces, the last step partial
        (8, 64, 64, 132, 1, 1),  # one unit: one CTA
    ],
)
def test_decode_grid_gives_every_cta_the_same_whole_tiles_or_part_of_one(
    m, n, k, resident, ctas, splits
):
    assert _core.fused_ctas(m, n, k, resident) == ctas
    assert _core.fused_splits(m, n, k, resident) == splits
    assert _check_division(m, n, k, ctas) == splits
    assert _core.fused_shape_problem(m, n, k, splits, 2) == ""
    # the tokens never change them (1..32 tokens are one block): buffers sized once serve all
    assert {_core.fused_splits(t, n, k, resident) for t in (1, 16, 17, 32)} == {splits}
    assert {_core.fused_ctas(t, n, k, resident) for t in (1, 16, 17, 32)} == {ctas}


@pytest.mark.parametrize(
    "m,n,k,ctas",
    [
        (8, 8192, 4096, 132),  # K steps cut in 132 equal shares: most tiles in 2 pieces
        (8, 16384, 8192, 100),  # whole tiles, 2 or 3 a CTA
        (8, 1024, 4104, 100),  # 16 tiles, 65 steps each: shares of 10 or 11 steps
        (24, 1000, 200, 7),  # 64 units in shares of 9 or 10 across tiles
        (8, 1024, 192, 48),  # one unit each
    ],
)
def test_decode_division_holds_for_any_grid(m, n, k, ctas):
    assert 1 <= _check_division(m, n, k, ctas)


def test_decode_pieces_refuse_a_grid_with_an_idle_cta():
    with pytest.raises(ValueError, match=r"ctas=49 must be in 1..48"):
        _core.fused_decode_pieces(8, 1024, 192, 49)
    with pytest.raises(ValueError, match=r"ctas=0 must be in 1.."):
        _core.fused_decode_pieces(8, 1024, 192, 0)


def test_partial_buffers_hold_two_parities_of_every_split():
    # CUTLASS: each rank's own partials, read by the peers: independent of tp
    for tp in (1, 2, 8):
        assert _core.fused_partial_bytes(256, 8192, 2, 2, tp) == 2 * 2 * 256 * 8192 * 2
    # decode: a receive buffer of every rank's partials, 16-byte lines of 4 elements (the
    # data next to the generation: twice the partial's bytes)
    assert _core.FUSED_LINE_BYTES == 16
    for tp in (1, 2, 8):
        lines = 8 * 8192 // 4
        assert _core.fused_partial_bytes(8, 8192, 4, 2, tp) == 2 * tp * 4 * lines * 16
        assert _core.fused_partial_bytes(8, 8192, 4, 2, tp) == 2 * tp * (2 * 4 * 8 * 8192 * 2)
    # the decode kernel's largest case of 405B at TP=2: 32 tokens x 16384 columns, 8 MiB a rank
    assert _core.fused_partial_bytes(32, 16384, 1, 2, 2) == 8 * 2**20
    # the control region: a generation word per CTA slot, a flag section per rank, and the
    # two-shot tail's section of sum flags
    assert _core.FUSED_FLAG_SECTIONS == _core.MAX_TP + 1
    assert _core.FUSED_CONTROL_BYTES == 4 * _core.FUSED_MAX_CTAS + (
        4 * _core.FUSED_MAX_TILES * (_core.MAX_TP + 1)
    )


def test_flag_sections_follow_the_generation_words_apart_and_within_the_region():
    tiles, words = _core.FUSED_MAX_TILES, _core.FUSED_CONTROL_BYTES // 4
    assert _core.fused_flag_word(0, 0) == _core.FUSED_MAX_CTAS  # after the generation words
    assert _core.FUSED_SUM_SECTION == _core.MAX_TP  # after every rank's partial flags
    seen = set()
    for section in range(_core.FUSED_FLAG_SECTIONS):
        first, last = _core.fused_flag_word(section, 0), _core.fused_flag_word(section, tiles - 1)
        assert last - first == tiles - 1
        span = set(range(first, last + 1))
        assert not span & seen, section
        seen |= span
    assert max(seen) == words - 1 and min(seen) == _core.FUSED_MAX_CTAS


def test_tails_are_named_and_two_shot_is_the_cutlass_kernels_only():
    assert _core.FUSED_TAILS == ("one_shot", "two_shot")
    limit = _core.FUSED_DECODE_MAX_TOKENS
    for m in (1, 8, limit, limit + 1, 256, 4096):
        assert _core.fused_tail_problem("one_shot", m) == ""
    for m in (1, limit):
        why = _core.fused_tail_problem("two_shot", m)
        assert "two-shot tail is the CUTLASS kernel's" in why and f"m={m}" in why
    for m in (limit + 1, 128, 300):
        assert _core.fused_tail_problem("two_shot", m) == ""
    assert "tail 'three_shot' is not one of one_shot, two_shot" == _core.fused_tail_problem(
        "three_shot", 64
    )
    with pytest.raises(ValueError, match="tail 'x' is not one of"):
        _core.fused_sum_bytes(64, 1024, 2, "x")


def test_sum_buffers_hold_two_parities_of_the_output_for_two_shot_only():
    for m, n in ((64, 8192), (256, 16384), (33, 1024)):
        assert _core.fused_sum_bytes(m, n, 2, "two_shot") == 2 * m * n * 2
        assert _core.fused_sum_bytes(m, n, 2, "one_shot") == 0


def _owners(m, n, splits, tp):
    """Every slice's owner rank, in the CUTLASS scheduler's walk (token blocks fastest, then n
    blocks, then splits)."""
    nbs, tbs = -(-n // 128), -(-m // _core.fused_token_tile(m))
    return [
        _core.fused_slice_owner(nb, tb, s, nbs, tbs, tp)
        for s in range(splits)
        for nb in range(nbs)
        for tb in range(tbs)
    ]


@pytest.mark.parametrize("tp", (2, 3, 4, 8))
@pytest.mark.parametrize(
    "m,n,splits",
    [(64, 8192, 2), (128, 8192, 2), (256, 16384, 1), (300, 1024, 3), (100, 6144, 4), (33, 128, 1)],
)
def test_every_rank_owns_an_equal_share_of_slices_and_neighbours_differ(m, n, splits, tp):
    owners = _owners(m, n, splits, tp)
    counts = [owners.count(r) for r in range(tp)]
    assert sum(counts) == len(owners) and max(counts) - min(counts) <= 1, counts
    # consecutive slices of the walk (consecutive CTAs of the grid's first round) go to
    # consecutive ranks: a rank's owning CTAs are every tp-th, spread over the SMs
    assert all((b - a) % tp == 1 % tp for a, b in zip(owners, owners[1:]))


def _placed(m, n, splits, tp, tail, itemsize=2, base=1 << 40):
    """Every rank's (partial, sum) addresses and parity bytes as FusedState.place sets them in a
    workspace sized by fused_layout (each rank's region 1 TiB apart)."""
    layout = fused.fused_layout(m, n, splits, itemsize, tp, 0, tail)
    parity = layout["slots_bytes"] // 2 // _core.FUSED_LINE_BYTES * _core.FUSED_LINE_BYTES
    partial = [base * (q + 1) for q in range(tp)]
    off = fused.fused_sum_offset(m, n, splits, itemsize, tp)
    sums = [p + off for p in partial] if tail == "two_shot" else [0] * tp
    return partial, sums, parity


@pytest.mark.parametrize("tp", (2, 3, 4, 8))
@pytest.mark.parametrize("m,n,splits", [(33, 1024, 1), (64, 8192, 2), (256, 16384, 4)])
def test_the_python_placement_passes_the_launchs_sum_buffer_check(m, n, splits, tp):
    for tail in ("one_shot", "two_shot"):
        partial, sums, parity = _placed(m, n, splits, tp, tail)
        problem = _core.fused_sum_buffers_problem("bf16", m, n, splits, tail, partial, sums, parity)
        assert problem == "", (tail, problem)
    # The layout holds both parities of the partials and the sums.
    part = _core.fused_partial_bytes(m, n, splits, 2, tp)
    layout = fused.fused_layout(m, n, splits, 2, tp, 0, "two_shot")
    assert layout["slots_bytes"] >= part + _core.fused_sum_bytes(m, n, 2, "two_shot")


def test_the_sum_buffer_check_refuses_overlaps_missing_and_stray_buffers():
    m, n, splits, tp = 64, 8192, 2, 2
    partial, sums, parity = _placed(m, n, splits, tp, "two_shot")
    check = _core.fused_sum_buffers_problem
    # a sum inside its rank's partials of the same parity, or of the other
    inside = [partial[0] + 16, sums[1]]
    assert "overlap its partial buffers" in check("bf16", m, n, splits, "two_shot", partial,
                                                  inside, parity)  # fmt: skip
    other = [partial[0] + parity, sums[1]]
    assert "rank 0's" in check("bf16", m, n, splits, "two_shot", partial, other, parity)
    # parities too close: parity 1's sum on parity 0's
    assert "overlap" in check("bf16", m, n, splits, "two_shot", partial, sums, 16)
    assert "no two-shot sum buffer of rank 1" in check(
        "bf16", m, n, splits, "two_shot", partial, [sums[0], 0], parity
    )
    assert "not 16-byte aligned" in check(
        "bf16", m, n, splits, "two_shot", partial, [sums[0] + 8, sums[1]], parity
    )
    assert "sum buffer given for the one-shot tail" in check(
        "bf16", m, n, splits, "one_shot", partial, sums, parity
    )


@pytest.mark.parametrize(
    "args,needle",
    [
        ((8, 1020, 4096, 1, 2), "n=1020 and k=4096 must be multiples of 8"),
        ((0, 1024, 4096, 1, 2), "m, n, k must be >= 1, got m=0"),
        ((300, 1024, 4096, 5, 2), "splits=5 must be in 1..4"),
        ((8, 1024, 4096, 9, 2), "splits=9 (pieces per tile) must be in 1..8"),
        ((8, 1024, 128, 3, 2), "at most the 2 K steps of 64 in k=128"),
        ((8, 2**20, 2**17, 1, 2), "more than the 2097152 the decode kernel divides"),
        ((8, 1024, 4096, 1, 99), "tp=99 is not in 1.."),
        ((100000, 65536, 4096, 1, 2), "more than the 4096 flags"),
    ],
)
def test_shape_problems_name_the_constraint_and_the_values(args, needle):
    assert needle in _core.fused_shape_problem(*args)


def test_auto_keeps_other_paths_where_the_kernel_cannot_run(monkeypatch):
    monkeypatch.setattr(_core, "cuda_runtime", True, raising=False)
    # a transposed weight view, or a dtype the kernel has not: the other paths
    path, _ = choose_path(_spec(8, transposed=True), "auto", torch.bfloat16, None)
    assert path != "fused"
    path, _ = choose_path(_spec(8), "auto", torch.float32, None)
    assert path != "fused"


def test_requested_fused_raises_with_the_reason_where_it_cannot_run(monkeypatch):
    monkeypatch.setattr(_core, "cuda_runtime", True, raising=False)
    path, info = choose_path(_spec(8), "fused", torch.bfloat16, None)
    assert (path, info["source"]) == ("fused", "requested")
    with pytest.raises(ValueError, match="transposed view"):
        choose_path(_spec(8, transposed=True), "fused", torch.bfloat16, None)
    monkeypatch.setattr(_core, "cuda_runtime", False, raising=False)
    with pytest.raises(ValueError, match="built without the CUDA runtime"):
        choose_path(_spec(8), "fused", torch.bfloat16, None)
    assert "built without" in fused.fused_problem(_spec(8), torch.bfloat16)


def test_fused_is_a_path_of_gemm_all_reduce_only(monkeypatch):
    for path in ("fused", "fused_two_shot"):
        assert validate.validate_path("gemm_all_reduce", path) == path
        with pytest.raises(ValueError, match=f"path='{path}' is only for gemm_all_reduce"):
            validate.validate_path("all_gather_gemm", path)
        # set for the whole job (DISTGEMM_PATH=fused), the other ops keep "auto"
        monkeypatch.setattr(validate, "DEFAULT_PATH", path)
        assert validate.validate_path("gemm_reduce_scatter", None) == "auto"
        assert validate.validate_path("gemm_all_reduce", None) == path


def test_requested_two_shot_runs_the_fused_path_with_its_tail_above_the_decode_kernel(
    monkeypatch,
):
    monkeypatch.setattr(_core, "cuda_runtime", True, raising=False)
    path, info = choose_path(_spec(64), "fused_two_shot", torch.bfloat16, None)
    assert (path, info["fused_tail"], info["source"]) == ("fused", "two_shot", "requested")
    path, info = choose_path(_spec(64), "fused", torch.bfloat16, None)
    assert (path, info["fused_tail"]) == ("fused", "one_shot")
    limit = _core.FUSED_DECODE_MAX_TOKENS
    with pytest.raises(ValueError, match=r"path='fused_two_shot' cannot run this call: the "
                       r"two-shot tail is the CUTLASS kernel's \(m > 32\)"):  # fmt: skip
        choose_path(_spec(limit), "fused_two_shot", torch.bfloat16, None)
    with pytest.raises(ValueError, match="transposed view"):
        choose_path(_spec(64, transposed=True), "fused_two_shot", torch.bfloat16, None)
    assert fused.fused_problem(_spec(8), torch.bfloat16, "two_shot") != ""
    assert fused.fused_problem(_spec(8), torch.bfloat16) == ""
