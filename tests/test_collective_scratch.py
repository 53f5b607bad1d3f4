"""CPU checks of the collective path's scratch (``paths.collective.CollectiveScratch``):
one flat buffer per communicator and stream, views of the call's shapes and dtypes, growth with
headroom, the bound after the 96 token counts of a server, close() and memory_stats.

The collective path itself needs NCCL (tests/gpu/test_collective_memory.py runs it on GPUs); the
scratch's policy is plain torch and runs here on CPU tensors."""

import gc
import weakref

import pytest

torch = pytest.importorskip("torch")

import distgemm  # noqa: E402
from distgemm.runtime import communicator as comm_mod  # noqa: E402
from distgemm.runtime.paths.collective import (  # noqa: E402
    ATTACHMENT,
    MAX_VIEW_SETS,
    SCRATCH_ALIGN,
    SCRATCH_HEADROOM,
    CollectiveScratch,
    scratch_bytes,
)

CPU = torch.device("cpu")
BF16 = torch.bfloat16
S0, S1 = 0x7000, 0x9000  # two raw stream handles
TOKENS = range(64, 6145, 64)  # the 96 token counts of issue 41's serving loop
K, N, TP = 4096, 3072, 4


def gathered(m, k=K, dtype=BF16):
    return (("gathered", (m, k), dtype),)


def partial(m, n=N, dtype=BF16):
    return (("partial", (m, n), dtype),)


def fill(views, seed):
    """Seeded values in every view, returned for comparison."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for v in views:
        if v.dtype.is_floating_point:
            x = torch.randn(v.shape, generator=g).to(v.dtype)
        else:
            x = torch.randint(-100, 100, v.shape, generator=g).to(v.dtype)
        v.copy_(x)
        out.append(x)
    return out


def test_the_first_call_allocates_its_bytes_plus_the_headroom():
    s = CollectiveScratch()
    (v,) = s.views(S0, gathered(640), CPU)
    need = 640 * K * 2
    flat = s.buffers[S0].flat
    assert flat.dtype == torch.uint8 and flat.numel() >= need
    assert flat.numel() == int(need * (1 + SCRATCH_HEADROOM)) // SCRATCH_ALIGN * SCRATCH_ALIGN
    assert v.shape == (640, K) and v.dtype == BF16 and v.is_contiguous()
    assert v.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
    assert s.allocations == 1


def test_a_smaller_call_and_one_within_the_headroom_reuse_the_buffer():
    s = CollectiveScratch()
    s.views(S0, gathered(1000), CPU)
    flat = s.buffers[S0].flat
    for m in (64, 999, 1000, 1096):  # 1096 rows: 9.6% more, within the headroom
        (v,) = s.views(S0, gathered(m), CPU)
        assert v.shape == (m, K) and v.data_ptr() == flat.data_ptr()  # at the buffer's start
    assert s.buffers[S0].flat is flat and s.allocations == 1
    (v,) = s.views(S0, gathered(1104), CPU)  # 10.4% more: grows
    assert s.allocations == 2 and s.buffers[S0].flat.numel() >= 1104 * K * 2
    assert v.data_ptr() == s.buffers[S0].flat.data_ptr()


def test_the_grown_buffer_replaces_the_old_one_which_is_freed():
    s = CollectiveScratch()
    s.views(S0, gathered(64), CPU)
    old = weakref.ref(s.buffers[S0].flat)
    s.views(S0, gathered(4096), CPU)
    gc.collect()
    assert old() is None  # nothing kept it: back to the allocator
    assert s.memory_stats()["collective_bytes"] == s.buffers[S0].flat.numel()


def test_every_dtype_and_shape_is_a_view_of_the_same_bytes():
    s = CollectiveScratch()
    flat = s.views(S0, gathered(256), CPU)[0].untyped_storage().data_ptr()
    cases = [
        (("x", (128, 96), torch.float16),),
        (("x", (33, 7), torch.float32),),
        (("x", (5, 3, 8), torch.int32),),
        (("x", (64, 64), torch.float8_e4m3fn),),
        (("x", (64, 8), BF16), ("scale", (64 * TP,), torch.float32)),
    ]
    for i, regions in enumerate(cases):
        views = s.views(S0, regions, CPU)
        assert [(tuple(v.shape), v.dtype) for v in views] == [(r[1], r[2]) for r in regions]
        assert all(v.is_contiguous() for v in views)
        assert all(v.untyped_storage().data_ptr() == flat for v in views)
        if regions[0][2] != torch.float8_e4m3fn:  # fp8: no randn; its bytes are checked below
            want = fill(views, seed=i)
            assert all(torch.equal(v, x) for v, x in zip(views, want))
    (f8,) = s.views(S0, (("x", (64, 64), torch.float8_e4m3fn),), CPU)
    f8.view(torch.uint8).copy_(torch.arange(64 * 64).remainder(120).view(64, 64))
    assert torch.equal(s.buffers[S0].flat[: 64 * 64], f8.view(torch.uint8).reshape(-1))
    assert s.allocations == 1


def test_the_regions_of_one_call_are_disjoint_and_aligned():
    """rs_tile_b's partial D^T and its reduced rows, and an fp8 gather with its row scales: one
    call's regions never overlap, whatever the shapes and dtypes."""
    s = CollectiveScratch()
    g = torch.Generator().manual_seed(41)
    for trial in range(20):
        n = 8 * int(torch.randint(1, 200, (1,), generator=g))
        m = int(torch.randint(1, 700, (1,), generator=g))
        regions = (
            ("partial", (n * TP, m), BF16),
            ("mine", (n, m), BF16),
            ("s", (m,), torch.float32),
        )
        views = s.views(S0, regions, CPU)
        base = s.buffers[S0].flat.data_ptr()
        spans = sorted((v.data_ptr() - base, v.data_ptr() - base + v.nbytes) for v in views)
        assert all(lo % SCRATCH_ALIGN == 0 for lo, _ in spans)
        assert all(a_hi <= b_lo for (_, a_hi), (b_lo, _) in zip(spans, spans[1:]))
        assert spans[-1][1] <= s.buffers[S0].flat.numel()
        want = fill(views, seed=trial)  # each region keeps its own values
        assert all(torch.equal(v, x) for v, x in zip(views, want))
    assert scratch_bytes((("a", (3,), torch.float32), ("b", (1,), torch.int8))) == 2 * SCRATCH_ALIGN


