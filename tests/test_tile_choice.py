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
# same waves x tile cost model over every configuration of the dtype, tiles counted after the
# scheduler's padding of the grid to the cluster (stream-K: swizzle x cluster) in each mode.
BF16 = ["128x256", "128x128", "128x128c1", "256x192"]
FP16 = ["128x256", "128x128"]
SK = ["128x256sk", "128x128sk"]


def _scheduler_swizzle(cfg, tm, tn, swizzle):
    """The swizzle the scheduler runs: as asked for by the data-parallel walk; for CUTLASS's
    stream-K scheduler, which pads to swizzle x cluster, lowered until it divides the grid."""
    sw = swizzle
    while (
        cfg["stream_k"]
        and sw > 1
        and (tm % (sw * cfg["cluster_m"]) or tn % (sw * cfg["cluster_n"]))
    ):
        sw //= 2
    return sw


def _padded_tiles(m, n, l, cfg, swizzle):
    tm, tn = math.ceil(m / cfg["tile_m"]), math.ceil(n / cfg["tile_n"])
    # the data-parallel tile walk pads only to the cluster, stream-K to swizzle x cluster
    sw = _scheduler_swizzle(cfg, tm, tn, swizzle) if cfg["stream_k"] else 1
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
            # the partial last wave's work spread over every CTA, plus the fixup; not below half
            # a wave
            cost = (tiles / slots[c] + _core.STREAM_K_FIXUP_WAVES) * table[c]["relative_cost"]
            cost = math.inf if 2 * tiles < slots[c] else cost
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
    assert [c for c in table if table[c]["bf16_only"]] == ["128x128c1", "256x192"] + SK
    assert [c for c in table if table[c]["stream_k"]] == SK
    # the stream-K configurations need a workspace: offered only to a caller that has one
    assert _core.gemm_config_names("bf16", stream_k=True) == BF16 + SK
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
        "128x128sk": (128, 128, 2, 1),
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
        # 70B O at 8192 tokens, TP=1: 11 waves of 256x192 x 1.40 = 15.4 against 16 x 0.97 = 15.5
        # (measured 1.3% faster, benchmarks/results/2026-11-24-tile-walk.md)
        (8192, 8192, "bf16", "256x192"),
        (8192, 28672, "bf16", "256x192"),  # 70B FC1, 8192 tokens: 37 x 1.40 against 55 waves
        (4096, 5120, "bf16", "128x256"),  # 70B QKV, 4096 tokens: 4 x 1.40 against 5 x 0.97
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
    # the data-parallel walk pads only to the cluster, whatever the swizzle
    for swizzle in (1, 8):
        assert _core.choose_config(128 * 3, 256, swizzle=swizzle)["128x256"]["tiles"] == 4
        assert _core.choose_config(128 * 9, 256 * 5, swizzle=swizzle)["128x256"]["tiles"] == 50
    # CUTLASS's stream-K scheduler pads to swizzle x cluster, so its swizzle is lowered until it
    # divides the grid: 10 x 5 tiles run with swizzle 1
    got = _core.choose_config(128 * 10, 256 * 5, swizzle=8, stream_k=True)
    assert got["128x256sk"]["tiles"] == 50


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
        # 4 x 28 tiles of 256x192 fit one wave at 1.40 (measured fastest too: 0.146 ms against
        # stream-K's 0.150, benchmarks/results/2026-11-24-256x192.md)
        (1024, 5120, "256x192"),
        # 405B QKV at 1024 tokens: 8 x 36 = 288 tiles, 2.18 waves against 3 (0.986 of torch.mm's
        # time against 256x192's 1.107, benchmarks/results/2026-11-24-stream-k-decomposition.md)
        (1024, 9216, "128x256sk"),
        # 70B O at 4096 tokens: 1024 tiles, 7.76 waves against 8: within the 10% margin
        (4096, 8192, "128x256"),
        # 8B QKV at 1024 tokens, TP=4: 48 tiles of 128x256, 96 of 128x128: stream-K at 0.73
        # waves + 0.30 does not beat one data-parallel wave of the smaller tile (measured 1.26
        # against 1.40-1.73)
        (1024, 1536, "128x128"),
        # 70B QKV at 1024 tokens, TP=4: 160 tiles of 128x128, 1.21 waves + 0.30 at 0.58 (measured
        # 1.16 against 128x256's 1.28)
        (1024, 2560, "128x128sk"),
        # 70B QKV at 1024 tokens, TP=8: 80 tiles of 128x128, 0.61 waves + 0.30 at 0.58 against a
        # data-parallel wave at 0.56 (measured 1.25 against 1.35)
        (1024, 1280, "128x128sk"),
        # 8B QKV at 1024 tokens, TP=8: 48 tiles of 128x128, below half a wave
        (1024, 768, "128x128"),
        # decode, 405B O: 128 cluster-1x1 tiles fill one wave at 0.60 of a wide tile's cost
        (8, 16384, "128x128c1"),
    ],
)
def test_stream_k_where_the_last_wave_is_partial(m, n, want):
    got = _core.choose_config(m, n, 1, "bf16", slots=H200_SLOTS, stream_k=True)
    assert got["config"] == want, got
    assert got["candidates"] == BF16 + SK
    # without a workspace the model never picks them
    assert _core.choose_config(m, n, 1, "bf16", slots=H200_SLOTS)["config"] not in SK


