"""GPU checks of the ops inside the caller's CUDA graph (torch.cuda.graph), one process per GPU:

    torchrun --nproc-per-node 2 tests/gpu/capture_worker.py --out results.json
    DISTGEMM_ALLOW_SHARED_GPU=1 torchrun --nproc-per-node 2 tests/gpu/capture_worker.py ...  # 1 GPU

Started by tests/gpu/test_capture.py. Sections (every rank runs all of them, in the same order;
rank 0 collects; inputs seeded, different per rank):

  every_op      every op x schedule x path (and S = 2*TP on the overlapped path) captured once,
                replayed 3 times with new data copied into the static inputs (activations,
                weight, bias, c) before each replay; each result against torch in fp32 from the
                same inputs (relative Frobenius error < TOL = 1e-2) and against torch's
                collective + mm in the op's dtype (< TOL_SAME_DTYPE = 2e-2)
  many_replays  1000 replays with fresh activations (new weights every 100) of one op of each
                kind (and one on the collective path), every replay checked as above
  interleaved   eager calls (new tensors, and the captured tensors themselves), replays, and an
                eager call of another op between them, on one stream; a graph holding two ops
                (a column- then a row-parallel layer)
  first_call    the first call of a new shape happens inside the capture: a fresh communicator
                (workspace allocated and IPC-exchanged during the capture) and new shapes on
                both paths; path="auto" undecided inside a capture, and
                Communicator.raise_launch_errors() inside a capture, refused with a clear
                RuntimeError
  timeout       a captured op whose peer never replays: the replaying ranks get RuntimeError
                naming the rank and where it waited, at the next op call and at check(), within
                a few wait_timeout_s, and a second replay ends at once (aborted), never a hang
  gathered      return_gathered under capture (both all-gather schedules, both paths): the
                gathered operand equal to torch's all-gather, bit for bit

With DISTGEMM_ALLOW_SHARED_GPU=1 (tests/gpu/test_capture.py on a one-GPU machine) 2 ranks share
GPU 0 over a gloo group: the collective path (NCCL captured in the graph) is left out, each such
check recorded as skipped with the reason.

Exit code 0 when every check passed on every rank. Rank 0 writes every result to --out (JSON).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torchrun_worker import (
    NEEDS_NCCL_IN_GRAPH,
    RESULTS,
    SHARED_GPU,
    call,
    communicator,
    gather0,
    left_out_when_shared,
    make_inputs,
    rank,
    record,
    record_exception,
    reduce_scatter0,
    reference,
    rel_err,
    runtime_errors,
    worker_main,
)

from distgemm.runtime import communicator as dcomm

SCHEDULES = ["ag_rotate_a", "ag_rotate_b", "rs_tile_a", "rs_tile_b", "ar_tile_a"]
# Relative Frobenius error bounds: against fp32 from the same inputs (as tests/gpu/
# torchrun_worker.py), and against torch's collective + mm in the op's dtype, which rounds
# differently (NCCL sums bf16 partials) and so may differ from ours by both roundings.
TOL = 1e-2
TOL_SAME_DTYPE = 2e-2
# The capture stream of every graph here: warmed up (cuBLAS, NCCL) before the first capture.
CAPTURE_STREAM: torch.cuda.Stream | None = None


def capture(fn):
    """(graph, fn()'s result recorded in it) on the warmed-up capture stream."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=CAPTURE_STREAM):
        res = fn()
    return g, res


def refill(schedule, tensors, seed, weights=True):
    """New data in place in the static inputs. bias and c of ar_tile_a are the same on
    every rank (each tile takes them from the rank that finishes it); the rest differs per
    rank."""
    dev = tensors["a"].device
    g = torch.Generator(device=dev).manual_seed(seed * 131 + rank())
    shared = torch.Generator(device=dev).manual_seed(seed * 131 + 977)
    for name in ("a", "w", "bias", "c"):
        t = tensors.get(name)
        if t is None or (name != "a" and not weights):
            continue
        gen = shared if schedule == "ar_tile_a" and name in ("bias", "c") else g
        x = torch.randn(t.shape, generator=gen, device=dev)
        if name == "w":
            x /= t.shape[1] ** 0.5
        t.copy_(x)


def check(y, schedule, tensors, beta):
    """(error against torch in the op's dtype, error against fp32)."""
    t = tensors
    ref32, ref_dt = reference(schedule, t["a"], t["w"], t.get("bias"), t.get("c"), beta, y.dtype)
    return rel_err(y, ref_dt), rel_err(y, ref32)


def worse(a: float, b: float) -> float:
    """The larger error, NaN once either is NaN (a NaN result must fail, not vanish in max)."""
    return float("nan") if a != a or b != b else max(a, b)


def run_case(name, fn, *, replays, tensors, schedule, beta, seed, weights_every=1):
    """Capture fn() and replay it `replays` times with fresh inputs, checking every replay."""
    try:
        g, res = capture(fn)
        y = res[0] if isinstance(res, tuple) else res
        worst_dt = worst_32 = 0.0
        for i in range(replays):
            refill(schedule, tensors, seed + i, weights=i % weights_every == 0)
            g.replay()
            e_dt, e_32 = check(y, schedule, tensors, beta)
            worst_dt, worst_32 = worse(worst_dt, e_dt), worse(worst_32, e_32)
            if not (worst_dt < TOL_SAME_DTYPE and worst_32 < TOL):  # the first bad one ends it
                break
        ok = worst_dt < TOL_SAME_DTYPE and worst_32 < TOL
        record(name, ok, replays=replays, worst_rel_err_same_dtype=worst_dt, worst_rel_err=worst_32)
        return g, res
    except Exception as ex:  # noqa: BLE001 - recorded, the run goes on
        record_exception(name, ex)
        return None, None


def inputs(schedule, steps, seed, dev, with_bias=True, beta=0.5):
    tp = dist.get_world_size()
    gen = torch.Generator(device="cpu").manual_seed(seed)
    beta = 0.0 if schedule.startswith("ag_") else beta
    a, w, bias, c = make_inputs(schedule, tp, steps, torch.bfloat16, gen, dev, with_bias, beta != 0)
    return {"a": a, "w": w, "bias": bias, "c": c}, beta


def op_of(schedule, tensors, beta, steps, path, out=None, gathered=False, group=None):
    t = tensors
    return lambda: call(
        schedule,
        t["a"],
        t["w"],
        t["bias"],
        t["c"],
        beta,
        steps,
        out=out,
        gathered=gathered,
        group=group,
        path=path,
    )


def test_every_op(dev):
    tp = dist.get_world_size()
    for i, schedule in enumerate(SCHEDULES):
        for path, steps in (("overlap", None), ("overlap", 2 * tp), ("collective", None)):
            # A given output buffer once per schedule; otherwise the graph's pool allocates it.
            given_out = path == "overlap" and steps is None
            name = f"every_op/{schedule}/{path}/S{steps or tp}/out{int(given_out)}"
            if path == "collective" and left_out_when_shared(name, NEEDS_NCCL_IN_GRAPH):
                continue
            t, beta = inputs(schedule, steps or tp, 100 + i, dev)
            # The usual server order: one eager call (warm-up), then the capture.
            y0 = op_of(schedule, t, beta, steps, path)()
            out = torch.empty_like(y0) if given_out else None
            run_case(
                name,
                op_of(schedule, t, beta, steps, path, out=out),
                replays=3,
                tensors=t,
                schedule=schedule,
                beta=beta,
                seed=1000 * i + 7,
            )


def test_many_replays(dev, replays):
    tp = dist.get_world_size()
    cases = [
        ("ag_rotate_a", "overlap", None),
        ("rs_tile_a", "overlap", 2 * tp),
        ("ar_tile_a", "overlap", None),
        ("rs_tile_b", "collective", None),
    ]
    for i, (schedule, path, steps) in enumerate(cases):
        name = f"many_replays/{schedule}/{path}/S{steps or tp}"
        if path == "collective" and left_out_when_shared(name, NEEDS_NCCL_IN_GRAPH):
            continue
        t, beta = inputs(schedule, steps or tp, 300 + i, dev)
        t0 = time.perf_counter()
        run_case(
            name,
            op_of(schedule, t, beta, steps, path),
            replays=replays,
            tensors=t,
            schedule=schedule,
            beta=beta,
            seed=50000 * (i + 1),
            weights_every=100,
        )
        RESULTS[-1]["seconds"] = time.perf_counter() - t0


def test_interleaved(dev):
    tp = dist.get_world_size()
    pairs = (("ag_rotate_a", "rs_tile_a"), ("rs_tile_a", "ar_tile_a"))
    for i, (schedule, other) in enumerate(pairs):
        name = f"interleaved/{schedule}"
        try:
            t, beta = inputs(schedule, tp, 400 + i, dev)
            o, obeta = inputs(other, tp, 450 + i, dev)
            g, y = capture(op_of(schedule, t, beta, None, "overlap"))  # first call: in the capture
            # Tensors of the same shapes at other addresses: eager calls get their own graph.
            e_t = {k: None if v is None else torch.empty_like(v) for k, v in t.items()}
            worst, rounds = 0.0, 10
            for r in range(rounds):
                # An eager call on other tensors, a replay with fresh static inputs, an eager
                # call of another op sharing the communicator, an eager call on the very
                # tensors the graph captured.
                refill(schedule, e_t, 500 + 10 * i + r)
                y_e = op_of(schedule, e_t, beta, None, "overlap")()
                worst = worse(worst, check(y_e, schedule, e_t, beta)[0])
                refill(schedule, t, 600 + r)
                g.replay()
                worst = worse(worst, check(y, schedule, t, beta)[0])
                y_o = op_of(other, o, obeta, None, "overlap")()
                worst = worse(worst, check(y_o, other, o, obeta)[0])
                y_s = op_of(schedule, t, beta, None, "overlap")()
                worst = worse(worst, check(y_s, schedule, t, beta)[0])
            record(name, worst < TOL_SAME_DTYPE, rounds=rounds, worst_rel_err_same_dtype=worst)
        except Exception as ex:  # noqa: BLE001
            record_exception(name, ex)
    # A layer in one graph: column-parallel (all-gather + GEMM) feeding row-parallel (GEMM +
    # reduce-scatter), as a server captures a transformer block; against fp32 from the same
    # bf16 inputs (the graph rounds the hidden activations to bf16).
    name = "interleaved/layer_in_one_graph"
    try:
        bf = torch.bfloat16
        gen = torch.Generator(device=dev).manual_seed(700 + rank())
        x = torch.randn(64, 512, device=dev, generator=gen).to(bf)
        w1 = (torch.randn(384, 512, device=dev, generator=gen) / 512**0.5).to(bf)
        w2 = (torch.randn(256, 384, device=dev, generator=gen) / 384**0.5).to(bf)

        def layer():
            h = call("ag_rotate_a", x, w1, None, None, 0.0, None)
            return call("rs_tile_a", h, w2, None, None, 0.0, None)

        g, y = capture(layer)
        worst = 0.0
        for _ in range(5):
            x.copy_(torch.randn(x.shape, device=dev, generator=gen))
            g.replay()
            ref = reduce_scatter0((gather0(x).float() @ w1.float().t()) @ w2.float().t())
            worst = worse(worst, rel_err(y, ref))
        record(name, worst < TOL, worst_rel_err=worst)
    except Exception as ex:  # noqa: BLE001
        record_exception(name, ex)


def test_first_call(dev):
    tp = dist.get_world_size()
    # A fresh communicator: its first plan's workspace is allocated and IPC-exchanged during the
    # capture; then new shapes of two more ops, one on the collective path.
    with communicator() as comm:
        cases = (
            ("ag_rotate_a", "overlap"),
            ("ar_tile_a", "overlap"),
            ("rs_tile_b", "collective"),
        )
        for i, (schedule, path) in enumerate(cases):
            name = f"first_call/{schedule}/{path}"
            if path == "collective" and left_out_when_shared(name, NEEDS_NCCL_IN_GRAPH):
                continue
            t, beta = inputs(schedule, tp, 800 + i, dev)
            held = comm.workspace_bytes
            run_case(
                name,
                op_of(schedule, t, beta, None, path, group=comm),
                replays=3,
                tensors=t,
                schedule=schedule,
                beta=beta,
                seed=900 + 10 * i,
            )
            if i == 0:
                record(
                    "first_call/workspace_allocated_in_capture",
                    held == 0 and comm.workspace_bytes > 0,
                    workspace_bytes_before_after=[held, comm.workspace_bytes],
                )
        # path="auto" on a shape never called: the path is decided at plan creation (table or
        # cost model, nothing measured), so the capture must work.
        t, beta = inputs("ag_rotate_a", tp, 850, dev)
        name = "first_call/auto_inside_capture"
        try:
            g, y = capture(op_of("ag_rotate_a", t, beta, None, "auto", group=comm))
            g.replay()
            e = check(y, "ag_rotate_a", t, beta)[0]
            record(name, e < TOL_SAME_DTYPE, outcome="captured", rel_err_same_dtype=e)
        except Exception as ex:  # noqa: BLE001
            record_exception(name, ex)
        # Communicator.raise_launch_errors() inside a capture: a clear RuntimeError, raised before
        # any CUDA call, so the capture around it stays valid and replays correctly.
        name = "first_call/check_inside_capture_refused"
        refused = []

        def op_then_check():
            y = op_of("ag_rotate_a", t, beta, None, "overlap", group=comm)()
            try:
                comm.raise_launch_errors()
            except RuntimeError as ex:
                refused.append(str(ex))
            return y

        try:
            g, y = capture(op_then_check)
            refill("ag_rotate_a", t, 870)
            g.replay()
            e = check(y, "ag_rotate_a", t, beta)[0]
            msg = refused[0] if refused else None
            expected = (
                "Communicator.raise_launch_errors() synchronises the device: not allowed inside "
                "a CUDA"
            )
            record(
                name,
                msg is not None and expected in msg and e < TOL_SAME_DTYPE,
                message=msg,
                rel_err_same_dtype=e,
            )
        except Exception as ex:  # noqa: BLE001
            record_exception(name, ex)
        torch.cuda.synchronize()


def test_timeout(dev):
    """Rank tp-1 never replays its captured op: the other ranks' replay times out in the entry
    barrier, reported at the next op call and by check(); nobody hangs."""
    tp, r = dist.get_world_size(), rank()
    wait_s = 1.0
    c = dcomm.Communicator(wait_timeout_s=wait_s, timeout_s=60.0)
    t, beta = inputs("ag_rotate_a", tp, 990, dev)
    op = op_of("ag_rotate_a", t, beta, None, "overlap", group=c)
    op()  # plan and graphs on every rank
    c.raise_launch_errors()
    g, y = capture(op)
    dist.barrier()
    if r != tp - 1:
        t0 = time.perf_counter()
        g.replay()
        torch.cuda.synchronize()  # the entry barrier gives up after wait_s
        waited = time.perf_counter() - t0
        t1 = time.perf_counter()
        g.replay()  # aborted: every captured op exits at once
        torch.cuda.synchronize()
        aborted_replay = time.perf_counter() - t1
        where = f"entry barrier: barrier slot of device {tp - 1} did not reach generation"
        msgs = runtime_errors(
            (("next_op_call", op), ("raise_launch_errors", c.raise_launch_errors))
        )
        ok = (
            msgs["next_op_call"] is not None
            and where in msgs["next_op_call"]
            and f"rank {r}: device {r}" in msgs["next_op_call"]
            and msgs["raise_launch_errors"] is not None
            and where in msgs["raise_launch_errors"]
            and waited < 4 * wait_s + 2
            and aborted_replay < wait_s / 2
        )
        record(
            "timeout/peer_never_replays",
            ok,
            replay_seconds=waited,
            aborted_replay_seconds=aborted_replay,
            **msgs,
        )
    dist.barrier()
    c.close()


def test_gathered(dev):
    tp = dist.get_world_size()
    for i, schedule in enumerate(("ag_rotate_a", "ag_rotate_b")):
        for path in ("overlap", "collective"):
            name = f"gathered/{schedule}/{path}"
            if path == "collective" and left_out_when_shared(name, NEEDS_NCCL_IN_GRAPH):
                continue
            try:
                t, beta = inputs(schedule, tp, 1100 + i, dev)
                g, (y, ga) = capture(op_of(schedule, t, beta, None, path, gathered=True))
                worst, equal = 0.0, True
                for r in range(3):
                    refill(schedule, t, 1200 + 10 * i + r)
                    g.replay()
                    worst = worse(worst, check(y, schedule, t, beta)[0])
                    full = gather0(t["a"] if schedule == "ag_rotate_a" else t["w"])
                    equal = equal and bool(torch.equal(ga, full))
                record(
                    name,
                    worst < TOL_SAME_DTYPE and equal,
                    worst_rel_err_same_dtype=worst,
                    gathered_equal=equal,
                )
            except Exception as ex:  # noqa: BLE001
                record_exception(name, ex)


def warm_up_capture_stream(dev):
    """cuBLAS and NCCL set themselves up lazily per stream: do it outside any capture, as torch's
    CUDA graph notes advise (ranks sharing a GPU run no NCCL)."""
    global CAPTURE_STREAM
    CAPTURE_STREAM = torch.cuda.Stream(dev)
    CAPTURE_STREAM.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(CAPTURE_STREAM):
        x = torch.randn(64, 64, device=dev).to(torch.bfloat16)
        for _ in range(3):
            y = x @ x.t()
            if not SHARED_GPU:
                dist.all_reduce(y)
    torch.cuda.current_stream().wait_stream(CAPTURE_STREAM)
    torch.cuda.synchronize()


def sections(dev, args) -> dict:
    warm_up_capture_stream(dev)
    return {
        "every_op": lambda: test_every_op(dev),
        "many_replays": lambda: test_many_replays(dev, args.replays),
        "interleaved": lambda: test_interleaved(dev),
        "first_call": lambda: test_first_call(dev),
        "timeout": lambda: test_timeout(dev),
        "gathered": lambda: test_gathered(dev),
    }


def main():
    worker_main("capture_results.json", sections, replays=1000)


if __name__ == "__main__":
    main()
