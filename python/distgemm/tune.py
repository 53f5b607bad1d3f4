"""``python -m distgemm.tune``: measure ahead of time, on the deployment's GPUs, every candidate of
the Llama layers of one model (the collective path, and the overlapped plan at S = TP and 2TP
with each GEMM tile) per token bucket, and write the tuning table the ops then read
(``DISTGEMM_TUNING_TABLE`` or ``distgemm.load_tuning_table``). Under torchrun, one process per
GPU::

    torchrun --nproc-per-node 2 -m distgemm.tune --model 70B --tp 2 --out table.json
    python -m distgemm.tune --model 70B --tp 2 --dry-run      # the candidate list, no GPU
    torchrun --nproc-per-node 4 -m distgemm.tune --calibrate  # the cost model's constants

``--calibrate`` measures the machine's constants instead of a table (``distgemm.calibrate``):
``path="auto"`` then prices every shape on this machine, tuned or not.

Timing: per candidate, a settled start (device sync + control exchange), ``--warmup-ms`` of
calls, then ``--rounds`` windows of about ``--round-ms`` each between two CUDA events; per round
the maximum over the ranks, then the median over the rounds (the steady state, as the sweep
times: docs/tuning_table.md, "Sweep timing windows"). Each overlapped candidate's first output is
checked against the collective path's. Progress on a tqdm bar where tqdm is installed.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from . import _core, calibrate, cli, llama3
from .runtime import cost_model, machine, tuning_table
from .runtime.communicator import close_all, get_communicator
from .runtime.entry_cache import EntryKey, entry_cache
from .runtime.event_wait import wait_event
from .runtime.precision import Precision
from .runtime.spec import make_spec

OPS = {"all_gather": "all_gather_gemm", "reduce_scatter": "gemm_reduce_scatter"}
DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16"}
CHECK_TOL = 2e-2  # relative Frobenius error of an overlapped candidate against the collective


@dataclass
class Candidate:
    path: str
    steps: int
    tile_n: int
    rejected: str | None = None  # why the plan cannot run this shape
    predicted_ms: float | None = None  # runtime.cost_model's prediction
    ms: float | None = None  # measured

    @property
    def name(self) -> str:
        return tuning_table.candidate_name(self.path, self.steps, self.tile_n)


@dataclass
class Case:
    model: str
    layer: str
    tokens: int
    op: str
    schedule: str
    m: int
    n: int
    k: int
    skipped: str | None = None
    candidates: list[Candidate] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.model}/{self.layer}/M{self.tokens}"


def make_cases(model: str, tp: int, tokens, layers, tiles, mc=None) -> list[Case]:
    """Every (layer, token count) of ``model`` on ``tp`` ranks with its candidates: the
    collective path, then the overlapped plan at S in {TP, 2TP} x ``tiles``, each with the
    plan's verdict and, given the machine's constants ``mc``, the model's prediction. Shapes
    only (no GPU)."""
    defs = llama3.layers()
    cases = []
    for t in tokens:
        for layer in layers:
            coll, schedule = defs[layer]["collective"], defs[layer]["schedule"]
            m, n, k = llama3.gemm(model, layer, t)
            case = Case(model, layer, t, OPS[coll], schedule, m, n, k)
            case.skipped = llama3.tp_split_reason(model, layer, t, tp) or None
            cases.append(case)
            if case.skipped:
                continue
            case.candidates.append(Candidate("collective", tp, 0))
            for steps in (tp, 2 * tp):
                for tile in tiles:
                    case.candidates.append(Candidate("overlap", steps, tile))
            for c in case.candidates:
                try:
                    plan = _core.build_plan(schedule, tp, c.steps, m, n, k)
                    c.rejected = plan.extent_problem(-1) or None
                except ValueError as e:
                    plan, c.rejected = None, str(e)
                if plan is not None and mc is not None:
                    pred = cost_model.predict(mc, plan, c.tile_n)
                    c.predicted_ms = pred[
                        "collective_ms" if c.path == "collective" else "overlap_ms"
                    ]
            case.skipped = case.candidates[0].rejected  # the collective path's S = TP plan
    return cases


def format_cases(cases: list[Case]) -> str:
    """The candidate list: one line per candidate with the model's prediction or the reason it
    is left out."""
    lines = []
    for c in cases:
        head = f"{c.name}: {c.op} {c.schedule} M={c.m} N={c.n} K={c.k}"
        if c.skipped:
            lines.append(f"{head}: skipped ({c.skipped})")
            continue
        lines.append(f"{head}, bucket {tuning_table.token_bucket(c.m)}")
        for cand in c.candidates:
            what = (
                f"skipped: {cand.rejected}"
                if cand.rejected
                else f"model {cand.predicted_ms:.4f} ms"
                if cand.predicted_ms is not None
                else "no model (no calibration of this machine)"
            )
            if cand.ms is not None:
                what += f", measured {cand.ms:.4f} ms"
            lines.append(f"  {cand.name:18s} {what}")
    return "\n".join(lines)


def table_entries(cases: list[Case], tp: int, dtype: str) -> list[tuning_table.TableEntry]:
    """One entry per measured case: the faster of the collective path and the best overlapped
    candidate (whose S and tile the entry keeps in either case)."""
    out = []
    for c in cases:
        timed = {cand.name: cand for cand in c.candidates if cand.ms is not None}
        overlap = [cand for cand in timed.values() if cand.path == "overlap"]
        if c.skipped or "collective" not in timed or not overlap:
            continue
        best = min(overlap, key=lambda cand: cand.ms)
        path = "overlap" if best.ms <= timed["collective"].ms else "collective"
        ms = {name: cand.ms for name, cand in timed.items()}
        bucket = tuning_table.token_bucket(c.m)
        key = dict(op=c.op, schedule=c.schedule, tp=tp, dtype=dtype, n=c.n, k=c.k, tokens=bucket)
        out.append(
            tuning_table.TableEntry(**key, path=path, steps=best.steps, tile_n=best.tile_n, ms=ms)
        )
    return out


# ---------------------------------------------------------------------------------------------
# Measuring (torchrun, one process per GPU).


def steady_ms(fn, comm, what: str, warmup_ms: float, round_ms: float, rounds: int) -> float:
    """Steady-state ms per call of ``fn`` (a collective: every rank calls it equally often):
    settle, one untimed and one timed call to size the windows (agreed over the ranks), warm-up,
    then ``rounds`` windows; per round the maximum over the ranks, the median over rounds."""
    torch.cuda.synchronize(comm.device)
    comm.all_gather(None, f"{what}: settle")
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def window(calls: int) -> float:
        start.record()
        for _ in range(calls):
            fn()
        stop.record()
        wait_event(stop, comm.timeout_s, what, comm)
        return start.elapsed_time(stop) / calls

    fn()
    per_call = max(max(comm.all_gather(window(1), f"{what}: probe")), 1e-3)
    calls = max(1, min(100_000, math.ceil(round_ms / per_call)))
    for _ in range(max(0, math.ceil(warmup_ms / per_call))):
        fn()
    times = [window(calls) for _ in range(rounds)]
    everyone = comm.all_gather(times, f"{what}: timings")
    return statistics.median(max(t[i] for t in everyone) for i in range(rounds))


def measure(cases: list[Case], comm, dtype: str, args, progress) -> None:
    """Time every candidate of every case on this communicator (``cand.ms``)."""
    torch_dtype = getattr(torch, DTYPE_NAMES[dtype])
    gen = torch.Generator(device=comm.device).manual_seed(1234 + comm.rank)
    for case in progress(cases):
        if case.skipped:
            continue
        local = _core.build_plan(case.schedule, comm.tp, comm.tp, case.m, case.n, case.k)
        a_shape, w_shape = local.local_shapes["A"], local.local_shapes["B"]
        a = torch.randn(a_shape, device=comm.device, dtype=torch_dtype, generator=gen)
        w = torch.randn(w_shape, device=comm.device, dtype=torch_dtype, generator=gen)
        w /= math.sqrt(w_shape[1])
        reference = None
        for cand in case.candidates:
            if not cand.rejected:
                reference = _time_candidate(case, cand, comm, a, w, reference, args)


def _time_candidate(case: Case, cand: Candidate, comm, a, w, reference, args):
    """Time one candidate (``cand.ms``) after checking its first output against ``reference``
    (the collective path's, the first candidate's); returns the reference."""
    # Each candidate's entry is dropped after its timing: one key serves every tile.
    shapes = (("a", tuple(a.shape)), ("w", tuple(w.shape)))
    key = EntryKey(
        case.op, case.schedule, cand.steps, Precision(a.dtype), shapes, 0.0, False, cand.path
    )
    cache = entry_cache(comm)
    entry = cache.create(
        key,
        lambda: make_spec(
            case.op, case.schedule, comm.tp, comm.rank, cand.steps, a, w, tile_n=cand.tile_n
        ),
    )
    out = a.new_empty(entry.state.out_shape)
    tensors = {"a": a, "w": w, "bias": None, "c": None}

    def call():
        entry.state.run(case.op, comm, tensors, out, False)

    call()
    comm.raise_launch_errors()
    if reference is None:
        reference = out.float().clone()
    else:
        err = float((out.float() - reference).norm() / reference.norm().clamp_min(1e-30))
        if not err <= CHECK_TOL:
            raise RuntimeError(
                f"{case.name} {cand.name}: relative error {err:.3g} against the collective "
                f"path exceeds {CHECK_TOL} (rank {comm.rank})"
            )
    what = f"tune {case.name} {cand.name}"
    cand.ms = steady_ms(call, comm, what, args.warmup_ms, args.round_ms, args.rounds)
    cache.drop(key)
    return reference


def _progress(enabled: bool):
    """An iterator wrapper: a tqdm bar on stderr where ``enabled`` and tqdm is installed."""
    if enabled:
        try:
            from tqdm import tqdm

            return lambda it: tqdm(it, file=sys.stderr, unit="case", dynamic_ncols=True)
        except ImportError:
            pass
    return lambda it: it


def run_measurement(cases: list[Case], args) -> tuning_table.TuningTable | None:
    """Join torchrun's process group (NCCL), measure, and return the table on rank 0."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    if dist.get_world_size() != args.tp:
        raise ValueError(
            f"--tp {args.tp} but the process group has {dist.get_world_size()} ranks: run "
            f"torchrun --nproc-per-node {args.tp}"
        )
    tuning_table.load_tuning_table(None)  # candidates are chosen here, not by a table
    comm = get_communicator(None)
    t0 = time.time()
    measure(cases, comm, args.dtype, args, _progress(comm.rank == 0 and not args.no_progress))
    entries = table_entries(cases, args.tp, args.dtype)
    meta = {
        "device": torch.cuda.get_device_name(comm.device),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python -m distgemm.tune", *sys.argv[1:]]),
        "timing": {"warmup_ms": args.warmup_ms, "round_ms": args.round_ms, "rounds": args.rounds},
        "seconds": round(time.time() - t0, 1),
    }
    table = tuning_table.TuningTable(entries, "measured", meta)
    rank = comm.rank
    comm.all_gather(None, "tune done")
    close_all()
    dist.destroy_process_group()
    return table if rank == 0 else None