def test_stream_k_choice_matches_the_model_on_random_shapes():
    rng = random.Random(SEED + 2)
    names = BF16 + SK
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


# Measured, swizzle 8, both rasters interleaved against cuBLAS on one H200 (132 resident CTAs):
# (config, m, n, k, the faster raster, 0 where the two ran within 1%). The 128x256 shapes whose
# grid swizzle 8 divides: benchmarks/results/2026-11-24-fp8-split-promotion.md (within 0.5%);
# the rest with the unpadded walk: benchmarks/results/2026-11-24-tile-walk.md (calls 1, 2).
MEASURED_RASTER = [
    ("128x256", 8192, 8192, 4096, 0),  # 70B/O/8192/TP2
    ("128x256", 4096, 8192, 4096, 0),  # 70B/O/4096/TP2
    ("128x256", 4096, 16384, 8192, 0),  # 405B/O/4096/TP2
    ("e4m3_128x192", 4096, 5120, 8192, 0),  # 70B/QKV/4096/TP2, r1/r2 1.006
    ("128x256", 4096, 5120, 8192, 0),  # 70B/QKV/4096/TP2, r1/r2 0.998
    ("e4m3_128x192", 4096, 8192, 4096, 0),  # 70B/O/4096/TP2, r1/r2 1.000
    ("e4m3_128x192", 4096, 28672, 8192, 2),  # 70B/FC1/4096/TP2, r1/r2 1.012
    ("e4m3_128x192", 4096, 8192, 14336, 0),  # 70B/FC2/4096/TP2, r1/r2 1.003
    ("e4m3_128x192", 8192, 5120, 8192, 0),  # 70B/QKV/8192/TP2, r1/r2 1.009
    ("128x256", 8192, 5120, 8192, 0),  # 70B/QKV/8192/TP2, r1/r2 1.001
    ("e4m3_128x192", 8192, 8192, 4096, 2),  # 70B/O/8192/TP2, r1/r2 1.020
    ("e4m3_128x192", 8192, 28672, 8192, 0),  # 70B/FC1/8192/TP2, r1/r2 1.006
    ("256x192", 8192, 28672, 8192, 0),  # 70B/FC1/8192/TP2, r1/r2 1.000
    ("e4m3_128x192", 8192, 8192, 14336, 0),  # 70B/FC2/8192/TP2, r1/r2 1.006
    ("e4m3_128x192", 4096, 9216, 16384, 0),  # 405B/QKV/4096/TP2, r1/r2 1.005
    ("e4m3_128x192", 4096, 16384, 8192, 2),  # 405B/O/4096/TP2, r1/r2 1.016
    ("e4m3_128x192", 4096, 53248, 16384, 2),  # 405B/FC1/4096/TP2, r1/r2 1.013
    ("256x192", 4096, 53248, 16384, 0),  # 405B/FC1/4096/TP2, r1/r2 1.000
    ("e4m3_128x192", 4096, 16384, 26624, 2),  # 405B/FC2/4096/TP2, r1/r2 1.012
    ("e4m3_128x192", 8192, 9216, 16384, 0),  # 405B/QKV/8192/TP2, r1/r2 1.002
    ("e4m3_128x192", 8192, 16384, 8192, 0),  # 405B/O/8192/TP2, r1/r2 1.009
    ("256x192", 8192, 16384, 8192, 0),  # 405B/O/8192/TP2, r1/r2 1.007
    ("e4m3_128x192", 8192, 53248, 16384, 0),  # 405B/FC1/8192/TP2, r1/r2 1.000
    ("256x192", 8192, 53248, 16384, 0),  # 405B/FC1/8192/TP2, r1/r2 0.999
    ("e4m3_128x192", 8192, 16384, 26624, 0),  # 405B/FC2/8192/TP2, r1/r2 1.007
    ("256x192", 8192, 16384, 26624, 0),  # 405B/FC2/8192/TP2, r1/r2 1.002
    ("e4m3_128x192", 8192, 57344, 8192, 0),  # 70B/FC1/8192/TP1, r1/r2 1.003
    ("256x192", 8192, 57344, 8192, 0),  # 70B/FC1/8192/TP1, r1/r2 1.001
    ("e4m3_128x192", 8192, 10240, 8192, 2),  # 70B/QKV/8192/TP1, r1/r2 1.012
    # call 2: bf16 local sweep GEMMs where the DRAM rule overrides CUTLASS's heuristic
    ("128x256", 4096, 28672, 4096, 0),  # 8B/FC1/M4096/TP1, r1/r2 1.007
    ("256x192", 16384, 6144, 4096, 0),  # 8B/QKV/M16384/TP1, r1/r2 0.995
    ("128x256", 1024, 8192, 28672, 0),  # 70B/FC2/M1024/TP1, r1/r2 1.000
    ("128x256", 4096, 10240, 8192, 2),  # 70B/QKV/M4096/TP1, r1/r2 1.016
    ("128x256", 1024, 16384, 16384, 2),  # 405B/O/M1024/TP1, r1/r2 1.016
    ("256x192", 2048, 18432, 16384, 2),  # 405B/QKV/M2048/TP1, r1/r2 1.015
    ("128x256", 2048, 16384, 53248, 0),  # 405B/FC2/M2048/TP1, r1/r2 1.007
    ("128x256", 4096, 16384, 53248, 0),  # 405B/FC2/M4096/TP1, r1/r2 1.000
    ("128x256", 8192, 4096, 7168, 0),  # 8B/FC2/M8192/TP2, r1/r2 1.000
    ("128x256", 2048, 28672, 8192, 2),  # 70B/FC1/M2048/TP2, r1/r2 1.022
    ("128x256", 1024, 53248, 16384, 0),  # 405B/FC1/M1024/TP2, r1/r2 1.006
    ("128x256", 2048, 16384, 8192, 0),  # 405B/O/M2048/TP2, r1/r2 1.003
    ("128x256", 4096, 16384, 8192, 0),  # 405B/O/M4096/TP2, r1/r2 1.005
    ("128x256", 16384, 4096, 3584, 0),  # 8B/FC2/M16384/TP4, r1/r2 0.998
    ("128x256", 1024, 26624, 16384, 2),  # 405B/FC1/M1024/TP4, r1/r2 1.017
    ("128x256", 2048, 16384, 13312, 2),  # 405B/FC2/M2048/TP4, r1/r2 1.016
    ("256x192", 8192, 4608, 16384, 1),  # 405B/QKV/M8192/TP4, r1/r2 0.983
    ("128x256", 2048, 13312, 16384, 2),  # 405B/FC1/M2048/TP8, r1/r2 1.011
    ("128x256", 4096, 16384, 6656, 2),  # 405B/FC2/M4096/TP8, r1/r2 1.015
]


