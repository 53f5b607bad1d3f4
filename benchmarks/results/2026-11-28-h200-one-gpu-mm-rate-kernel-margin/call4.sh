#!/usr/bin/env bash
# Session 19 call 5 (one GPU, fresh machine): the README's install, then the TP=8 shapes above
# 1.02x in call 3 again, with cuBLASLt's first 4 heuristic algorithms and the table's pick
# against torch.mm (A B A), and the kernels torch.mm and cuBLASLt rank 0 run there (profiler).
set -u
export OUT=${OUT:?}
S=$OUT/s; mkdir -p $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
pack() { (cd $OUT && tar czf a.tgz s); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader | tee $S/smi.txt
KERNEL_S=200 KERNEL_ARGS='--tp 8 --local-only --configs= --cublas-algos 4 --kernel-table shipped --models 70B --layers FC1 --tokens 4096,8192' OUT=$S \
  bash benchmarks/run_on_gpus.sh install kernel-vs-cublas > $S/parts.log 2>&1
grep "==" $S/parts.log
tail -8 $S/kernel-vs-cublas.log | cut -c1-220
python3 - > $S/kernels.txt 2>&1 <<'PY'
import torch
from torch.profiler import profile, ProfilerActivity
from distgemm import _core
a = (torch.rand(8192, 8192, device="cuda") * 2 - 1).bfloat16()
b = ((torch.rand(7168, 8192, device="cuda") * 2 - 1) / 8192**0.5).bfloat16()
out = torch.empty(8192, 7168, device="cuda", dtype=torch.bfloat16)
for name, fn in (("torch.mm", lambda: torch.mm(a, b.t(), out=out)),
                 ("cublaslt:0", lambda: _core.gemm(a.data_ptr(), b.data_ptr(), out.data_ptr(),
                     8192, 7168, 8192, dtype="bf16", cuda_device=0,
                     stream=torch.cuda.current_stream().cuda_stream, cublas_algo=0))):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn(); torch.cuda.synchronize()
    print(name, [e.name for e in p.events() if e.device_type.name == "CUDA"])
print(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction)
PY
cat $S/kernels.txt | cut -c1-400
pack; rm -rf $S; ls $OUT
