"""GPU checks of gemm_all_reduce's fused path (GEMM + all-reduce in one kernel), one process per
GPU:

    torchrun --nproc-per-node 2 tests/gpu/fused_worker.py --out results.json
    DISTGEMM_ALLOW_SHARED_GPU=1 torchrun --nproc-per-node 2 tests/gpu/fused_worker.py ...  # 1 GPU

Started by tests/gpu/test_fused.py. Sections (every rank runs all of them in the same order;
inputs seeded, different per rank):

  correctness  token counts 1..300 on both sides of the decode kernel's limit (decode kernel at
               token widths 16 and 32, tiles in 1..8 pieces, more tiles than CTAs with shares
               crossing up to 3 tiles, a K whose last step is partial; CUTLASS kernel at every
               token tile, split-K 1..4), bf16 and fp16,
               with and without bias and beta * c: against torch in fp32 from the same inputs
               (relative Frobenius error < TOL) and against torch.mm + NCCL all_reduce in the
               op's dtype (< TOL_SAME_DTYPE); the output bitwise equal on every rank; "auto"
               runs what the machine's decode model picks where it covers the call
  capture      one fused op captured in torch.cuda.graph, replayed REPLAYS times with fresh
               activations copied in place (new weights every 100), every replay checked;
               eager calls and an overlapped op (which grows the workspace) interleaved with
               replays
  mixed        fused ops of four sizes and both kernels back to back in one captured graph,
               replayed REPLAYS / 5 times with fresh activations, every output checked (each
               launch's parity apart from the previous launch's, whatever their shapes)
  timeout      rank tp-1 never replays its captured fused op: the other ranks' replay ends
               after wait_timeout_s with RuntimeError naming the rank and the tile, at the next
               op call and at check(); the next replay exits at once; nobody hangs
  two_shot*    path="fused_two_shot" (the CUTLASS kernel's two-shot tail), at token counts
               33..300, every token tile, split-K 1..4, partial n blocks, bias and beta * c,
               bf16 and fp16: bitwise equal to path="fused" (the one-shot tail: the same
               partials summed in float32 in the same order) and on every rank, and within
               TOL of torch in fp32; captured beside the one-shot op and replayed REPLAYS / 5
               times with fresh activations, bitwise equal at every replay; both tails and both
               kernels back to back in one captured graph, every output checked at every
               replay; its timeouts: rank tp-1 never replays (the others name it, waiting for
               its partials), and rank tp-1 runs the one-shot tail where the others run the
               two-shot (its partials arrive, its sums never: the others name it, waiting for
               the sum of a slice it owns)

With DISTGEMM_ALLOW_SHARED_GPU=1 (tests/gpu/test_fused.py on a one-GPU machine) 2 ranks share
GPU 0 over a gloo group: every section runs (the references' collectives on CPU copies); the
fused kernels of the two ranks time-slice the GPU while they wait on each other's tiles.

Exit code 0 when every check passed on every rank. Rank 0 writes every result to --out (JSON).
"""

from __future__ import annotations

import hashlib
import time

import torch
import torch.distributed as dist
from torchrun_worker import (
    rank,
    record,
    reference,
    rel_err,
    runtime_errors,
    same_on_all_ranks,
    worker_main,
)

import distgemm
from distgemm.runtime import communicator as dcomm
from distgemm.runtime import machine, reduce_cost
from distgemm.runtime.paths import collective

TOL = 1e-2
TOL_SAME_DTYPE = 2e-2
TOKENS = [1, 3, 7, 8, 16, 17, 33, 64, 80, 100, 128, 129, 200, 256, 300]


