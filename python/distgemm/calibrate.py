"""Measures this machine's cost-model constants on its GPUs and stores them, keyed by GPU model,
TP and NVLink topology, where ``path="auto"`` finds them.

    torchrun --nproc-per-node N -m distgemm.tune --calibrate [--out FILE] [--window-ms MS]
        [--reduce-only]
    python -m distgemm.tune --calibrate --refit FILE [--out FILE2]   # no GPU

TP = N. It runs, on shapes of its own (none of them a Llama layer's): our GEMM kernel and
torch.mm alone; copy-engine reads from 1..TP-1 peers at once; the all-gather and reduce-scatter
ops on the collective path (NCCL + torch.mm) and on the overlapped plan at S = TP and 2 TP; and
gemm_all_reduce's decode terms: torch.mm, NCCL's and our all-reduces and the fused kernel with
each tail it runs at 1..256 tokens (``REDUCE_SHAPES``).
``--reduce-only`` measures only the last and adds them to the machine's calibration already
found (the file written, or shipped, for this GPU, TP and topology). Each run: calls until
``--window-ms`` of them are timed with CUDA events, after a warm-up (``RUN_WARMUP_MS``),
enqueued behind a sleeping kernel where the host is slower than the GPU (GPU time is what the
model prices); the slowest rank's ms per call. Then ``runtime.calibration_fit`` fits the
constants, and rank 0 writes them with every run and the fit's errors (default: the directory
of ``DISTGEMM_CALIBRATION`` or ``~/.cache/distgemm/machines``, file
``<gpu>-tp<N>-<topology>.json``). Under a minute on 2 or 4 H100s. ``--refit FILE`` fits the
constants again from the runs FILE stores (the model's terms changed, not the machine), without
a GPU, and writes them to ``--out`` (default: FILE itself).
"""

from __future__ import annotations

import datetime
import functools
import math
import os
import sys
import time
from typing import Any

from . import cli
from .runtime import calibration_fit, machine
from .runtime.event_wait import wait_event

WARMUP_S = 1.0  # the GPUs' clocks settle under sustained load (a 700 W cap) before any run
# Each run's own warm-up before its timed window: RUN_WARMUP_MS of its calls, or
# RUN_WARMUP_CALLS calls where those take less (and at least a quarter of the window). Without
# it, a run of long calls after runs of short ones starts on the higher clocks of a cooler chip
# under the 700 W cap, and its window times those: the rates of large GEMMs came out above what
# they sustain (docs/tuning.md).
RUN_WARMUP_MS = 200.0
RUN_WARMUP_CALLS = 40
# Per-rank GEMMs of the kernel and torch.mm fits: (m, n, k), both tiles for the kernel; the last
# two as large as the largest layers' per-rank GEMMs (a 405B-class FC1 at 8 Ki tokens, TP=4),
# so that the rates are measured there rather than extrapolated.
GEMMS = [
    *((m, n, k) for m in (512, 2048, 6144) for n in (2560, 6144, 11264) for k in (2560, 6144)),
    (8192, 13312, 10240),
    (10240, 24576, 15360),
]
COPY_BYTES = (1 << 23, 1 << 25, 1 << 27)  # per peer
# Global (m, n, k) of the path runs, for the all-gather (ag_rotate_a) and the reduce-scatter
# (rs_tile_a) op alike, before path_shapes rounds them for the TP: tokens from 512 to 16 Ki, and
# K and N varied apart so that the bytes moved and the GEMM's work are not proportional.
PATH_SHAPES = [
    (512, 14336, 4096),
    (2048, 28672, 4096),
    (4096, 8192, 14336),
    (4096, 20480, 3072),
    (8192, 6144, 8192),
    (8192, 16384, 2048),
    (16384, 4096, 5120),
    (12288, 12288, 12288),
    (16384, 24576, 10240),
    (8192, 49152, 18432),
]
# gemm_all_reduce at decode token counts: this rank's (n, k), each at every token count of
# REDUCE_TOKENS (the weight from 16 to 503 MB, the all-reduce from 6 KB to 8.6 MB). The weights
# reach into those of the layers the model prices (a 405B FC2 holds 872 MB per rank at TP=2), so
# that the fused kernel's cost per weight byte is measured there rather than extrapolated. The
# first has fewer output tiles than an H100's or H200's SMs, so that the decode kernel computes
# each tile in pieces there and the fit sees more than one partial per tile.
REDUCE_SHAPES = [(3072, 2560), (5632, 1536), (10240, 3584), (16896, 5120), (12288, 20480)]
REDUCE_TOKENS = (1, 4, 16, 32, 64, 128, 256)
GRAPH_CALLS = 20  # calls per CUDA graph of a decode run
# The weights one decode graph cycles through span at least this many L2 caches, so that every
# call streams its weight from HBM, as a server's layers (each its own weight) do: one weight
# replayed GRAPH_CALLS times stays in L2 where it fits and times below HBM's floor.
COLD_L2_SPAN = 2
WAIT_S = 60.0  # the longest wait for this rank's GPU work (one run is at most a few seconds)
CYCLES_PER_MS = 2.0e6  # torch.cuda._sleep's cycles per ms at up to 2 GHz (sleeps at least that)
SCHEDULES = {"all_gather_gemm": "ag_rotate_a", "gemm_reduce_scatter": "rs_tile_a"}


