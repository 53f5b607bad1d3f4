"""Probe (not shipped): the unpadded swizzle walk against the old default order (swizzle lowered
until it divides the grid, the rows rule of the padded walk), one GPU, steady state, interleaved
against torch.mm / torch._scaled_mm. Usage: python3 -m benchmarks.probes.tile_walk OUT_JSON [BUDGET_S]"""

import json
import math
import os
import sys
import time

import torch

from benchmarks.common.timing import WARMUP_S, SingleGpuContext, graphed, time_variant
from distgemm import _core
from distgemm.runtime.scales import quantize, scaled_mm_scales

SHAPES = []
for model, layers in (
    ("70B", {"QKV": (5120, 8192), "O": (8192, 4096), "FC1": (28672, 8192), "FC2": (8192, 14336)}),
    (
        "405B",
        {"QKV": (9216, 16384), "O": (16384, 8192), "FC1": (53248, 16384), "FC2": (16384, 26624)},
    ),
):
    for tokens in (4096, 8192):
        for layer, (n, k) in layers.items():
            SHAPES.append((f"{model}/{layer}/{tokens}/TP2", tokens, n, k))
SHAPES += [("70B/FC1/8192/TP1", 8192, 57344, 8192), ("70B/QKV/8192/TP1", 8192, 10240, 8192)]
DTYPES = os.environ.get("PROBE_DTYPES", "e4m3,bf16").split(",")
if os.environ.get("PROBE_SET") == "bf16flips":
    # local bf16 GEMMs of the sweep where the DRAM rule leaves CUTLASS's heuristic
    from benchmarks.kernel import shapes as ks

    SHAPES, DTYPES = [], ["bf16"]
    t = _core.gemm_config_table()
    for s in ks.kernel_shapes(local_only=True)[0]:
        c = ks.model_config(s.m, s.n)
        if c == "128x256sk" or 2.0 * s.m * s.n * s.k < 4e11:
            continue
        x = t[c]
        tm = -(-math.ceil(s.m / x["tile_m"]) // x["cluster_m"]) * x["cluster_m"]
        tn = -(-math.ceil(s.n / x["tile_n"]) // x["cluster_n"]) * x["cluster_n"]
        heur = 1 if tn > tm else 2
        if (_core.choose_raster(c, s.m, s.n, s.k)["raster"] or heur) != heur:
            SHAPES.append((s.sources[0].name, s.m, s.n, s.k))
    SHAPES = SHAPES[:: max(1, len(SHAPES) // 18)]


def old_swizzle(t, m, n, sw=8):
    tm, tn = math.ceil(m / t["tile_m"]), math.ceil(n / t["tile_n"])
    while sw > 1 and (tm % (sw * t["cluster_m"]) or tn % (sw * t["cluster_n"])):
        sw //= 2
    return sw


def old_rows(t, m, n, slots, raster):
    """The padded walk's wave rows (the model before the unpadded walk)."""
    tm, tn = math.ceil(m / t["tile_m"]), math.ceil(n / t["tile_n"])
    cm, cn = t["cluster_m"], t["cluster_n"]
    sw = old_swizzle(t, m, n)
    cl_m, cl_n = -(-tm // cm), -(-tn // cn)
    minor_n, major_n = (cl_m, cl_n) if raster == 2 else (cl_n, cl_m)
    covered = set()
    for cid in range(slots // (cm * cn)):
        group, rest = divmod(cid, sw * major_n)
        major, offset = divmod(rest, sw)
        minor = group * sw + offset
        if minor >= minor_n:
            break
        mi, ni = (minor, major) if raster == 2 else (major, minor)
        for a in range(cm):
            for b in range(cn):
                covered.add((mi * cm + a, ni * cn + b))
    return (
        len({x for x, _ in covered if x < tm}) * t["tile_m"]
        + len({y for _, y in covered if y < tn}) * t["tile_n"]
    )


def heuristic(t, m, n):
    tm = -(-math.ceil(m / t["tile_m"]) // t["cluster_m"]) * t["cluster_m"]
    tn = -(-math.ceil(n / t["tile_n"]) // t["cluster_n"]) * t["cluster_n"]
    return 1 if tn > tm else 2


def resolve(t, m, n, rule):
    return rule or heuristic(t, m, n)


def old_raster(t, m, n, slots):
    rm, rn = old_rows(t, m, n, slots, 1), old_rows(t, m, n, slots, 2)
    if rm < 0.9 * rn:
        return 1
    if rn < 0.9 * rm:
        return 2
    return 0


def main() -> None:
    out_path = sys.argv[1]
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 1e9
    t0 = time.time()
    ctx = SingleGpuContext.current()
    dev = ctx.dev
    table = _core.gemm_config_table()
    res = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "cases": []}
    stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
    ci = 0
    for si, (name, m, n, k) in enumerate(SHAPES):
        for dtype in DTYPES:
            if time.time() - t0 > budget:
                print("budget reached", flush=True)
                break
            cfg = (
                "e4m3_128x192"
                if dtype == "e4m3"
                else _core.gemm_resolve_config(m, n, cuda_device=dev.index)
            )
            t = table[cfg]
            try:
                slots = _core.gemm_resident_ctas(
                    "e4m3" if dtype == "e4m3" else "bf16", cuda_device=dev.index, config=cfg
                )
            except Exception as e:  # noqa: BLE001
                print(f"resident ctas of {cfg}: {e}; 132", flush=True)
                slots = 132
            o_sw, o_ra = old_swizzle(t, m, n), resolve(t, m, n, old_raster(t, m, n, slots))
            new_rule = _core.choose_raster(cfg, m, n, k, slots=slots, swizzle=8)
            n_ra = resolve(t, m, n, new_rule["raster"])
            variants = {"old": (o_sw, o_ra), "new": (8, n_ra), "new_other": (8, 3 - n_ra)}
            if dtype == "bf16" and o_sw == 8 and o_ra == n_ra and "PROBE_SET" not in os.environ:
                print(f"{name} bf16 {cfg}: same order as before, skipped", flush=True)
                continue
            gen = torch.Generator(device=dev).manual_seed(7 + si)
            a = torch.empty((m, k), device=dev).uniform_(-1, 1, generator=gen)
            w = torch.empty((n, k), device=dev).uniform_(-1, 1, generator=gen) / math.sqrt(k)
            d = torch.empty((m, n), device=dev, dtype=torch.bfloat16)
            dref = torch.empty_like(d)
            if dtype == "bf16":
                a16, w16 = a.bfloat16(), w.bfloat16()
                ref_fn = lambda a16=a16, w16=w16: torch.mm(a16, w16.t(), out=dref)  # noqa: E731

                def ours(sw, ra, a16=a16, w16=w16, cfg=cfg):
                    return lambda: _core.gemm(
                        a16.data_ptr(), w16.data_ptr(), d.data_ptr(), m, n, k, "bf16",
                        cuda_device=dev.index, stream=stream(), config=cfg, swizzle=sw,
                        raster=ra)  # fmt: skip
            else:
                qa, sa = quantize(a, True)
                qb, sb = quantize(w, True)
                ta, tb = scaled_mm_scales(sa, sb, m, n)

                def ref_fn(qa=qa, qb=qb, ta=ta, tb=tb):
                    torch._scaled_mm(  # into dref, as ours writes d: no copy
                        qa, qb.t(), scale_a=ta, scale_b=tb, out_dtype=torch.bfloat16, out=dref
                    )

                def ours(sw, ra, qa=qa, qb=qb, sa=sa, sb=sb):
                    return lambda: _core.gemm(
                        qa.data_ptr(), qb.data_ptr(), d.data_ptr(), m, n, k, "e4m3",
                        cuda_device=dev.index, stream=stream(), scale_a=sa.data_ptr(),
                        scale_a_rows=True, scale_b=sb.data_ptr(), scale_b_rows=True,
                        swizzle=sw, raster=ra)  # fmt: skip

            del a, w
            calls = max(1, int(2e10 / (2.0 * m * n * k) * (2 if dtype == "e4m3" else 1)) + 1)
            fns = {"ref": ref_fn}
            for v, (sw, ra) in variants.items():
                fns[v] = ours(sw, ra)
            errs = {}
            for v, fn in fns.items():
                d.fill_(float("nan"))
                fn()
                torch.cuda.synchronize()
                if v == "ref":
                    continue
                ref_fn()
                torch.cuda.synchronize()
                errs[v] = float((d.float() - dref.float()).norm() / dref.float().norm())
            graphs = {v: graphed(torch, fn, calls) for v, fn in fns.items()}
            names = [v for v in fns if v != "ref"]
            if ci % 2:
                names = names[::-1]
            ci += 1
            ms = {"ref0": time_variant(ctx, graphs["ref"].replay, warm_s=WARMUP_S) / calls}
            for v in names:
                ms[v] = time_variant(ctx, graphs[v].replay) / calls
            ms["ref1"] = time_variant(ctx, graphs["ref"].replay) / calls
            refm = (ms["ref0"] + ms["ref1"]) / 2
            rec = {
                "case": name,
                "dtype": dtype,
                "config": cfg,
                "m": m,
                "n": n,
                "k": k,
                "slots": slots,
                "calls": calls,
                "variants": variants,
                "rows_new": new_rule,
                "err_vs_ref": errs,
                "ms": ms,
                "ratio": {v: ms[v] / refm for v in names},
            }
            print(
                f"{name} {dtype} {cfg} ref {refm:.4f} old s{o_sw}r{o_ra} "
                f"{ms['old'] / refm:.3f} new s8r{n_ra} {ms['new'] / refm:.3f} other "
                f"{ms['new_other'] / refm:.3f} new/old {ms['new'] / ms['old']:.3f} "
                f"err {max(errs.values()):.2e}",
                flush=True,
            )
            res["cases"].append(rec)
            del graphs
            torch.cuda.empty_cache()
            with open(out_path, "w") as f:
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