def inputs(m, n, k, dtype, dev, seed, bias=False, beta=0.0):
    g = torch.Generator(device="cpu").manual_seed(seed * 1000 + rank())
    a = (torch.rand(m, k, generator=g) * 2 - 1).to(dtype).to(dev)
    w = ((torch.rand(n, k, generator=g) * 2 - 1) / k**0.5).to(dtype).to(dev)
    gb = torch.Generator(device="cpu").manual_seed(seed)  # bias and c: the same on every rank
    b = (torch.rand(n, generator=gb) * 2 - 1).to(dtype).to(dev) if bias else None
    c = (torch.rand(m, n, generator=gb) * 2 - 1).to(dtype).to(dev) if beta else None
    return a, w, b, c


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def check(name, y, a, w, b, c, beta, dtype, also_ok=True, **extra):
    """Records `name`: y within TOL of torch in fp32 and TOL_SAME_DTYPE of torch in `dtype`,
    bitwise the same on every rank, and `also_ok` (a further check of the caller's)."""
    ref32, ref_dt = reference("ar_tile_a", a, w, b, c, beta, dtype)
    e32, edt = rel_err(y, ref32), rel_err(y, ref_dt)
    same = len(set(same_on_all_ranks(digest(y)))) == 1
    record(
        name,
        e32 < TOL and edt < TOL_SAME_DTYPE and same and also_ok,
        rel_err_fp32=e32,
        rel_err_same_dtype=edt,
        identical_on_ranks=same,
        **extra,
    )


def test_correctness(dev):
    shapes = [(m, 1024, 4096) for m in TOKENS]
    shapes += [
        (8, 8192, 4096),
        (256, 8192, 4096),
        (5, 4096, 14336),
        (3, 1024, 4104),
        (40, 2048, 200),
        (4, 16384, 1024),  # 256 tiles on fewer CTAs: a share of about 2 tiles
        (20, 16384, 520),  # 9 K steps a tile, the last partial: shares across up to 3 tiles
    ]
    for i, (m, n, k) in enumerate(shapes):
        for dtype in (torch.bfloat16, torch.float16):
            bias, beta = i % 2 == 1, (0.5 if i % 3 == 2 else 0.0)
            a, w, b, c = inputs(m, n, k, dtype, dev, seed=i, bias=bias, beta=beta)
            y = distgemm.gemm_all_reduce(a, w, bias=b, c=c, beta=beta, path="fused")
            kernel = distgemm._core.fused_kernel(m)
            check(f"correctness/m{m}_n{n}_k{k}/{dtype}", y, a, w, b, c, beta, dtype, kernel=kernel)
    # "auto": what the machine's decode model picks (runtime.reduce_cost) where its constants
    # cover the call, else the path model's overlap or collective
    tp = dist.get_world_size()
    mc = machine.constants_for(dev, tp)
    for m in (8, 256, 512):
        a, w, _, _ = inputs(m, 1024, 1024, torch.bfloat16, dev, seed=77)
        distgemm.gemm_all_reduce(a, w)
        chosen = [p for p in distgemm.path_choices() if p["m"] == m and p["requested"] == "auto"]
        got = chosen[-1] if chosen else {}
        rc = mc.reduce if mc is not None else None
        if rc is not None and m <= rc.max_tokens:
            offered = {p: distgemm._core.fused_tail_problem(tail, m)
                       for p, tail in machine.FUSED_PATHS.items()}  # fmt: skip
            offered.update(collective.own_all_reduce_offer(m * 1024, torch.bfloat16, tp))
            want, _, _ = reduce_cost.choose(rc, m, 1024, 1024, tp, offered, mc.key.slug())
            fused = want in machine.FUSED_PATHS
            path = "fused" if fused else "collective"
            alg = "nccl" if fused else want.split("/")[1]
            ok = got.get("path") == path and got.get("all_reduce") == alg
            if fused:
                ok = ok and got.get("fused_tail") == machine.FUSED_PATHS[want]
        else:
            want = "overlap or collective"
            ok = got.get("path") in ("overlap", "collective")
        record(f"correctness/auto_m{m}", ok, path=got.get("path"), expected=want)
    torch.cuda.synchronize()
    dcomm.get_communicator().raise_launch_errors()


