// Dtype and kernel dispatch and the boundary checks of the fused GEMM + all-reduce
// (kernel/fused_allreduce.hpp). The instantiations live in fused_decode_<dtype>.cu (the decode
// kernel) and fused_<dtype>_t<token tile>.cu (the CUTLASS kernel).
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "distgemm/kernel/fused_allreduce.hpp"

namespace distgemm::kernel {

namespace detail {
#define DISTGEMM_DECLARE_FUSED_ENTRY_POINTS(SUFFIX)                                    \
  std::string fused_can_implement_##SUFFIX(const FusedAllReduceDesc& f);               \
  void fused_launch_##SUFFIX(const FusedAllReduceDesc& f, int device, cudaStream_t s); \
  int fused_resident_##SUFFIX(int64_t m, int device);
DISTGEMM_DECLARE_FUSED_ENTRY_POINTS(decode_bf16)
DISTGEMM_DECLARE_FUSED_ENTRY_POINTS(bf16_t64)
DISTGEMM_DECLARE_FUSED_ENTRY_POINTS(bf16_t96)
DISTGEMM_DECLARE_FUSED_ENTRY_POINTS(bf16_t128)
DISTGEMM_DECLARE_FUSED_ENTRY_POINTS(bf16_t192)
DISTGEMM_DECLARE_FUSED_ENTRY_POINTS(bf16_t256)
DISTGEMM_DECLARE_FUSED_ENTRY_POINTS(decode_fp16)
DISTGEMM_DECLARE_FUSED_ENTRY_POINTS(fp16_t64)
DISTGEMM_DECLARE_FUSED_ENTRY_POINTS(fp16_t96)
DISTGEMM_DECLARE_FUSED_ENTRY_POINTS(fp16_t128)
DISTGEMM_DECLARE_FUSED_ENTRY_POINTS(fp16_t192)
DISTGEMM_DECLARE_FUSED_ENTRY_POINTS(fp16_t256)
#undef DISTGEMM_DECLARE_FUSED_ENTRY_POINTS

struct FusedKernels {
  std::string (*can_implement)(const FusedAllReduceDesc&);
  void (*launch)(const FusedAllReduceDesc&, int, cudaStream_t);
  int (*resident)(int64_t, int);
};

#define DISTGEMM_FUSED_KERNELS(SUFFIX) \
  FusedKernels { fused_can_implement_##SUFFIX, fused_launch_##SUFFIX, fused_resident_##SUFFIX }

FusedKernels fused_kernels(DType dtype, int64_t m) {
  const bool bf16 = dtype == DType::BF16;
  if (fused_kernel(m) == FusedKernel::Decode)
    return bf16 ? DISTGEMM_FUSED_KERNELS(decode_bf16) : DISTGEMM_FUSED_KERNELS(decode_fp16);
  switch (fused_token_tile(m)) {
    case 64:
      return bf16 ? DISTGEMM_FUSED_KERNELS(bf16_t64) : DISTGEMM_FUSED_KERNELS(fp16_t64);
    case 96:
      return bf16 ? DISTGEMM_FUSED_KERNELS(bf16_t96) : DISTGEMM_FUSED_KERNELS(fp16_t96);
    case 128:
      return bf16 ? DISTGEMM_FUSED_KERNELS(bf16_t128) : DISTGEMM_FUSED_KERNELS(fp16_t128);
    case 192:
      return bf16 ? DISTGEMM_FUSED_KERNELS(bf16_t192) : DISTGEMM_FUSED_KERNELS(fp16_t192);
    case 256:
      return bf16 ? DISTGEMM_FUSED_KERNELS(bf16_t256) : DISTGEMM_FUSED_KERNELS(fp16_t256);
  }
  throw std::logic_error("internal: no fused kernel of token tile " +
                         std::to_string(fused_token_tile(m)) + " (m=" + std::to_string(m) + ")");
}
#undef DISTGEMM_FUSED_KERNELS
}  // namespace detail

namespace {

std::string aligned(const char* name, const void* p, int64_t ld) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
    return std::string(name) + ": address is not 16-byte aligned";
  if (ld % 8 != 0)
    return std::string(name) + ": row stride " + std::to_string(ld) +
           " elements is not a multiple of 8 (16 bytes)";
  return "";
}

}  // namespace

std::string fused_allreduce_can_implement(const FusedAllReduceDesc& f) {
  std::string e = fused_shape_problem(f.m, f.n, f.k, f.splits, f.tp);
  if (!e.empty()) return e;
  if (f.rank < 0 || f.rank >= f.tp)
    return "rank=" + std::to_string(f.rank) + " is not in 0.." + std::to_string(f.tp - 1);
  if (!f.a || !f.w || !f.out) return "internal: fused GEMM without a, w or out pointer";
  for (int q = 0; q < f.tp; ++q)
    if (!f.partial[q] || !f.control[q])
      return "internal: no partial buffer or control region of rank " + std::to_string(q);
  if (!f.abort || !f.record) return "internal: fused GEMM without an error sink";
  if (f.lda < f.k || f.ldw < f.k || f.ldo < f.n || (f.c && f.ldc < f.n))
    return "row strides lda=" + std::to_string(f.lda) + " ldw=" + std::to_string(f.ldw) +
           " ldo=" + std::to_string(f.ldo) +
           " must be at least the row lengths (k=" + std::to_string(f.k) +
           ", n=" + std::to_string(f.n) + ")";
  if (!(e = aligned("a", f.a, f.lda)).empty()) return e;
  if (!(e = aligned("w", f.w, f.ldw)).empty()) return e;
  if (!(e = aligned("out", f.out, f.ldo)).empty()) return e;
  if (f.c && !(e = aligned("c", f.c, f.ldc)).empty()) return e;
  if (f.bias && !(e = aligned("bias", f.bias, 0)).empty()) return e;
  for (int q = 0; q < f.tp; ++q)
    if (!(e = aligned("partial buffer", f.partial[q], 0)).empty()) return e;
  return detail::fused_kernels(f.dtype, f.m).can_implement(f);
}

int fused_allreduce_resident_ctas(DType dtype, int64_t m, int device) {
  return detail::fused_kernels(dtype, m).resident(m, device);
}

void fused_allreduce_launch(const FusedAllReduceDesc& f, int device, cudaStream_t stream) {
  const std::string why = fused_allreduce_can_implement(f);
  if (!why.empty()) throw std::invalid_argument("fused GEMM + all-reduce rejected: " + why);
  detail::fused_kernels(f.dtype, f.m).launch(f, device, stream);
}

}  // namespace distgemm::kernel