def path_shapes(tp: int) -> list[tuple[int, int, int]]:
    """PATH_SHAPES with every extent rounded up to a multiple of 128 TP: S up to 2 TP steps of
    a shard of 64-element (128-byte) aligned rows and columns."""
    unit = 128 * tp
    return [tuple(-(-x // unit) * unit for x in shape) for shape in PATH_SHAPES]


class Runner:
    """Times calls on every rank alike: the ranks agree on a call count from the slowest rank's
    estimate, so that collectives pair up."""

    def __init__(self, torch, dist, device, window_ms: float):
        self.torch, self.dist, self.device, self.window_ms = torch, dist, device, window_ms

    def sync(self, what: str) -> None:
        """Wait for this rank's GPU work so far, at most WAIT_S (a rank that never joins a
        collective would otherwise hold the others until NCCL's watchdog)."""
        done = self.torch.cuda.Event()
        done.record()
        wait_event(done, WAIT_S, f"calibration: {what}")

    def _agree_max(self, value: float) -> float:
        t = self.torch.tensor([value], device=self.device, dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t.item())

    def ms(self, fn) -> float:
        """GPU ms per call of ``fn``: the calls are enqueued behind a sleeping kernel long enough
        for the host to enqueue them all, so that the host's time per call (Python, NCCL's
        and the ops' host work) is not what is timed where it exceeds the GPU's."""
        torch = self.torch
        fn()
        self.sync("a first call")
        t0 = time.perf_counter()
        fn()
        fn()
        self.sync("two calls")
        est = self._agree_max((time.perf_counter() - t0) / 2 * 1e3)
        calls = int(min(5000, max(3, math.ceil(self.window_ms / max(est, 1e-3)))))
        warm = max(1, calls // 4, math.ceil(min(RUN_WARMUP_MS, RUN_WARMUP_CALLS * est) / est))
        t0 = time.perf_counter()
        for _ in range(warm):
            fn()
        host_ms = self._agree_max((time.perf_counter() - t0) * 1e3 / warm)
        # Host-bound calls (host time near the call's whole time) sleep while all are enqueued;
        # GPU-bound ones only long enough to get ahead (a long idle GPU would run the window
        # at the higher clocks of a cooled-down power cap).
        ahead = calls if host_ms > est / 2 else 10
        torch.cuda._sleep(int(min(host_ms * ahead * 1.5, 200.0) * CYCLES_PER_MS))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        wait_event(end, WAIT_S, "calibration: a timed window")
        return start.elapsed_time(end) / calls


def _warm(torch, device) -> None:
    a = torch.rand(8192, 8192, device=device, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < WARMUP_S:
        for _ in range(10):
            torch.mm(a, a)
        torch.cuda.synchronize(device)


def measure(
    torch, dist, device, tp: int, rank: int, window_ms: float, say, reduce_only: bool = False
) -> list[dict[str, Any]]:
    """Every run of a calibration on this rank (its own ms; the caller takes the maximum);
    ``reduce_only``: gemm_all_reduce's decode runs alone."""
    from . import _core, ops

    run = Runner(torch, dist, device, window_ms)
    stream = lambda: torch.cuda.current_stream(device).cuda_stream  # noqa: E731
    gen = torch.Generator(device=device).manual_seed(1234 + rank)

    def rand(*shape):
        return torch.rand(shape, device=device, generator=gen, dtype=torch.bfloat16) - 0.5

    runs: list[dict[str, Any]] = []
    _warm(torch, device)
    if reduce_only:
        return reduce_runs(torch, dist, device, tp, run, rand, say) if tp > 1 else []
    say(f"kernels: {len(GEMMS)} GEMMs x (2 tiles, torch.mm)")
    for m, n, k in GEMMS:
        a, b, d = rand(m, k), rand(n, k), torch.empty(m, n, device=device, dtype=torch.bfloat16)
        shape = {"m": m, "n": n, "k": k}
        for tile in (128, 256):
            args = (a.data_ptr(), b.data_ptr(), d.data_ptr(), m, n, k, "bf16", tile)

            def ours(args=args):
                _core.gemm(*args, cuda_device=device.index, stream=stream())

            runs.append({"kind": "gemm", **shape, "tile_n": tile, "ms": run.ms(ours)})
        runs.append(
            {"kind": "mm", **shape, "ms": run.ms(functools.partial(torch.mm, a, b.t(), out=d))}
        )
    if tp > 1:
        runs += _copy_runs(torch, dist, device, tp, rank, run, say)
        say(f"the ops: {len(PATH_SHAPES)} shapes x 2 ops x (collective, S = TP, 2 TP)")
        for m, n, k in path_shapes(tp):
            for op, schedule in SCHEDULES.items():
                if op == "all_gather_gemm":
                    a, w = rand(m // tp, k), rand(n // tp, k)
                else:
                    a, w = rand(m, k // tp), rand(n, k // tp)
                fn = getattr(ops, op)
                for path, steps in (("collective", None), ("overlap", tp), ("overlap", 2 * tp)):
                    call = functools.partial(fn, a, w, path=path, steps=steps)
                    plan_steps = steps or _core.default_steps(schedule, tp, m, n, k, 1)
                    where = {"path": path, "schedule": schedule, "tp": tp, "steps": plan_steps}
                    shape = {"m": m, "n": n, "k": k}
                    runs.append({"kind": "path", **where, **shape, "ms": run.ms(call)})
                    if path == "overlap":  # after its first call, which installs the table
                        runs[-1]["step_kernel"] = calibration_fit.installed_step_kernel(
                            schedule, tp, plan_steps, m, n, k
                        )
                del a, w
        run.sync("the ops' runs")
        runs += reduce_runs(torch, dist, device, tp, run, rand, say)
    return runs


def _collective_call(torch, comm, a, w, out, algorithm: str) -> None:
    """One call of ``gemm_all_reduce``'s collective path with ``algorithm``, by the path's own
    functions: torch.mm of ``a`` by ``w``, then NCCL's all-reduce in place
    (``mm_then_nccl_all_reduce``) or ours (``mm_then_all_reduce``)."""
    from .runtime.allreduce import mm_then_all_reduce
    from .runtime.paths.collective import mm_then_nccl_all_reduce

    if algorithm == "nccl":
        mm_then_nccl_all_reduce(comm, a, w.t(), out)
    else:
        capturing = torch.cuda.is_current_stream_capturing()
        mm_then_all_reduce(comm, a, w.t(), out, algorithm, capturing)


def weight_copies(weight_bytes: int, l2_bytes: int, calls: int = GRAPH_CALLS) -> int:
    """How many copies of a weight of ``weight_bytes`` a decode graph of ``calls`` calls cycles
    through: enough to span COLD_L2_SPAN L2 caches of ``l2_bytes`` (0: none known, one copy), at
    most one per call."""
    if l2_bytes <= 0 or weight_bytes <= 0:
        return 1
    need = -(-COLD_L2_SPAN * l2_bytes // weight_bytes)
    return max(1, min(calls, need))


def l2_bytes(device) -> int:
    """The L2 cache's bytes of a CUDA ``device`` (0 on the CPU or where torch does not say)."""
    import torch

    if torch.device(device).type != "cuda":
        return 0
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0))


def reduce_runs(torch, dist, device, tp, run, rand, say) -> list[dict[str, Any]]:
    """gemm_all_reduce's decode runs (calibration_fit.fit_reduce): torch.mm and the fused path
    with each tail that runs the shape (``machine.FUSED_PATHS``) at every REDUCE_SHAPES x
    REDUCE_TOKENS, and torch.mm then NCCL's and each of our all-reduces (the collective path).
    Each is timed as servers run it: a CUDA graph of GRAPH_CALLS calls, replayed (eager launches
    of calls of a few microseconds time the launch gaps, not the call), every call's torch.mm
    cycling through weight_copies copies of the weight."""
    from . import ops
    from .runtime.communicator import get_communicator
    from .runtime.paths.collective import own_all_reduce_offer
    from .runtime.paths.fused import fused_problem, resident_and_partials
    from .runtime.spec import make_spec

    comm = get_communicator(None)
    say(f"gemm_all_reduce at decode sizes: {len(REDUCE_SHAPES)} shapes x {len(REDUCE_TOKENS)}"
        " token counts x (torch.mm, fused, NCCL and our all-reduces), in CUDA graphs")  # fmt: skip

    def graphed_ms(*calls) -> float:
        calls[0]()  # eagerly first: an entry's setup is no part of a capture
        run.sync("an eager call before capture")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(GRAPH_CALLS):
                calls[i % len(calls)]()
        ms = run.ms(graph.replay) / GRAPH_CALLS
        run.sync("a graph's replays")
        del graph
        return ms

    runs: list[dict[str, Any]] = []
    for n, k in REDUCE_SHAPES:
        w = rand(n, k)
        copies = weight_copies(w.numel() * w.element_size(), l2_bytes(device))
        ws = [w] + [w.clone() for _ in range(copies - 1)]
        for m in REDUCE_TOKENS:
            a, d = rand(m, k), torch.empty(m, n, device=device, dtype=torch.bfloat16)
            shape = {"m": m, "n": n, "k": k}
            mm = graphed_ms(*(functools.partial(torch.mm, a, x.t(), out=d) for x in ws))
            runs.append({"kind": "reduce_mm", **shape, "ms": mm})
            spec = make_spec("gemm_all_reduce", "ar_tile_a", tp, 0, None, a, w)
            for path, tail in machine.FUSED_PATHS.items():
                if not fused_problem(spec, torch.bfloat16, tail):
                    resident, splits = resident_and_partials("bf16", m, n, k, device.index)
                    partials = {"resident_ctas": resident, "splits": splits}
                    fused_calls = (
                        functools.partial(ops.gemm_all_reduce, a, x, path=path, out=d) for x in ws
                    )
                    runs.append({"kind": "fused", "tp": tp, **shape, "tail": tail, **partials,
                                 "ms": graphed_ms(*fused_calls)})  # fmt: skip
            nbytes = m * n * 2
            # Each all-reduce as the collective path runs it, right after its torch.mm (the
            # ranks' GEMMs end apart and the all-reduce waits for the last): NCCL's in place, ours
            # by the path's own call; its ms is the pair's less torch.mm's.
            offer = own_all_reduce_offer(m * n, d.dtype, tp)
            for algorithm in ["nccl"] + [x for x, problem in offer.items() if not problem]:
                pair_calls = (
                    functools.partial(_collective_call, torch, comm, a, x, d, algorithm) for x in ws
                )
                pair = graphed_ms(*pair_calls)
                runs.append({"kind": "all_reduce", "algorithm": algorithm, "bytes": nbytes,
                             **shape, "after_mm_ms": pair, "ms": pair - mm})  # fmt: skip
            del a, d
        del w, ws
    return runs


def _copy_runs(torch, dist, device, tp, rank, run, say) -> list[dict[str, Any]]:
    """Copy-engine reads into this GPU from 1..TP-1 peers at once (torch's symmetric memory maps
    the peers' buffers; a same-device copy of mapped peer memory is a copy-engine memcpy)."""
    import torch.distributed._symmetric_memory as symm

    say(f"copy engine: 1..{tp - 1} peers x {len(COPY_BYTES)} sizes")
    biggest = max(COPY_BYTES)
    buf = symm.empty(biggest, dtype=torch.uint8, device=device)
    buf.fill_(rank)
    handle = symm.rendezvous(buf, dist.group.WORLD.group_name)
    peers = [(rank + i) % tp for i in range(1, tp)]
    remote = [handle.get_buffer(p, (biggest,), torch.uint8) for p in peers]
    dst = torch.empty(tp - 1, biggest, dtype=torch.uint8, device=device)
    streams = [torch.cuda.Stream(device) for _ in peers]
    runs = []
    for count in range(1, tp):
        for nbytes in COPY_BYTES:

            def copies(count=count, nbytes=nbytes):
                cur = torch.cuda.current_stream(device)
                for i in range(count):
                    streams[i].wait_stream(cur)
                    with torch.cuda.stream(streams[i]):
                        dst[i, :nbytes].copy_(remote[i][:nbytes])
                for i in range(count):
                    cur.wait_stream(streams[i])

            runs.append({"kind": "copy", "peers": count, "bytes": nbytes, "ms": run.ms(copies)})
    run.sync("the copies")
    dist.barrier()
    return runs


PROG = "python -m distgemm.tune --calibrate"


def command(argv: list[str]) -> str:
    """The command line of a run with arguments ``argv``, as the machine file records it."""
    return " ".join([PROG] + [a for a in argv if a != "--calibrate"])


def parse_args(argv=None):
    """(the parser, the arguments)."""
    ap = cli.ArgumentParser(PROG, __doc__)
    ap.add_argument("--calibrate", action="store_true", help="this mode (distgemm.tune's flag)")
    ap.add_argument("--out", help="the file to write (rank 0); default: see above")
    ap.add_argument("--window-ms", type=float, default=50.0, help="timed ms per run (default 50)")
    ap.add_argument(
        "--reduce-only",
        action="store_true",
        help="measure gemm_all_reduce's decode terms only, added to this machine's calibration",
    )
    ap.add_argument("--refit", metavar="FILE", help="fit FILE's stored runs again (no GPU)")
    args = ap.parse_args(argv)
    if args.refit and args.reduce_only:
        ap.error("--refit fits a whole calibration's runs: give it without --reduce-only")
    if not 1 <= args.window_ms <= 10_000:
        ap.error(f"--window-ms {args.window_ms} is not in 1..10000")
    return ap, args


def refit(path: str, out: str | None, argv) -> tuple[machine.MachineConstants, str]:
    """The constants fitted again from the runs the machine file ``path`` stores, written to
    ``out`` (None: ``path``); ValueError where the file stores no runs. Decode runs added by
    ``--reduce-only`` (``meta["reduce"]``) price the decode terms again, as they did."""
    old = machine.load(path)
    runs = old.meta.get("runs")
    if not runs:
        raise ValueError(f"{path} stores no calibration runs: it was fitted elsewhere")
    meta = {k: v for k, v in old.meta.items() if k not in ("fit", "reduce")}
    meta["refit"] = command(argv)
    mc = calibration_fit.fit(runs, old.key, old.slots, meta)
    added = old.meta.get("reduce")
    if added:
        mc = calibration_fit.with_reduce(
            mc, added["runs"], {k: v for k, v in added.items() if k != "runs"}
        )
    out = out or path
    mc.save(out)
    return mc, out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap, args = parse_args(argv)
    if args.refit:
        try:
            mc, out = refit(args.refit, args.out, argv)
        except (OSError, ValueError) as e:
            ap.error(str(e))
        reduce_error = f", decode {mc.reduce.choice_error:.3f}" if mc.reduce else ""
        print(f"choice error {mc.choice_error:.3f}{reduce_error}; wrote {out}")
        return 0
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        ap.error("it measures this machine's GPUs, and torch sees none")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    if not dist.is_initialized():
        if "RANK" in os.environ:
            dist.init_process_group("nccl", device_id=device)
        else:
            dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29531", rank=0,
                                    world_size=1, device_id=device)  # fmt: skip
    tp, rank = dist.get_world_size(), dist.get_rank()
    t0 = time.perf_counter()

    def say(text: str) -> None:
        if rank == 0:
            print(f"[{time.perf_counter() - t0:6.1f} s] {text}", flush=True)

    key = machine.local_key(device, tp)
    base = machine.find(key) if args.reduce_only else None
    if args.reduce_only and (base is None or base.key != key or tp < 2):
        ap.error(
            f"--reduce-only adds to a calibration of {key.slug()} at TP >= 2, and none is found"
        )
    runs = measure(torch, dist, device, tp, rank, args.window_ms, say, args.reduce_only)
    ms = torch.tensor([r["ms"] for r in runs], device=device, dtype=torch.float64)
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)
    for r, v in zip(runs, ms.tolist(), strict=True):
        r["ms"] = v
    props = torch.cuda.get_device_properties(device)
    meta = {
        "command": command(argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "seconds": round(time.perf_counter() - t0, 1),
        "runs": runs,
    }
    if rank == 0:
        if base is not None:
            mc = calibration_fit.with_reduce(base, runs, meta)
        else:
            mc = calibration_fit.fit(runs, key, props.multi_processor_count, meta)
        out = args.out or str(machine.calibration_dir() / (key.slug() + ".json"))
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        mc.save(out)
        for stage, e in mc.meta["fit"].items():
            rms, worst = e["rms"], e["max"]
            print(f"  {stage:24s} runs {e['runs']:3d}  rel. err. rms {rms:.3f} max {worst:.3f}")
        took = time.perf_counter() - t0
        reduce_error = f", decode {mc.reduce.choice_error:.3f}" if mc.reduce else ""
        print(f"choice error {mc.choice_error:.3f}{reduce_error}; wrote {out} in {took:.1f} s")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