def test_capture(dev, replays):
    m, n, k, dtype = 16, 8192, 4096, torch.bfloat16
    a, w, b, _ = inputs(m, n, k, dtype, dev, seed=5, bias=True)
    out = torch.empty(m, n, dtype=dtype, device=dev)
    distgemm.gemm_all_reduce(a, w, bias=b, out=out, path="fused")  # entry made eagerly
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        distgemm.gemm_all_reduce(a, w, bias=b, out=out, path="fused")
    worst, bad = 0.0, 0
    gen = torch.Generator(device="cpu").manual_seed(99 + rank())
    for i in range(replays):
        a.copy_((torch.rand(m, k, generator=gen) * 2 - 1).to(dtype))
        if i % 100 == 99:
            w.copy_(((torch.rand(n, k, generator=gen) * 2 - 1) / k**0.5).to(dtype))
        g.replay()
        ref32 = reference("ar_tile_a", a, w, b, None, 0.0, dtype)[0]
        e = rel_err(out, ref32)
        worst = max(worst, e)
        bad += e >= TOL
    record("capture/replays", bad == 0, replays=replays, worst_rel_err=worst)
    # Eager calls, an overlapped op that grows the workspace, and replays, interleaved; the
    # overlapped op's result and the communicator's state checked at every iteration, so a
    # failure names the iteration and whether the workspace grew there.
    comm = dcomm.get_communicator()
    worst, worst_rs, steps = 0.0, 0.0, []
    for i in range(5):
        big_a, big_w, _, _ = inputs(2048 * (i + 1), 4096, 2048, dtype, dev, seed=200 + i)
        held = comm.workspace_bytes
        z = distgemm.gemm_reduce_scatter(big_a, big_w, path="overlap")
        y = distgemm.gemm_all_reduce(a, w, bias=b, path="fused")
        ref32 = reference("ar_tile_a", a, w, b, None, 0.0, dtype)[0]
        worst = max(worst, rel_err(y, ref32))
        g.replay()
        worst = max(worst, rel_err(out, ref32))
        torch.cuda.synchronize()
        e_rs = rel_err(z, reference("rs_tile_a", big_a, big_w, None, None, 0.0, dtype)[0])
        worst_rs = max(worst_rs, e_rs)
        try:
            comm.raise_launch_errors()
            state = "ok"
        except RuntimeError as e:
            state = str(e)
        steps.append(
            dict(iteration=i, grew=comm.workspace_bytes > held, rs_rel_err=e_rs, state=state)
        )
        if state != "ok":
            break
    ok = worst < TOL and worst_rs < TOL and all(s["state"] == "ok" for s in steps)
    record(
        "capture/interleaved_with_growth", ok, worst_rel_err=worst, worst_rs_rel_err=worst_rs,
        iterations=steps,
    )  # fmt: skip
    comm.raise_launch_errors()


def test_mixed_sizes(dev, replays):
    """Fused ops of different sizes and both kernels back to back in one captured graph: each
    launch writes the parity its peers do not read, whatever the previous launch's shapes (the
    decode kernel pushes into the peers' receive buffers while they may still sum the previous
    launch). Every output of every replay checked, fresh activations each replay."""
    dtype = torch.bfloat16
    shapes = [(1, 8192, 4096), (32, 2048, 4096), (100, 1024, 1024), (8, 4096, 2048)] * 2
    ops = []
    for i, (m, n, k) in enumerate(shapes):
        a, w, b, _ = inputs(m, n, k, dtype, dev, seed=300 + i, bias=i % 2 == 0)
        out = torch.empty(m, n, dtype=dtype, device=dev)
        distgemm.gemm_all_reduce(a, w, bias=b, out=out, path="fused")  # entries made eagerly
        ops.append((a, w, b, out))
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for a, w, b, out in ops:
            distgemm.gemm_all_reduce(a, w, bias=b, out=out, path="fused")
    gen = torch.Generator(device="cpu").manual_seed(400 + rank())
    worst, bad = 0.0, 0
    for _ in range(replays):
        for a, _, _, _ in ops:
            a.copy_((torch.rand(a.shape, generator=gen) * 2 - 1).to(dtype))
        g.replay()
        for a, w, b, out in ops:
            e = rel_err(out, reference("ar_tile_a", a, w, b, None, 0.0, dtype)[0])
            worst = max(worst, e)
            bad += e >= TOL
    torch.cuda.synchronize()
    dcomm.get_communicator().raise_launch_errors()
    record(
        "capture/mixed_sizes", bad == 0, replays=replays, ops=len(ops), worst_rel_err=worst,
        kernels=[distgemm._core.fused_kernel(m) for m, _, _ in shapes],
        fused_receive_bytes=distgemm.memory_stats()["fused_receive_bytes"],
    )  # fmt: skip


