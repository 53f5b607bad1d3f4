// The fused GEMM + all-reduce kernel behind fused_allreduce.hpp. Included only by the
// translation units in cpp/src/runtime/ that instantiate it (one per dtype and token tile).
//
// Kernel: CUTLASS's SM90 TMA warp-specialized cooperative GEMM, swapped (D^T = W X^T: the
// weight [n, k] is CUTLASS's A, the tokens [m, k] its B, the partial [m, n] row-major its
// column-major D), tile 128 x TokenTile x 64, no cluster (a cluster pairs tiles along a side
// that decode shapes do not have), plain epilogue D = alpha * acc (no C). K is split into
// `splits` batches (batch strides of k/splits elements), each writing its own partial.
//
// After the GEMM the two consumer warpgroups of each CTA (the producer warpgroup has given its
// registers back and leaves):
//   1. complete their TMA stores (cp.async.bulk.wait_group 0, then a proxy fence: the stores
//      went through the async proxy, the flag is a generic release);
//   2. one thread releases the CTA's tiles: flag[rank][tile] = generation on every rank;
//   3. for each of its tiles (n block, token block, split s): wait until every rank's flags of
//      all splits of that (n block, token block) reached the generation, then sum slice s of its
//      rows over ranks and splits in a fixed order (rank 0.., split 0..: the same bits on every
//      rank), add beta * c and bias in fp32, and store to out;
//   4. the last CTA to finish advances the generation (the next launch of the stream reads it).
// Every wait is bounded; a timeout sets the abort word and the error record, and the CTA skips
// the rest of its work.
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <stdexcept>
#include <string>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "distgemm/device/check.hpp"
#include "distgemm/kernel/fused_allreduce.hpp"
#include "distgemm/kernel/leading_barrier.cuh"

