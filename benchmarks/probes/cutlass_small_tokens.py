"""Probe (not shipped): CUTLASS schedules for 33..128 tokens x weight^T with split-K (the fused
GEMM + all-reduce's CUTLASS range) against torch.mm, steady state, interleaved, one GPU.
Usage: python3 -m benchmarks.probes.cutlass_small_tokens SO_PATH OUT_JSON"""

import ctypes
import json
import math
import os
import sys

import torch

from benchmarks.common.timing import WARMUP_S, SingleGpuContext, graphed, time_variant

# variant: (name, token tile, weight tile, CTAs' units each: 1 cooperative, 2 ping-pong)
VARIANTS = {
    0: ("coop_t128_w128", 128, 128, 1),
    1: ("pp_t64_w128", 64, 128, 2),
    2: ("pp_t64_w256", 64, 256, 2),
    3: ("coopsw_w128_t64", 64, 128, 1),
    4: ("ppsw_w64_t64", 64, 64, 2),
}
LAYERS = [("70B/O", 8192, 4096), ("70B/FC2", 8192, 14336), ("405B/O", 16384, 8192)]
TOKENS = [int(x) for x in os.environ.get("PROBE_TOKENS", "33,64,128").split(",")]
PICK = [int(x) for x in os.environ.get("PROBE_VARIANTS", "0,1,2,3,4").split(",")]
SMS = 132


def main() -> None:
    lib = ctypes.CDLL(sys.argv[1])
    ctx = SingleGpuContext.current()
    dev = ctx.dev
    out = {
        "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "stages": {VARIANTS[v][0]: getattr(lib, f"dg_small_{v}_stages")() for v in PICK},
        "cases": [],
    }
    print(out["stages"], flush=True)
    first = True
    for li, (lname, n, k) in enumerate(LAYERS):
        gen = torch.Generator(device=dev).manual_seed(99 + li)
        w = torch.empty((n, k), device=dev, dtype=torch.bfloat16).uniform_(-1, 1, generator=gen)
        w /= math.sqrt(k)
        for m in TOKENS:
            x = torch.empty((m, k), device=dev, dtype=torch.bfloat16).uniform_(-1, 1, generator=gen)
            ref = torch.mm(x, w.t())
            fns, outs = {}, {}
            dref = torch.empty_like(ref)
            fns["torch"] = lambda x=x, w=w, d=dref: torch.mm(x, w.t(), out=d)
            for v, (vname, tt, tw, per_cta) in VARIANTS.items():
                if v not in PICK:
                    continue
                tiles = math.ceil(m / tt) * math.ceil(n / tw)
                for s in (1, 2, 4):
                    if tiles * s > SMS * per_cta or k % (s * 64):
                        continue
                    d = torch.zeros((s, m, n), device=dev, dtype=torch.bfloat16)
                    args = (
                        ctypes.c_void_p(x.data_ptr()),
                        ctypes.c_void_p(w.data_ptr()),
                        ctypes.c_void_p(d.data_ptr()),
                        m,
                        n,
                        k,
                        s,
                    )
                    rc = getattr(lib, f"dg_small_{v}_prepare")(*args)
                    if rc:
                        print(f"{lname} m={m} {vname} s={s}: prepare rc={rc}", flush=True)
                        continue
                    launch = getattr(lib, f"dg_small_{v}_launch")

                    def call(launch=launch, args=args):
                        rc = launch(*args, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
                        assert rc == 0, rc

                    fns[f"{vname}/s{s}"] = call
                    outs[f"{vname}/s{s}"] = d
            for fn in fns.values():
                fn()
            torch.cuda.synchronize()
            errs = {
                v: float((d.float().sum(0) - ref.float()).norm() / ref.float().norm())
                for v, d in outs.items()
            }
            graphs = {v: graphed(torch, fn, 20) for v, fn in fns.items()}
            order = list(graphs)
            us = {v: [] for v in order}
            for rnd in range(2):
                for v in order if rnd == 0 else order[::-1]:
                    t = time_variant(ctx, graphs[v].replay, warm_s=WARMUP_S if first else 0.25)
                    first = False
                    us[v].append(t / 20 * 1e3)
            med = {v: sum(x) / len(x) for v, x in us.items()}
            rec = {"layer": lname, "m": m, "n": n, "k": k, "us": med, "rounds": us, "err": errs}
            out["cases"].append(rec)
            line = "  ".join(f"{v}={med[v]:.1f}({med[v] / med['torch']:.2f})" for v in order)
            print(f"{lname} m={m}: {line}  max err {max(errs.values()):.1e}", flush=True)
    with open(sys.argv[2], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
