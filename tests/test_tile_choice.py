"""The GEMM kernel's tile and configuration choice (kernel/tile_choice.hpp through
_core.choose_tile_n and _core.choose_config): a pure wave model, so the same on every rank and
checkable without a GPU. The runtime runs the configuration it returns
(tests/gpu/test_cpp_bench.py and tests/gpu/test_kernel_gemm.py check that on the GPUs)."""

import math
import random

import pytest

from distgemm import _core
from distgemm.simulate import H200_RESIDENT_CTAS as H200_SLOTS

SEED = 14  # of the random shapes and slot counts


def _model(m, n, l, tile, slots):
    tiles = math.ceil(m / 128) * math.ceil(n / tile) * l
    waves = math.ceil(tiles / slots)
    return tiles, waves, waves * (_core.TILE128_RELATIVE_COST if tile == 128 else 1.0)


@pytest.mark.parametrize(
    "m,n,want",
    [
        (512, 4096, 128),  # a step of 8B O at 1024 tokens, TP=2 S=2: 64 wide tiles, half the GPU
        (1024, 5120, 128),  # 70B QKV's own floor at 1024 tokens: 160 wide tiles = 2 waves
        (8192, 8192, 256),  # 70B O at 8192 tokens: 2048 wide tiles, 15.5 waves either way
        (2048, 8192, 256),  # an S=4 step of it: 3.9 waves of wide tiles
        (8192, 28672, 256),  # 70B FC1's per-rank output
        (2048, 5120, 256),  # 70B QKV step at 4096 tokens, S=2: rated 7% cheaper, not enough
        (512, 28672, 256),  # 70B FC1 step at 1024 tokens, S=2: rated 2% cheaper
        (1024, 9216, 256),  # 405B QKV step at 2048 tokens, S=2: rated 7% cheaper
        (512, 9216, 128),  # 405B QKV step at 1024 tokens, S=2: rated 16% cheaper
    ],
)
def test_llama_shapes(m, n, want):
    got = _core.choose_tile_n(m, n, 1, H200_SLOTS, H200_SLOTS)
    assert got["tile_n"] == want, got


def test_matches_the_wave_model_on_random_shapes():
    """Random shapes and slot counts (seeded): the tile counts, waves and costs are the model's,
    and the choice is 128x128 only where it is rated TILE128_MIN_GAIN cheaper."""
    rng = random.Random(SEED)
    for _ in range(500):
        m, n, l = rng.randint(1, 40000), rng.randint(1, 60000), rng.randint(1, 4)
        s256, s128 = rng.randint(1, 140), rng.randint(1, 140)
        got = _core.choose_tile_n(m, n, l, s256, s128)
        wide, narrow = _model(m, n, l, 256, s256), _model(m, n, l, 128, s128)
        assert (got["n256"]["tiles"], got["n256"]["waves"]) == wide[:2]
        assert (got["n128"]["tiles"], got["n128"]["waves"]) == narrow[:2]
        assert got["n256"]["cost"] == pytest.approx(wide[2])
        assert got["n128"]["cost"] == pytest.approx(narrow[2])
        cheaper = narrow[2] < (1 - _core.TILE128_MIN_GAIN) * wide[2]
        assert got["tile_n"] == (128 if cheaper else 256), (m, n, l, s256, s128)