def test_each_stream_has_its_own_buffer():
    s = CollectiveScratch()
    (a,) = s.views(S0, gathered(512), CPU)
    (b,) = s.views(S1, gathered(512), CPU)
    assert set(s.buffers) == {S0, S1}
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    wa, wb = fill([a], 1), fill([b], 2)  # writing one stream's buffer leaves the other's alone
    assert torch.equal(a, wa[0]) and torch.equal(b, wb[0])
    s.views(S1, gathered(2048), CPU)  # one stream's growth leaves the other's buffer in place
    assert s.views(S0, gathered(512), CPU)[0].data_ptr() == a.data_ptr()
    stats = s.memory_stats()
    assert stats["collective_buffers"] == 2 and stats["collective_allocations"] == 3
    assert stats["collective_bytes"] == sum(x.flat.numel() for x in s.buffers.values())


def test_views_are_made_once_per_layout_and_their_number_is_bounded():
    s = CollectiveScratch()
    first = s.views(S0, partial(128), CPU)
    assert s.views(S0, partial(128), CPU) is first  # a warm call: one dict lookup
    s.views(S0, partial(8192), CPU)  # a growth drops the views of the old buffer
    assert s.views(S0, partial(128), CPU) is not first
    for m in range(1, MAX_VIEW_SETS + 40):
        s.views(S0, partial(m, n=8), CPU)
    assert len(s.buffers[S0].views) <= MAX_VIEW_SETS and s.allocations == 2


def test_a_capture_takes_fresh_tensors_and_keeps_nothing():
    s = CollectiveScratch()
    (v,) = s.views(S0, partial(64), CPU, capturing=True)
    (w,) = s.views(S0, partial(64), CPU, capturing=True)
    assert v.shape == (64, N) and v.data_ptr() != w.data_ptr()
    assert s.buffers == {} and s.allocations == 0


def test_views_made_under_inference_mode_are_written_outside_it():
    s = CollectiveScratch()
    with torch.inference_mode():
        (v,) = s.views(S0, partial(16, n=8), CPU)
        v.fill_(1)  # a call inside inference mode
    assert not v.is_inference()
    torch.mm(torch.ones(16, 4, dtype=BF16), torch.ones(4, 8, dtype=BF16), out=v)
    assert bool((v == 4).all())


def test_96_rising_token_counts_stay_within_the_headroom_of_the_largest_call():
    """Issue 41's loop at TP=4 (K=4096, N=3072): per token count an all-gather (the gathered
    [M, K]) and a reduce-scatter (the partial [M, N]), one stream."""
    s = CollectiveScratch()
    largest, worst = 0, 0.0
    for m in TOKENS:
        for regions in (gathered(m), partial(m)):
            views = s.views(S0, regions, CPU)
            assert views[0].shape == regions[0][1]
            largest = max(largest, scratch_bytes(regions))
            worst = max(worst, s.memory_stats()["collective_bytes"] / largest)
    stats = s.memory_stats()
    assert largest == 6144 * K * 2
    assert stats["collective_bytes"] <= largest * (1 + SCRATCH_HEADROOM)
    assert worst <= 1 + SCRATCH_HEADROOM  # at every call, not only at the end
    # Without headroom every rising call would reallocate (96); with 10% it grows once per
    # 64-row step while that is more than 10%, then about every 10%: 29 times.
    assert stats["collective_buffers"] == 1 and 20 <= stats["collective_allocations"] <= 30
    # The largest call first: never grows again.
    t = CollectiveScratch()
    for m in reversed(TOKENS):
        t.views(S0, gathered(m), CPU)
        t.views(S0, partial(m), CPU)
    assert t.allocations == 1


class Comm:
    """A Communicator with nothing but its attachments (find_communicator accepts it)."""

    def __new__(cls):
        c = object.__new__(comm_mod.Communicator)
        c._closed, c._attachments = False, {}
        c._pool = type("Pool", (), {"memory_stats": lambda self: {}})()
        return c


def test_the_scratch_is_an_attachment_reported_by_memory_stats_and_freed_by_close():
    c = Comm()
    s = CollectiveScratch.of(c)
    assert CollectiveScratch.of(c) is s and c.attachment(ATTACHMENT) is s
    zero = distgemm.memory_stats(c)
    assert (zero["collective_bytes"], zero["collective_buffers"]) == (0, 0)
    s.views(S0, gathered(1024), CPU)
    s.views(S1, partial(64), CPU)
    stats = distgemm.memory_stats(c)
    assert stats["collective_bytes"] == sum(b.flat.numel() for b in s.buffers.values()) > 0
    assert stats["collective_buffers"] == 2 and stats["collective_allocations"] == 2
    assert stats["workspace_bytes"] == 0  # torch memory, not a symmetric region
    held = [weakref.ref(b.flat) for b in s.buffers.values()]
    assert s.close() == [] and s.launch_error() == ""
    gc.collect()
    assert all(r() is None for r in held)
    after = distgemm.memory_stats(c)
    assert (after["collective_bytes"], after["collective_buffers"]) == (0, 0)
