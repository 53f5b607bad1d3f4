"""Probe (not shipped): the persistent scheduler's tile order (swizzle x raster) of distgemm's bf16
and accurate fp8 kernels against torch.mm / torch._scaled_mm, steady state, interleaved, one GPU.
Usage: python3 -m benchmarks.probes.tile_order OUT_JSON [BUDGET_S]"""

import json
import math
import os
import sys
import time

import torch

from benchmarks.common.timing import WARMUP_S, SingleGpuContext, graphed, time_variant
from distgemm import _core
from distgemm.runtime.scales import quantize, scaled_mm_scales

ORDERS = [(8, 1), (8, 2), (4, 1), (4, 2), (2, 1), (2, 2), (1, 1), (1, 2)]
# (name, m, n, k): TP=2 local GEMMs
SHAPES = [
    ("70B/QKV/8192", 8192, 5120, 8192),
    ("70B/O/8192", 8192, 8192, 4096),
    ("70B/FC1/8192", 8192, 28672, 8192),
    ("70B/FC2/8192", 8192, 8192, 14336),
    ("405B/QKV/8192", 8192, 9216, 16384),
    ("405B/O/8192", 8192, 16384, 8192),
    ("405B/FC2/8192", 8192, 16384, 26624),
    ("70B/QKV/4096", 4096, 5120, 8192),
    ("70B/O/4096", 4096, 8192, 4096),
    ("405B/O/4096", 4096, 16384, 8192),
    ("405B/FC1/8192", 8192, 53248, 16384),
]
if os.environ.get("PROBE_SHAPES") == "tp1":
    SHAPES = [
        ("70B/FC1/8192/TP1", 8192, 57344, 8192),
        ("70B/QKV/8192/TP1", 8192, 10240, 8192),
        ("405B/FC1/8192", 8192, 53248, 16384),
    ]
if os.environ.get("PROBE_SHAPES") == "bf16model":  # where the rows model leaves the heuristic
    SHAPES = [
        ("405B/QKV/8192/TP4", 8192, 4608, 16384),
        ("405B/QKV/16384/TP4", 16384, 4608, 16384),
        ("405B/FC1/16384/TP8", 16384, 13312, 16384),
        ("8B/FC1/16384/TP2", 16384, 14336, 4096),
    ]
DTYPES = os.environ.get("PROBE_DTYPES", "bf16,e4m3").split(",")


def main() -> None:
    out_path = sys.argv[1]
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 1e9
    t0 = time.time()
    ctx = SingleGpuContext.current()
    dev = ctx.dev
    res = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "cases": []}
    stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
    for si, (name, m, n, k) in enumerate(SHAPES):
        for dtype in DTYPES:
            if time.time() - t0 > budget:
                break
            gen = torch.Generator(device=dev).manual_seed(7 + si)
            a = torch.empty((m, k), device=dev).uniform_(-1, 1, generator=gen)
            w = torch.empty((n, k), device=dev).uniform_(-1, 1, generator=gen) / math.sqrt(k)
            d = torch.empty((m, n), device=dev, dtype=torch.bfloat16)
            dref = torch.empty_like(d)
            if dtype == "bf16":
                a16, w16 = a.bfloat16(), w.bfloat16()
                cfg = _core.gemm_resolve_config(m, n, cuda_device=dev.index)
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
                cfg = "e4m3_128x192"

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
            for sw, ra in ORDERS:
                fns[f"s{sw}r{ra}"] = ours(sw, ra)
            for fn in fns.values():
                fn()
            torch.cuda.synchronize()
            ref_fn()
            ours(8, 0)()
            torch.cuda.synchronize()
            err = float((d.float() - dref.float()).norm() / dref.float().norm())
            graphs = {v: graphed(torch, fn, calls) for v, fn in fns.items()}
            names = list(fns)[1:]
            if si % 2:
                names = names[::-1]
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
                "calls": calls,
                "err_vs_ref": err,
                "ms": ms,
                "ratio": {v: ms[v] / refm for v in names},
            }
            best = min(names, key=lambda v: ms[v])
            print(
                f"{name} {dtype} {cfg} ref {refm:.4f} best {best} {ms[best] / refm:.3f} "
                + " ".join(f"{v}={ms[v] / refm:.3f}" for v in fns if v != "ref"),
                flush=True,
            )
            res["cases"].append(rec)
            del graphs
            torch.cuda.empty_cache()
            with open(out_path, "w") as f:
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