namespace distgemm::kernel::sm90 {

using namespace cute;

template <class Element, int TokenTile>
struct FusedConfig {
  using TileShape = Shape<Int<kFusedTileN>, Int<TokenTile>, _64>;
  using ClusterShape = Shape<_1, _1, _1>;
  static constexpr int kAlign = 128 / cutlass::sizeof_bits<Element>::value;
  using LayoutA = cutlass::layout::RowMajor;     // the weight [n, k]
  using LayoutB = cutlass::layout::ColumnMajor;  // the tokens [m, k], K contiguous
  using LayoutD = cutlass::layout::ColumnMajor;  // D^T [n, m] column-major = partial [m, n]
  using Fusion = cutlass::epilogue::fusion::LinearCombination<Element, float, void, float>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlign, Element,
      LayoutD, kAlign, cutlass::epilogue::TmaWarpSpecializedCooperative, Fusion>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlign, Element,
      LayoutB, kAlign, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;

  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
};

// What the kernel needs besides CUTLASS's parameters: one set per launch.
struct FusedTail {
  const void* partial[kMaxDevices];  // every rank's partial buffers (parity 0, then 1)
  uint32_t* control[kMaxDevices];    // every rank's control region
  const void* bias;
  const void* c;
  void* out;
  uint32_t* abort;
  ErrorRecord* record;
  int64_t m, n, ldo, ldc;
  int64_t split_elems;   // m * n: one split's partial
  int64_t parity_elems;  // splits * m * n: one parity's buffers
  uint64_t timeout_ns;
  float beta;
  int tp, rank, splits, n_blocks, token_blocks;
};

template <class GemmKernel>
struct FusedParams {
  typename GemmKernel::Params gemm[2];  // writing parity 0 / parity 1 partial buffers
};

// Tile (n block, token block, split) -> its flag within a rank's section.
__device__ __forceinline__ int fused_tile_index(const FusedTail& t, int nb, int tb, int s) {
  return (s * t.token_blocks + tb) * t.n_blocks + nb;
}

__device__ __forceinline__ void consumers_sync() {
  // Named barrier of the two consumer warpgroups only (the producer warpgroup has left).
  asm volatile(
      "bar.sync %0, %1;" ::"r"(int(cutlass::arch::ReservedNamedBarriers::FirstUserBarrier)),
      "r"(256)
      : "memory");
}

__device__ __forceinline__ uint4 ld_volatile_v4(const void* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// One thread: wait until every rank's flags of every split of tile (nb, tb) reach `gen`.
__device__ inline bool wait_tile(const FusedTail& t, int nb, int tb, uint32_t gen) {
  const uint32_t* local = t.control[t.rank] + kFusedHeaderBytes / 4;
  uint64_t start = 0;
  for (int q = 0; q < t.tp; ++q) {
    for (int s = 0; s < t.splits; ++s) {
      const int idx = fused_tile_index(t, nb, tb, s);
      const uint32_t* f = local + q * kFusedMaxTiles + idx;
      uint32_t v = ld_acquire_sys(f);
      while (!reached(v, gen)) {
        if (aborted(t.abort)) return false;
        const uint64_t now = global_timer_ns();
        if (start == 0) {
          start = now;
        } else if (now - start > t.timeout_ns) {
          report_timeout(t.abort, t.record, kWaitFusedTile, t.rank, idx, q, gen, v, t.timeout_ns);
          return false;
        }
        __nanosleep(20);
        v = ld_acquire_sys(f);
      }
    }
  }
  return true;
}

// Consumer threads (tid 0..255): slice `s` of tile (nb, tb)'s rows x columns, summed over every
// rank and split. Each thread keeps kLoads 16-byte loads in flight (peers' are NVLink reads).
template <class Element, int TokenTile>
__device__ inline void reduce_slice(const FusedTail& t, int nb, int tb, int s, uint32_t parity,
                                    int tid) {
  constexpr int kLoads = 16;
  constexpr int kThreads = 256;
  const int64_t row0 = int64_t(tb) * TokenTile, col0 = int64_t(nb) * kFusedTileN;
  const int64_t rows = t.m - row0 < TokenTile ? t.m - row0 : TokenTile;
  const int64_t vec_per_row = (t.n - col0 < kFusedTileN ? t.n - col0 : kFusedTileN) / 8;
  const int64_t total = rows * vec_per_row;
  const int64_t begin = total * s / t.splits, end = total * (s + 1) / t.splits;
  const int srcs = t.tp * t.splits;
  const int per = srcs >= kLoads ? 1 : kLoads / srcs;  // vectors per thread per round
  for (int64_t base = begin + int64_t(tid) * per; base < end; base += int64_t(kThreads) * per) {
    for (int g0 = 0; g0 < srcs; g0 += kLoads) {
      // Loads first (all in flight), then the sums in the fixed (rank, split) order.
      uint4 x[kLoads];
#pragma unroll
      for (int i = 0; i < kLoads; ++i) {
        const int u = srcs >= kLoads ? 0 : i / srcs;
        const int src = srcs >= kLoads ? g0 + i : i - u * srcs;
        const int64_t v = base + u;
        if (u < per && src < srcs && v < end) {
          const int q = src / t.splits, sp = src - q * t.splits;
          const int64_t off = int64_t(parity) * t.parity_elems + sp * t.split_elems +
                              (row0 + v / vec_per_row) * t.n + col0 + (v % vec_per_row) * 8;
          x[i] = ld_volatile_v4(static_cast<const Element*>(t.partial[q]) + off);
        }
      }
      float acc[8];
#pragma unroll
      for (int i = 0; i < kLoads; ++i) {
        const int u = srcs >= kLoads ? 0 : i / srcs;
        const int src = srcs >= kLoads ? g0 + i : i - u * srcs;
        const int64_t v = base + u;
        if (!(u < per && src < srcs && v < end)) continue;
        if (src == 0) {
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[e] = 0.f;
        }
        const Element* xe = reinterpret_cast<const Element*>(&x[i]);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] += float(xe[e]);
        if (src == srcs - 1) {
          const int64_t row = row0 + v / vec_per_row, col = col0 + (v % vec_per_row) * 8;
          if (t.c) {
            const uint4 cv = *reinterpret_cast<const uint4*>(static_cast<const Element*>(t.c) +
                                                             row * t.ldc + col);
            const Element* ce = reinterpret_cast<const Element*>(&cv);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[e] += t.beta * float(ce[e]);
          }
          if (t.bias) {
            const uint4 bv =
                *reinterpret_cast<const uint4*>(static_cast<const Element*>(t.bias) + col);
            const Element* be = reinterpret_cast<const Element*>(&bv);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[e] += float(be[e]);
          }
          uint4 ov;
          Element* oe = reinterpret_cast<Element*>(&ov);
#pragma unroll
          for (int e = 0; e < 8; ++e) oe[e] = Element(acc[e]);
          *reinterpret_cast<uint4*>(static_cast<Element*>(t.out) + row * t.ldo + col) = ov;
        }
      }
    }
  }
}

template <class GemmKernel, class Element, int TokenTile>
__global__ void __launch_bounds__(GemmKernel::MaxThreadsPerBlock,
                                  GemmKernel::MinBlocksPerMultiprocessor)
    fused_allreduce_kernel(CUTLASS_GRID_CONSTANT FusedParams<GemmKernel> const p,
                           CUTLASS_GRID_CONSTANT FusedTail const t) {
  extern __shared__ char smem[];
  static_assert(GemmKernel::MaxThreadsPerBlock == 384, "one producer + two consumer warpgroups");
  if (aborted(t.abort)) return;  // a previous launch timed out: the communicator is broken
  uint32_t* word = reinterpret_cast<uint32_t*>(smem);
  uint32_t* control = t.control[t.rank];
  if (threadIdx.x == 0) *word = *reinterpret_cast<volatile uint32_t*>(control) + 1u;
  __syncthreads();
  const uint32_t gen = *word;
  __syncthreads();  // read before the GEMM reuses shared memory
  const uint32_t parity = gen & 1u;
  {
    GemmKernel op;
    op(p.gemm[parity], smem);
  }
  if (threadIdx.x < 128) return;  // the producer warpgroup (registers given back: no more work)
  const int tid = threadIdx.x - 128;
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  asm volatile("fence.proxy.async.global;" ::: "memory");
  consumers_sync();

  using Scheduler = typename GemmKernel::TileScheduler;
  using Cluster = Shape<_1, _1, _1>;  // FusedConfig::ClusterShape
  auto in_problem = [&](const auto& w) {
    return int(w.M_idx) < t.n_blocks && int(w.N_idx) < t.token_blocks && int(w.L_idx) < t.splits;
  };
  if (tid == 0) {
    __threadfence_system();
    Scheduler sched{p.gemm[parity].scheduler};
    auto w = sched.initial_work_tile_info(Cluster{});
    while (w.is_valid()) {
      if (in_problem(w)) {
        const int idx = fused_tile_index(t, int(w.M_idx), int(w.N_idx), int(w.L_idx));
        for (int q = 0; q < t.tp; ++q)
          st_release_sys(t.control[q] + kFusedHeaderBytes / 4 + t.rank * kFusedMaxTiles + idx, gen);
      }
      auto next = sched.fetch_next_work(w);
      w = cute::get<0>(next);
    }
  }

  Scheduler sched{p.gemm[parity].scheduler};
  auto w = sched.initial_work_tile_info(Cluster{});
  while (w.is_valid()) {
    if (in_problem(w)) {
      if (tid == 0) *word = wait_tile(t, int(w.M_idx), int(w.N_idx), gen) ? 1u : 0u;
      consumers_sync();
      const bool ok = *word != 0u;
      consumers_sync();  // every thread has read `word` before it is rewritten
      if (!ok) break;
      reduce_slice<Element, TokenTile>(t, int(w.M_idx), int(w.N_idx), int(w.L_idx), parity, tid);
    }
    auto next = sched.fetch_next_work(w);
    w = cute::get<0>(next);
  }

  consumers_sync();
  if (tid == 0) {
    __threadfence();
    const uint32_t ctas = gridDim.x * gridDim.y * gridDim.z;
    if (atomicAdd(control + 1, 1u) == ctas - 1u) {
      *reinterpret_cast<volatile uint32_t*>(control + 1) = 0u;
      __threadfence();
      *reinterpret_cast<volatile uint32_t*>(control) = gen;
    }
  }
}

template <class Element, int TokenTile>
struct FusedRunner {
  using Cfg = FusedConfig<Element, TokenTile>;
  using Kernel = typename Cfg::Kernel;
  using Arguments = typename Kernel::Arguments;

