"""Probe of pushing a reduce-scatter ring's partials with a few SMs instead of the copy engine:
how fast do k CTAs move a partial to the next GPU, and what does the GEMM lose when it leaves
them those SMs?

    python3 -m benchmarks.probes.sm_push [--mb 8] [--pushes 6] [--out FILE.json]

One process drives every visible GPU; GPU d pushes to GPU d+1 (mod TP), PUSHES partials of MB
MiB each, as a TP-rank reduce-scatter plan at S = 2 TP does (70B O at 4096 tokens, TP=4: 6
pushes of 8 MiB, each after a 512 x 8192 x 2048 step GEMM). The push kernel (sm_push.cu, built
here with nvcc, 16-byte loads and stores by `ctas` CTAs of 512 threads) against the copy engine
(cudaMemcpyAsync); the GEMM is torch.mm of that step shape through cuBLASLt
(``torch.backends.cuda.preferred_blas_library("cublaslt")``) with
``torch._C._set_sm_carveout_experimental(c)``, which has cuBLASLt target all SMs but c. Per
round, on every GPU at once, each of:
  - ce: the pushes by the copy engine, alone; sm k: by the kernel with k CTAs, alone;
  - mm c: 4 PUSHES step GEMMs back to back with carveout c (0: none), alone;
  - mm 0 + ce, mm k + sm k: both at once on two streams.
Reported per variant: the pushes' GB/s (bytes over their span), the GEMMs' ms per call, and the
wall ms of the pair (first start to last end; CUDA events), medians over ROUNDS rounds after a
1 s warm-up, uniform random data. A GEMM whose time does not grow with c says the carveout did
not reach it.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import time

import torch

from benchmarks.probes.copy_engine_split import cudart, enable_peer_access, step_gemm

ROUNDS = 10
CTAS = (4, 8, 16, 32)
THREADS = 512
SOURCE = pathlib.Path(__file__).with_name("sm_push.cu")


def build() -> ctypes.CDLL:
    """sm_push.cu as a shared library (nvcc from CUDA_HOME, PATH or /usr/local/cuda), kept per
    source hash under the temp directory."""
    nvcc = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    nvcc = shutil.which("nvcc") or nvcc
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    lib = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"distgemm-sm-push-{digest}.so"
    if not lib.exists():
        subprocess.run(
            [nvcc, "-O3", "-shared", "-Xcompiler", "-fPIC", "-cudart", "shared",
             "-gencode=arch=compute_90a,code=sm_90a", "-o", str(lib), str(SOURCE)],
            check=True,
        )  # fmt: skip
    return ctypes.CDLL(str(lib))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=8)
    ap.add_argument("--pushes", type=int, default=6)
    ap.add_argument("--m", type=int, default=512, help="rows of the step GEMM")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    rt, push = cudart(), build()
    tp = torch.cuda.device_count()
    nbytes = args.mb << 20
    src, dst, streams, ops = [], [], [], []
    for d in range(tp):
        peer = (d + 1) % tp
        torch.cuda.set_device(d)
        enable_peer_access(rt, d, peer)
        g = torch.Generator(device="cpu").manual_seed(d)
        src.append(torch.rand(args.pushes * nbytes // 2, generator=g).to(torch.bfloat16).cuda(d))
        dst.append(torch.empty(args.pushes * nbytes // 2, dtype=torch.bfloat16, device=peer))
        streams.append((torch.cuda.Stream(d), torch.cuda.Stream(d)))  # GEMM, pushes
        ops.append(step_gemm(args.m, d, g))
    calls = 4 * args.pushes

    def timed(stream, fn) -> tuple:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(stream)
        with torch.cuda.stream(stream):
            fn()
        e1.record(stream)
        return e0, e1

    def pushes(d: int, ctas: int | None, stream) -> None:
        for p in range(args.pushes):
            to = ctypes.c_void_p(dst[d].data_ptr() + p * nbytes)
            frm = ctypes.c_void_p(src[d].data_ptr() + p * nbytes)
            s = ctypes.c_void_p(stream.cuda_stream)
            if ctas is None:
                rc = rt.cudaMemcpyAsync(to, frm, ctypes.c_size_t(nbytes), ctypes.c_int(4), s)
            else:
                rc = push.sm_push(to, frm, ctypes.c_size_t(nbytes), ctas, THREADS, s)
            if rc != 0:
                raise RuntimeError(f"push returned {rc}")

    def gemms(d: int) -> None:
        a, wt, out = ops[d]
        for _ in range(calls):
            torch.mm(a, wt, out=out)

    def one(mm_carveout: int | None, push_ctas: int | None, with_push: bool) -> list[dict]:
        """Every GPU at once: the GEMMs (carveout, or none when None), the pushes (copy engine
        when push_ctas is None), or both; per GPU the GB/s, GEMM ms per call and wall ms."""
        torch._C._set_sm_carveout_experimental(mm_carveout or None)
        try:
            spans = []
            for d in range(tp):
                with torch.cuda.device(d):
                    g = (
                        timed(streams[d][0], lambda d=d: gemms(d))
                        if mm_carveout is not None
                        else None
                    )
                    p = (
                        timed(streams[d][1], lambda d=d: pushes(d, push_ctas, streams[d][1]))
                        if with_push
                        else None
                    )
                    spans.append((g, p))
            for d in range(tp):
                torch.cuda.synchronize(d)
        finally:
            torch._C._set_sm_carveout_experimental(None)
        out = []
        for g, p in spans:
            rec = {}
            if p is not None:
                rec["gb_s"] = args.pushes * nbytes / (p[0].elapsed_time(p[1]) * 1e-3) / 1e9
            if g is not None:
                rec["mm_ms"] = g[0].elapsed_time(g[1]) / calls
            if g is not None and p is not None:
                first = g[0] if g[0].elapsed_time(p[0]) >= 0 else p[0]
                rec["wall_ms"] = max(first.elapsed_time(g[1]), first.elapsed_time(p[1]))
            out.append(rec)
        return out

    variants = {"ce": (None, None, True)}
    variants.update({f"sm {k}": (None, k, True) for k in CTAS})
    variants["mm 0"] = (0, None, False)
    variants.update({f"mm {k}": (k, None, False) for k in CTAS})
    variants["mm 0 + ce"] = (0, None, True)
    variants.update({f"mm {k} + sm {k}": (k, k, True) for k in CTAS})
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 1.0:
        one(0, None, True)
    rows = []
    for r in range(ROUNDS):
        names = list(variants) if r % 2 == 0 else list(reversed(variants))
        for name in names:
            for d, rec in enumerate(one(*variants[name])):
                rows.append(dict(round=r, variant=name, gpu=d, **rec))
    summary = {}
    for name in variants:
        mine = [x for x in rows if x["variant"] == name]
        summary[name] = {
            key: statistics.median(x[key] for x in mine)
            for key in ("gb_s", "mm_ms", "wall_ms")
            if key in mine[0]
        }
        line = ", ".join(f"{key} {v:.4g}" for key, v in summary[name].items())
        print(f"{name:<14} {line}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                dict(gpu=torch.cuda.get_device_name(0), tp=tp, mb=args.mb, pushes=args.pushes,
                     m=args.m, rounds=ROUNDS, threads=THREADS, summary=summary, rows=rows),
                f, indent=1,
            )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
