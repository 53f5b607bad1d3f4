"""Probe (not shipped): CUTLASS epilogue/schedule variants of the 128x256 bf16 GEMM against
distgemm's 128x256 kernel and torch.mm on full-grid Llama shapes, steady state, interleaved.
Usage: python3 -m benchmarks.probes.cutlass_epilogue SO_PATH OUT_JSON"""

import ctypes
import json
import math
import sys

import torch

from benchmarks.common.timing import WARMUP_S, SingleGpuContext, graphed, time_variant
from distgemm import _core

VARIANTS = {
    0: "coop_tma_noC",
    1: "coop_tma_C",
    2: "coop_nosmem",
    3: "pingpong_128x128",
    4: "coop_c1x2",
}
SHAPES = [
    ("70B/O/4096", 4096, 8192, 4096),
    ("70B/QKV/4096", 4096, 5120, 8192),
    ("70B/FC2/4096", 4096, 8192, 14336),
    ("70B/O/8192", 8192, 8192, 4096),
    ("405B/O/4096", 4096, 16384, 8192),
]


def main() -> None:
    lib = ctypes.CDLL(sys.argv[1])
    ctx = SingleGpuContext.current()
    dev = ctx.dev.index
    out = {
        "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "stages": {VARIANTS[v]: getattr(lib, f"dg_probe_{v}_stages")() for v in VARIANTS},
        "shapes": [],
    }
    for si, (name, m, n, k) in enumerate(SHAPES):
        gen = torch.Generator(device=ctx.dev).manual_seed(1234 + si)
        a = torch.empty((m, k), device=ctx.dev, dtype=torch.bfloat16).uniform_(-1, 1, generator=gen)
        w = torch.empty((n, k), device=ctx.dev, dtype=torch.bfloat16).uniform_(-1, 1, generator=gen)
        w /= math.sqrt(k)
        ref = torch.mm(a, w.t())
        outs = {}
        fns = {}

        def torch_call(a=a, w=w, d=torch.empty_like(ref)):
            torch.mm(a, w.t(), out=d)

        fns["torch"] = torch_call
        d_ours = torch.empty_like(ref)
        outs["ours"] = d_ours

        def ours(d=d_ours, a=a, w=w, m=m, n=n, k=k):
            _core.gemm(
                a.data_ptr(),
                w.data_ptr(),
                d.data_ptr(),
                m,
                n,
                k,
                dtype="bf16",
                cuda_device=dev,
                stream=torch.cuda.current_stream().cuda_stream,
                config="128x256",
            )

        fns["ours"] = ours
        for v, vname in VARIANTS.items():
            d = torch.empty_like(ref)
            rc = getattr(lib, f"dg_probe_{v}_prepare")(
                ctypes.c_void_p(a.data_ptr()),
                ctypes.c_void_p(w.data_ptr()),
                ctypes.c_void_p(d.data_ptr()),
                m,
                n,
                k,
            )
            if rc != 0:
                print(f"{name} {vname}: prepare failed rc={rc}", flush=True)
                continue
            launch = getattr(lib, f"dg_probe_{v}_launch")

            def call(launch=launch, a=a, w=w, d=d, m=m, n=n, k=k):
                rc = launch(
                    ctypes.c_void_p(a.data_ptr()),
                    ctypes.c_void_p(w.data_ptr()),
                    ctypes.c_void_p(d.data_ptr()),
                    m,
                    n,
                    k,
                    ctypes.c_void_p(torch.cuda.current_stream().cuda_stream),
                )
                assert rc == 0, rc

            fns[vname] = call
            outs[vname] = d
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        errs = {
            v: float((d.float() - ref.float()).norm() / ref.float().norm()) for v, d in outs.items()
        }
        calls = max(1, int(0.5e-3 / (2 * m * n * k / 600e12)))
        graphs = {v: graphed(torch, fn, calls) for v, fn in fns.items()}
        order = list(graphs)
        ms = {v: [] for v in order}
        first = True
        for rnd in range(2):
            for v in order if rnd == 0 else order[::-1]:
                t = time_variant(ctx, graphs[v].replay, warm_s=WARMUP_S if first else 0.25)
                first = False
                ms[v].append(t / calls)
        med = {v: sorted(x)[len(x) // 2] if len(x) > 2 else sum(x) / len(x) for v, x in ms.items()}
        rec = {
            "name": name,
            "m": m,
            "n": n,
            "k": k,
            "ms": med,
            "rounds": ms,
            "err": errs,
            "ratio_to_torch": {v: med[v] / med["torch"] for v in med},
        }
        out["shapes"].append(rec)
        line = "  ".join(f"{v}={med[v]:.4f}({med[v] / med['torch']:.3f})" for v in order)
        print(f"{name}: {line}  errs max {max(errs.values()):.2e}", flush=True)
    with open(sys.argv[2], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
