"""distgemm's fp8 (e4m3) GEMM kernels against torch._scaled_mm (cuBLAS) on one GPU, with bf16
torch.mm and distgemm's bf16 kernel in the same run, on the local GEMMs of the Llama sweep.

    python3 -m benchmarks.fp8.fp8_kernel_vs_scaled_mm [--models 70B,405B] [--tp 2]
        [--tokens 4096,8192] [--layers QKV,O,FC1,FC2] [--scales row|tensor] [--budget-s S]
        [--skip N] [--limit N] [--variants ours_fp8,...] [--cublas] [--kernel-table off]
        [--table OUT.json] [--with-steps] [--out DIR]
    python3 -m benchmarks.fp8.fp8_kernel_vs_scaled_mm --dry-run     # the shapes, no GPU

Per shape, on the current CUDA device: fresh uniform random A[m, k] in [-1, 1) with rows scaled
by U(0.1, 4) and B[n, k] in [-1, 1)/sqrt(k), the same for every variant; fp8 operands quantized
from them with one scale per row (--scales row, the default) or per tensor. Variants:

    torch_bf16       torch.mm on the bf16 operands (cuBLAS)
    ours_bf16        distgemm's bf16 kernel, the model's configuration (no workspace)
    scaled_mm        torch._scaled_mm, bf16 out (use_fast_accum=False)
    scaled_mm_fast   torch._scaled_mm with use_fast_accum=True
    ours_fp8         distgemm's accurate fp8 GEMM as _core.gemm chooses it: the kernel table's
                     row (--kernel-table, default the package's for this GPU), else its
                     accurate kernel (e4m3_128x192)
    ours_fp8_fast    the same with fast accumulation (else e4m3_128x256fa)
    cublaslt_fp8[_fast]  with --cublas: cuBLASLt's fp8 GEMM as the runtime runs it (rank 0 of
                     its heuristic, no workspace; row-wise scales as its outer-vector scales),
                     where it offers an algorithm (the count is in the record's "cublaslt")

--with-steps adds the shapes that occur only as a plan's steps (after the local GEMMs): shapes a
table measured on the local GEMMs was not tuned on, where its rows and defaults generalize or not.

--variants times a subset (scaled_mm, the baseline, always); a kernel table's measurement needs
only "ours_fp8,cublaslt_fp8" (or their _fast pair) with --kernel-table off, an acceptance run
only "ours_fp8" (or "scaled_mm_fast,ours_fp8_fast"). --skip/--limit take a part of the shape
list, so that several GPUs each time a part at once (kernel_vs_cublas --merge joins their
tables).

Each fp8 variant's relative Frobenius error against the fp32 GEMM of the dequantized operands
is recorded (and must be < 1e-2 before timing). Timing: steady state as the sweep's
(benchmarks/common/timing.time_variant), graph replays of back-to-back calls; scaled_mm first with
the long warm-up, the others in an order reversed from shape to shape, scaled_mm again (its time
is the mean of both windows, their spread the drift). Output: a line per shape, then a
markdown table and ``<date>-fp8-kernel[-LABEL].{json,csv,md}`` under --out. A time below its
compute floor (2mnk at the dense peak of its dtype) is flagged as a measurement bug.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import os
import sys
import time
from typing import Any

from benchmarks.common.llama_cases import LAYERS, MODELS
from benchmarks.common.report import RESULTS_DIR
from benchmarks.common.timing import (
    ERR_TOL,
    PEAK_TFLOPS,
    REWARM_S,
    TIMED_S,
    WARMUP_S,
    SingleGpuContext,
    graphed,
    short_error,
    time_variant,
)
from benchmarks.kernel.kernel_vs_cublas import _csv_list, calls_per_replay, install_kernels
from benchmarks.kernel.shapes import TP_CHOICES, kernel_shapes
from benchmarks.kernel.table import table_measured, table_pick
from distgemm import _core, cli
from distgemm.runtime import kernel_table
from distgemm.runtime.scales import dequantize, quantize, scaled_mm_scales

VARIANTS = ("torch_bf16", "ours_bf16", "scaled_mm", "scaled_mm_fast", "ours_fp8", "ours_fp8_fast")
FP8_VARIANTS = ("scaled_mm", "scaled_mm_fast", "ours_fp8", "ours_fp8_fast")
# cuBLASLt's fp8 GEMM as the runtime runs it (gemm(cublas_algo=0), no workspace), accurate and
# fast accumulation: timed with --cublas where its heuristic offers an algorithm for the scales.
CUBLAS_VARIANTS = ("cublaslt_fp8", "cublaslt_fp8_fast")
ALL_VARIANTS = VARIANTS + CUBLAS_VARIANTS
DEFAULT_TOKENS = (4096, 8192)
SETUP_S = 1.0  # per shape besides the timed windows: operands, quantization, checks, captures


def shape_seconds(n_variants: int) -> float:
    """One shape's time: scaled_mm's long warm-up and window, a window with a short warm-up for
    each other variant and for scaled_mm again, and the setup."""
    return WARMUP_S + TIMED_S + n_variants * (REWARM_S + TIMED_S) + SETUP_S


def timed_variants(args: argparse.Namespace) -> tuple[str, ...]:
    """The variants a run times, in ALL_VARIANTS' order: --variants (every one without it; the
    cuBLASLt ones with --cublas only), scaled_mm always."""
    wanted = args.variants or VARIANTS + (CUBLAS_VARIANTS if args.cublas else ())
    return tuple(v for v in ALL_VARIANTS if v in wanted or v == "scaled_mm")


def parse_args(argv=None) -> argparse.Namespace:
    ap = cli.ArgumentParser("python3 -m benchmarks.fp8.fp8_kernel_vs_scaled_mm", __doc__)
    ap.add_argument("--models", type=_csv_list(str, tuple(MODELS)), default=["70B", "405B"])
    ap.add_argument("--tp", type=_csv_list(int, TP_CHOICES), default=[2])
    ap.add_argument("--tokens", type=_csv_list(int), default=list(DEFAULT_TOKENS))
    ap.add_argument("--layers", type=_csv_list(str, LAYERS), default=None)
    ap.add_argument("--scales", choices=("row", "tensor"), default="row")
    ap.add_argument(
        "--cublas",
        action="store_true",
        help="also time cuBLASLt's fp8 GEMM (rank 0, both accumulation modes) as the runtime "
        "runs it, where it has an algorithm for the scales",
    )
    ap.add_argument(
        "--table",
        metavar="OUT.json",
        default=None,
        help="with --cublas: write the fp8 rows of a kernel table (per shape and accumulation, "
        "cuBLASLt where it beats distgemm's kernel by more than the table's margin)",
    )
    ap.add_argument(
        "--variants",
        type=_csv_list(str, ALL_VARIANTS),
        default=None,
        help="time only these (scaled_mm always); default every variant, the cuBLASLt ones with "
        "--cublas",
    )
    ap.add_argument(
        "--kernel-table",
        default="shipped",
        help="the kernel table _core.gemm consults for ours_fp8[_fast]: 'shipped' (the "
        "package's for this GPU), 'off', or a table file (distgemm.runtime.kernel_table)",
    )
    ap.add_argument(
        "--with-steps",
        action="store_true",
        help="also the shapes that occur only as plan steps (after the local GEMMs)",
    )
    ap.add_argument("--skip", type=int, default=0, help="leave out the first N shapes")
    ap.add_argument("--limit", type=int, default=None, help="at most N shapes (after --skip)")
    ap.add_argument("--budget-s", type=float, default=None, help="start no shape past this")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--dry-run", action="store_true", help="list the shapes; no GPU")
    ap.add_argument("--out", default=RESULTS_DIR)
    ap.add_argument("--stem", default=None, help="output file name without extension")
    args = ap.parse_args(argv)
    if args.table and not args.cublas:
        ap.error("--table needs --cublas: a row weighs cuBLASLt against distgemm's fp8 kernel")
    if args.skip < 0 or (args.limit is not None and args.limit < 1):
        ap.error(f"--skip must be >= 0 and --limit >= 1, got {args.skip} and {args.limit}")
    cublas_asked = [v for v in args.variants or () if v in CUBLAS_VARIANTS]
    if cublas_asked and not args.cublas:
        ap.error(f"--variants {','.join(cublas_asked)} needs --cublas")
    if args.table and args.kernel_table != "off":
        ap.error(
            "--table needs --kernel-table off: a table weighs distgemm's own fp8 kernel against "
            "cuBLASLt, not an earlier table's choice"
        )
    return args


def kernel_table_rows(records: list[dict], rowwise: bool) -> list[dict]:
    """The fp8 rows of a kernel table (distgemm.runtime.kernel_table's format) from measured
    records: per shape and accumulation mode, cuBLASLt's rank 0 where it beats distgemm's kernel
    of that mode by more than the table's margin (benchmarks/kernel/table.TABLE_MARGIN), else
    distgemm's kernel. Shapes without both timings get no row of that mode."""
    rows = []
    for rec in records:
        ms = rec.get("ms", {})
        if rec.get("status") != "ok":
            continue
        for fast, ours, lt in ((False, "ours_fp8", "cublaslt_fp8"),
                               (True, "ours_fp8_fast", "cublaslt_fp8_fast")):  # fmt: skip
            if not (ms.get(ours) and ms.get(lt)):
                continue
            pick_lt = table_pick(ms, ours, (ours, lt)) == lt
            rows.append(
                dict(
                    dtype="e4m3", m=rec["m"], n=rec["n"], k=rec["k"],
                    scale_a_rows=rowwise, scale_b_rows=rowwise, fast_accum=fast,
                    kernel="cublaslt" if pick_lt else kernel_table.fp8_kernel(fast), algo=0,
                    ms={ours: round(ms[ours], 5), lt: round(ms[lt], 5)},
                )
            )  # fmt: skip
    return rows


def select(args: argparse.Namespace):
    """The local GEMM shapes of the filters (then, with --with-steps, those only of plan steps)
    whose K and N the fp8 kernel takes (multiples of 16)."""
    shapes, _ = kernel_shapes(
        models=args.models, tps=args.tp, tokens=args.tokens, layers=args.layers,
        local_only=not args.with_steps,
    )  # fmt: skip
    shapes = [s for s in shapes if s.k % 16 == 0 and s.n % 16 == 0]
    end = None if args.limit is None else args.skip + args.limit
    return shapes[args.skip : end]


def floor_ms(flops: float, dtype: str) -> float:
    return flops / (PEAK_TFLOPS[dtype] * 1e12) * 1e3


def measure(
    ctx: SingleGpuContext,
    shape,
    index: int,
    rowwise: bool,
    seed: int,
    variants: tuple[str, ...] = VARIANTS,
) -> dict:
    """One shape's record: errors, then the steady-state times of `variants` (cuBLASLt's where
    its heuristic has an algorithm for the scales)."""
    torch = ctx.torch
    m, n, k = shape.m, shape.n, shape.k
    dev = ctx.dev.index
    rec: dict[str, Any] = dict(shape.as_dict(), status="ok", reason=None, ms={}, err={})
    gen = torch.Generator(device=ctx.dev).manual_seed(seed + index)
    a = torch.empty((m, k), device=ctx.dev).uniform_(-1, 1, generator=gen)
    a *= torch.empty((m, 1), device=ctx.dev).uniform_(0.1, 4, generator=gen)
    w = torch.empty((n, k), device=ctx.dev).uniform_(-1, 1, generator=gen) / math.sqrt(k)
    a16, w16 = a.bfloat16(), w.bfloat16()
    qa, sa = quantize(a, rowwise)
    qb, sb = quantize(w, rowwise)
    del a, w
    ta, tb = scaled_mm_scales(sa, sb, m, n)
    outs = {v: torch.empty((m, n), device=ctx.dev, dtype=torch.bfloat16) for v in variants}
    stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731

    def ours_fp8(fast: bool, lt: bool = False):
        name = ("cublaslt_fp8" if lt else "ours_fp8") + ("_fast" if fast else "")
        kw = dict(cublas_algo=0) if lt else {}

        def call() -> None:
            out = outs[name]  # at the call: only the timed variants have an output
            _core.gemm(
                qa.data_ptr(), qb.data_ptr(), out.data_ptr(),
                m, n, k, "e4m3", cuda_device=dev, stream=stream(), scale_a=sa.data_ptr(),
                scale_a_rows=rowwise, scale_b=sb.data_ptr(), scale_b_rows=rowwise, fast_accum=fast,
                **kw,
            )  # fmt: skip

        return call

    def scaled(fast: bool):
        name = "scaled_mm_fast" if fast else "scaled_mm"

        def call() -> None:  # into the preallocated output, as every other variant writes
            torch._scaled_mm(
                qa, qb.t(), scale_a=ta, scale_b=tb, out_dtype=torch.bfloat16,
                use_fast_accum=fast, out=outs[name],
            )  # fmt: skip

        return call

    def ours_bf16() -> None:
        _core.gemm(
            a16.data_ptr(), w16.data_ptr(), outs["ours_bf16"].data_ptr(), m, n, k, "bf16",
            cuda_device=dev, stream=stream(),
        )  # fmt: skip

    w16t = w16.t()
    every = {
        "torch_bf16": lambda: torch.mm(a16, w16t, out=outs["torch_bf16"]),
        "ours_bf16": ours_bf16,
        "scaled_mm": scaled(False),
        "scaled_mm_fast": scaled(True),
        "ours_fp8": ours_fp8(False),
        "ours_fp8_fast": ours_fp8(True),
    }
    fns = {v: fn for v, fn in every.items() if v in variants}
    rec["cublaslt"] = {}
    for fast, v in ((False, "cublaslt_fp8"), (True, "cublaslt_fp8_fast")):
        if v not in variants:
            continue
        count = _core.cublaslt_algo_count(
            m, n, k, "e4m3", cuda_device=dev, scale_a_rows=rowwise, scale_b_rows=rowwise,
            fast_accum=fast,
        )  # fmt: skip
        rec["cublaslt"][v] = count  # 0: cuBLASLt has no algorithm for these scales
        if count:
            fns[v] = ours_fp8(fast, lt=True)
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    ref = dequantize(qa, sa) @ dequantize(qb, sb).t()
    for v in (v for v in FP8_VARIANTS + CUBLAS_VARIANTS if v in fns):
        x = outs[v].float()
        rec["err"][v] = float((x - ref).norm() / ref.norm()) if x.isfinite().all() else math.nan
    if "ours_bf16" in fns and "torch_bf16" in fns:
        rec["err"]["ours_bf16"] = float(
            (outs["ours_bf16"].float() - outs["torch_bf16"].float()).norm()
            / outs["torch_bf16"].float().norm()
        )
    del ref
    bad = [v for v, e in rec["err"].items() if not e < ERR_TOL]
    if bad:
        rec.update(status="failed", reason=f"error >= {ERR_TOL:g}: " + ", ".join(bad))
        return rec
    calls = calls_per_replay(m, n, k)
    rec["calls"] = calls
    graphs = {v: graphed(torch, fn, calls) for v, fn in fns.items()}
    order = [v for v in fns if v != "scaled_mm"]
    windows = [time_variant(ctx, graphs["scaled_mm"].replay, warm_s=WARMUP_S) / calls]
    for v in order if index % 2 == 0 else order[::-1]:
        rec["ms"][v] = time_variant(ctx, graphs[v].replay) / calls
    windows.append(time_variant(ctx, graphs["scaled_mm"].replay) / calls)
    rec["scaled_mm_windows"] = windows
    rec["ms"]["scaled_mm"] = sum(windows) / 2
    flops = 2.0 * m * n * k
    below = [
        v
        for v, ms in rec["ms"].items()
        if ms < floor_ms(flops, "bf16" if v.endswith("bf16") else "fp8")
    ]
    if below:
        rec.update(status="failed", reason="below the compute floor: " + ", ".join(below))
    return rec


RATIOS = {  # name: (numerator, denominator) variants; > 1: the denominator is faster
    "fp8_over_scaled_mm": ("scaled_mm", "ours_fp8"),
    "fast_over_scaled_mm_fast": ("scaled_mm_fast", "ours_fp8_fast"),
    "fp8_over_ours_bf16": ("ours_bf16", "ours_fp8"),
    "fast_over_ours_bf16": ("ours_bf16", "ours_fp8_fast"),
    "scaled_mm_over_torch_bf16": ("torch_bf16", "scaled_mm"),
}


def ratios(rec: dict) -> dict:
    """The RATIOS whose two variants the record timed."""
    ms = rec["ms"]
    return {q: ms[a] / ms[b] for q, (a, b) in RATIOS.items() if ms.get(a) and ms.get(b)}


TABLE_TIMES = (
    "torch_bf16", "ours_bf16", "scaled_mm", "ours_fp8", "scaled_mm_fast", "ours_fp8_fast",
)  # fmt: skip
TABLE_RATIOS = ("fp8_over_scaled_mm", "fast_over_scaled_mm_fast", "fp8_over_ours_bf16")


def table(records: list[dict]) -> str:
    head = (
        "| shape (m x n x k) | source | torch bf16 | ours bf16 | scaled_mm | ours fp8 | "
        "scaled_mm fast | ours fp8 fast | ours fp8 / scaled_mm | fast / fast | ours fp8 vs "
        "ours bf16 | err ours fp8 | err fast |"
    )
    lines = [head, "|" + "---|" * 13]
    for r in records:
        src = r["sources"][0]
        name = f"{src['model']} {src['layer']} {src['tokens']} TP={src['tp']}"
        if r["status"] != "ok":
            lines.append(f"| {r['m']}x{r['n']}x{r['k']} | {name} | {r['status']}: {r['reason']} |")
            continue
        ms, q, err = r["ms"], ratios(r), r["err"]
        cells = [ms.get(v) for v in TABLE_TIMES]
        cells = [f"{x:.4f}" if x else "-" for x in cells]
        cells += [f"{q[n]:.3f}x" if n in q else "-" for n in TABLE_RATIOS]
        cells += [f"{err[v]:.2e}" if v in err else "-" for v in ("ours_fp8", "ours_fp8_fast")]
        lines.append(f"| {r['m']}x{r['n']}x{r['k']} | {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "Times in ms per GEMM (median, steady state); '-': not timed. Ratios > 1: ours faster. "
        "Errors: relative Frobenius against the fp32 GEMM of the dequantized operands."
    )
    return "\n".join(lines)


def write(records: list[dict], stem: str, meta: dict) -> None:
    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    with open(stem + ".json", "w") as f:
        json.dump(dict(meta=meta, records=records), f, indent=1)
    with open(stem + ".csv", "w", newline="") as f:
        wr = csv.writer(f)
        fp8 = FP8_VARIANTS + CUBLAS_VARIANTS
        wr.writerow(["m", "n", "k", "status", *[f"ms_{v}" for v in ALL_VARIANTS],
                     *[f"err_{v}" for v in fp8]])  # fmt: skip
        for r in records:
            wr.writerow(
                [r["m"], r["n"], r["k"], r["status"]]
                + [r["ms"].get(v, "") for v in ALL_VARIANTS]
                + [r["err"].get(v, "") for v in fp8]
            )
    with open(stem + ".md", "w") as f:
        f.write(f"# {meta['title']}\n\n{table(records)}\n")


def run(args: argparse.Namespace, shapes) -> int:
    import torch

    if not _core.cuda_runtime or not torch.cuda.is_available():
        print("needs one CUDA GPU and a distgemm build with its CUDA runtime (--dry-run does not)")
        return 2
    ctx = SingleGpuContext.current()
    why = install_kernels(ctx.dev, args.kernel_table, "--cublas" if args.cublas else "")
    if why:
        print(why)
        return 2
    variants = timed_variants(args)
    t0 = time.time()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    stem = os.path.join(args.out, args.stem or f"{date}-fp8-kernel-{args.scales}")
    dev = torch.cuda.current_device()
    meta = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        torch=torch.__version__,
        device=torch.cuda.get_device_name(dev),
        args=" ".join(sys.argv[1:]),
        scales=args.scales,
        cublaslt_version=_core.cublaslt_version() if args.cublas else None,
        variants=list(variants),
        kernel_table=kernel_table.installed(),
        timing=dict(warmup_s=WARMUP_S, rewarm_s=REWARM_S, timed_s=TIMED_S),
        title=(
            f"distgemm fp8 kernels vs torch._scaled_mm, {torch.cuda.get_device_name(dev)}, "
            f"{args.scales}-wise scales, steady state (graph replays)"
        ),
    )
    records = []
    shape_s = shape_seconds(len(variants))
    for i, shape in enumerate(shapes):
        if args.budget_s is not None and time.time() - t0 + shape_s > args.budget_s:
            why = f"not started: --budget-s {args.budget_s:g} reached"
            records += [dict(s.as_dict(), status="skipped", reason=why, ms={}, err={})
                        for s in shapes[i:]]  # fmt: skip
            break
        try:
            rec = measure(ctx, shape, args.skip + i, args.scales == "row", args.seed, variants)
        except Exception as e:  # noqa: BLE001 - one shape's failure must not lose the others
            rec = dict(shape.as_dict(), status="failed", reason=short_error(e), ms={}, err={})
        torch.cuda.empty_cache()
        records.append(rec)
        q = ratios(rec)
        print(
            f"[{i + 1}/{len(shapes)}] {shape.m}x{shape.n}x{shape.k} {rec['status']} "
            + " ".join(f"{v}={ms:.4f}" for v, ms in rec["ms"].items())
            + (" " + " ".join(f"{k}={v:.3f}" for k, v in q.items()) if q else "")
            + (f" ({rec['reason']})" if rec["reason"] else ""),
            flush=True,
        )
        meta["seconds"] = round(time.time() - t0, 1)
        write(records, stem, meta)
    print(table(records))
    if args.table:
        rows = kernel_table_rows(records, args.scales == "row")
        doc = kernel_table.document(meta["device"], table_measured(meta), rows)
        with open(args.table, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"kernel table: {len(rows)} fp8 rows -> {args.table}")
    return 0 if all(r["status"] == "ok" for r in records) else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    shapes = select(args)
    if args.dry_run:
        for s in shapes:
            src = s.sources[0]
            step = f" S={src.steps}" if src.steps else ""
            print(f"{s.m}x{s.n}x{s.k}  {src.model} {src.layer} {src.tokens} TP={src.tp}{step}")
        secs = len(shapes) * shape_seconds(len(timed_variants(args)))
        print(f"{len(shapes)} shapes, about {secs:.0f} s")
        return 0
    return run(args, shapes)


if __name__ == "__main__":
    sys.exit(main())
