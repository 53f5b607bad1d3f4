"""The GEMM kernel's tile choice (kernel/tile_choice.hpp through _core.choose_tile_n): a pure
wave model, so the same on every rank and checkable without a GPU. The runtime runs the tile it
returns (tests/gpu/test_cpp_bench.py checks that on the GPUs)."""

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
