// The accurate fp8 mainloop of the GEMM kernel: CUTLASS's fp8 collective (TMA loads, stages,
// fp32 promotion every k-tile of 128) with its consumer loop replaced, so that the tensor cores
// never wait for a promotion. Included only by kernel/gemm_sm90.cuh.
//
// Why: wgmma accumulates fp8 products in a reduced-precision accumulator, so the accurate
// mainloop adds a temporary accumulator into the fp32 one after every k-tile. CUTLASS's loop
// drains the warpgroup's wgmma pipeline (warpgroup_wait<0>) before each such add, and both
// consumer warpgroups wait on the same stage, so the tensor cores idle through every promotion.
// Here the warpgroup's tile is issued as two halves along N, each with its own temporary: while
// one half's wgmmas of k-tile t run, the other half's of k-tile t - 1 are promoted. The
// registers are those of CUTLASS's loop (the fp32 accumulator plus one tile of temporaries), and
// every output element gets the same k-tile sums added in the same order as in CUTLASS's loop.
// The promotion is every k-tile, CUTLASS's default interval: Params' mma_promotion_interval is
// not read.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/collective_builder.hpp"

namespace distgemm::kernel::sm90 {

// `Built`: the CollectiveMma that CUTLASS's builder makes for the accurate fp8 schedule. The same
// collective with its tiled MMA's atom half as wide (two atoms along the warpgroup's N), and the
// consumer loop below.
template <class Built>
struct Fp8SplitPromotionBase {
  using TileShape = typename Built::TileShape;
  static constexpr int kTileM = cute::size<0>(TileShape{});
  static constexpr int kHalfN = cute::size<1>(TileShape{}) / 2;
  static_assert(kTileM == 128 && kHalfN % 8 == 0 && kHalfN <= 128,
                "a 128-row cooperative tile whose width splits into two wgmma atoms");
  using HalfAtom =
      decltype(cute::GMMA::ss_op_selector<
               typename Built::ElementA, typename Built::ElementB, float,
               cute::Shape<cute::_64, cute::Int<kHalfN>,
                           cute::remove_cvref_t<decltype(cute::get<2>(TileShape{}))>>>());
  using HalfTiledMma = decltype(cute::make_tiled_mma(
      HalfAtom{}, cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>{}));
  using Collective = cutlass::gemm::collective::CollectiveMma<
      typename Built::DispatchPolicy, TileShape, typename Built::ElementA, typename Built::StrideA,
      typename Built::ElementB, typename Built::StrideB, HalfTiledMma,
      typename Built::GmemTiledCopyA, typename Built::SmemLayoutAtomA,
      typename Built::SmemCopyAtomA, typename Built::TransformA, typename Built::GmemTiledCopyB,
      typename Built::SmemLayoutAtomB, typename Built::SmemCopyAtomB, typename Built::TransformB>;
};

template <class Built>
struct Fp8SplitPromotionMainloop : Fp8SplitPromotionBase<Built>::Collective {
  using Base = typename Fp8SplitPromotionBase<Built>::Collective;
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::TensorStorage;
  using typename Base::TiledMma;

  // k-tiles per unrolled run of the consumer loop (see mma): each run ends with one promotion that
  // waits, so longer runs wait less (docs/tuning.md).
  static constexpr int kRun = 8;

  // The consumer loop. On return every k-tile's stage is released and `accum` holds the fp32
  // sum.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read,
                          FrgTensorC& accum, int k_tile_count, int thread_idx,
                          TensorStorage& shared_tensors, Params const&) {
    using namespace cute;
    static_assert(is_rmem<FrgTensorC>::value, "C tensor must be rmem resident.");
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});
    constexpr int kWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    Layout wg_layout = make_layout(Int<kWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
    const int wg = __shfl_sync(0xFFFFFFFF, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_slice(wg_layout(wg));
    Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));  // (MMA,1,K,PIPE)
    Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));  // (MMA,2,K,PIPE)
    static_assert(size<1>(decltype(tCrA){}) == 1 && size<1>(decltype(tCrB){}) == 2,
                  "one atom of the warpgroup's rows, two along N");
    static_assert(size<1>(FrgTensorC{}) == 1 && size<2>(FrgTensorC{}) == 2,
                  "the accumulator in two halves along N");
    constexpr int kBlocks = size<2>(decltype(tCrA){});

    Tensor temp = make_fragment_like(accum);  // the halves' reduced-precision sums of one k-tile
    clear(accum);

    // The wgmmas of half `n` of one k-tile into its temporary, as one committed batch.
    // Fences touch only the half's own registers: any instruction on a register of a wgmma in
    // flight makes ptxas serialize every wgmma of the kernel.
    auto issue = [&](auto n, int stage) {
      Tensor half = temp(_, 0, n);
      warpgroup_fence_operand(half);
      warpgroup_arrive();
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      CUTLASS_PRAGMA_UNROLL
      for (int kb = 0; kb < kBlocks; ++kb) {
        cute::gemm(tiled_mma, tCrA(_, 0, kb, stage), tCrB(_, n, kb, stage), half);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(half);
    };
    // The fp32 sum of half `n` += its temporary (its batch has completed).
    auto promote = [&](auto n) {
      Tensor half = temp(_, 0, n);
      Tensor sum = accum(_, 0, n);
      warpgroup_fence_operand(half);
      warpgroup_fence_operand(sum);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(sum); ++i) sum(i) += half(i);
      warpgroup_fence_operand(sum);
    };

    PipelineState smem_pipe_release = smem_pipe_read;
    // The next k-tile's stage, once its data have landed.
    auto next_stage = [&]() {
      pipeline.consumer_wait(smem_pipe_read, pipeline.consumer_try_wait(smem_pipe_read));
      const int stage = smem_pipe_read.index();
      ++smem_pipe_read;
      return stage;
    };
    // Both halves of a k-tile have completed: its stage goes back to the producer.
    auto release = [&]() {
      pipeline.consumer_release(smem_pipe_release);
      ++smem_pipe_release;
    };

    // Runs of kRun k-tiles, each unrolled: ptxas proves which wgmma a warpgroup_wait<1> retires
    // only in straight-line code (a wgmma in flight across a loop's back edge, read after such a
    // wait, makes it serialize them all), so each run ends drained.
    int t = 0;
    CUTLASS_PRAGMA_NO_UNROLL
    for (; t + kRun <= k_tile_count; t += kRun) {
      int stage = next_stage();
      issue(_0{}, stage);
      CUTLASS_PRAGMA_UNROLL
      for (int u = 0; u < kRun; ++u) {
        issue(_1{}, stage);   // in flight: both halves of k-tile t + u
        warpgroup_wait<1>();  // half 0 has completed
        promote(_0{});
        if (u + 1 < kRun) {
          stage = next_stage();
          issue(_0{}, stage);   // in flight: half 1 of t + u, half 0 of t + u + 1
          warpgroup_wait<1>();  // half 1 of t + u has completed
        } else {
          warpgroup_wait<0>();
        }
        promote(_1{});
        release();
      }
    }
    // The last k_tile_count % kRun k-tiles: only half 1's promotion waits.
    CUTLASS_PRAGMA_NO_UNROLL
    for (; t < k_tile_count; ++t) {
      const int stage = next_stage();
      issue(_0{}, stage);
      issue(_1{}, stage);
      warpgroup_wait<1>();
      promote(_0{});
      warpgroup_wait<0>();
      promote(_1{});
      release();
    }
  }

  // mma() has released every stage.
  CUTLASS_DEVICE void mma_tail(MainloopPipeline, PipelineState, int) {}
};

}  // namespace distgemm::kernel::sm90