def test_fewer_resident_ctas_can_flip_the_choice():
    # 66 wide tiles fill 66 slots in one wave; with 132 slots the 132 narrow tiles are one wave
    # of half-cost tiles: 128 wins. With 66 slots for the narrow kernel they take 2 waves.
    assert _core.choose_tile_n(128 * 66, 256, 1, 66, 132)["tile_n"] == 128
    assert _core.choose_tile_n(128 * 66, 256, 1, 66, 66)["tile_n"] == 256


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(m=0, n=4096), "m=0"),
        (dict(m=512, n=4096, l=0), "l=0"),
        (dict(m=512, n=4096, slots_n128=0), "slots_n128=0"),
    ],
)
def test_bad_arguments_name_the_values(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        _core.choose_tile_n(**kwargs)


# The kernel configurations (kernel/tile_choice.hpp's kConfigs through _core.choose_config): the
# same waves x tile cost model over every configuration of the dtype, tiles counted after
# CUTLASS's padding of the grid to the cluster (and swizzle x cluster) in each mode.
BF16 = ["128x256", "128x128", "128x128c1", "256x192"]
FP16 = ["128x256", "128x128"]


def _padded_tiles(m, n, l, cfg, swizzle):
    tm, tn = math.ceil(m / cfg["tile_m"]), math.ceil(n / cfg["tile_n"])
    sw = swizzle
    while sw > 1 and (tm % (sw * cfg["cluster_m"]) or tn % (sw * cfg["cluster_n"])):
        sw //= 2
    um, un = sw * cfg["cluster_m"], sw * cfg["cluster_n"]
    return math.ceil(tm / um) * um * math.ceil(tn / un) * un * l


def _config_model(m, n, l, names, slots, swizzle):
    table = _core.gemm_config_table()
    est = {}
    for c in names:
        tiles = _padded_tiles(m, n, l, table[c], swizzle)
        waves = math.ceil(tiles / slots[c])
        cost = waves * table[c]["relative_cost"]
        if table[c]["stream_k"] and tiles % slots[c]:
            # the partial last wave's work spread over every CTA, plus the fixup; not below one
            # full wave
            cost = (tiles / slots[c] + _core.STREAM_K_FIXUP_WAVES) * table[c]["relative_cost"]
            cost = math.inf if tiles < slots[c] else cost
        est[c] = (tiles, waves, cost)
    # each configuration competes only where it beats the default by its own margin
    first = est[names[0]][2]
    eligible = [c for c in names if c == names[0] or est[c][2] < (1 - table[c]["min_gain"]) * first]
    return est, min(eligible, key=lambda c: (est[c][2], names.index(c)))


def test_config_names_per_dtype_and_b_layout():
    assert _core.gemm_config_names("bf16") == BF16
    assert _core.gemm_config_names("bfloat16") == BF16
    assert _core.gemm_config_names("fp16") == FP16  # the bf16-only configurations are not offered
    assert _core.gemm_config_names("bf16", b_n_major=True) == ["128x256"]
    table = _core.gemm_config_table()
    assert [c for c in table if table[c]["bf16_only"]] == ["128x128c1", "256x192", "128x256sk"]
    assert [c for c in table if table[c]["stream_k"]] == ["128x256sk"]
    # the stream-K configuration needs a workspace: offered only to a caller that has one
    assert _core.gemm_config_names("bf16", stream_k=True) == BF16 + ["128x256sk"]
    assert _core.gemm_config_names("fp16", stream_k=True) == FP16
    assert _core.gemm_config_names("bf16", b_n_major=True, stream_k=True) == ["128x256"]
    shapes = {
        c: (t["tile_m"], t["tile_n"], t["cluster_m"], t["cluster_n"]) for c, t in table.items()
    }
    assert shapes == {
        "128x256": (128, 256, 2, 1),
        "128x128": (128, 128, 2, 1),
        "128x128c1": (128, 128, 1, 1),
        "256x192": (256, 192, 1, 2),
        "128x256sk": (128, 256, 2, 1),
        "e4m3_128x192": (128, 192, 2, 1),
        "e4m3_128x256fa": (128, 256, 2, 1),
    }  # fmt: skip
    assert table["128x128"]["relative_cost"] == _core.TILE128_RELATIVE_COST
    with pytest.raises(ValueError, match="dtype 'fp32'"):
        _core.gemm_config_names("fp32")


@pytest.mark.parametrize(
    "m,n,dtype,want",
    [
        # decode, 405B O (n=16384): one 128-row M tile. Cluster 2x1 pads it to two, so 128x128
        # needs 256 tiles (2 waves); cluster 1x1 runs 128 tiles in one.
        (8, 16384, "bf16", "128x128c1"),
        (8, 16384, "fp16", "128x256"),  # fp16 has no cluster-1x1 kernel: 64 (padded 128) tiles
        # 32 N tiles: 128x128 with cluster 2x1 also fits one wave (64 real + 64 padding tiles)
        # and its tile is rated cheaper than cluster 1x1's
        (8, 8192, "bf16", "128x128"),
        # 33 M tiles: the 2x1 padding to 34 x 8 = 272 tiles makes 3 waves, 264 unpadded make 2
        (128 * 33, 1024, "bf16", "128x128c1"),
        (512, 4096, "bf16", "128x128"),  # the narrow tile's case of old: one wave either way
        (4096, 8192, "bf16", "128x256"),  # 70B O at 4096 tokens, TP=2: full grid, 8 waves
        (8192, 8192, "bf16", "128x256"),  # 256x192: 11 waves x 1.5 against 16: the default stays
        (8192, 28672, "bf16", "256x192"),  # 70B FC1, 8192 tokens: 37 x 1.44 against 55 waves
    ],
)
def test_config_choice_on_llama_shapes(m, n, dtype, want):
    got = _core.choose_config(m, n, 1, dtype, slots=H200_SLOTS)
    assert got["config"] == want, got
    assert got["candidates"] == (BF16 if dtype == "bf16" else FP16)


def test_config_estimates_count_cluster_padding():
    got = _core.choose_config(8, 16384, slots=132)
    assert (got["128x256"]["tiles"], got["128x256"]["waves"]) == (128, 1)  # 1 M tile padded to 2
    assert (got["128x128"]["tiles"], got["128x128"]["waves"]) == (256, 2)
    assert (got["128x128c1"]["tiles"], got["128x128c1"]["waves"]) == (128, 1)
    assert (got["256x192"]["tiles"], got["256x192"]["waves"]) == (86, 1)  # 86 N tiles, even
    # a 1x2 cluster pads N: 3 N tiles of 192 run as 4
    assert _core.choose_config(256, 576, slots=132)["256x192"]["tiles"] == 4
    # swizzle 1 pads only to the cluster; a larger swizzle is lowered until it divides the grid
    assert _core.choose_config(128 * 3, 256, swizzle=1)["128x256"]["tiles"] == 4
    assert _core.choose_config(1024, 4096, swizzle=8)["128x256"]["tiles"] == 8 * 16


def test_config_choice_matches_the_model_on_random_shapes():
    """Random shapes, slot counts and swizzles (seeded): the tiles, waves and costs are the
    model's, and the choice is the cheapest configuration among those that beat the default by
    their min_gain; fp16 never gets a bf16-only configuration."""
    rng = random.Random(SEED + 1)
    for _ in range(500):
        m, n, l = rng.randint(1, 40000), rng.randint(1, 60000), rng.randint(1, 4)
        swizzle = rng.choice([1, 2, 4, 8])
        for dtype, names in (("bf16", BF16), ("fp16", FP16)):
            slots = {c: rng.randint(1, 140) for c in names}
            got = _core.choose_config(m, n, l, dtype, slots=slots, swizzle=swizzle)
            est, want = _config_model(m, n, l, names, slots, swizzle)
            for c in names:
                assert (got[c]["tiles"], got[c]["waves"]) == est[c][:2], (m, n, l, c)
                assert got[c]["cost"] == pytest.approx(est[c][2])
            assert got["config"] == want, (m, n, l, dtype, slots, swizzle)


@pytest.mark.parametrize(
    "m,n,want",
    [
        # 70B QKV at 1024 tokens, TP=2: 8 x 20 tiles of 128x256 = 160 for 132 SMs. Data-parallel
        # runs 2 waves (the second 21% full); stream-K spreads it: 1.21 + fixup = 1.46; but
        # 4 x 28 tiles of 256x192 fit one wave at 1.44 (measured fastest too: 0.146 ms against
        # stream-K's 0.150, benchmarks/results/2026-11-24-256x192.md)
        (1024, 5120, "256x192"),
        # 405B QKV at 1024 tokens: 8 x 36 = 288 tiles, 2.18 waves against 3
        (1024, 9216, "128x256sk"),
        # 70B O at 4096 tokens: 1024 tiles, 7.76 waves against 8: within the 10% margin
        (4096, 8192, "128x256"),
        # 8B QKV at 1024 tokens, TP=4: 48 tiles, below one wave: a smaller data-parallel tile
        (1024, 1536, "128x128"),
        # 70B QKV at 1024 tokens, TP=4: 80 tiles, below one wave
        (1024, 2560, "128x256"),
        # decode, 405B O: 128 cluster-1x1 tiles fill one wave at 0.60 of a wide tile's cost
        (8, 16384, "128x128c1"),
    ],
)
def test_stream_k_where_the_last_wave_is_partial(m, n, want):
    got = _core.choose_config(m, n, 1, "bf16", slots=H200_SLOTS, stream_k=True)
    assert got["config"] == want, got
    assert got["candidates"] == BF16 + ["128x256sk"]
    # without a workspace the model never picks it
    assert _core.choose_config(m, n, 1, "bf16", slots=H200_SLOTS)["config"] != "128x256sk"


def test_stream_k_choice_matches_the_model_on_random_shapes():
    rng = random.Random(SEED + 2)
    names = BF16 + ["128x256sk"]
    for _ in range(500):
        m, n, l = rng.randint(1, 40000), rng.randint(1, 60000), rng.randint(1, 4)
        swizzle = rng.choice([1, 2, 4, 8])
        slots = {c: rng.randint(1, 140) for c in names}
        got = _core.choose_config(m, n, l, "bf16", slots=slots, swizzle=swizzle, stream_k=True)
        est, want = _config_model(m, n, l, names, slots, swizzle)
        for c in names:
            assert (got[c]["tiles"], got[c]["waves"]) == est[c][:2], (m, n, l, c)
            assert got[c]["cost"] == pytest.approx(est[c][2])
        assert got["config"] == want, (m, n, l, slots, swizzle)


def test_n_major_b_has_one_config():
    got = _core.choose_config(8, 16384, b_n_major=True)
    assert got["config"] == "128x256" and got["candidates"] == ["128x256"]


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(m=0, n=4096), "m=0"),
        (dict(m=512, n=4096, swizzle=0), "swizzle=0"),
        (dict(m=512, n=4096, slots=0), "slots of config 128x256 is 0"),
        (dict(m=512, n=4096, slots={"128x256": 132}), "no entry for config 128x128"),
        (dict(m=512, n=4096, dtype="fp8"), "dtype 'fp8'"),
    ],
)
def test_choose_config_bad_arguments_name_the_values(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        _core.choose_config(**kwargs)


# Measured (benchmarks/results/2026-11-24-fp8-split-promotion.md, one H200, 132 resident CTAs):
# (config, m, n, the faster raster, 0 where the two were within 0.5%).
MEASURED_RASTER = [
    ("128x256", 8192, 5120, 0),
    ("e4m3_128x192", 8192, 5120, 2),
    ("128x256", 8192, 8192, 0),
    ("e4m3_128x192", 8192, 8192, 2),
    ("256x192", 8192, 28672, 1),
    ("e4m3_128x192", 8192, 28672, 2),
    ("256x192", 8192, 9216, 1),
    ("e4m3_128x192", 8192, 9216, 0),
    ("256x192", 8192, 16384, 1),
    ("e4m3_128x192", 8192, 16384, 2),
    ("128x256", 4096, 5120, 0),
    ("e4m3_128x192", 4096, 5120, 1),
    ("128x256", 4096, 8192, 0),
    ("e4m3_128x192", 4096, 8192, 1),
    ("128x256", 4096, 16384, 0),
    ("e4m3_128x192", 4096, 16384, 1),
    ("256x192", 8192, 53248, 1),
    ("e4m3_128x192", 8192, 53248, 2),
    ("e4m3_128x192", 8192, 57344, 1),
    ("e4m3_128x192", 8192, 10240, 2),
]


def _cutlass_heuristic(config, m, n):
    t = _core.gemm_config_table()[config]
    return 1 if math.ceil(n / t["tile_n"]) > math.ceil(m / t["tile_m"]) else 2


@pytest.mark.parametrize("config,m,n,faster", MEASURED_RASTER)
def test_raster_choice_runs_the_measured_faster_order(config, m, n, faster):
    got = _core.choose_raster(config, m, n, slots=132)
    runs = got["raster"] or _cutlass_heuristic(config, m, n)
    assert faster in (0, runs), got


def _wave_rows(config, m, n, slots, swizzle, raster):
    """The model written out: the tiles one wave covers, walked as CUTLASS's scheduler does."""
    t = _core.gemm_config_table()[config]
    tm, tn = math.ceil(m / t["tile_m"]), math.ceil(n / t["tile_n"])
    cm, cn = t["cluster_m"], t["cluster_n"]
    sw = swizzle
    while sw > 1 and (tm % (sw * cm) or tn % (sw * cn)):
        sw //= 2
    covered = set()
    clusters = slots // (cm * cn)
    # cluster index -> (m tile, n tile) of its first CTA, swizzle groups along the minor mode
    cl_m, cl_n = -(-tm // cm), -(-tn // cn)  # modes in clusters, padded
    minor_n, major_n = (cl_m, cl_n) if raster == 2 else (cl_n, cl_m)
    for cid in range(clusters):
        group, rest = divmod(cid, sw * major_n)
        major, offset = divmod(rest, sw)
        minor = group * sw + offset
        if minor >= minor_n:
            break
        mi, ni = (minor, major) if raster == 2 else (major, minor)
        for a in range(cm):
            for b in range(cn):
                covered.add((mi * cm + a, ni * cn + b))
    rows_m = len({x for x, _ in covered if x < tm})
    rows_n = len({y for _, y in covered if y < tn})
    return rows_m * t["tile_m"] + rows_n * t["tile_n"]


@pytest.mark.parametrize("config,m,n,faster", MEASURED_RASTER)
def test_wave_rows_match_a_walk_of_the_scheduler(config, m, n, faster):
    got = _core.choose_raster(config, m, n, slots=132)
    assert got["rows_along_m"] == _wave_rows(config, m, n, 132, 8, 1)
    assert got["rows_along_n"] == _wave_rows(config, m, n, 132, 8, 2)


def test_small_grids_keep_cutlass_heuristic():
    # A grid of less than one wave: both orders cover every tile, nothing to choose.
    for config in ("128x256", "e4m3_128x192", "128x128"):
        assert _core.choose_raster(config, 1024, 2048)["raster"] == 0


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(config="nope", m=128, n=128), "config 'nope' names no kernel"),
        (dict(config="auto", m=128, n=128), "'auto'"),
        (dict(config="128x256", m=0, n=128), "m=0"),
        (dict(config="128x256", m=128, n=128, slots=0), "slots=0"),
    ],
)
def test_choose_raster_bad_arguments_name_the_values(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        _core.choose_raster(**kwargs)


def test_wave_rows_match_the_walk_on_random_shapes():
    rng = random.Random(SEED)
    configs = list(_core.gemm_config_table())
    for _ in range(300):
        config = rng.choice(configs)
        m, n = rng.randrange(1, 20000), 8 * rng.randrange(1, 8000)
        slots, swizzle = rng.choice([66, 114, 132]), rng.choice([1, 2, 4, 8])
        got = _core.choose_raster(config, m, n, slots=slots, swizzle=swizzle)
        for raster, key in ((1, "rows_along_m"), (2, "rows_along_n")):
            assert got[key] == _wave_rows(config, m, n, slots, swizzle, raster), (config, m, n)