def _ints(text: str) -> list[int]:
    """An argparse type: comma-separated integers."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not comma-separated integers") from None


def parse_args(argv=None) -> argparse.Namespace:
    ap = cli.ArgumentParser("python -m distgemm.tune", __doc__)
    ap.add_argument(
        "--model",
        required=True,
        choices=list(llama3.models()),
        help="the Llama-3 model whose layers are tuned (python/distgemm/data/llama3.json)",
    )
    ap.add_argument("--tp", type=int, required=True, help="ranks, 1..8 (torchrun --nproc-per-node)")
    ap.add_argument(
        "--tokens",
        type=_ints,
        default=list(llama3.tokens()),
        help="token counts, powers of two (each is its bucket); default: the sweep's",
    )
    ap.add_argument("--layers", default=",".join(llama3.layers()), help="comma-separated")
    ap.add_argument(
        "--dtype", choices=tuple(DTYPE_NAMES), default="bf16", help="operand dtype (default bf16)"
    )
    ap.add_argument(
        "--tiles",
        type=_ints,
        default=[128, 256],
        help="GEMM tile widths to try, of 128 and 256 (default both)",
    )
    ap.add_argument(
        "--warmup-ms",
        type=float,
        default=200.0,
        help="ms of calls before each candidate's rounds (default 200)",
    )
    ap.add_argument(
        "--round-ms", type=float, default=100.0, help="ms of calls per timed round (default 100)"
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="timed rounds per candidate; their median counts (default 5)",
    )
    ap.add_argument("--out", help="table file to write (rank 0); needed unless --dry-run")
    ap.add_argument("--dry-run", action="store_true", help="print the candidates; no GPU")
    ap.add_argument(
        "--constants",
        help="a machine-constants file to price the candidates with (runtime.machine; default: "
        "this machine's, where a GPU is visible)",
    )
    ap.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    args = ap.parse_args(argv)
    layers = [x for x in args.layers.split(",") if x]
    unknown = sorted(set(layers) - set(llama3.layers()))
    if unknown:
        ap.error(f"--layers: {unknown[0]!r} is not one of {', '.join(llama3.layers())}")
    args.layers = layers
    if not 1 <= args.tp <= 8:
        ap.error(f"--tp {args.tp} is not in 1..8")
    for t in args.tokens:
        if t < 1 or t & (t - 1) or t > 2**30:
            ap.error(f"--tokens: {t} is not a power of two up to 2**30 (the table's buckets are)")
    for t in args.tiles:
        if t not in (128, 256):
            ap.error(f"--tiles: {t} is not 128 or 256")
    if args.rounds < 1 or not 0 < args.round_ms < math.inf or not 0 <= args.warmup_ms < math.inf:
        ap.error(
            "--rounds must be >= 1, --round-ms > 0 and --warmup-ms >= 0 (finite); got "
            f"{args.rounds}, {args.round_ms}, {args.warmup_ms}"
        )
    if not args.dry_run and not args.out:
        ap.error("--out is required unless --dry-run")
    return args


def main(argv=None) -> int:
    if "--calibrate" in (sys.argv[1:] if argv is None else argv):
        return calibrate.main(argv)
    args = parse_args(argv)
    mc = None  # the machine whose constants price the candidates beside the measurements
    if args.constants:
        try:
            mc = machine.load(args.constants).at_tp(args.tp)
        except ValueError as e:
            cli.ArgumentParser("python -m distgemm.tune", __doc__).error(str(e))
    elif torch.cuda.is_available():
        local = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        mc = machine.find(machine.local_key(local, args.tp))
    cases = make_cases(args.model, args.tp, args.tokens, args.layers, args.tiles, mc)
    if args.dry_run:
        print(format_cases(cases))
        n = sum(1 for c in cases for cand in c.candidates if not cand.rejected)
        print(f"{n} candidates in {sum(1 for c in cases if not c.skipped)} cases")
        return 0
    table = run_measurement(cases, args)
    if table is not None:
        table.save(args.out)
        print(format_cases(cases))
        print(f"wrote {args.out}: {len(table.entries)} entries (digest {table.digest})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
