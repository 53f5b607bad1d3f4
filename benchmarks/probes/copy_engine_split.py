"""Probe of the copy engine's bandwidth in a reduce-scatter ring under a GEMM: does splitting each
push into several memcpys on several streams (so several copy engines) move the partials faster?

    python3 -m benchmarks.probes.copy_engine_split [--mb 8] [--pushes 6] [--spread] [--paced]
        [--out FILE.json]

One process drives every visible GPU. GPU d pushes PUSHES partials of MB MiB to GPU d+1 (mod
TP), as a TP-rank reduce-scatter plan at S = 2 TP does (70B O at 4096 tokens, TP=4: 6 pushes of
8 MiB), each push as `split` cudaMemcpyAsync calls (peer, by UVA) of equal parts on `split`
streams, pushes one after another on each stream. With `gemm` on, each GPU runs torch.mm
(M x 8192 x 2048, the step GEMM of that plan) back to back on its own stream meanwhile. Reported:
the pushes' GB/s per GPU (bytes over the span from the first copy's start to the last copy's
end, CUDA events) and each memcpy's own GB/s (events around it, after its wait), medians over
ROUNDS rounds after a 1 s warm-up; uniform random data.
--spread sends stream j's parts to GPU d+1+j (mod TP) instead, so a push split in `split` parts
goes to `split` different peers (splits up to TP-1): what a reduce-scatter that pushes each
partial straight to its owner would see. --paced makes push p wait for the p-th GEMM of its GPU
(an event after it), as a plan's push waits for the step GEMM that wrote it, so each push starts
alone instead of behind the previous one (with `gemm` off the GEMMs still run, for the pacing,
on the GEMM stream; the rounds differ only in the pushes' order).
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


def enable_peer_access(rt: ctypes.CDLL, device: int, peer: int) -> None:
    """Lets the current device (``device``) address ``peer``'s memory (already enabled: fine)."""
    rc = rt.cudaDeviceEnablePeerAccess(ctypes.c_int(peer), ctypes.c_uint(0))
    if rc not in (0, 704):  # 704: already enabled
        raise RuntimeError(f"cudaDeviceEnablePeerAccess({device} -> {peer}) returned {rc}")


def step_gemm(m: int, device: int, g: torch.Generator) -> tuple:
    """(a, w.T, out) of the plan's step GEMM m x 8192 x 2048 on ``device``, uniform random."""
    a = (torch.rand(m, 2048, generator=g) * 2 - 1).to(torch.bfloat16).cuda(device)
    w = (torch.rand(8192, 2048, generator=g) * 2 - 1).to(torch.bfloat16).cuda(device)
    return a, w.t(), torch.empty(m, 8192, dtype=torch.bfloat16, device=device)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=8)
    ap.add_argument("--pushes", type=int, default=6)
    ap.add_argument("--m", type=int, default=512, help="rows of the GEMM under the copies")
    ap.add_argument("--spread", action="store_true", help="stream j pushes to GPU d+1+j")
    ap.add_argument("--paced", action="store_true", help="push p waits for GEMM p")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rt = cudart()
    tp = torch.cuda.device_count()
    nbytes = args.mb << 20
    splits = [s for s in SPLITS if not args.spread or s <= tp - 1]
    src, dst, copy_streams, mm_streams, ops = [], [], [], [], []

    def peer_of(d: int, j: int) -> int:
        return (d + 1 + (j if args.spread else 0)) % tp

    for d in range(tp):
        torch.cuda.set_device(d)
        dst.append({})
        for j in range(max(splits)):
            peer = peer_of(d, j)
            if peer in dst[d]:
                continue
            enable_peer_access(rt, d, peer)
            dst[d][peer] = torch.empty(args.pushes * nbytes // 2, dtype=torch.bfloat16, device=peer)
        g = torch.Generator(device="cpu").manual_seed(d)
        src.append(torch.rand(args.pushes * nbytes // 2, generator=g).to(torch.bfloat16).cuda(d))
        copy_streams.append([torch.cuda.Stream(d) for _ in range(max(splits))])
        mm_streams.append(torch.cuda.Stream(d))
        ops.append(step_gemm(args.m, d, g))

    def one_round(split: int, gemm: bool) -> list[float]:
        for d in range(tp):
            torch.cuda.synchronize(d)
        spans = []
        events = []
        for d in range(tp):
            with torch.cuda.device(d):
                done = []  # an event after each of the first PUSHES GEMMs (--paced)
                if gemm or args.paced:
                    with torch.cuda.stream(mm_streams[d]):
                        a, wt, out = ops[d]
                        for i in range(4 * args.pushes):
                            torch.mm(a, wt, out=out)
                            if i < args.pushes:
                                done.append(torch.cuda.Event())
                                done[-1].record(mm_streams[d])
                starts, ends, pushes = [], [], []
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
                        if args.paced:
                            s.wait_event(done[p])
                        each = (
                            torch.cuda.Event(enable_timing=True),
                            torch.cuda.Event(enable_timing=True),
                        )
                        each[0].record(s)
                        rc = rt.cudaMemcpyAsync(
                            ctypes.c_void_p(dst[d][peer_of(d, j)].data_ptr() + off),
                            ctypes.c_void_p(src[d].data_ptr() + off),
                            ctypes.c_size_t(part), ctypes.c_int(4), ctypes.c_void_p(s.cuda_stream),
                        )  # fmt: skip
                        if rc != 0:
                            raise RuntimeError(f"cudaMemcpyAsync returned {rc}")
                        each[1].record(s)
                        pushes.append((part, each))
                    e1.record(s)
                    starts.append(e0)
                    ends.append(e1)
                events.append((starts, ends, pushes))
        for d in range(tp):
            torch.cuda.synchronize(d)
        for starts, ends, pushes in events:
            span = max(starts[0].elapsed_time(e) for e in ends) - min(
                starts[0].elapsed_time(s) for s in starts
            )
            alone = statistics.median(
                b / (e0.elapsed_time(e1) * 1e-3) / 1e9 for b, (e0, e1) in pushes
            )
            spans.append((args.pushes * nbytes / (span * 1e-3) / 1e9, alone))
        return spans

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 1.0:
        one_round(1, True)
    rows = []
    for r in range(ROUNDS):
        order = [(s, g) for g in (False, True) for s in splits]
        for split, gemm in order if r % 2 == 0 else reversed(order):
            for d, (gbs, alone) in enumerate(one_round(split, gemm)):
                rows.append(dict(round=r, split=split, gemm=gemm, gpu=d, gb_s=gbs, push_gb_s=alone))
    summary = {}
    for gemm in (False, True):
        for split in splits:
            mine = [x for x in rows if x["split"] == split and x["gemm"] == gemm]
            v = [x["gb_s"] for x in mine]
            each = statistics.median(x["push_gb_s"] for x in mine)
            summary[f"split={split} gemm={gemm}"] = dict(gb_s=statistics.median(v), push_gb_s=each)
            print(f"split {split} gemm {'on ' if gemm else 'off'}: median {statistics.median(v):.1f} "
                  f"GB/s per GPU (min {min(v):.1f}, max {max(v):.1f}); one memcpy alone "
                  f"{each:.1f} GB/s", flush=True)  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                dict(gpu=torch.cuda.get_device_name(0), tp=tp, mb=args.mb, pushes=args.pushes,
                     m=args.m, spread=args.spread, paced=args.paced, rounds=ROUNDS, summary=summary, rows=rows), f, indent=1,
            )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