  static auto kernel_fn() { return fused_allreduce_kernel<Kernel, Element, TokenTile>; }
  static int smem_bytes() { return static_cast<int>(Kernel::SharedStorageSize); }

  static Arguments make_arguments(const FusedAllReduceDesc& f, void* partial, int sm_count) {
    using E = Element;
    const int64_t kpart = f.k / f.splits;
    typename Kernel::EpilogueArguments epi{};
    epi.thread.alpha = f.alpha;
    epi.thread.beta = 0.0f;
    epi.ptr_C = nullptr;
    epi.dC = cute::make_stride(cute::Int<1>{}, f.n, f.m * f.n);
    epi.ptr_D = static_cast<E*>(partial);
    epi.dD = cute::make_stride(cute::Int<1>{}, f.n, f.m * f.n);
    cutlass::KernelHardwareInfo hw;
    hw.sm_count = sm_count;
    typename Kernel::TileSchedulerArguments sched{};
    sched.max_swizzle_size = 1;
    // Token blocks of one weight slice side by side: they share the slice through L2.
    sched.raster_order = cutlass::gemm::kernel::detail::RasterOrderOptions::AlongN;
    return Arguments{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {static_cast<int>(f.n), static_cast<int>(f.m), static_cast<int>(kpart), f.splits},
        {static_cast<E const*>(f.w), cute::make_stride(f.ldw, cute::Int<1>{}, kpart),
         static_cast<E const*>(f.a), cute::make_stride(f.lda, cute::Int<1>{}, kpart)},
        epi,
        hw,
        sched};
  }

