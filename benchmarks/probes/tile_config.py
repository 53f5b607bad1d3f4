"""Probe (not shipped): 128x256 against 256x192 on the local sweep GEMMs where the fitted 256x192
cost (kConfigs) changes the model's pick, one GPU, steady state, interleaved against torch.mm.
Usage: python3 -m benchmarks.probes.tile_config OUT_JSON [BUDGET_S]"""

import json
import math
import sys
import time

import torch

from benchmarks.common.timing import WARMUP_S, SingleGpuContext, graphed, time_variant
from benchmarks.kernel import shapes as ks
from distgemm import _core

MEASURED = {
    (4096, 28672, 8192),
    (8192, 8192, 4096),
    (8192, 8192, 14336),
    (4096, 16384, 8192),
    (4096, 16384, 26624),
    (8192, 8192, 8192),
    (8192, 8192, 28672),
    (4096, 16384, 16384),
    (4096, 16384, 53248),
    (8192, 18432, 16384),
}


def shapes(old_cost=1.44):
    t = _core.gemm_config_table()
    out = []
    for s in ks.kernel_shapes(local_only=True)[0]:
        est = _core.choose_config(s.m, s.n, 1, "bf16", slots=132)
        first = est["128x256"]["waves"]
        old = est["256x192"]["waves"] * old_cost < (1 - t["256x192"]["min_gain"]) * first
        if est["config"] == "256x192" and not old and (s.m, s.n, s.k) not in MEASURED:
            out.append((s.sources[0].name, s.m, s.n, s.k))
    return out


def main() -> None:
    out_path = sys.argv[1]
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 1e9
    t0 = time.time()
    ctx = SingleGpuContext.current()
    dev = ctx.dev
    res = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "cases": []}
    stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
    for si, (name, m, n, k) in enumerate(shapes()):
        if time.time() - t0 > budget:
            print("budget reached", flush=True)
            break
        gen = torch.Generator(device=dev).manual_seed(7 + si)
        a = torch.empty((m, k), device=dev).uniform_(-1, 1, generator=gen).bfloat16()
        w = (
            torch.empty((n, k), device=dev).uniform_(-1, 1, generator=gen) / math.sqrt(k)
        ).bfloat16()
        d = torch.empty((m, n), device=dev, dtype=torch.bfloat16)
        dref = torch.empty_like(d)
        fns = {"ref": lambda: torch.mm(a, w.t(), out=dref)}
        for cfg in ("128x256", "256x192"):
            fns[cfg] = lambda cfg=cfg: _core.gemm(
                a.data_ptr(), w.data_ptr(), d.data_ptr(), m, n, k, "bf16",
                cuda_device=dev.index, stream=stream(), config=cfg)  # fmt: skip
        errs = {}
        fns["ref"]()
        for cfg in ("128x256", "256x192"):
            d.fill_(float("nan"))
            fns[cfg]()
            torch.cuda.synchronize()
            errs[cfg] = float((d.float() - dref.float()).norm() / dref.float().norm())
        calls = max(1, int(2e10 / (2.0 * m * n * k)) + 1)
        graphs = {v: graphed(torch, fn, calls) for v, fn in fns.items()}
        names = ["128x256", "256x192"][:: (-1 if si % 2 else 1)]
        ms = {"ref0": time_variant(ctx, graphs["ref"].replay, warm_s=WARMUP_S) / calls}
        for v in names:
            ms[v] = time_variant(ctx, graphs[v].replay) / calls
        ms["ref1"] = time_variant(ctx, graphs["ref"].replay) / calls
        refm = (ms["ref0"] + ms["ref1"]) / 2
        rec = {
            "case": name,
            "m": m,
            "n": n,
            "k": k,
            "calls": calls,
            "err": errs,
            "ms": ms,
            "ratio": {v: ms[v] / refm for v in names},
        }
        print(
            f"{name} {m}x{n}x{k} ref {refm:.4f} 128x256 {ms['128x256'] / refm:.3f} 256x192 "
            f"{ms['256x192'] / refm:.3f} 192/256 {ms['256x192'] / ms['128x256']:.3f} "
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
