// The CUTLASS kernel of the fused GEMM + all-reduce (fused_allreduce.hpp: above the decode
// kernel's token limit). Included only by the translation units that instantiate it (one per
// dtype and token tile, generated from cpp/src/runtime/fused_instance.cu.in); its tail is
// fused_tail.cuh.
//
// Kernel: CUTLASS's SM90 TMA warp-specialized cooperative GEMM, swapped: partial^T [n, m] =
// alpha x weight [n, k] @ tokens [m, k]^T, stored column-major, i.e. the row-major partial
// [m, n] the tail reads. Tile kFusedTileN weight rows x TokenTile tokens x 64, no cluster, plain
// epilogue D = alpha * acc (no C). K is split into `splits` batches (batch strides of k/splits
// elements), each writing its own partial. Swapped, the tokens are the MMA's N side, which comes
// in steps of 8, so the token tile follows m (64, 96, 128, 192 or 256: fused_token_tile) and up
// to 256 tokens one token tile holds them all (fused_allreduce.hpp says why that matters).
//
// After the GEMM the two consumer warpgroups of each CTA (the producer warpgroup has given its
// registers back and leaves):
//   1. complete their TMA stores (cp.async.bulk.wait_group 0, then a proxy fence: the stores
//      went through the async proxy, the flag is a generic release);
//   2. one thread releases the CTA's tiles: flag[rank][tile] = generation on every rank;
//   3. for each of its tiles (n block, token block, split s): wait until every rank's flags of
//      all splits of that (n block, token block) reached the generation, then
//      - one-shot, or the two-shot slice's owner (fused_slice_owner): sum slice s of its rows
//        over ranks and splits in a fixed order (rank 0.., split 0..: the same bits on every
//        rank), add beta * c and bias in fp32, and store to out; the two-shot owner then
//        copies the finished slice from out into its sum buffer and (a CTA barrier, one
//        thread's system-scope fence) sets the slice's sum flag on every other rank;
//      - a two-shot non-owner: wait until the owner's sum flag of the slice reached the
//        generation, then copy the slice from the owner's sum buffer into out;
//   4. each CTA advances its generation word (fused_tail.cuh's fused_finish_cta).
// Every wait is bounded; a timeout sets the abort word and the error record, and the CTA skips
// the rest of its work.
//
// No wait can deadlock. Every CTA of the grid is resident at once (the launch refuses a larger
// grid), and each publishes the flags of all its tiles (step 2) before its first wait, after
// its GEMM, which waits for nothing outside the CTA: so every partial flag of a launch is set on
// every rank, and the waits of step 3 for them end. A two-shot owner's sum waits for nothing
// else, so it ends too; a non-owner's copy waits for that one owner's sum. A CTA takes its tiles
// in the order of the scheduler's walk (its linear index grows by the grid each round), which is
// the same order on every rank whatever the grid: by induction over that order, every rank's
// CTA gets past each slice, since the owner's CTA of the slice got past the earlier ones and
// then waits only for partial flags. The non-owner waits for the tile's partial flags before the
// sum flag though it does not read the partials: with a rank missing, every rank then names
// that rank (kWaitFusedTile), rather than an owner that gave up waiting for it (kWaitFusedSum).
#pragma once

#include <cuda_runtime.h>

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
#include "distgemm/kernel/fused_tail.cuh"

namespace distgemm::kernel::sm90 {

using namespace cute;

template <class Element, int TokenTile>
struct FusedConfig {
  // CUTLASS's M: the weight's rows (the output's columns); its N: the tokens.
  using TileShape = Shape<Int<kFusedTileN>, Int<TokenTile>, _64>;
  using ClusterShape = Shape<_1, _1, _1>;
  static constexpr int kAlign = 128 / cutlass::sizeof_bits<Element>::value;
  using LayoutA = cutlass::layout::RowMajor;     // the weight [n, k], K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // the tokens [m, k], K contiguous
  using LayoutD = cutlass::layout::ColumnMajor;  // partial^T [n, m]: the partial [m, n] row-major
  using Fusion = cutlass::epilogue::fusion::LinearCombination<Element, float, void, float>;

