"""distgemm's own GEMM kernel against torch.mm (cuBLAS) on one GPU, on every distinct local GEMM
and per-step sub-GEMM shape of the Llama sweep, with every kernel configuration and the model's
pick.

    python3 -m benchmarks.kernel.kernel_vs_cublas [--models 70B,405B] [--tp 2] [--tokens 4096,8192]
        [--layers O,FC2] [--local-only] [--skip N] [--limit N] [--budget-s S]
        [--configs 128x256,128x128c1] [--out DIR]
    python3 -m benchmarks.kernel.kernel_vs_cublas --tp 2 --dry-run     # the shapes, no GPU
    python3 -m benchmarks.kernel.kernel_vs_cublas --replot RUN.json [MORE.json] --out DIR   # no GPU
        [--table OUT.json]     # also the kernel table of the stored runs' records

Shapes (benchmarks/kernel/shapes.py): models 8B/70B/405B x QKV/O/FC1/FC2 x the sweep's token
counts x TP 1, 2, 4, 8, each case's local GEMM (the sweep's compute floor) and every sub-GEMM of
its S = TP and 2*TP plans, deduplicated, local GEMMs first. Per shape, on the current CUDA
device: fresh uniform random bf16 operands A[m, k] in [-1, 1) and B[n, k] scaled by 1/sqrt(k)
(the same tensors for every variant); distgemm's kernel (``_core.gemm``) in every bf16
configuration (``_core.gemm_config_names``; --configs restricts the list, the model's pick is
always timed), the model's pick on this device recorded (``_core.gemm_resolve_config``), each
checked against torch.mm (relative error < 1e-2); then steady-state timing as the sweep does
(benchmarks/common/timing.time_variant): torch.mm with the long warm-up, the configurations (their
order reversed from shape to shape), torch.mm again (A B A: its time is the mean of both
windows, their spread is reported as drift). Each timed
call replays a CUDA graph of ``calls`` back-to-back GEMMs (enough for ~0.1 ms, so that host
launch overhead does not decide small shapes; --eager times single eager calls); the ms
reported are per GEMM. Output: a line per shape as it finishes, then the table, the acceptance
summary, ``<date>-kernel-vs-cublas[-LABEL].{csv,json,txt,png}`` under --out (CSV and JSON also
after every shape). Reports are benchmarks/kernel/report.py.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
from typing import Any

from benchmarks.common.llama_cases import LAYERS, MODELS, TOKENS
from benchmarks.common.report import RESULTS_DIR
from benchmarks.common.timing import (
    REWARM_S,
    TIMED_S,
    WARMUP_S,
    SingleGpuContext,
    graphed,
    rel_err,
    short_error,
    time_variant,
)
from benchmarks.kernel import report, table
from benchmarks.kernel.shapes import TP_CHOICES, KernelShape, describe_sources, kernel_shapes
from distgemm import _core, cli
from distgemm.runtime import kernel_table

# Graph replays are sized so that one replay takes about this long (at the compute floor).
REPLAY_TARGET_MS = 0.1
MAX_CALLS = 64
# Seconds per shape besides the timed windows: operands, checks, graph capture.
SETUP_S = 0.5


def shape_seconds(n_configs: int = len(report.CONFIGS)) -> float:
    """One shape's time: torch.mm's long warm-up and window, then a window with a short warm-up
    for each configuration and for torch.mm again, and the setup."""
    return WARMUP_S + TIMED_S + (n_configs + 1) * (REWARM_S + TIMED_S) + SETUP_S


SHAPE_S = shape_seconds()  # with every configuration


def estimated_seconds(n_shapes: int, n_configs: int = len(report.CONFIGS)) -> float:
    """The run's time on one GPU."""
    return n_shapes * shape_seconds(n_configs)


