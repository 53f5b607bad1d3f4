"""Probe (not shipped): the stream-K kernels' decompositions on the local sweep GEMMs whose
128x256 grid leaves a partial wave, against torch.mm and the data-parallel pick, one GPU, steady
state, interleaved. Usage: python3 -m benchmarks.probes.stream_k_decompositions OUT_JSON [BUDGET_S]"""

import json
import math
import os
import sys
import time

import torch

from benchmarks.common.timing import WARMUP_S, SingleGpuContext, graphed, time_variant
from benchmarks.kernel import shapes as ks
from distgemm import _core


def shapes():
    out = []
    for s in ks.kernel_shapes(local_only=True)[0]:
        w256 = math.ceil(s.m / 128) * math.ceil(s.n / 256) / 132
        if w256 < 3 and 0 < w256 % 1 < 0.9:
            out.append((s.sources[0].name, s.m, s.n, s.k))
    only = os.environ.get("PROBE_ONLY")
    if only:
        out = [x for x in out if any(o in x[0] for o in only.split(","))]
    return out


def variants(m, n):
    v = {"dp": ("auto", "auto", 1)}
    for cfg in ("128x256sk", "128x128sk"):
        v[f"{cfg}/heur"] = (cfg, "heuristic", 1)
        v[f"{cfg}/sk"] = (cfg, "stream_k", 1)
    t128 = math.ceil(m / 128) * math.ceil(n / 128)
    for s in (2, 3, 4):
        if t128 * s <= 1.5 * 132:
            v[f"128x128sk/split{s}"] = ("128x128sk", "split_k", s)
    return v


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
        gen = torch.Generator(device=dev).manual_seed(11 + si)
        a = torch.empty((m, k), device=dev).uniform_(-1, 1, generator=gen).bfloat16()
        w = (
            torch.empty((n, k), device=dev).uniform_(-1, 1, generator=gen) / math.sqrt(k)
        ).bfloat16()
        d = torch.empty((m, n), device=dev, dtype=torch.bfloat16)
        dref = torch.empty_like(d)
        exact = torch.mm(a.float(), w.float().t())
        fns = {"ref": lambda: torch.mm(a, w.t(), out=dref)}
        vs = variants(m, n)
        wss = {}
        dp_cfg = _core.gemm_resolve_config(m, n, cuda_device=dev.index)
        for v, (cfg, dec, sp) in vs.items():
            kw = {}
            if cfg != "auto":
                nb = _core.gemm_workspace_bytes(
                    m, n, k, cuda_device=dev.index, config=cfg, decomposition=dec, splits=sp
                )
                wss[v] = torch.zeros(max(nb, 16), device=dev, dtype=torch.uint8)
                kw = dict(
                    config=cfg,
                    workspace=wss[v].data_ptr(),
                    workspace_bytes=wss[v].numel(),
                    decomposition=dec,
                    splits=sp,
                )
            fns[v] = lambda kw=kw: _core.gemm(
                a.data_ptr(),
                w.data_ptr(),
                d.data_ptr(),
                m,
                n,
                k,
                "bf16",
                cuda_device=dev.index,
                stream=stream(),
                **kw,
            )
        errs = {}
        for v, fn in fns.items():
            d.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            got = dref if v == "ref" else d
            errs[v] = float((got.float() - exact).norm() / exact.norm())
        calls = max(1, int(2e10 / (2.0 * m * n * k)) + 1)
        graphs = {v: graphed(torch, fn, calls) for v, fn in fns.items()}
        names = [v for v in fns if v != "ref"]
        if si % 2:
            names = names[::-1]
        ms = {"ref0": time_variant(ctx, graphs["ref"].replay, warm_s=WARMUP_S) / calls}
        for v in names:
            ms[v] = time_variant(ctx, graphs[v].replay) / calls
        ms["ref1"] = time_variant(ctx, graphs["ref"].replay) / calls
        refm = (ms["ref0"] + ms["ref1"]) / 2
        ratio = {v: ms[v] / refm for v in names}
        best = min(ratio, key=ratio.get)
        rec = {
            "case": name,
            "m": m,
            "n": n,
            "k": k,
            "dp_config": dp_cfg,
            "calls": calls,
            "variants": vs,
            "err": errs,
            "ms": ms,
            "ratio": ratio,
            "best": best,
        }
        print(
            f"{name} {m}x{n}x{k} mm {refm:.4f} dp({dp_cfg}) {ratio['dp']:.3f} "
            + " ".join(f"{v} {r:.3f}" for v, r in ratio.items() if v != "dp")
            + f" | best {best} {ratio[best]:.3f} maxerr {max(errs.values()):.1e}",
            flush=True,
        )
        res["cases"].append(rec)
        del graphs
        torch.cuda.empty_cache()
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
