"""GPU checks of the one switch for torch's async-TP (distgemm.compat.async_tp), one rank per GPU:

    torchrun --nproc-per-node 4 tests/gpu/async_tp_worker.py --out results.json

Started by tests/gpu/test_async_tp_switch.py. One section, ``async_tp``, run by every rank:

A sequence-parallel MLP (tests/test_async_tp.sequence_parallel_mlp: all-gather of the sequence,
``x @ w1.T``, relu, ``@ w2.T``, reduce-scatter of the sequence; x ``[B, S, H]`` =
``[2, 2048, 1024]``, FFN 2816, bf16, the same seeded full tensors on every rank, each rank its
shards) compiled once by inductor with ``fullgraph=True`` and torch's micro-pipeline TP pass
(``torch._inductor.config._micro_pipeline_tp = True``, symmetric memory enabled for the group
as torchtitan enables it). The same compiled function is then called:

  async_tp/switch_on      after install(): distgemm served both fused ops of the graph
                          (routing_stats: one call each, no fallback), no graph break, output
                          within TOLERANCE of the fp32 MLP on the same bf16 inputs
  async_tp/switch_off     after uninstall(): nothing routed (torch's own kernels ran), output
                          within TOLERANCE of the switch-on output and of fp32
  async_tp/eager_fallback an eager fp32 torch.ops.symm_mem.fused_all_gather_matmul with the switch
                          on: given back to torch's CUDA kernel with distgemm's dtype reason,
                          equal to the full A @ B (fp32 rounding, FP32_RTOL / FP32_ATOL)

Where the ranks share one GPU (gloo), the switch-off baseline and the fallback, which run
torch's symmetric-memory kernels, are left out with the reason. Exit code 0 when every check
passed on every rank; rank 0 writes every result to --out (JSON).
"""

from __future__ import annotations

import pathlib
import sys
import warnings

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as torch_symm_mem
from torchrun_worker import left_out_when_shared, record, rel_err, worker_main

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # tests/: the MLP
from test_async_tp import routed, sequence_parallel_mlp  # noqa: E402

from distgemm.compat import async_tp  # noqa: E402

BATCH, SEQ, HIDDEN, FFN = 2, 2048, 1024, 2816  # S/TP, FFN/TP multiples of 8 at TP 2, 4, 8
TOLERANCE = 1e-2  # relative Frobenius error: bf16 intermediates (h) against fp32 ~4e-3
FP32_RTOL, FP32_ATOL = 1e-4, 1e-4  # torch's kernel (fp32 GEMM chunks, TF32 off) vs one GEMM
FUSED = ["fused_all_gather_matmul", "fused_matmul_reduce_scatter"]
NEEDS_ONE_GPU_PER_RANK = (
    "the switch-off baseline is torch's async-TP (its symmetric-memory kernels), run with one GPU "
    "per rank over NCCL only; ranks sharing one GPU run gloo"
)


def _shards(dev, rank: int, tp: int):
    """The full MLP's tensors (seeded, the same on every rank) and this rank's shards."""
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(SEQ, BATCH, HIDDEN, device=dev, generator=g).bfloat16()
    w1 = (torch.randn(FFN, HIDDEN, device=dev, generator=g) / HIDDEN**0.5).bfloat16()
    w2 = (torch.randn(HIDDEN, FFN, device=dev, generator=g) / FFN**0.5).bfloat16()
    s, f = SEQ // tp, FFN // tp
    rows, cols = slice(rank * s, (rank + 1) * s), slice(rank * f, (rank + 1) * f)
    ref = torch.relu(x.float() @ w1.float().t()) @ w2.float().t()
    shards = (x[rows].contiguous(), w1[cols].contiguous(), w2[:, cols].contiguous())
    return shards, ref[rows]


def test_switch(dev) -> None:
    from torch._dynamo.utils import counters

    rank, tp = dist.get_rank(), dist.get_world_size()
    group_name = dist.group.WORLD.group_name
    with warnings.catch_warnings():  # deprecated in newer torch, still what the pass checks
        warnings.simplefilter("ignore", FutureWarning)
        torch_symm_mem.enable_symm_mem_for_group(group_name)
    (x_shard, w1, w2), ref = _shards(dev, rank, tp)
    torch._dynamo.reset()
    counters.clear()
    with torch._inductor.config.patch(_micro_pipeline_tp=True), torch.no_grad():
        compiled = torch.compile(sequence_parallel_mlp, fullgraph=True)
        async_tp.install()
        before = async_tp.routing_stats()
        on = compiled(x_shard, w1, w2, group_name)
        torch.cuda.synchronize()
        routed_on = routed(before, async_tp.routing_stats())
        breaks = sum(counters["graph_break"].values())
        want = {name: [1 if name in FUSED else 0, {}] for name in routed_on}
        err_on = rel_err(on, ref)
        record(
            "async_tp/switch_on",
            routed_on == want
            and breaks == 0
            and err_on <= TOLERANCE
            and list(on.shape) == [SEQ // tp, BATCH, HIDDEN],
            routed=routed_on,
            graph_breaks=breaks,
            rel_err_vs_fp32=err_on,
            shape=list(on.shape),
        )
        async_tp.uninstall()
        shared = left_out_when_shared("async_tp/switch_off", NEEDS_ONE_GPU_PER_RANK)
        if left_out_when_shared("async_tp/eager_fallback", NEEDS_ONE_GPU_PER_RANK) or shared:
            return
        before = async_tp.routing_stats()
        off = compiled(x_shard, w1, w2, group_name)
        torch.cuda.synchronize()
        routed_off = routed(before, async_tp.routing_stats())
        err_off, err_on_off = rel_err(off, ref), rel_err(on, off)
        record(
            "async_tp/switch_off",
            all(v == [0, {}] for v in routed_off.values())
            and err_off <= TOLERANCE
            and err_on_off <= TOLERANCE,
            routed=routed_off,
            rel_err_vs_fp32=err_off,
            rel_err_on_vs_off=err_on_off,
        )
    test_eager_fallback(dev, rank, tp, group_name)


def test_eager_fallback(dev, rank: int, tp: int, group_name: str) -> None:
    """An fp32 call (distgemm does not take it) reaches torch's CUDA kernel through the router."""
    g = torch.Generator(device=dev).manual_seed(1)
    A = torch.randn(2, 64 * tp, 128, device=dev, generator=g)
    B = torch.randn(128, 64, device=dev, generator=g)
    A_shard = A[:, rank * 64 : (rank + 1) * 64].contiguous()
    reason = "dtypes ['torch.float32']: distgemm takes one dtype, bf16 or fp16"
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    async_tp.install()
    try:
        before = async_tp.routing_stats()
        A_out, (C,) = torch.ops.symm_mem.fused_all_gather_matmul(A_shard, [B], 1, group_name)
        torch.cuda.synchronize()
        got = routed(before, async_tp.routing_stats())["fused_all_gather_matmul"]
        want = A @ B
    finally:
        async_tp.uninstall()
        torch.backends.cuda.matmul.allow_tf32 = tf32
    record(
        "async_tp/eager_fallback",
        got == [0, {reason: 1}]
        and torch.equal(A_out, A)
        and torch.allclose(C, want, rtol=FP32_RTOL, atol=FP32_ATOL),
        routed=got,
        max_abs_diff=float((C - want).abs().max()),
    )


def main() -> None:
    worker_main(
        "async_tp_results.json",
        lambda dev, args: {"async_tp": lambda: test_switch(dev)},
        init_timeout_s=300.0,
    )


if __name__ == "__main__":
    main()
