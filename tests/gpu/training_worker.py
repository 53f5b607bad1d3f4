"""The training checks on GPUs, one process per GPU under torchrun: the CPU tests' workers
(tests/test_nn.py, test_custom_ops.py, test_torch_compat.py) with CUDA tensors, NCCL and
distgemm. Each rank writes its results to ``--out``/result<rank>.pt; tests/gpu/test_training.py
judges them with the CPU tests' checks.

    torchrun --nproc-per-node 2 tests/gpu/training_worker.py --out DIR
"""

import argparse
import os
import pathlib
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # tests/: the workers

from test_custom_ops import compile_worker  # noqa: E402
from test_nn import layers_worker  # noqa: E402
from test_torch_compat import compat_worker  # noqa: E402

# Tokens, hidden, ffn: every GEMM extent a multiple of 8 at TP = 2, 4 or 8, large enough for
# distgemm's pipelines (M/S rows per step).
SIZES = (1024, 1024, 2816)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=pathlib.Path)
    args = ap.parse_args()
    rank, tp = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    results = {
        "layers": layers_worker(rank, tp, ["bfloat16", "float16"], "cuda", SIZES),
        "compile aot_eager": compile_worker(rank, tp, "cuda", "bfloat16", SIZES),
        "compile inductor": compile_worker(rank, tp, "cuda", "bfloat16", SIZES, "inductor"),
        "compat": compat_worker(rank, tp, "cuda"),
    }
    torch.cuda.synchronize()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(results, args.out / f"result{rank}.pt")
    from distgemm.comm import close_all

    close_all()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