def install_kernels(device, choice: str, cublas_option: str = "") -> str:
    """Hands the runtime the kernel table of ``--kernel-table`` ("shipped": the package's for
    this GPU, "off", or a file) and, where ``cublas_option`` names the option that asks for
    cuBLASLt, checks that it is available; '' when done, else the line that says why not."""
    if choice != "shipped":
        os.environ[kernel_table.TABLE_ENV] = choice
    try:
        kernel_table.install(device)
    except ValueError as e:
        return f"--kernel-table {choice}: {e}"
    if cublas_option and _core.cublaslt_problem():
        return f"{cublas_option}: {_core.cublaslt_problem()}"
    return ""


def calls_per_replay(m: int, n: int, k: int) -> int:
    """GEMMs per graph replay: ~REPLAY_TARGET_MS at the compute floor, 1 to MAX_CALLS."""
    return max(1, min(MAX_CALLS, math.ceil(REPLAY_TARGET_MS / report.floor_ms(m, n, k))))


def variant_count(args: argparse.Namespace) -> int:
    """Kernels timed per shape besides torch.mm, at most: the configurations asked for, cuBLASLt's
    ranks, and the model's pick where it is none of them."""
    return len(args.configs) + args.cublas_algos + 1


def _csv_list(kind, valid=None):
    def parse(text: str):
        items = [kind(x) for x in text.split(",") if x]
        bad = [x for x in items if valid is not None and x not in valid]
        if bad:
            raise argparse.ArgumentTypeError(
                f"{bad[0]!r} is not one of {', '.join(map(str, valid))}"
            )
        return items

    return parse


def parse_args(argv=None) -> argparse.Namespace:
    ap = cli.ArgumentParser("python3 -m benchmarks.kernel.kernel_vs_cublas", __doc__)
    ap.add_argument("--models", type=_csv_list(str, tuple(MODELS)), default=None)
    ap.add_argument("--tp", type=_csv_list(int, TP_CHOICES), default=list(TP_CHOICES))
    ap.add_argument("--tokens", type=_csv_list(int), default=None, help=f"default {TOKENS}")
    ap.add_argument("--layers", type=_csv_list(str, LAYERS), default=None)
    ap.add_argument("--local-only", action="store_true", help="only the local GEMMs")
    ap.add_argument("--skip", type=int, default=0, help="leave out the first N shapes")
    ap.add_argument("--limit", type=int, default=None, help="at most N shapes (after --skip)")
    ap.add_argument(
        "--budget-s", type=float, default=None, help="start no shape that would end after this"
    )
    ap.add_argument(
        "--configs",
        type=_csv_list(str, report.CONFIGS),
        default=list(report.CONFIGS),
        help=f"kernel configurations to time (default all: {','.join(report.CONFIGS)}); the "
        "model's pick is timed too",
    )
    ap.add_argument(
        "--cublas-algos",
        type=int,
        default=0,
        help="also time cuBLASLt's first N heuristic algorithms (variants cublaslt:0..N-1, as the "
        f"runtime runs them: no workspace); at most {report.MAX_CUBLAS_ALGOS}",
    )
    ap.add_argument(
        "--kernel-table",
        default="shipped",
        help="the kernel table 'auto' consults: 'shipped' (the package's for this GPU), 'off', "
        "or a table file (distgemm.runtime.kernel_table)",
    )
    ap.add_argument(
        "--table",
        metavar="OUT.json",
        default=None,
        help="write a kernel table from this run: per shape the fastest variant, unless the "
        f"model's pick is within {table.TABLE_MARGIN * 100:g}%% of it",
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        metavar="TABLE.json",
        default=None,
        help="merge kernel tables of one GPU model (runs on several GPUs, each a part of the "
        "shapes) into --table; no GPU",
    )
    ap.add_argument("--eager", action="store_true", help="time eager calls, not graph replays")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--dry-run", action="store_true", help="list the shapes; no GPU")
    ap.add_argument("--replot", nargs="+", metavar="JSON", help="redraw stored runs; no GPU")
    ap.add_argument("--out", default=RESULTS_DIR)
    ap.add_argument("--stem", default=None, help="output file name without extension")
    args = ap.parse_args(argv)
    if args.skip < 0 or (args.limit is not None and args.limit < 1):
        ap.error(f"--skip must be >= 0 and --limit >= 1, got {args.skip} and {args.limit}")
    if not 0 <= args.cublas_algos <= report.MAX_CUBLAS_ALGOS:
        ap.error(f"--cublas-algos must be 0..{report.MAX_CUBLAS_ALGOS}, got {args.cublas_algos}")
    return args


