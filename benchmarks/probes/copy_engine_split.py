"""Probe of the copy engine's bandwidth in a reduce-scatter ring under a GEMM: does splitting each
push into several memcpys on several streams (so several copy engines) move the partials faster?

    python3 -m benchmarks.probes.copy_engine_split [--mb 8] [--pushes 6] [--out FILE.json]

One process drives every visible GPU. GPU d pushes PUSHES partials of MB MiB to GPU d+1 (mod
TP), as a TP-rank reduce-scatter plan at S = 2 TP does (70B O at 4096 tokens, TP=4: 6 pushes of
8 MiB), each push as `split` cudaMemcpyAsync calls (peer, by UVA) of equal parts on `split`
streams, pushes one after another on each stream. With `gemm` on, each GPU runs torch.mm
(M x 8192 x 2048, the step GEMM of that plan) back to back on its own stream meanwhile. Reported:
the pushes' GB/s per GPU (bytes over the span from the first copy's start to the last copy's
end, CUDA events), median over ROUNDS rounds after a 1 s warm-up; uniform random data.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time

import torch

ROUNDS = 20
SPLITS = (1, 2, 3, 4)


def cudart() -> ctypes.CDLL:
    """The CUDA runtime torch loaded (found in this process's maps)."""
    torch.cuda.init()
    with open("/proc/self/maps") as f:
        for line in f:
            if "libcudart.so" in line:
                return ctypes.CDLL(line.split()[-1])
    raise RuntimeError("libcudart is not loaded in this process")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=8)
    ap.add_argument("--pushes", type=int, default=6)
    ap.add_argument("--m", type=int, default=512, help="rows of the GEMM under the copies")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rt = cudart()
    tp = torch.cuda.device_count()
    nbytes = args.mb << 20
    src, dst, copy_streams, mm_streams, ops = [], [], [], [], []
    for d in range(tp):
        peer = (d + 1) % tp
        torch.cuda.set_device(d)
        rc = rt.cudaDeviceEnablePeerAccess(ctypes.c_int(peer), ctypes.c_uint(0))
        if rc not in (0, 704):  # 704: already enabled
            raise RuntimeError(f"cudaDeviceEnablePeerAccess({d} -> {peer}) returned {rc}")
        g = torch.Generator(device="cpu").manual_seed(d)
        src.append(torch.rand(args.pushes * nbytes // 2, generator=g).to(torch.bfloat16).cuda(d))
        dst.append(torch.empty(args.pushes * nbytes // 2, dtype=torch.bfloat16, device=peer))
        copy_streams.append([torch.cuda.Stream(d) for _ in range(max(SPLITS))])
        mm_streams.append(torch.cuda.Stream(d))
        a = (torch.rand(args.m, 2048, generator=g) * 2 - 1).to(torch.bfloat16).cuda(d)
        w = (torch.rand(8192, 2048, generator=g) * 2 - 1).to(torch.bfloat16).cuda(d)
        ops.append((a, w.t(), torch.empty(args.m, 8192, dtype=torch.bfloat16, device=d)))

    def one_round(split: int, gemm: bool) -> list[float]:
        for d in range(tp):
            torch.cuda.synchronize(d)
        spans = []
        events = []
        for d in range(tp):
            with torch.cuda.device(d):
                if gemm:
                    with torch.cuda.stream(mm_streams[d]):
                        a, wt, out = ops[d]
                        for _ in range(4 * args.pushes):
                            torch.mm(a, wt, out=out)
                starts, ends = [], []
                part = nbytes // split
                for j in range(split):
                    s = copy_streams[d][j]
                    e0, e1 = (
                        torch.cuda.Event(enable_timing=True),
                        torch.cuda.Event(enable_timing=True),
                    )
                    e0.record(s)
                    for p in range(args.pushes):
                        off = p * nbytes + j * part
                        rc = rt.cudaMemcpyAsync(
                            ctypes.c_void_p(dst[d].data_ptr() + off),
                            ctypes.c_void_p(src[d].data_ptr() + off),
                            ctypes.c_size_t(part), ctypes.c_int(4), ctypes.c_void_p(s.cuda_stream),
                        )  # fmt: skip
                        if rc != 0:
                            raise RuntimeError(f"cudaMemcpyAsync returned {rc}")
                    e1.record(s)
                    starts.append(e0)
                    ends.append(e1)
                events.append((starts, ends))
        for d in range(tp):
            torch.cuda.synchronize(d)
        for starts, ends in events:
            span = max(starts[0].elapsed_time(e) for e in ends) - min(
                starts[0].elapsed_time(s) for s in starts
            )
            spans.append(args.pushes * nbytes / (span * 1e-3) / 1e9)
        return spans

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 1.0:
        one_round(1, True)
    rows = []
    for r in range(ROUNDS):
        order = [(s, g) for g in (False, True) for s in SPLITS]
        for split, gemm in order if r % 2 == 0 else reversed(order):
            for d, gbs in enumerate(one_round(split, gemm)):
                rows.append(dict(round=r, split=split, gemm=gemm, gpu=d, gb_s=gbs))
    summary = {}
    for gemm in (False, True):
        for split in SPLITS:
            v = [x["gb_s"] for x in rows if x["split"] == split and x["gemm"] == gemm]
            summary[f"split={split} gemm={gemm}"] = statistics.median(v)
            print(f"split {split} gemm {'on ' if gemm else 'off'}: median {statistics.median(v):.1f} "
                  f"GB/s per GPU (min {min(v):.1f}, max {max(v):.1f})", flush=True)  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                dict(gpu=torch.cuda.get_device_name(0), tp=tp, mb=args.mb, pushes=args.pushes,
                     m=args.m, rounds=ROUNDS, summary=summary, rows=rows), f, indent=1,
            )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
