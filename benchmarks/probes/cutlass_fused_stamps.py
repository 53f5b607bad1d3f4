"""Probe (uncommitted instrumentation in fused_allreduce_sm90.cuh): the CUTLASS fused kernel at
TP=1, full / without its tail (mode 1) / without its GEMM (mode 2), against torch.mm and the
plain 128x128c1 GEMM; per-CTA globaltimer stamps of one launch."""

import json
import os
import statistics
import sys

import torch

import distgemm
from benchmarks.common.timing import SingleGpuContext, graphed, time_variant
from benchmarks.decode.fused_tp1 import start_world_of_one, uniform
from distgemm import _core

dev = start_world_of_one()
ctx = SingleGpuContext.current()
out = {}
gen = torch.Generator().manual_seed(3)
CALLS = 20
for name, n, k, m in [
    ("70B-O", 8192, 4096, 256),
    ("70B-O", 8192, 4096, 128),
    ("405B-O", 16384, 8192, 256),
]:
    a = uniform((m, k), gen, torch.bfloat16, dev)
    w = uniform((n, k), gen, torch.bfloat16, dev, k**-0.5)
    o = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
    o2 = torch.empty_like(o)
    o3 = torch.empty_like(o)
    graphs = {"mm": graphed(torch, lambda: torch.mm(a, w.t(), out=o2), CALLS)}
    graphs["c1"] = graphed(
        torch,
        lambda: _core.gemm(
            a.data_ptr(),
            w.data_ptr(),
            o3.data_ptr(),
            m,
            n,
            k,
            dtype="bf16",
            cuda_device=dev.index,
            stream=torch.cuda.current_stream().cuda_stream,
            config="128x128c1",
        ),
        CALLS,
    )
    for mode in (0, 1, 2):
        os.environ["DISTGEMM_FUSED_PROBE_MODE"] = str(mode)
        graphs[f"mode{mode}"] = graphed(
            torch, lambda: distgemm.gemm_all_reduce(a, w, out=o, path="fused"), CALLS
        )
    os.environ["DISTGEMM_FUSED_PROBE_MODE"] = "0"
    buf = torch.zeros(1024 * 8, dtype=torch.int64, device=dev)
    os.environ["DISTGEMM_FUSED_PROBE_BUF"] = str(buf.data_ptr())
    g_st = graphed(torch, lambda: distgemm.gemm_all_reduce(a, w, out=o, path="fused"), 1)
    del os.environ["DISTGEMM_FUSED_PROBE_BUF"]
    times = {key: [] for key in graphs}
    for r in range(2):
        for key, g in graphs.items():
            times[key].append(
                time_variant(ctx, g.replay, warm_s=1.0 if r == 0 else 0.25) * 1e3 / CALLS
            )
    rec = {key: round(statistics.median(v), 2) for key, v in times.items()}
    for _ in range(200):
        graphs["mm"].replay()
    g_st.replay()
    torch.cuda.synchronize()
    st = buf.view(-1, 8).cpu()
    st = st[st[:, 0] > 0]
    t0 = int(st[:, 0].min())
    rel = (st - t0).double() / 1000.0
    rel[st <= 0] = float("nan")
    names = [
        "start",
        "gemm_done",
        "stores_done",
        "flagged",
        "waited",
        "reduced1",
        "tail_done",
        "end",
    ]
    rec["ctas"] = int(st.shape[0])
    for i, nm in enumerate(names):
        col = rel[:, i]
        col = col[~torch.isnan(col)]
        if len(col):
            rec[nm] = [
                round(float(x), 2)
                for x in torch.quantile(col, torch.tensor([0.0, 0.5, 1.0], dtype=torch.double))
            ]
    out[f"{name}/m{m}"] = rec
    print(name, m, json.dumps(rec), flush=True)
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1)