def select(args: argparse.Namespace) -> tuple[list[KernelShape], list]:
    """The shapes of the filters, after --skip and --limit, and the cases the sweep skips."""
    shapes, skipped = kernel_shapes(
        models=args.models,
        tps=args.tp,
        tokens=args.tokens,
        layers=args.layers,
        local_only=args.local_only,
    )
    end = None if args.limit is None else args.skip + args.limit
    return shapes[args.skip : end], skipped


def dry_run_text(shapes: list[KernelShape], skipped: list, n_configs: int | None = None) -> str:
    """The shape list as --dry-run prints it: one line per shape with the configuration the model
    picks with an H200's resident CTAs, the sources, and the count and estimated time."""
    from benchmarks.kernel.shapes import model_config

    n_configs = len(report.CONFIGS) if n_configs is None else n_configs
    lines = [f"{'#':>4} {'m':>6} {'n':>6} {'k':>6} {'local':>5} {'config':>9}  sources"]
    for i, s in enumerate(shapes):
        lines.append(
            f"{i:>4} {s.m:>6} {s.n:>6} {s.k:>6} {'yes' if s.local else 'no':>5} "
            f"{model_config(s.m, s.n):>9}  {describe_sources(s)}"
        )
    for case, why in skipped:
        lines.append(f"SKIPPED {case.name}: {why}")
    n_local = sum(s.local for s in shapes)
    lines.append(
        f"{len(shapes)} shapes ({n_local} local GEMMs, {len(shapes) - n_local} steps only); "
        f"about {estimated_seconds(len(shapes), n_configs):.0f} s on one GPU "
        f"({shape_seconds(n_configs):.2f} s per shape, {n_configs} configs)"
    )
    return "\n".join(lines)


