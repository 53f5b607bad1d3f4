"""Probe of the decode kernel's fixed cost at TP=1 (uncommitted instrumentation): per-call time of
the full kernel, without its tail (1), without its mainloop (2), neither (3), against torch.mm;
and per-CTA globaltimer stamps (start, first stage landed, mainloop end, end) of one launch."""

import json
import os
import statistics
import sys
import time

import torch

import distgemm
from benchmarks.decode.fused_tp1 import graph_of, start_world_of_one, timed_window_us, uniform

dev = start_world_of_one()
out = {}
gen = torch.Generator().manual_seed(3)
for name, n, k in [("70B-O", 8192, 4096)]:
    for m in (1,):
        a = uniform((m, k), gen, torch.bfloat16, dev)
        w = uniform((n, k), gen, torch.bfloat16, dev, k**-0.5)
        o = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
        o2 = torch.empty_like(o)
        graphs = {"mm": graph_of(lambda: torch.mm(a, w.t(), out=o2))}
        for mode in (0, 8, 16):
            os.environ["DISTGEMM_DECODE_PROBE"] = str(mode)
            graphs[f"mode{mode}"] = graph_of(
                lambda: distgemm.gemm_all_reduce(a, w, out=o, path="fused")
            )
        os.environ["DISTGEMM_DECODE_PROBE"] = os.environ.get("STAMP_MODE", "0")
        buf = torch.zeros(4096 * 12, dtype=torch.int64, device=dev)
        os.environ["DISTGEMM_DECODE_PROBE_BUF"] = str(buf.data_ptr())
        g_st = graph_of(lambda: distgemm.gemm_all_reduce(a, w, out=o, path="fused"))
        del os.environ["DISTGEMM_DECODE_PROBE_BUF"]
        t_end = time.perf_counter() + 1.0
        while time.perf_counter() < t_end:
            for g in graphs.values():
                g.replay()
        torch.cuda.synchronize()
        times = {key: [] for key in graphs}
        for _ in range(2):
            for key, g in graphs.items():
                times[key].append(timed_window_us(g, 0.5))
        rec = {key: round(statistics.median(v), 2) for key, v in times.items()}
        # stamps of the last call of a steady replay
        t_end = time.perf_counter() + 0.3
        while time.perf_counter() < t_end:
            graphs["mm"].replay()
        g_st.replay()
        torch.cuda.synchronize()
        st = buf.view(-1, 12).cpu()
        st = st[st[:, 0] > 0]
        t0 = int(st[:, 0].min())
        rel = (st - t0).double() / 1000.0  # us
        q = lambda col: [
            round(float(x), 2)
            for x in torch.quantile(
                rel[:, col], torch.tensor([0.0, 0.5, 0.9, 1.0], dtype=torch.double)
            )
        ]
        rec["ctas"] = int(st.shape[0])
        names = {
            0: "start",
            2: "mainloop_end",
            6: "flagged",
            7: "waited",
            10: "synced2",
            11: "loaded",
            8: "reduced",
            9: "synced",
            3: "end",
        }
        for i, nm in names.items():
            rec[nm + "_q"] = q(i)
        for i, j, nm in [
            (2, 6, "store+flag"),
            (6, 7, "wait"),
            (7, 10, "2syncs"),
            (10, 8, "reduce"),
            (8, 9, "to_sync"),
            (9, 3, "finish"),
        ]:
            d = rel[:, j] - rel[:, i]
            rec["d_" + nm] = [round(float(d.median()), 2), round(float(d.max()), 2)]
        out[f"{name}/m{m}"] = rec
        print(name, m, json.dumps(rec), flush=True)
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1)