def test_timeout(dev, path="fused", m=8, name="timeout/peer_never_replays"):
    """Rank tp-1 never replays its captured op on ``path`` at ``m`` tokens: the others' replay
    ends after wait_timeout_s naming it, the next replay exits at once. (The two-shot tail: its
    non-owners wait for the tile's partials too, so they name rank tp-1, not an owner.)"""
    tp, r = dist.get_world_size(), rank()
    wait_s = 1.0
    c = dcomm.Communicator(wait_timeout_s=wait_s, timeout_s=60.0)
    a, w, _, _ = inputs(m, 1024, 1024, torch.bfloat16, dev, seed=3)
    distgemm.gemm_all_reduce(a, w, path=path, group=c)
    c.raise_launch_errors()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        distgemm.gemm_all_reduce(a, w, path=path, group=c)
    dist.barrier()
    if r != tp - 1:
        t0 = time.perf_counter()
        g.replay()
        torch.cuda.synchronize()
        waited = time.perf_counter() - t0
        t1 = time.perf_counter()
        g.replay()
        torch.cuda.synchronize()
        aborted_replay = time.perf_counter() - t1
        where = "fused GEMM + all-reduce, tile"
        msgs = runtime_errors(
            (
                ("next_op_call", lambda: distgemm.gemm_all_reduce(a, w, path=path, group=c)),
                ("raise_launch_errors", c.raise_launch_errors),
            )
        )
        ok = (
            msgs["raise_launch_errors"] is not None
            and where in msgs["raise_launch_errors"]
            and f"rank {tp - 1}" in msgs["raise_launch_errors"]
            and msgs["next_op_call"] is not None
            and waited < 4 * wait_s + 2
            and aborted_replay < wait_s / 2
        )
        record(
            name,
            ok,
            replay_seconds=waited,
            aborted_replay_seconds=aborted_replay,
            **msgs,
        )
    dist.barrier()
    c.close()


def test_two_shot(dev):
    """path="fused_two_shot" against path="fused" (bitwise: the same partials, summed in float32
    in the same order, one by every rank, the other by each slice's owner and copied), against
    torch in fp32 and across ranks."""
    shapes = [(m, 1024, 4096) for m in (33, 64, 80, 100, 128, 129, 200, 256, 300)]
    shapes += [
        (64, 8192, 4096),  # 64 n blocks x 2 splits: every rank owns 128 / tp slices
        (256, 16384, 2048),  # 128 n blocks
        (40, 2048, 200),  # k = 200: one split
        (96, 1000, 1024),  # a partial last n block
        (300, 1024, 192),  # 5 token blocks x 8 n blocks x 3 splits
        (129, 3000, 4104),  # 192-token tile, a partial n block, k of 513 8-element vectors
    ]
    for i, (m, n, k) in enumerate(shapes):
        for dtype in (torch.bfloat16, torch.float16):
            bias, beta = i % 2 == 0, (0.5 if i % 3 == 1 else 0.0)
            a, w, b, c = inputs(m, n, k, dtype, dev, seed=500 + i, bias=bias, beta=beta)
            one = distgemm.gemm_all_reduce(a, w, bias=b, c=c, beta=beta, path="fused")
            two = distgemm.gemm_all_reduce(a, w, bias=b, c=c, beta=beta, path="fused_two_shot")
            same_as_one_shot = bool(torch.equal(one, two))
            check(
                f"two_shot/m{m}_n{n}_k{k}/{dtype}", two, a, w, b, c, beta, dtype,
                same_as_one_shot=same_as_one_shot, also_ok=same_as_one_shot,
                token_tile=distgemm._core.fused_token_tile(m),
            )  # fmt: skip
    chosen = [p for p in distgemm.path_choices() if p["requested"] == "fused_two_shot"]
    record(
        "two_shot/entries_run_the_two_shot_tail",
        bool(chosen)
        and all(p["path"] == "fused" and p["fused_tail"] == "two_shot" for p in chosen),
        entries=len(chosen),
    )
    torch.cuda.synchronize()
    dcomm.get_communicator().raise_launch_errors()


