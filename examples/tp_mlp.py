"""A tensor-parallel (and sequence-parallel) Llama MLP forward with distgemm, checked against the
same MLP computed on one GPU.

    torchrun --nproc-per-node 2 examples/tp_mlp.py [--tokens 4096 --hidden 4096 --ffn 11008]

Per rank (TP ranks): the activations arrive sharded on tokens, x_shard [T/TP, H]; the gate and up
projections are column-parallel (this rank's F/TP rows of each, stacked into one [2F/TP, H]
weight, so one all_gather_gemm does both); the down projection is row-parallel (its [H, F/TP]
columns) and its reduce-scatter hands back token-sharded activations [T/TP, H] for the next layer.
The all-gather of x and the reduce-scatter of the output run under the GEMMs.

Exit code 0 when the relative Frobenius error against the single-GPU computation (fp32) is below
1e-2 on every rank. It needs torchrun (one process per GPU), CUDA GPUs and distgemm's CUDA
runtime; without one of them it says how to run it, in one line, and exits 2.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

from distgemm import _core
from distgemm.ops import all_gather_gemm, gemm_reduce_scatter
from distgemm.runtime.communicator import close_all

RUN = "torchrun --nproc-per-node 2 examples/tp_mlp.py"


def why_not_runnable() -> str | None:
    """What this process lacks to run the example (None: nothing)."""
    if "RANK" not in os.environ or "LOCAL_RANK" not in os.environ:
        return f"runs one process per GPU under torchrun: {RUN}"
    if not torch.cuda.is_available():
        return f"needs CUDA GPUs, one per rank; torch sees none (run `{RUN}` on a GPU machine)"
    local, gpus = int(os.environ["LOCAL_RANK"]), torch.cuda.device_count()
    if local >= gpus:
        return f"rank {local} needs GPU {local}; this machine has {gpus} (--nproc-per-node {gpus})"
    if not _core.cuda_runtime:
        return (
            f"distgemm was built without the CUDA runtime ({_core.cuda_runtime_reason}): "
            "reinstall it with DISTGEMM_CUDA=ON bash scripts/install.sh"
        )
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", type=int, default=4096, help="T, tokens (default 4096)")
    ap.add_argument("--hidden", type=int, default=4096, help="H, hidden size (default 4096)")
    ap.add_argument("--ffn", type=int, default=11008, help="F, MLP width (default 11008)")
    args = ap.parse_args()
    why = why_not_runnable()
    if why is None and min(args.tokens, args.hidden, args.ffn) < 1:
        sizes = f"--tokens {args.tokens} --hidden {args.hidden} --ffn {args.ffn}"
        why = f"sizes must be positive, got {sizes}"
    if why is not None:
        if os.environ.get("RANK", "0") == "0":  # one line, not one per rank
            print(f"tp_mlp.py: {why}", file=sys.stderr)
        raise SystemExit(2)
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    tp = dist.get_world_size()
    T, H, Fd = args.tokens, args.hidden, args.ffn
    dt = torch.bfloat16

    # The full model and input, identical on every rank (same seed); each rank keeps its shards.
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(T, H, device=dev, generator=g).to(dt)
    w_gate = (torch.randn(Fd, H, device=dev, generator=g) / H**0.5).to(dt)
    w_up = (torch.randn(Fd, H, device=dev, generator=g) / H**0.5).to(dt)
    w_down = (torch.randn(H, Fd, device=dev, generator=g) / Fd**0.5).to(dt)
    f = Fd // tp
    rows = slice(rank * f, (rank + 1) * f)
    x_shard = x[rank * T // tp : (rank + 1) * T // tp].contiguous()  # [T/TP, H]
    w_gate_up = torch.cat([w_gate[rows], w_up[rows]]).contiguous()  # [2F/TP, H]
    w_down_shard = w_down[:, rows].contiguous()  # [H, F/TP]

    # The tensor-parallel forward: two distgemm calls.
    gate_up = all_gather_gemm(x_shard, w_gate_up)  # [T, 2F/TP]
    gate, up = gate_up[:, :f], gate_up[:, f:]
    h = (F.silu(gate.float()) * up.float()).to(dt)  # [T, F/TP]
    y_shard = gemm_reduce_scatter(h, w_down_shard)  # [T/TP, H]

    # The same MLP on this one GPU, in fp32.
    xf = x.float()
    ref = (F.silu(xf @ w_gate.float().t()) * (xf @ w_up.float().t())) @ w_down.float().t()
    ref_shard = ref[rank * T // tp : (rank + 1) * T // tp]
    err = float((y_shard.float() - ref_shard).norm() / ref_shard.norm())
    errs = [None] * tp
    dist.all_gather_object(errs, err)
    if rank == 0:
        print(
            f"tp_mlp: T={T} H={H} F={Fd} TP={tp} bf16; relative error vs one GPU (fp32) per "
            f"rank: {', '.join(f'{e:.2e}' for e in errs)}"
        )
    close_all()  # distgemm's workspaces (collective), before the process group goes
    dist.destroy_process_group()
    raise SystemExit(0 if max(errs) < 1e-2 else 1)


if __name__ == "__main__":
    main()
