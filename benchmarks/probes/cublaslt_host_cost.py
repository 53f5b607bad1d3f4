"""Probe (not shipped): the host cost of cuBLASLt's GEMM on shapes it has not seen, the cost a
plan's first call pays per new step shape, against distgemm's own kernel. One GPU.
Usage: python3 -m benchmarks.probes.cublaslt_host_cost OUT_JSON

Per new shape m x N x K (bf16, m in steps of 8, the step GEMMs of a reduce-scatter's first calls
at TP=4 with K=4096, N=3072), host ms of: cuBLASLt's heuristic (cublaslt_algo_count), the first
and a second eager call of its rank-0 algorithm (each until the device is done), and a CUDA graph
of one call captured and instantiated (what cublaslt_preload does per shape); the same eager and
graph costs for distgemm's kernel of that shape. DISTGEMM_CUBLASLT_ROW_BUCKETS=off asks cuBLASLt's
heuristic about every row count (runtime.kernel_table.row_buckets).
"""

import json
import statistics
import sys
import time

import torch

from distgemm import _core
from distgemm.runtime import kernel_table

N, K = 3072, 1024
MS = list(range(8, 776, 8))


def ms_of(fn) -> float:
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3


def main() -> int:
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    buckets = kernel_table.row_buckets()
    _core.set_cublaslt_row_buckets(buckets == "on")
    a = torch.rand(max(MS), K, device=dev, dtype=torch.bfloat16)
    b = torch.rand(N, K, device=dev, dtype=torch.bfloat16)
    d = torch.empty(max(MS), N, device=dev, dtype=torch.bfloat16)

    def call(m: int, algo: int):
        def run():
            _core.gemm(
                a.data_ptr(), b.data_ptr(), d.data_ptr(), m, N, K, "bf16", cuda_device=0,
                stream=torch.cuda.current_stream().cuda_stream, cublas_algo=algo,
            )  # fmt: skip

        return run

    def graph_of(run) -> None:
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
            run()
        g.replay()

    for m in (8, 16):  # warm both paths (libraries, contexts) on shapes not measured below
        call(m + 4, -1)()
        call(m + 4, 0)()
    torch.cuda.synchronize()
    rows = []
    for m in MS:
        row = dict(m=m, n=N, k=K)
        row["heuristic"] = ms_of(
            lambda m=m: _core.cublaslt_algo_count(m, N, K, "bf16", cuda_device=0)
        )
        row["cublaslt_first"] = ms_of(call(m, 0))
        row["cublaslt_second"] = ms_of(call(m, 0))
        row["cublaslt_graph"] = ms_of(lambda m=m: graph_of(call(m, 0)))
        row["ours_first"] = ms_of(call(m, -1))
        row["ours_second"] = ms_of(call(m, -1))
        row["ours_graph"] = ms_of(lambda m=m: graph_of(call(m, -1)))
        rows.append(row)
    keys = [k for k in rows[0] if k not in ("m", "n", "k")]
    summary = {
        k: dict(
            median=statistics.median(r[k] for r in rows),
            max=max(r[k] for r in rows),
            over_1ms=sum(r[k] > 1 for r in rows),
        )
        for k in keys
    }
    for k, v in summary.items():
        print(f"{k:18s} median {v['median']:.3f} ms  max {v['max']:.3f}  >1 ms: {v['over_1ms']}")
    meta = dict(gpu=torch.cuda.get_device_name(dev), torch=torch.__version__,
                cublaslt=_core.cublaslt_version(), row_buckets=buckets)  # fmt: skip
    with open(sys.argv[1], "w") as f:
        json.dump(dict(meta=meta, summary=summary, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