def measure(
    ctx: SingleGpuContext,
    shape: KernelShape,
    index: int,
    eager: bool,
    seed: int,
    configs: list[str] | tuple[str, ...] = report.CONFIGS,
    cublas_algos: int = 0,
):
    """One shape's record (kernel/report.py's format) with ``configs`` and the model's pick timed;
    failures are recorded, not raised."""
    torch = ctx.torch
    m, n, k = shape.m, shape.n, shape.k
    rec: dict[str, Any] = dict(shape.as_dict(), status="ok", reason=None, ms={}, err={})
    dev = ctx.dev.index
    gen = torch.Generator(device=ctx.dev).manual_seed(seed + index)
    a = torch.empty((m, k), device=ctx.dev, dtype=torch.bfloat16).uniform_(-1, 1, generator=gen)
    w = torch.empty((n, k), device=ctx.dev, dtype=torch.bfloat16).uniform_(-1, 1, generator=gen)
    w /= math.sqrt(k)
    d_torch = torch.empty((m, n), device=ctx.dev, dtype=torch.bfloat16)
    d_ours = torch.empty_like(d_torch)
    wt = w.t()
    # One zeroed workspace for the stream-K configurations, offered to every call as a user of
    # _core.gemm offers one: the calls run one after another on one stream, so they can share it.
    ws_bytes = max(
        _core.gemm_workspace_bytes(m, n, k, "bf16", cuda_device=dev, config=c)
        for c in ("auto", *configs)
    )
    ws = torch.zeros(max(ws_bytes, 16), device=ctx.dev, dtype=torch.uint8)

    def ours(variant: str):
        # A configuration with the shared workspace; cuBLASLt as the runtime runs it (no
        # workspace: a plan's GEMMs have none).
        algo = report.cublas_rank(variant)
        kw = (
            dict(config=variant, workspace=ws.data_ptr(), workspace_bytes=ws.numel())
            if algo is None
            else dict(cublas_algo=algo)
        )

        def call() -> int:
            return _core.gemm(
                a.data_ptr(), w.data_ptr(), d_ours.data_ptr(), m, n, k, dtype="bf16",
                cuda_device=dev, stream=torch.cuda.current_stream().cuda_stream, **kw,
            )  # fmt: skip

        return call

    def ref() -> None:
        torch.mm(a, wt, out=d_torch)

    ref()
    rec["model_config"] = model = _core.gemm_resolve_config(
        m, n, "bf16", cuda_device=dev, stream_k=True, k=k
    )
    n_algos = 0
    if cublas_algos:
        n_algos = min(cublas_algos, _core.cublaslt_algo_count(m, n, k, "bf16", cuda_device=dev))
    variants = list(configs) + [report.cublas_name(i) for i in range(n_algos)]
    timed = variants + ([model] if model not in variants else [])
    rec["configs"] = timed
    table = _core.gemm_config_table()
    torch.cuda.synchronize()
    for config in timed:
        d_ours.zero_()
        ran = ours(config)()
        torch.cuda.synchronize()
        rec["err"][config] = err = rel_err(torch, d_ours, d_torch)
        tile = 0 if report.cublas_rank(config) is not None else table[config]["tile_n"]
        if ran != tile or not err < report.ERR_TOL:
            why = f"config {config} ran with tile width {ran}, rel. error {err:.3g}"
            rec.update(status="failed", reason=why)
            return rec
    calls = 1 if eager else calls_per_replay(m, n, k)
    rec["calls"], rec["timing"] = calls, "eager" if eager else "graph"
    fns = {"torch": ref, **{c: ours(c) for c in timed}}
    if not eager:
        graphs = {v: graphed(torch, fn, calls) for v, fn in fns.items()}
        fns = {v: g.replay for v, g in graphs.items()}
    windows = [time_variant(ctx, fns["torch"], warm_s=WARMUP_S) / calls]
    for v in timed if index % 2 == 0 else timed[::-1]:
        rec["ms"][v] = time_variant(ctx, fns[v]) / calls
    windows.append(time_variant(ctx, fns["torch"]) / calls)
    rec["torch_windows"] = windows
    rec["ms"]["torch"] = sum(windows) / 2
    return rec


def _meta(torch, args, t_start: float, shapes: list[KernelShape]) -> dict[str, Any]:
    dev = torch.cuda.current_device()
    return dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        torch=torch.__version__,
        device=torch.cuda.get_device_name(dev),
        resident_ctas={
            c: _core.gemm_resident_ctas("bf16", cuda_device=dev, config=c) for c in report.CONFIGS
        },
        configs=list(args.configs),
        cublas_algos=args.cublas_algos,
        cublaslt_version=_core.cublaslt_version(),
        kernel_table=kernel_table.installed(),
        args=" ".join(sys.argv[1:]),
        shapes=len(shapes),
        timing=dict(warmup_s=WARMUP_S, rewarm_s=REWARM_S, timed_s=TIMED_S, eager=args.eager),
        peak_tflops=report.PEAK_TFLOPS,
        seconds=round(time.time() - t_start, 1),
        title=(
            f"distgemm GEMM kernel vs torch.mm, {torch.cuda.get_device_name(dev)}, bf16, "
            f"steady state ({'eager calls' if args.eager else 'graph replays'})"
        ),
    )


