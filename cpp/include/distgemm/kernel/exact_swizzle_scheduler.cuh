// The persistent tile scheduler of the data-parallel GEMM kernels: CUTLASS's SM90 persistent
// scheduler with the tile order of tile_walk.hpp, which swizzles any grid without padding it.
//
// Why: CUTLASS's scheduler rounds both modes of the tile grid up to a multiple of swizzle x
// cluster and runs the padding tiles through the whole mainloop, so a swizzle is only free where
// it divides the grid. Grids such as 27 or 43 tiles of 192 columns (every fp8 Llama shape) then
// run with swizzle 1, where a wave of 132 CTAs spreads over a whole operand and reads more operand
// rows than a swizzle-8 wave. The walk here keeps the group of 8 and narrows only the last group.
//
// The kernel selects it by tag (ExactSwizzleScheduler, as GemmUniversal's TileScheduler
// argument). Everything but the tile order is CUTLASS's: the launch grid, the linear index of a
// CTA's visits (its block index, then steps of the grid size), the end of the work.
#pragma once

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/gemm/kernel/sm90_tile_scheduler.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "distgemm/kernel/tile_walk.hpp"

namespace distgemm::kernel::sm90 {

// GemmUniversal's TileScheduler tag.
struct ExactSwizzleScheduler {};

class ExactSwizzleTileScheduler
    : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90 {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90;

 public:
  using WorkTileInfo = typename Base::WorkTileInfo;
  using RasterOrder = typename Base::RasterOrder;
  using RasterOrderOptions = typename Base::RasterOrderOptions;
  using Arguments = typename Base::Arguments;

  // CUTLASS's parameters for an unswizzled grid (so that it pads only to the cluster and sizes
  // the launch grid from the real tiles), plus the walk.
  struct Params : Base::Params {
    TileWalk walk{};
  };

  template <class ProblemShapeMNKL, class TileShape, class ClusterShape>
  static Params to_underlying_arguments(ProblemShapeMNKL problem_shape_mnkl, TileShape tile_shape,
                                        ClusterShape cluster_shape,
                                        cutlass::KernelHardwareInfo const& hw_info,
                                        Arguments const& arguments, void* workspace = nullptr,
                                        const uint32_t epilogue_subtile = 1,
                                        uint32_t ktile_start_alignment_count = 1u) {
    Arguments unswizzled = arguments;
    unswizzled.max_swizzle_size = 1;
    Params p;
    static_cast<Base::Params&>(p) = Base::to_underlying_arguments(
        problem_shape_mnkl, tile_shape, cluster_shape, hw_info, unswizzled, workspace,
        epilogue_subtile, ktile_start_alignment_count);
    // problem_tiles_m_/n_ count clusters (CUTLASS pads each mode to whole clusters).
    const bool along_n = p.raster_order_ == RasterOrder::AlongN;
    p.walk.minor = along_n ? p.problem_tiles_m_ : p.problem_tiles_n_;
    p.walk.major = along_n ? p.problem_tiles_n_ : p.problem_tiles_m_;
    p.walk.group = arguments.max_swizzle_size > 1 ? uint32_t(arguments.max_swizzle_size) : 1u;
    return p;
  }

  CUTLASS_HOST_DEVICE ExactSwizzleTileScheduler() {}

  CUTLASS_DEVICE explicit ExactSwizzleTileScheduler(Params const& params)
      : Base(params), walk_(params.walk) {
#if defined(__CUDA_ARCH__)
    // CUTLASS's numbering of a CTA's first visit and its stride (StaticPersistentTileScheduler).
    if (params.raster_order_ == RasterOrder::AlongN)
      linear_idx_ = uint64_t(blockIdx.x) + uint64_t(blockIdx.y) * uint64_t(gridDim.x);
    else
      linear_idx_ = uint64_t(blockIdx.x) * uint64_t(gridDim.y) + uint64_t(blockIdx.y);
    grid_size_ = uint64_t(gridDim.x) * uint64_t(gridDim.y) * uint64_t(gridDim.z);
#endif
  }

  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) {
    return get_current_work();
  }

  CUTLASS_DEVICE WorkTileInfo get_current_work() const {
    return get_current_work_for_linear_idx(linear_idx_);
  }

  CUTLASS_DEVICE WorkTileInfo get_current_work_for_linear_idx(uint64_t linear_idx) const {
    auto const& p = scheduler_params;
    if (linear_idx >= p.blocks_per_problem_) return WorkTileInfo::invalid_work_tile();
    uint64_t batch, in_batch;
    p.divmod_batch_(batch, in_batch, linear_idx);
    // A cluster's CTAs hold consecutive indices: the minor-mode offset is the CTA's place in the
    // cluster, the major-mode one the remainder below (as in CUTLASS).
    const uint64_t blk = p.divmod_cluster_shape_minor_.divide(in_batch);
    uint64_t cluster, major_offset;
    p.divmod_cluster_shape_major_(cluster, major_offset, blk);
    auto [cta_m, cta_n, cta_l] = cute::block_id_in_cluster();
    (void)cta_l;
    const bool along_n = p.raster_order_ == RasterOrder::AlongN;
    const WalkCoord c = walk_cluster(static_cast<uint32_t>(cluster), walk_);
    const auto minor = static_cast<int32_t>(c.minor * p.divmod_cluster_shape_minor_.divisor +
                                            (along_n ? cta_m : cta_n));
    const auto major =
        static_cast<int32_t>(c.major * p.divmod_cluster_shape_major_.divisor + major_offset);
    return {along_n ? minor : major, along_n ? major : minor, static_cast<int32_t>(batch), true};
  }

  CUTLASS_DEVICE void advance_to_next_work(uint32_t advance_count = 1) {
    linear_idx_ += grid_size_ * uint64_t(advance_count);
  }

  CUTLASS_DEVICE bool is_last_tile(WorkTileInfo& work_tile_info, uint32_t advance_count = 1) const {
    if (continue_current_work(work_tile_info)) return false;
    return !get_current_work_for_linear_idx(linear_idx_ + grid_size_ * uint64_t(advance_count))
                .is_valid();
  }

  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo work_tile_info) {
    if (continue_current_work(work_tile_info)) return cute::make_tuple(work_tile_info, true);
    advance_to_next_work();
    return cute::make_tuple(get_current_work(), true);
  }

  template <class TileSchedulerPipeline, class TileSchedulerPipelineState>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo work_tile_info, TileSchedulerPipeline&,
                                      TileSchedulerPipelineState) {
    return fetch_next_work(work_tile_info);
  }

 private:
  TileWalk walk_{};
  uint64_t linear_idx_ = 0;
  uint64_t grid_size_ = 0;
};

}  // namespace distgemm::kernel::sm90

namespace cutlass::gemm::kernel::detail {

template <class ArchTag, class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<::distgemm::kernel::sm90::ExactSwizzleScheduler, ArchTag, TileShape,
                             ClusterShape, SchedulerPipelineStageCount> {
  using Scheduler = ::distgemm::kernel::sm90::ExactSwizzleTileScheduler;
};

}  // namespace cutlass::gemm::kernel::detail
