// Dtype and tile dispatch and shape checks of the GEMM, and the two single-block runtime kernels
// (entry barrier, wait before a copy). The CUTLASS instantiations live in
// gemm_<dtype>_n<tile>[_bn].cu, one kernel per translation unit.
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "distgemm/device/check.hpp"
#include "distgemm/kernel/gemm.hpp"
#include "distgemm/kernel/gemm_extents.hpp"
#include "distgemm/kernel/leading_barrier.cuh"
#include "distgemm/kernel/tile_choice.hpp"

namespace distgemm::kernel {

namespace detail {
// One set per kernel (gemm_<dtype>_n<tile>[_bn].cu; _bn: B N-contiguous).
#define DISTGEMM_DECLARE_GEMM_ENTRY_POINTS(SUFFIX)                                        \
  std::string can_implement_##SUFFIX(const GemmDesc& g);                                  \
  void launch_##SUFFIX(const GemmDesc& g, const WaitSpec& w, int device, cudaStream_t s); \
  int prepare_##SUFFIX(int device);
DISTGEMM_DECLARE_GEMM_ENTRY_POINTS(bf16_n256)
DISTGEMM_DECLARE_GEMM_ENTRY_POINTS(bf16_n128)
DISTGEMM_DECLARE_GEMM_ENTRY_POINTS(fp16_n256)
DISTGEMM_DECLARE_GEMM_ENTRY_POINTS(fp16_n128)
DISTGEMM_DECLARE_GEMM_ENTRY_POINTS(bf16_n256_bn)
DISTGEMM_DECLARE_GEMM_ENTRY_POINTS(fp16_n256_bn)
#undef DISTGEMM_DECLARE_GEMM_ENTRY_POINTS

struct Kernels {
  std::string (*can_implement)(const GemmDesc&);
  void (*launch)(const GemmDesc&, const WaitSpec&, int, cudaStream_t);
  int (*prepare)(int);
};

// b_n_major has the 128x256 tile only (gemm_can_implement refuses a forced 128 with it).
Kernels kernels(DType dtype, int tile_n, bool b_n_major = false) {
  if (b_n_major)
    return dtype == DType::BF16
               ? Kernels{can_implement_bf16_n256_bn, launch_bf16_n256_bn, prepare_bf16_n256_bn}
               : Kernels{can_implement_fp16_n256_bn, launch_fp16_n256_bn, prepare_fp16_n256_bn};
  if (dtype == DType::BF16)
    return tile_n == 128 ? Kernels{can_implement_bf16_n128, launch_bf16_n128, prepare_bf16_n128}
                         : Kernels{can_implement_bf16_n256, launch_bf16_n256, prepare_bf16_n256};
  return tile_n == 128 ? Kernels{can_implement_fp16_n128, launch_fp16_n128, prepare_fp16_n128}
                       : Kernels{can_implement_fp16_n256, launch_fp16_n256, prepare_fp16_n256};
}
}  // namespace detail

namespace {

std::string s(int64_t v) { return std::to_string(v); }

// TMA reads and writes each operand through a tensor map: the base address must be 16-byte
// aligned and every stride but the contiguous one a multiple of 16 bytes.
std::string check_operand(const char* name, const void* p, int64_t ld, int64_t batch, int64_t l,
                          int eb, bool row_vector = false) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  if (addr % 16 != 0)
    return std::string("operand ") + name + ": address " + s(static_cast<int64_t>(addr)) +
           " is not 16-byte aligned (TMA requires it): start the tensor and every shard or tile "
           "offset on a multiple of " +
           s(16 / eb) + " elements";
  if (row_vector) return "";
  if ((ld * eb) % 16 != 0)
    return std::string("operand ") + name + ": row stride " + s(ld) + " elements (" + s(ld * eb) +
           " bytes) is not a multiple of 16 bytes (TMA requires it): make the contiguous "
           "extent a multiple of " +
           s(16 / eb) + " elements (e.g. " + s(ld) + " -> " +
           s((ld + 16 / eb - 1) / (16 / eb) * (16 / eb)) + ")";
  if (l > 1 && (batch * eb) % 16 != 0)
    return std::string("operand ") + name + ": batch stride " + s(batch) +
           " elements is not a multiple of 16 bytes (TMA requires it)";
  return "";
}

}  // namespace