def test_two_shot_capture(dev, replays):
    """The two-shot op captured beside the one-shot op of the same inputs, replayed with fresh
    activations (new weights every 50): bitwise equal and within TOL at every replay."""
    m, n, k, dtype = 128, 8192, 4096, torch.bfloat16
    a, w, b, _ = inputs(m, n, k, dtype, dev, seed=600, bias=True)
    one = torch.empty(m, n, dtype=dtype, device=dev)
    two = torch.empty(m, n, dtype=dtype, device=dev)

    def both():
        distgemm.gemm_all_reduce(a, w, bias=b, out=one, path="fused")
        distgemm.gemm_all_reduce(a, w, bias=b, out=two, path="fused_two_shot")

    both()  # entries made eagerly
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        both()
    gen = torch.Generator(device="cpu").manual_seed(601 + rank())
    worst, bad, differ = 0.0, 0, 0
    for i in range(replays):
        a.copy_((torch.rand(m, k, generator=gen) * 2 - 1).to(dtype))
        if i % 50 == 49:
            w.copy_(((torch.rand(n, k, generator=gen) * 2 - 1) / k**0.5).to(dtype))
        two.fill_(float("nan"))
        g.replay()
        ref32 = reference("ar_tile_a", a, w, b, None, 0.0, dtype)[0]
        e = rel_err(two, ref32)
        worst = max(worst, e)
        bad += not e < TOL
        differ += not bool(torch.equal(one, two))
    torch.cuda.synchronize()
    dcomm.get_communicator().raise_launch_errors()
    same = len(set(same_on_all_ranks(digest(two)))) == 1
    record(
        "two_shot/capture_replays", bad == 0 and differ == 0 and same, replays=replays,
        worst_rel_err=worst, replays_off_one_shot=differ, identical_on_ranks=same,
    )  # fmt: skip


def test_two_shot_mixed(dev, replays):
    """Both tails and both kernels back to back in one captured graph: a two-shot launch's sums
    lie in its parity's half, apart from the next launch's partials whatever its shape and
    tail. Every output of every replay checked, fresh activations each replay."""
    dtype = torch.bfloat16
    ops = [
        (1, 8192, 4096, "fused"),
        (64, 2048, 4096, "fused_two_shot"),
        (100, 1024, 1024, "fused"),
        (256, 4096, 2048, "fused_two_shot"),
        (129, 8192, 1024, "fused_two_shot"),
        (8, 4096, 2048, "fused"),
        (40, 1024, 4096, "fused_two_shot"),
    ] * 2
    calls = []
    for i, (m, n, k, path) in enumerate(ops):
        a, w, b, _ = inputs(m, n, k, dtype, dev, seed=700 + i, bias=i % 2 == 1)
        out = torch.empty(m, n, dtype=dtype, device=dev)
        distgemm.gemm_all_reduce(a, w, bias=b, out=out, path=path)  # entries made eagerly
        calls.append((a, w, b, out, path))
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for a, w, b, out, path in calls:
            distgemm.gemm_all_reduce(a, w, bias=b, out=out, path=path)
    gen = torch.Generator(device="cpu").manual_seed(800 + rank())
    worst, bad = 0.0, 0
    for _ in range(replays):
        for a, _, _, out, _ in calls:
            a.copy_((torch.rand(a.shape, generator=gen) * 2 - 1).to(dtype))
            out.fill_(float("nan"))
        g.replay()
        for a, w, b, out, _ in calls:
            e = rel_err(out, reference("ar_tile_a", a, w, b, None, 0.0, dtype)[0])
            worst = max(worst, e)
            bad += not e < TOL
    torch.cuda.synchronize()
    dcomm.get_communicator().raise_launch_errors()
    record(
        "two_shot/mixed_sizes", bad == 0, replays=replays, ops=len(ops), worst_rel_err=worst,
        paths=[p for _, _, _, p in ops], kernels=[distgemm._core.fused_kernel(m) for m, *_ in ops],
    )  # fmt: skip