def run(args: argparse.Namespace, shapes: list[KernelShape]) -> int:
    if not _core.cuda_runtime:
        print(
            "this distgemm build has no CUDA runtime (_core.cuda_runtime is False): no _core.gemm"
        )
        return 2
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device visible to torch: the timing needs one GPU (--dry-run does not)")
        return 2
    ctx = SingleGpuContext.current()
    cublas_option = f"--cublas-algos {args.cublas_algos}" if args.cublas_algos else ""
    why = install_kernels(ctx.dev, args.kernel_table, cublas_option)
    if why:
        print(why)
        return 2
    t_start = time.time()
    label = "-".join(f"tp{t}" for t in args.tp) + ("-local" if args.local_only else "")
    stem = os.path.join(args.out, args.stem or report.output_stem(label))
    records: list[dict[str, Any]] = []
    per_shape = shape_seconds(variant_count(args))
    print(
        f"{len(shapes)} shapes, {len(args.configs)} configs ({','.join(args.configs)}), "
        f"{args.cublas_algos} cuBLASLt ranks: about {per_shape:.2f} s per shape, "
        f"{len(shapes) * per_shape:.0f} s",
        flush=True,
    )
    for i, shape in enumerate(shapes):
        if args.budget_s is not None and time.time() - t_start + per_shape > args.budget_s:
            # Listed as not measured, so that the acceptance line cannot pass without them.
            why = f"not started: --budget-s {args.budget_s:g} reached"
            records += [dict(s.as_dict(), status="skipped", reason=why, ms={}) for s in shapes[i:]]
            print(f"{why}: {len(shapes) - i} shapes left out", flush=True)
            break
        try:
            rec = measure(
                ctx, shape, args.skip + i, args.eager, args.seed, args.configs, args.cublas_algos
            )
        except Exception as e:  # noqa: BLE001 - one shape's failure must not lose the others
            rec = dict(shape.as_dict(), status="failed", reason=short_error(e), ms={}, err={})
        torch.cuda.empty_cache()
        records.append(rec)
        d = report.derived(rec)
        print(
            f"[{i + 1}/{len(shapes)}] {shape.m}x{shape.n}x{shape.k} {rec['status']}: torch "
            f"{report.fmt_ms(rec['ms'].get('torch'))} ms, ours {report.fmt_ms(d['ours_ms'])} ms "
            f"({rec.get('model_config')}), ratio {report.fmt_ratio(d['ratio'])}, fastest "
            f"{d['fastest_config']} ({report.fmt_ratio(d['ratio_fastest'])}) {report.flags(rec)}",
            flush=True,
        )
        report.write_outputs(records, stem, _meta(torch, args, t_start, shapes), final=False)
    meta = _meta(torch, args, t_start, shapes)
    why = report.write_outputs(records, stem, meta, final=True)
    if args.table:
        doc = table.kernel_table(records, meta)
        with open(args.table, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"kernel table: {len(doc['rows'])} rows -> {args.table}", flush=True)
    return 0 if why is None and all(r["status"] == "ok" for r in records) else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.replot:
        if args.table:
            doc = table.table_of_runs(args.replot)
            with open(args.table, "w") as f:
                json.dump(doc, f, indent=1)
            print(
                f"kernel table: {len(doc['rows'])} rows, defaults {doc['defaults']} -> {args.table}"
            )
        return report.replot(args.replot, args.out, args.stem)
    if args.merge:
        if not args.table:
            print("--merge needs --table OUT.json")
            return 2
        try:
            tables = [kernel_table.load(p) for p in args.merge]
            merged = table.merge_tables(tables)
        except ValueError as e:
            print(f"--merge: {e}")
            return 2
        with open(args.table, "w") as f:
            json.dump(merged, f, indent=1)
        kept = sum(len(t["rows"]) for t in tables) - len(merged["rows"])
        print(
            f"kernel table: {len(merged['rows'])} rows from {len(args.merge)} -> {args.table}"
            + (f" ({kept} row(s) of shapes already in an earlier table left out)" if kept else "")
        )
        return 0
    shapes, skipped = select(args)
    if args.dry_run:
        print(dry_run_text(shapes, skipped, variant_count(args)))
        return 0
    return run(args, shapes)


if __name__ == "__main__":
    sys.exit(main())