std::string gemm_can_implement(const GemmDesc& g) {
  const int eb = dtype_bytes(g.dtype);
  std::string e = gemm_extent_problem(g.m, g.n, g.k, g.l, eb);
  if (!e.empty()) return e;
  if (!g.a || !g.b || !g.d) return "internal: GEMM without A, B or D pointer";
  if (!(e = check_operand("A", g.a, g.lda, g.batch_a, g.l, eb)).empty()) return e;
  if (!(e = check_operand("B", g.b, g.ldb, g.batch_b, g.l, eb)).empty()) return e;
  if (!(e = check_operand("D", g.d, g.ldd, g.batch_d, g.l, eb)).empty()) return e;
  if (g.partial &&
      !(e = check_operand("partial C", g.partial, g.ld_partial, g.batch_partial, g.l, eb)).empty())
    return e;
  if (g.user_c && !(e = check_operand("C", g.user_c, g.ldc, g.batch_c, g.l, eb)).empty()) return e;
  if (g.bias && !(e = check_operand("bias", g.bias, 0, 0, 1, eb, true)).empty()) return e;
  if (!(e = tile_n_problem(g.tile_n)).empty()) return e;
  if (g.b_n_major && g.tile_n == 128)
    return "tile_n=128 has no kernel for an N-contiguous B (a transposed weight view): use "
           "tile_n=0 or 256, or pass the weight K-contiguous";
  // Both tiles take the same shapes (TMA alignment); ask the kernel a forced tile names.
  return detail::kernels(g.dtype, g.tile_n, g.b_n_major).can_implement(g);
}

int gemm_resident_ctas(DType dtype, int tile_n, int device) {
  if (tile_n != 128 && tile_n != 256)
    throw std::invalid_argument("gemm_resident_ctas: tile_n=" + std::to_string(tile_n) +
                                " is not 128 or 256");
  // prepare_* is set up once per device and cached: a table lookup after the first call.
  return detail::kernels(dtype, tile_n).prepare(device);
}

int gemm_tile_n(const GemmDesc& g, int device) {
  if (g.tile_n != 0) return g.tile_n;
  if (g.b_n_major) return 256;  // the one tile with that B layout
  return choose_tile_n(g.m, g.n, g.l, gemm_resident_ctas(g.dtype, 256, device),
                       gemm_resident_ctas(g.dtype, 128, device));
}

void gemm_launch(const GemmDesc& g, const WaitSpec& wait, int device, cudaStream_t stream) {
  const std::string why = gemm_can_implement(g);
  if (!why.empty()) throw std::invalid_argument("GEMM rejected before launch: " + why);
  detail::kernels(g.dtype, gemm_tile_n(g, device), g.b_n_major).launch(g, wait, device, stream);
}

void gemm_prepare(DType dtype, int device) {
  (void)detail::kernels(dtype, 256).prepare(device);
  (void)detail::kernels(dtype, 128).prepare(device);
  (void)detail::kernels(dtype, 256, true).prepare(device);
}

// Entry barrier of a launch: bump this device's generation, publish it into every device's
// barrier slot `device`, then wait until every device has published it here. One thread.
__global__ void entry_barrier_kernel(const EntryBarrierSpec s) {
  if (threadIdx.x != 0) return;
  if (aborted(s.abort)) return;
  const uint32_t gen = *reinterpret_cast<volatile uint32_t*>(s.epoch) + 1u;
  *reinterpret_cast<volatile uint32_t*>(s.epoch) = gen;  // read by this graph's later nodes
  for (int r = 0; r < s.tp; ++r) st_release_sys(s.peer_barrier[r] + s.device, gen);
  uint64_t start = 0;
  for (int r = 0; r < s.tp; ++r) {
    uint32_t v = ld_acquire_sys(s.local_barrier + r);
    while (!reached(v, gen)) {
      if (aborted(s.abort)) return;
      const uint64_t now = global_timer_ns();
      if (start == 0) {
        start = now;
      } else if (now - start > s.timeout_ns) {
        report_timeout(s.abort, s.record, kWaitEntryBarrier, s.device, -1, r, gen, v, s.timeout_ns);
        return;
      }
      __nanosleep(64);
      v = ld_acquire_sys(s.local_barrier + r);
    }
  }
}

// Wait before a copy-engine transfer (only gemm_allreduce's local copies of pushed tiles need one).
// One thread; it never blocks a GEMM's progress (GEMMs never depend on the copy branch), see
// device/graph.hpp.
__global__ void copy_wait_kernel(const WaitSpec w) {
  if (threadIdx.x == 0) (void)wait_flags(w);
}

void entry_barrier_launch(const EntryBarrierSpec& spec, cudaStream_t stream) {
  entry_barrier_kernel<<<1, 32, 0, stream>>>(spec);
  DISTGEMM_CUDA_CHECK(cudaGetLastError());
}

void copy_wait_launch(const WaitSpec& wait, cudaStream_t stream) {
  copy_wait_kernel<<<1, 32, 0, stream>>>(wait);
  DISTGEMM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace distgemm::kernel