def _cutlass_heuristic(config, m, n):
    t = _core.gemm_config_table()[config]
    return 1 if math.ceil(n / t["tile_n"]) > math.ceil(m / t["tile_m"]) else 2


@pytest.mark.parametrize("config,m,n,k,faster", MEASURED_RASTER)
def test_raster_choice_runs_the_measured_faster_order(config, m, n, k, faster):
    got = _core.choose_raster(config, m, n, k, slots=132)
    runs = got["raster"] or _cutlass_heuristic(config, m, n)
    assert faster in (0, runs), got


def _walk(minor_n, major_n, sw, cid):
    """Cluster `cid` of a tile walk, as the kernels number them: the data-parallel scheduler's
    groups of `sw` minor clusters (the last one narrower), each walked minor-first."""
    group, rest = divmod(cid, sw * major_n)
    width = min(sw, minor_n - group * sw)
    major, offset = divmod(rest, width)
    return group * sw + offset, major


def _wave_rows(config, m, n, slots, swizzle, raster):
    """The model written out: the tiles one wave covers, walked as the kernel's scheduler does."""
    t = _core.gemm_config_table()[config]
    tm, tn = math.ceil(m / t["tile_m"]), math.ceil(n / t["tile_n"])
    cm, cn = t["cluster_m"], t["cluster_n"]
    sw = _scheduler_swizzle(t, tm, tn, swizzle)
    cl_m, cl_n = -(-tm // cm), -(-tn // cn)  # modes in clusters, padded
    minor_n, major_n = (cl_m, cl_n) if raster == 2 else (cl_n, cl_m)
    if t["stream_k"]:  # CUTLASS's scheduler pads the minor mode to a multiple of the swizzle
        minor_n = -(-minor_n // sw) * sw
    covered = set()
    for cid in range(min(slots // (cm * cn), minor_n * major_n)):
        minor, major = _walk(minor_n, major_n, sw, cid)
        mi, ni = (minor, major) if raster == 2 else (major, minor)
        for a in range(cm):
            for b in range(cn):
                covered.add((mi * cm + a, ni * cn + b))
    rows_m = len({x for x, _ in covered if x < tm})
    rows_n = len({y for _, y in covered if y < tn})
    return rows_m * t["tile_m"] + rows_n * t["tile_n"]


@pytest.mark.parametrize("config,m,n,k,faster", MEASURED_RASTER)
def test_wave_rows_match_a_walk_of_the_scheduler(config, m, n, k, faster):
    got = _core.choose_raster(config, m, n, k, slots=132)
    assert got["rows_along_m"] == _wave_rows(config, m, n, 132, 8, 1)
    assert got["rows_along_n"] == _wave_rows(config, m, n, 132, 8, 2)


def test_small_grids_keep_cutlass_heuristic():
    # A grid of less than one wave: both orders cover every tile, nothing to choose.
    for config in ("128x256", "e4m3_128x192", "128x128"):
        assert _core.choose_raster(config, 1024, 2048, 1024)["raster"] == 0


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(config="nope", m=128, n=128, k=64), "config 'nope' names no kernel"),
        (dict(config="auto", m=128, n=128, k=64), "'auto'"),
        (dict(config="128x256", m=0, n=128, k=64), "m=0"),
        (dict(config="128x256", m=128, n=128, k=0), "k=0"),
        (dict(config="128x256", m=128, n=128, k=64, slots=0), "slots=0"),
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
        got = _core.choose_raster(config, m, n, 4096, slots=slots, swizzle=swizzle)
        for raster, key in ((1, "rows_along_m"), (2, "rows_along_n")):
            assert got[key] == _wave_rows(config, m, n, slots, swizzle, raster), (config, m, n)


def _dram_rows(config, m, n, k, swizzle, raster):
    """The DRAM model written out: each group of `swizzle` minor clusters reads its slice of the
    minor operand once and the whole major operand once, unless that fits in L2."""
    t = _core.gemm_config_table()[config]
    tm, tn = math.ceil(m / t["tile_m"]), math.ceil(n / t["tile_n"])
    sw = _scheduler_swizzle(t, tm, tn, swizzle)
    row_bytes = k * (1 if t["e4m3"] else 2)
    if raster == 2:
        minor_rows, major_rows, groups = m, n, math.ceil(tm / (sw * t["cluster_m"]))
    else:
        minor_rows, major_rows, groups = n, m, math.ceil(tn / (sw * t["cluster_n"]))
    if major_rows * row_bytes <= _core.L2_RESIDENT_OPERAND_BYTES:
        groups = 1
    return minor_rows + major_rows * groups


def test_dram_rows_match_the_model_on_random_shapes():
    rng = random.Random(SEED + 1)
    configs = list(_core.gemm_config_table())
    for _ in range(300):
        config = rng.choice(configs)
        m, n, k = rng.randrange(1, 20000), 8 * rng.randrange(1, 8000), 8 * rng.randrange(1, 4000)
        swizzle = rng.choice([1, 2, 4, 8])
        got = _core.choose_raster(config, m, n, k, swizzle=swizzle)
        for raster, key in ((1, "dram_rows_along_m"), (2, "dram_rows_along_n")):
            assert got[key] == _dram_rows(config, m, n, k, swizzle, raster), (config, m, n, k)


def test_dram_rows_decide_where_the_waves_tie():
    # fp8 70B O at TP=2, 8192 tokens (8192 x 8192 x 4096): both waves read about as many rows;
    # along N the weight is read once per group of 16 M tiles (4 groups), along M the
    # activations once per group of 8 N tiles (6 groups): along N reads 40960 rows, along M 57344
    got = _core.choose_raster("e4m3_128x192", 8192, 8192, 4096)
    assert got["dram_rows_along_n"] == 8192 + 8192 * 4
    assert got["dram_rows_along_m"] == 8192 + 8192 * 6
    assert got["raster"] == 2
    # an operand that fits in L2 is read once in either order: 512 rows of an 8192-wide fp8 A
    # (4 MiB), so a decode-sized step keeps CUTLASS's heuristic
    small = _core.choose_raster("e4m3_128x192", 512, 57344, 8192)
    assert small["dram_rows_along_m"] == 57344 + 512
    assert small["raster"] == 0


def test_walk_visits_every_cluster_once():
    """The device scheduler's tile order (walk_clusters is the function it calls): a permutation
    of the cluster grid for any group, with CUTLASS's order where the group divides the grid."""
    rng = random.Random(SEED)
    for _ in range(200):
        minor, major, group = rng.randrange(1, 70), rng.randrange(1, 70), rng.choice([1, 2, 4, 8])
        got = _core.walk_clusters(minor, major, group)
        assert sorted(got) == [(a, b) for a in range(minor) for b in range(major)], (
            minor,
            major,
            group,
        )
        assert got == [_walk(minor, major, group, i) for i in range(minor * major)]
        if minor % group == 0:  # CUTLASS: offset i % g, major (i / g) % major, group i / (g major)
            want = [
                ((i // (group * major)) * group + i % group, (i // group) % major)
                for i in range(minor * major)
            ]
            assert got == want


def test_walk_narrows_the_last_group():
    # 3 minor clusters in groups of 2: the first group walks (0,0) (1,0) (0,1) (1,1), the last
    # one column (2,0) (2,1), with no padding visits
    assert _core.walk_clusters(3, 2, 2) == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (2, 1)]


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(minor=0, major=2, group=1), "minor=0"),
        (dict(minor=2, major=2, group=0), "group=0"),
        (dict(minor=1 << 13, major=1 << 12, group=8), "2\\^24"),
    ],
)
def test_walk_clusters_bad_arguments_name_the_values(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        _core.walk_clusters(**kwargs)


def test_unpadded_swizzle_reads_fewer_rows_than_swizzle_one():
    # fp8 70B QKV at TP=2 (8192 x 5120): 27 N tiles of 192, which no swizzle above 1 divides.
    # Swizzle 8 without padding still groups 8 (then 3) N clusters: a wave of 66 clusters spans
    # 8 N tiles and 9 M-tile pairs; with swizzle 1 it spans all 64 M tiles and 3 N tiles
    got = _core.choose_raster("e4m3_128x192", 8192, 5120, 8192, slots=132, swizzle=8)
    one = _core.choose_raster("e4m3_128x192", 8192, 5120, 8192, slots=132, swizzle=1)
    assert got["rows_along_m"] == 18 * 128 + 8 * 192
    assert one["rows_along_m"] == 64 * 128 + 3 * 192


@pytest.mark.parametrize(
    "config,decomposition,splits,needle",
    [
        ("128x128sk", "auto", 1, ""),
        ("128x256sk", "stream_k", 1, ""),
        ("128x128sk", "split_k", 3, ""),
        ("128x128sk", "data_parallel", 1, ""),
        ("128x128sk", "split_k", 1, "splits=1 with decomposition split_k: split_k takes splits"),
        ("128x256sk", "stream_k", 2, "splits=2 with decomposition stream_k"),
        ("128x128sk", "heuristic", 0, "splits=0 with decomposition heuristic"),
        ("128x128", "stream_k", 1, "is for the stream-K configurations; config 128x128 runs"),
        ("auto", "split_k", 2, "config auto runs whole tiles"),
        ("e4m3_128x192", "stream_k", 1, "config e4m3_128x192 runs whole tiles"),
        ("128x128sk", "streamk", 1, "decomposition 'streamk' is not one of auto, heuristic,"),
    ],
)
def test_decomposition_checked_against_the_configuration(config, decomposition, splits, needle):
    """gemm(decomposition=, splits=) is for the stream-K kernels only; split_k needs 2 or more K
    ranges and the others one. The message names the values (the GEMM kernel's own check)."""
    got = _core.decomposition_problem(config, decomposition, splits)
    assert (got == "") if not needle else (needle in got), got
    assert _core.DECOMPOSITIONS == ["auto", "heuristic", "data_parallel", "split_k", "stream_k"]