def _fused_state(comm, tail: str):
    """The communicator's fused entry with ``tail`` (the only one made on it)."""
    from distgemm.runtime.paths.fused import FusedState

    states = [e.state for e in comm.attachment("entries").values()
              if isinstance(e.state, FusedState) and e.state.tail == tail]  # fmt: skip
    assert len(states) == 1, states
    return states[0]


def test_two_shot_timeout(dev):
    """The two-shot tail's bounded waits: (1) rank tp-1 never replays its captured two-shot op
    (test_timeout): every other rank names rank tp-1 (its partials, which every CTA waits for
    before any sum); (2) rank tp-1's entry is made to launch the one-shot tail while the others
    launch the two-shot (a disagreement the entry's signature exchange otherwise refuses): its
    partials arrive, its sums never, so the others end naming the sum of a slice rank tp-1
    owns; rank tp-1 itself finishes. Nobody hangs."""
    test_timeout(dev, "fused_two_shot", 64, "two_shot/timeout/peer_never_replays")
    tp, r = dist.get_world_size(), rank()
    wait_s = 1.0
    # 8 n blocks x 4 splits, one slice a CTA: every rank owns slices, no CTA waits for two
    a, w, _, _ = inputs(64, 1024, 1024, torch.bfloat16, dev, seed=900)
    c = dcomm.Communicator(wait_timeout_s=wait_s, timeout_s=60.0)
    distgemm.gemm_all_reduce(a, w, path="fused_two_shot", group=c)
    torch.cuda.synchronize()
    c.raise_launch_errors()
    if r == tp - 1:
        state = _fused_state(c, "two_shot")
        state.tail, state.sums = "one_shot", []
    dist.barrier()
    t0 = time.perf_counter()
    distgemm.gemm_all_reduce(a, w, path="fused_two_shot", group=c)
    torch.cuda.synchronize()
    waited = time.perf_counter() - t0
    msgs = runtime_errors((("raise_launch_errors", c.raise_launch_errors),))
    err = msgs["raise_launch_errors"] or ""
    if r == tp - 1:
        ok = err == ""  # the one-shot tail waits only for partials, which every rank wrote
    else:
        ok = (
            "(two-shot): the sum of its owner rank " + str(tp - 1) in err
            and waited < 4 * wait_s + 2
        )
    record("two_shot/timeout/owner_never_sums", ok, seconds=waited, **msgs)
    dist.barrier()
    c.close()


def main():
    worker_main(
        "fused_results.json",
        lambda dev, args: {
            "correctness": lambda: test_correctness(dev),
            "capture": lambda: test_capture(dev, args.replays),
            "mixed": lambda: test_mixed_sizes(dev, max(1, args.replays // 5)),
            "timeout": lambda: test_timeout(dev),
            "two_shot": lambda: test_two_shot(dev),
            "two_shot_capture": lambda: test_two_shot_capture(dev, max(1, args.replays // 5)),
            "two_shot_mixed": lambda: test_two_shot_mixed(dev, max(1, args.replays // 5)),
            "two_shot_timeout": lambda: test_two_shot_timeout(dev),
        },
        replays=1000,
    )


if __name__ == "__main__":
    main()