  static std::string can_implement(const FusedAllReduceDesc& f) {
    Arguments args = make_arguments(f, f.partial[f.rank], 1);
    if (!Kernel::can_implement(args))
      return "CUTLASS can_implement rejected the fused GEMM (m=" + std::to_string(f.m) +
             " n=" + std::to_string(f.n) + " k=" + std::to_string(f.k) +
             " splits=" + std::to_string(f.splits) + ")";
    if (Kernel::get_workspace_size(args) != 0)
      return "internal: the fused GEMM kernel asks for a workspace";
    return "";
  }

  // Once per device: the kernel's shared-memory limit, the SM count and the resident CTAs.
  static std::pair<int, int> prepare(int device) {
    static std::mutex mu;
    static int sms[64] = {}, resident[64] = {};
    std::lock_guard<std::mutex> lock(mu);
    if (device < 0 || device >= 64) throw std::runtime_error("device index out of range");
    if (sms[device] == 0) {
      int current = -1;
      DISTGEMM_CUDA_CHECK(cudaGetDevice(&current));
      DISTGEMM_CUDA_CHECK(cudaSetDevice(device));
      DISTGEMM_CUDA_CHECK(cudaFuncSetAttribute(
          kernel_fn(), cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes()));
      int per_sm = 0, count = 0;
      DISTGEMM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &per_sm, kernel_fn(), Kernel::MaxThreadsPerBlock, smem_bytes()));
      DISTGEMM_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
      DISTGEMM_CUDA_CHECK(cudaSetDevice(current));
      resident[device] = per_sm * count;
      sms[device] = count;
    }
    return {sms[device], resident[device]};
  }

  static void launch(const FusedAllReduceDesc& f, int device, cudaStream_t stream) {
    const auto [sm_count, resident] = prepare(device);
    FusedParams<Kernel> params;
    for (int parity = 0; parity < 2; ++parity) {
      void* part = static_cast<Element*>(f.partial[f.rank]) + parity * f.splits * f.m * f.n;
      Arguments args = make_arguments(f, part, sm_count);
      params.gemm[parity] = Kernel::to_underlying_arguments(args, nullptr);
    }
    FusedTail t{};
    for (int q = 0; q < f.tp; ++q) {
      t.partial[q] = f.partial[q];
      t.control[q] = f.control[q];
    }
    t.bias = f.bias;
    t.c = f.c;
    t.out = f.out;
    t.abort = f.abort;
    t.record = f.record;
    t.m = f.m;
    t.n = f.n;
    t.ldo = f.ldo;
    t.ldc = f.ldc;
    t.split_elems = f.m * f.n;
    t.parity_elems = f.splits * f.m * f.n;
    t.timeout_ns = f.timeout_ns;
    t.beta = f.beta;
    t.tp = f.tp;
    t.rank = f.rank;
    t.splits = f.splits;
    t.n_blocks = static_cast<int>((f.n + kFusedTileN - 1) / kFusedTileN);
    t.token_blocks = static_cast<int>((f.m + TokenTile - 1) / TokenTile);
    dim3 grid = Kernel::get_grid_shape(params.gemm[0]);
    const int64_t ctas = int64_t(grid.x) * grid.y * grid.z;
    if (ctas > resident)
      throw std::runtime_error("fused GEMM + all-reduce: grid of " + std::to_string(ctas) +
                               " CTAs exceeds the " + std::to_string(resident) +
                               " resident at once (its CTAs wait for each other)");
    fused_allreduce_kernel<Kernel, Element, TokenTile>
        <<<grid, Kernel::get_block_shape(), smem_bytes(), stream>>>(params, t);
    DISTGEMM_CUDA_CHECK(cudaGetLastError());
  }
};

}  // namespace distgemm::kernel::sm90

// One fused kernel's entry points (dtype x token tile).
#define DISTGEMM_DEFINE_FUSED_ENTRY_POINTS(SUFFIX, ELEMENT, TOKEN_TILE)                 \
  namespace distgemm::kernel::detail {                                                  \
  std::string fused_can_implement_##SUFFIX(const FusedAllReduceDesc& f) {               \
    return sm90::FusedRunner<ELEMENT, TOKEN_TILE>::can_implement(f);                    \
  }                                                                                     \
  void fused_launch_##SUFFIX(const FusedAllReduceDesc& f, int device, cudaStream_t s) { \
    sm90::FusedRunner<ELEMENT, TOKEN_TILE>::launch(f, device, s);                       \
  }                                                                                     \
  int fused_resident_##SUFFIX(int device) {                                             \
    return sm90::FusedRunner<ELEMENT, TOKEN_TILE>::prepare(device).second;              \
  }                                                                                     \
  }