  static_assert(TokenTile % 16 == 0 && TokenTile <= 256, "the MMA's N: a multiple of 16 to 256");
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlign, Element,
      LayoutD, kAlign, EpilogueSchedule, Fusion>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlign, Element,
      LayoutB, kAlign, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
};

// 16-byte loads in flight per thread in the tail's sum (reduce_slice). The tail runs under the
// GEMM's register limit (168 at 384 threads): at 4 it spills nothing beyond the GEMM's own
// ptxas spills, at 8 it spills ~200 bytes more. 256 threads x 4 x 16 bytes in flight per SM.
inline constexpr int kTailLoads = 4;

template <class GemmKernel>
struct FusedParams {
  typename GemmKernel::Params gemm[2];  // writing parity 0 / parity 1 partial buffers
};

__device__ __forceinline__ void consumers_sync() {
  // Named barrier of the two consumer warpgroups only (the producer warpgroup has left).
  asm volatile(
      "bar.sync %0, %1;" ::"r"(int(cutlass::arch::ReservedNamedBarriers::FirstUserBarrier)),
      "r"(256)
      : "memory");
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
  if (threadIdx.x == 0) *word = fused_launch_generation(t);
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
  // A work tile's (n block, token block): CUTLASS's M and N indices (swapped).
  auto in_problem = [&](const auto& w) {
    return int(w.M_idx) < t.n_blocks && int(w.N_idx) < t.token_blocks && int(w.L_idx) < t.splits;
  };
  if (tid == 0) {
    // Every tile of this CTA is stored: one fence makes each flag store below a release of them.
    fence_acq_rel_sys();
    Scheduler sched{p.gemm[parity].scheduler};
    auto w = sched.initial_work_tile_info(Cluster{});
    while (w.is_valid()) {
      if (in_problem(w)) {
        publish_tile(t, fused_tile_index(t, int(w.M_idx), int(w.N_idx), int(w.L_idx)), gen);
      }
      auto next = sched.fetch_next_work(w);
      w = cute::get<0>(next);
    }
  }

  Scheduler sched{p.gemm[parity].scheduler};
  auto w = sched.initial_work_tile_info(Cluster{});
  while (w.is_valid()) {
    if (in_problem(w)) {
      const int nb = int(w.M_idx), tb = int(w.N_idx), s = int(w.L_idx);
      const int owner = fused_owner(t, nb, tb, s);
      if (tid == 0) {
        bool ok = wait_tile(t, nb, tb, gen);
        if (ok && owner != t.rank) ok = wait_sum(t, fused_tile_index(t, nb, tb, s), owner, gen);
        *word = ok ? 1u : 0u;
      }
      consumers_sync();
      const bool ok = *word != 0u;
      consumers_sync();  // every thread has read `word` before it is rewritten
      if (!ok) break;
      Element* out = static_cast<Element*>(t.out);
      if (owner == t.rank) {
        reduce_slice<Element, TokenTile, kTailLoads>(t, nb, tb, s, parity, tid);
        if (t.two_shot) {
          // The finished slice from out into this rank's sum buffer, then its sum flag.
          copy_slice<Element, TokenTile, kTailLoads>(
              t, nb, tb, s, out, t.ldo, fused_sum_buffer<Element>(t, t.rank, parity), t.n, tid);
          consumers_sync();  // every thread's stores of the slice precede the release
          if (tid == 0) publish_sum(t, fused_tile_index(t, nb, tb, s), gen);
        }
      } else {
        copy_slice<Element, TokenTile, kTailLoads>(
            t, nb, tb, s, fused_sum_buffer<Element>(t, owner, parity), t.n, out, t.ldo, tid);
      }
    }
    auto next = sched.fetch_next_work(w);
    w = cute::get<0>(next);
  }

  consumers_sync();
  fused_finish_cta(t, gen, tid, 256);
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
    // partial^T [n, m] column-major: element (col c, token r) at r * n + c, split s at s * m * n.
    const auto stride_d = cute::make_stride(cute::Int<1>{}, f.n, f.m * f.n);
    typename Kernel::EpilogueArguments epi{};
    epi.thread.alpha = f.alpha;
    epi.thread.beta = 0.0f;
    epi.ptr_C = nullptr;
    epi.dC = stride_d;
    epi.ptr_D = static_cast<E*>(partial);
    epi.dD = stride_d;
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

  // The device's SM count and the CTAs resident at once (fused_tail.cuh, cached).
  static std::pair<int, int> prepare(int device) {
    return fused_occupancy(reinterpret_cast<const void*>(kernel_fn()), Kernel::MaxThreadsPerBlock,
                           smem_bytes(), device);
  }

  static void launch(const FusedAllReduceDesc& f, int device, cudaStream_t stream) {
    if (fused_token_tile(f.m) != TokenTile)
      throw std::logic_error("internal: the fused kernel of token tile " +
                             std::to_string(TokenTile) +
                             " was dispatched m=" + std::to_string(f.m));
    const auto [sm_count, resident] = prepare(device);
    const FusedTail t = make_fused_tail(f);
    FusedParams<Kernel> params;
    for (int parity = 0; parity < 2; ++parity) {
      void* part = static_cast<char*>(f.partial[f.rank]) + parity * t.parity_bytes;
      Arguments args = make_arguments(f, part, sm_count);
      if (parity == 0 && !Kernel::can_implement(args))
        throw std::invalid_argument(
            "fused GEMM + all-reduce rejected: CUTLASS can_implement rejected the fused GEMM (m=" +
            std::to_string(f.m) + " n=" + std::to_string(f.n) + " k=" + std::to_string(f.k) +
            " splits=" + std::to_string(f.splits) + ")");
      if (parity == 0 && Kernel::get_workspace_size(args) != 0)
        throw std::logic_error("internal: the fused GEMM kernel asks for a workspace");
      params.gemm[parity] = Kernel::to_underlying_arguments(args, nullptr);
    }
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
  void fused_launch_##SUFFIX(const FusedAllReduceDesc& f, int device, cudaStream_t s) { \
    sm90::FusedRunner<ELEMENT, TOKEN_TILE>::launch(f, device, s);                       \
  }                                                                                     \
  int fused_resident_##SUFFIX(int64_t, int device) {                                    \
    return sm90::FusedRunner<ELEMENT, TOKEN_TILE>::prepare(device).second;              \
  }                                                                                     \
  }
