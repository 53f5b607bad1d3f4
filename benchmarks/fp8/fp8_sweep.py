"""fp8 (e4m3) tensor-parallel layers: distgemm fp8 against distgemm bf16, NCCL + torch._scaled_mm
and torch's fused scaled symmetric-memory ops, with the fp8 kernel floor, in one run.

    torchrun --nproc-per-node N -m benchmarks.fp8.fp8_sweep [--models 70B] [--tokens 8192]
             [--layers QKV,O,FC1,FC2] [--scales row|tensor] [--fast-accum] [--out DIR]

Cases: Llama-3 models x layers x tokens (default 70B, all four layers, 8192 tokens: issue 18's
acceptance cases), TP = world size. Per case: bf16 operands as the sweep makes them
(``layer_operands`` of benchmarks/common/timing.py), quantized on each rank to e4m3 with one
scale per row (--scales row, the default) or per tensor. Variants, each checked once against
the fp32 GEMM of the dequantized operands through NCCL (relative Frobenius error < 1e-2;
dg_bf16 against NCCL + torch.mm on the bf16 operands), then timed at steady state as the sweep
does (``time_variant``):

  floor_fp8     distgemm's fp8 kernel on the per-rank GEMM alone (a one-rank group: TP=1 plan)
  base_fp8      NCCL all-gather (fp8 as bytes, and the row scales) + torch._scaled_mm, resp.
                torch._scaled_mm + NCCL reduce-scatter (bf16 partials)
  symm_fp8      torch.ops.symm_mem.fused_all_gather_scaled_matmul /
                fused_scaled_matmul_reduce_scatter, where they run
  dg_fp8        distgemm all_gather_gemm / gemm_reduce_scatter, fp8, path="overlap", steps=None
  dg_bf16       the same op in bf16 on the bf16 operands (the speed-up fp8 must bring), timed
                before and after dg_fp8 (the mean; both windows in ``dg_bf16_windows_ms``)

Reported per case: ms, ``bf16/fp8`` (dg_bf16 / dg_fp8), ``symm/fp8`` (symm_fp8 / dg_fp8),
``base/fp8`` (base_fp8 / dg_fp8), ``eff`` (floor_fp8 / dg_fp8, the overlap efficiency against
distgemm's own fp8 kernel). Output: ``<date>-fp8-sweep[-LABEL].{json,md}`` under --out. A time
below its compute floor (2mnk/TP at the fp8 dense peak) is flagged as a measurement bug.
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import os
import sys
import time
from typing import Any

from benchmarks.common.llama_cases import LAYERS, MODELS, Case, global_gemm, make_cases, shapes
from benchmarks.common.report import RESULTS_DIR
from benchmarks.common.timing import (
    ERR_TOL,
    PEAK_TFLOPS,
    WARMUP_S,
    RankContext,
    baseline_call,
    enable_symm_mem,
    layer_operands,
    rel_err,
    short_error,
    time_around,
    time_variant,
    try_symm_mem,
)
from distgemm import cli
from distgemm.runtime.scales import dequantize, quantize, scaled_mm_scales

VARIANTS = ("floor_fp8", "base_fp8", "symm_fp8", "dg_fp8", "dg_bf16")


class Fp8Layer:
    """One rank's fp8 operands of a case and the torch-side variants."""

    def __init__(self, ctx: RankContext, case: Case, rowwise: bool, fast: bool):
        torch = ctx.torch
        self.ctx, self.case, self.fast = ctx, case, fast
        self.lo = lo = layer_operands(torch, ctx.dev, case, 1234 + 7919 * ctx.rank + case.tokens)
        self.qa, self.sa = quantize(lo.a, rowwise)
        self.qw, self.sw = quantize(lo.w, rowwise)
        s = shapes(case)
        self.out = torch.empty(s["out"], device=ctx.dev, dtype=torch.bfloat16)
        if lo.ag:
            self.gathered = torch.empty(s["full_a"], device=ctx.dev, dtype=torch.float8_e4m3fn)
            self.gathered_sa = torch.empty(self.sa.numel() * ctx.tp, device=ctx.dev)
        else:
            self.partial = torch.empty(s["partial"], device=ctx.dev, dtype=torch.bfloat16)

    def dequantized_reference(self):
        """fp32 of the dequantized operands through NCCL: the all-gathered A @ W^T, or the
        reduce-scatter of the partial A @ W^T."""
        torch, dist = self.ctx.torch, self.ctx.dist
        a, w = dequantize(self.qa, self.sa), dequantize(self.qw, self.sw)
        if self.lo.ag:
            full = torch.empty((a.shape[0] * self.ctx.tp, a.shape[1]), device=a.device)
            dist.all_gather_into_tensor(full, a)
            return full @ w.t()
        p = a @ w.t()
        out = torch.empty((p.shape[0] // self.ctx.tp, p.shape[1]), device=a.device)
        dist.reduce_scatter_tensor(out, p)
        return out

    def baseline(self):
        """NCCL + torch._scaled_mm (fp8 gathered as bytes, row scales gathered beside)."""
        torch, dist = self.ctx.torch, self.ctx.dist
        if self.lo.ag:
            dist.all_gather_into_tensor(self.gathered.view(torch.uint8), self.qa.view(torch.uint8))
            sa = self.sa
            if sa.numel() > 1:
                dist.all_gather_into_tensor(self.gathered_sa, sa)
                sa = self.gathered_sa
            x = self.gathered
        else:
            x, sa = self.qa, self.sa
        ta, tb = scaled_mm_scales(sa, self.sw, x.shape[0], self.qw.shape[0])
        # Into the output (all-gather) or the partial (reduce-scatter) directly: no copy.
        y = self.out if self.lo.ag else self.partial
        torch._scaled_mm(
            x, self.qw.t(), scale_a=ta, scale_b=tb, out_dtype=torch.bfloat16,
            use_fast_accum=self.fast, out=y,
        )  # fmt: skip
        if self.lo.ag:
            return self.out
        dist.reduce_scatter_tensor(self.out, self.partial)
        return self.out

    def symm(self, group_name: str):
        """torch's fused scaled ops (symmetric memory)."""
        torch = self.ctx.torch
        if self.lo.ag:
            ta, tb = scaled_mm_scales(self.sa, self.sw, self.qa.shape[0], self.qw.shape[0])
            return torch.ops.symm_mem.fused_all_gather_scaled_matmul(
                self.qa, [self.qw.t()], ta, [tb], 0, group_name, [None], [None],
                [torch.bfloat16], [self.fast],
            )[1][0]  # fmt: skip
        ta, tb = scaled_mm_scales(self.sa, self.sw, self.qa.shape[0], self.qw.shape[0])
        return torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter(
            self.qa, self.qw.t(), ta, tb, "sum", 0, 0, group_name,
            [self.qa.shape[0], self.qw.shape[0]], None, None, torch.bfloat16, self.fast,
        )  # fmt: skip


def run_case(ctx: RankContext, case: Case, args, solo, group_name) -> dict[str, Any]:
    torch = ctx.torch
    from distgemm import ops
    from distgemm.runtime import communicator as dcomm

    layer = Fp8Layer(ctx, case, args.scales == "row", args.fast_accum)
    lo = layer.lo
    op = ops.all_gather_gemm if lo.ag else ops.gemm_reduce_scatter
    ms: dict[str, float | None] = {}
    errs: dict[str, float] = {}
    unavailable: dict[str, str] = {}
    ref = layer.dequantized_reference()
    fp8 = dict(scale_a=layer.sa, scale_b=layer.sw, fast_accum=args.fast_accum)

    # The kernel floor: the per-rank GEMM through a one-rank group (a TP=1 plan, one GEMM).
    s = shapes(case)
    if lo.ag:
        fa = torch.empty(s["full_a"], device=ctx.dev, dtype=torch.float8_e4m3fn)
        fa.view(torch.uint8).copy_(layer.qa.view(torch.uint8).repeat(ctx.tp, 1))
        fsa = layer.sa.repeat(ctx.tp) if layer.sa.numel() > 1 else layer.sa
        floor = functools.partial(op, fa, layer.qw, out=layer.out, group=solo, path="overlap",
                                  **dict(fp8, scale_a=fsa))  # fmt: skip
    else:
        floor_out = torch.empty(s["partial"], device=ctx.dev, dtype=torch.bfloat16)
        floor = functools.partial(op, layer.qa, layer.qw, out=floor_out, group=solo,
                                  path="overlap", **fp8)  # fmt: skip
    floor()
    torch.cuda.synchronize()
    solo.raise_launch_errors()
    ms["floor_fp8"] = time_variant(ctx, floor, warm_s=WARMUP_S)

    errs["base_fp8"] = rel_err(torch, layer.baseline(), ref)
    ms["base_fp8"] = time_variant(ctx, layer.baseline)

    symm = functools.partial(layer.symm, group_name)
    err, why = try_symm_mem(ctx, symm, ref)
    if why:
        unavailable["symm_fp8"] = why
        ms["symm_fp8"] = None
    else:
        errs["symm_fp8"] = err
        ms["symm_fp8"] = time_variant(ctx, symm)

    with dcomm.Communicator(timeout_s=60.0, wait_timeout_s=5.0) as comm:
        dg8 = functools.partial(op, layer.qa, layer.qw, out=layer.out, group=comm,
                                path="overlap", **fp8)  # fmt: skip
        layer.out.fill_(float("nan"))
        errs["dg_fp8"] = rel_err(torch, dg8(), ref)
        comm.raise_launch_errors()
        out16 = torch.empty_like(layer.out)
        dg16 = functools.partial(op, lo.a, lo.w, out=out16, group=comm, path="overlap")
        base16 = dg16().clone()
        torch.cuda.synchronize()
        comm.raise_launch_errors()
        # bf16 A, fp8 B, bf16 A: bf16/fp8 is the speed-up fp8 must bring, so neither side gets
        # the cooler GPU of an earlier window; dg_bf16 is the mean of its two windows.
        bf16_before, ms["dg_fp8"], bf16_after = time_around(ctx, dg16, dg8)
        ms["dg_bf16"] = (bf16_before + bf16_after) / 2
        ref16 = baseline_call(torch, ctx.dist, lo.ag, lo.a, lo.wt, lo.tmp, lo.out)
        errs["dg_bf16"] = rel_err(torch, base16, ref16)  # the bf16 operands' own baseline
    keys = sorted(errs)
    worst = ctx.agree_max([errs[k] if errs[k] == errs[k] else math.inf for k in keys])
    return dict(
        ms=ms,
        dg_bf16_windows_ms=[bf16_before, bf16_after],
        rel_err=dict(zip(keys, worst)),
        unavailable=unavailable,
    )


def ratios(ms: dict) -> dict[str, float | None]:
    def r(a, b):
        return ms[a] / ms[b] if ms.get(a) and ms.get(b) else None

    return {
        "bf16/fp8": r("dg_bf16", "dg_fp8"),
        "symm/fp8": r("symm_fp8", "dg_fp8"),
        "base/fp8": r("base_fp8", "dg_fp8"),
        "eff": r("floor_fp8", "dg_fp8"),
    }


def table(records, meta) -> str:
    cols = ("floor_fp8", "base_fp8", "symm_fp8", "dg_fp8", "dg_bf16")
    lines = [
        f"# {meta['title']}",
        "",
        "| case | " + " | ".join(cols) + " | bf16/fp8 | symm/fp8 | base/fp8 | eff | err dg_fp8 |",
        "|" + "---|" * (len(cols) + 6),
    ]
    fmt = lambda v, d=4: "n/a" if v is None else f"{v:.{d}f}"  # noqa: E731
    for r in records:
        if r["status"] != "ok":
            lines.append(f"| {r['case']} | {r['status']}: {r['reason']} |")
            continue
        q = r["ratios"]
        lines.append(
            f"| {r['case']} | " + " | ".join(fmt(r["ms"].get(c)) for c in cols) + " | "
            + " | ".join(fmt(q[k], 3) for k in ("bf16/fp8", "symm/fp8", "base/fp8", "eff"))
            + f" | {r['rel_err'].get('dg_fp8', float('nan')):.2e} |"
        )  # fmt: skip
    lines += ["", "ms per call (median over ranks' maxima, steady state); ratios > 1: dg_fp8 "
              "faster; eff = floor_fp8 / dg_fp8."]  # fmt: skip
    for r in records:
        for k, v in r.get("unavailable", {}).items():
            lines.append(f"- {r['case']}: {k} unavailable: {v}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = cli.ArgumentParser("python3 -m benchmarks.fp8.fp8_sweep", __doc__)
    ap.add_argument("--models", default="70B", help="comma-separated subset of " + ",".join(MODELS))
    ap.add_argument("--tokens", default="8192", help="comma-separated token counts")
    ap.add_argument("--layers", default=",".join(LAYERS))
    ap.add_argument("--scales", choices=("row", "tensor"), default="row")
    ap.add_argument("--fast-accum", action="store_true")
    ap.add_argument("--out", default=RESULTS_DIR)
    ap.add_argument("--stem", default=None)
    args = ap.parse_args(argv)
    models = args.models.split(",")
    tokens = [int(t) for t in args.tokens.split(",")]
    layers = args.layers.split(",")
    make_cases(1, False, models, tokens, layers)  # unknown names: fail before torchrun work

    ctx = RankContext.from_torchrun(ctrl_timeout_s=120.0)
    torch, dist = ctx.torch, ctx.dist
    group_name = dist.group.WORLD.group_name
    symm_setup = enable_symm_mem(group_name)
    from distgemm.runtime import communicator as dcomm

    solo_pg, _ = dist.new_subgroups(group_size=1)
    solo = dcomm.Communicator(solo_pg, timeout_s=60.0, wait_timeout_s=5.0)
    t0 = time.perf_counter()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    label = f"tp{ctx.tp}-{args.scales}" + ("-fast" if args.fast_accum else "")
    stem = os.path.join(args.out, args.stem or f"{date}-fp8-sweep-{label}")
    meta = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        tp=ctx.tp, torch=torch.__version__, device=torch.cuda.get_device_name(ctx.dev),
        installed_by=os.environ.get("INSTALLED_BY"), argv=sys.argv, symm_setup=symm_setup,
        title=f"distgemm fp8 vs bf16 and torch's fused scaled ops, TP={ctx.tp}, "
        f"{args.scales}-wise scales{', fast accumulation' if args.fast_accum else ''}",
    )  # fmt: skip
    records = []
    for case in make_cases(ctx.tp, False, models, tokens, layers):
        m, n, k = global_gemm(case.model, case.layer, case.tokens)
        rec: dict[str, Any] = dict(case=case.name, m=m, n=n, k=k, tp=ctx.tp, ms={}, rel_err={})
        err = None
        try:
            rec.update(run_case(ctx, case, args, solo, group_name))
        except Exception as e:  # noqa: BLE001 - one case's failure must not end the run
            err = short_error(e)
        if ctx.agree_max([1.0 if err else 0.0])[0]:
            rec.update(status="failed", reason=err or "failed on another rank")
        else:
            floor_ms = 2.0 * m * n * k / ctx.tp / (PEAK_TFLOPS["fp8"] * 1e12) * 1e3
            below = [v for v in ("floor_fp8", "dg_fp8") if (rec["ms"].get(v) or 1e9) < floor_ms]
            bad = {v: e for v, e in rec["rel_err"].items() if not e < ERR_TOL}
            rec["ratios"] = ratios(rec["ms"])
            rec["status"] = "suspect" if below else "wrong" if bad else "ok"
            rec["reason"] = (f"below the fp8 compute floor: {below}" if below else
                             f"error >= {ERR_TOL}: {bad}" if bad else None)  # fmt: skip
        records.append(rec)
        torch.cuda.empty_cache()
        if ctx.rank == 0:
            print(json.dumps(rec), flush=True)
    if ctx.rank == 0:
        meta["seconds"] = round(time.perf_counter() - t0, 1)
        os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
        with open(stem + ".json", "w") as f:
            json.dump(dict(meta=meta, records=records), f, indent=1)
        text = table(records, meta)
        with open(stem + ".md", "w") as f:
            f.write(text)
        print(text)
    ctx.close()
    return 0 if all(r["status"] == "ok" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
